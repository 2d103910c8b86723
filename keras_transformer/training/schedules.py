"""The paper's optimizer (section 5.3): Adam with a warmup / inverse-square-root schedule."""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer import compat
from keras_transformer.config import ModelConfig, TrainConfig


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (equation 3).

    The rate rises linearly for `warmup_steps` steps, then decays with the inverse square root of
    the step. Steps count from 1 as in the paper: the optimizer's first update (iteration 0) uses
    step 1, so no update is wasted at a rate of 0.

    The step is the optimizer's update count, gradient accumulation or not (an accumulated
    update is one step, `Transformer.train_step`).

    With `total_steps`, the rate falls linearly instead after the warmup, from the same peak
    to 0 at step `total_steps` (and stays 0 after it): a run whose length is fixed in advance
    spends its last steps at small rates, where the paper's schedule is still at
    sqrt(warmup_steps / step) of its peak (`train.decay: linear`).

    `timed` is that linear decay over a training-time budget instead of steps
    (`train.budget_minutes`): the rate is the peak times the share of the budget left, or the
    warmup's rate if lower. The share spent is `budget_spent`, a float32 variable in [0, 1]
    that `callbacks.TrainingClock` sets before each step (0 until then), so that the rate
    reaches 0 when the budget ends, whatever the machine's speed.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, total_steps=None, timed=False):
        if total_steps is not None and total_steps <= warmup_steps:
            raise ValueError(f"total_steps={total_steps} must exceed "
                             f"warmup_steps={warmup_steps}")
        if timed and total_steps is not None:
            raise ValueError("a schedule decays over total_steps or over time (timed), not both")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.total_steps = total_steps
        self.timed = timed
        # Not a weight: created where the schedule is (under the strategy's scope, so that
        # every replica reads the value the callback assigns), and not checkpointed.
        self.budget_spent = (tf.Variable(0.0, trainable=False, dtype=tf.float32,
                                         name="budget_spent") if timed else None)

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        warmup = float(self.warmup_steps)
        if self.timed:
            spent = ops.clip(ops.convert_to_tensor(self.budget_spent), 0.0, 1.0)
            decay = warmup**-0.5 * (1.0 - spent)
        elif self.total_steps is None:
            decay = ops.rsqrt(step)
        else:
            total = float(self.total_steps)
            decay = warmup**-0.5 * ops.maximum(total - step, 0.0) / (total - warmup)
        return self.scale * self.d_model**-0.5 * ops.minimum(decay, step * warmup**-1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale,
                "total_steps": self.total_steps, "timed": self.timed}


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update of a variable is TensorFlow's fused `ApplyAdam` kernel.

    The same update, variables and checkpoints as Keras's Adam; Keras writes it as about twelve
    element-wise ops, each a pass over the variable or its moments, which the one kernel
    replaces by a single pass. Sparse gradients and `amsgrad` take Keras's path.
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        local_step = ops.cast(self.iterations + 1, dtype)
        m, v = compat.adam_moments(self, variable)
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.handle, v=v.handle,
            beta1_power=ops.power(ops.cast(self.beta_1, dtype), local_step),
            beta2_power=ops.power(ops.cast(self.beta_2, dtype), local_step),
            lr=ops.cast(learning_rate, dtype), beta1=ops.cast(self.beta_1, dtype),
            beta2=ops.cast(self.beta_2, dtype), epsilon=ops.cast(self.epsilon, dtype),
            grad=ops.cast(gradient, dtype))


def create_schedule(model_config: ModelConfig, train_config: TrainConfig) -> TransformerSchedule:
    """The paper's schedule, by default; with `train.decay: linear` the rate falls to 0 at the
    run's last step (`train.epochs` x `train.steps_per_epoch`), or with `train.budget_minutes`
    at the budget's end (a `timed` schedule: create it under the strategy's scope)."""
    total_steps, timed = None, False
    if train_config.decay == "linear":
        if train_config.budget_minutes is None:
            total_steps = train_config.epochs * train_config.steps_per_epoch
        else:
            timed = True
    return TransformerSchedule(model_config.d_model, train_config.warmup_steps,
                               train_config.learning_rate_scale, total_steps, timed)


def create_optimizer(model_config: ModelConfig, train_config: TrainConfig,
                     schedule: TransformerSchedule | None = None) -> keras.Optimizer:
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on `schedule` (default:
    `create_schedule`'s).

    Gradient accumulation (`train.accumulate_steps`) is not the optimizer's: the model's
    `train_step` sums a group's gradients and applies them once.
    """
    if schedule is None:
        schedule = create_schedule(model_config, train_config)
    return FusedAdam(
        learning_rate=schedule, beta_1=train_config.adam_beta_1, beta_2=train_config.adam_beta_2,
        epsilon=train_config.adam_epsilon)
