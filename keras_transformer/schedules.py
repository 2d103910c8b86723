"""The paper's optimizer (section 5.3): Adam with a warmup / inverse-square-root schedule."""

import keras
from keras import ops

from keras_transformer.config import ModelConfig, TrainConfig


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (equation 3).

    The rate rises linearly for `warmup_steps` steps, then decays with the inverse square root of
    the step. Steps count from 1 as in the paper: the optimizer's first update (iteration 0) uses
    step 1, so no update is wasted at a rate of 0.

    With gradient accumulation Keras hands schedules the batch count; `steps_per_update`
    converts it back to the update count the formula is defined on.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, steps_per_update=1):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.steps_per_update = steps_per_update

    def __call__(self, step):
        step = ops.floor_divide(ops.cast(step, "float32"), float(self.steps_per_update))
        step = ops.maximum(step, 1.0)
        warmup = float(self.warmup_steps)
        return (self.scale * self.d_model**-0.5
                * ops.minimum(ops.rsqrt(step), step * warmup**-1.5))

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale,
                "steps_per_update": self.steps_per_update}


def create_optimizer(model_config: ModelConfig, train_config: TrainConfig) -> keras.Optimizer:
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the paper's schedule, by default.

    With `accumulate_steps` > 1 the optimizer sums gradients over that many batches before
    each update (Keras' `gradient_accumulation_steps`), reaching large token batches on a small
    machine; the schedule still counts updates, not batches.
    """
    schedule = TransformerSchedule(model_config.d_model, train_config.warmup_steps,
                                   train_config.learning_rate_scale,
                                   steps_per_update=train_config.accumulate_steps)
    accumulate = train_config.accumulate_steps if train_config.accumulate_steps > 1 else None
    return keras.optimizers.Adam(
        learning_rate=schedule, beta_1=train_config.adam_beta_1, beta_2=train_config.adam_beta_2,
        epsilon=train_config.adam_epsilon, gradient_accumulation_steps=accumulate)
