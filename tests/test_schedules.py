"""The paper's learning-rate schedule and Adam settings."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import ModelConfig, TrainConfig, TransformerSchedule, compat
from keras_transformer import create_optimizer
from keras_transformer.config import ConfigError
from keras_transformer.training.schedules import FusedAdam, create_schedule
from keras_transformer.training.runner import make_strategy


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_schedule_equals_formula(step):
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6)


def test_schedule_peaks_at_warmup_and_step_zero_is_not_wasted():
    schedule = TransformerSchedule(d_model=128, warmup_steps=100, scale=2.0)
    rates = np.array([float(schedule(s)) for s in range(0, 400)])
    assert rates.argmax() == 100
    assert rates[0] == rates[1] > 0
    np.testing.assert_allclose(rates[100], 2.0 * 128**-0.5 * 100**-0.5, rtol=1e-6)


def test_linear_decay_shares_the_warmup_and_peak_then_reaches_zero_at_the_last_step():
    paper = TransformerSchedule(d_model=128, warmup_steps=100, scale=2.0)
    linear = TransformerSchedule(d_model=128, warmup_steps=100, scale=2.0, total_steps=300)
    rates = np.array([float(linear(s)) for s in range(0, 400)])
    np.testing.assert_allclose(rates[:101], [float(paper(s)) for s in range(0, 101)], rtol=1e-6)
    peak = 2.0 * 128**-0.5 * 100**-0.5
    np.testing.assert_allclose(rates[[100, 150, 200, 250]], [peak, 0.75 * peak, 0.5 * peak,
                                                             0.25 * peak], rtol=1e-5)
    assert np.all(np.diff(rates[100:301]) < 0)
    assert np.all(rates[300:] == 0)
    with pytest.raises(ValueError, match="total_steps=100 must exceed warmup_steps=100"):
        TransformerSchedule(d_model=128, warmup_steps=100, total_steps=100)


def test_train_decay_linear_sets_the_runs_length_and_needs_it():
    optimizer = create_optimizer(ModelConfig(), TrainConfig(
        decay="linear", epochs=3, steps_per_epoch=50, warmup_steps=20))
    assert optimizer._learning_rate.total_steps == 150
    assert create_optimizer(ModelConfig(), TrainConfig())._learning_rate.total_steps is None
    with pytest.raises(ConfigError, match="set train.steps_per_epoch"):
        TrainConfig(decay="linear")
    with pytest.raises(ConfigError, match="= 40 steps must exceed train.warmup_steps=40"):
        TrainConfig(decay="linear", epochs=2, steps_per_epoch=20, warmup_steps=40)
    with pytest.raises(ConfigError, match="train.decay"):
        TrainConfig(decay="cosine")


def test_a_timed_linear_decay_falls_from_the_same_peak_with_the_budget_spent():
    paper = TransformerSchedule(d_model=128, warmup_steps=100, scale=2.0)
    timed = TransformerSchedule(d_model=128, warmup_steps=100, scale=2.0, timed=True)
    peak = 2.0 * 128**-0.5 * 100**-0.5

    def rates(*steps):
        return np.array([float(timed(step)) for step in steps])

    # Nothing spent: the paper's warmup, then the peak held.
    np.testing.assert_allclose(rates(*range(101)), [float(paper(s)) for s in range(101)],
                               rtol=1e-6)
    np.testing.assert_allclose(rates(150, 10_000), [peak, peak], rtol=1e-6)
    # A quarter spent: 3/4 of the peak, or the warmup's rate where that is lower.
    timed.budget_spent.assign(0.25)
    np.testing.assert_allclose(rates(10, 90, 150, 10_000),
                               [float(paper(10)), 0.75 * peak, 0.75 * peak, 0.75 * peak],
                               rtol=1e-6)
    timed.budget_spent.assign(1.0)
    assert list(rates(50, 150)) == [0.0, 0.0]
    timed.budget_spent.assign(1.5)  # past the budget (its last step): still 0, not negative
    assert list(rates(150)) == [0.0]
    with pytest.raises(ValueError, match="not both"):
        TransformerSchedule(d_model=128, warmup_steps=100, total_steps=300, timed=True)


def test_a_timed_schedule_gives_every_replica_the_share_assigned_outside_them():
    """What `callbacks.TrainingClock` does before each step: one assignment from Python, read
    by the optimizer's update on each replica."""
    strategy = make_strategy("mirrored")
    with strategy.scope():
        schedule = TransformerSchedule(d_model=128, warmup_steps=10, timed=True)
    schedule.budget_spent.assign(0.4)
    per_replica = strategy.run(tf.function(lambda: schedule(tf.constant(50))))
    rates = [float(rate) for rate in strategy.experimental_local_results(per_replica)]
    assert len(rates) == 2
    np.testing.assert_allclose(rates, [0.6 * 128**-0.5 * 10**-0.5] * 2, rtol=1e-6)


def test_train_budget_minutes_makes_the_linear_decay_timed():
    timed = create_schedule(ModelConfig(), TrainConfig(decay="linear", budget_minutes=30))
    assert timed.timed and timed.total_steps is None  # no steps_per_epoch needed
    assert create_optimizer(ModelConfig(), TrainConfig(), timed)._learning_rate is timed
    # The paper's decay: the budget only stops the run.
    paper = create_schedule(ModelConfig(), TrainConfig(budget_minutes=30))
    assert not paper.timed and paper.budget_spent is None and paper.total_steps is None
    for bad in (0, -2.5, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="train.budget_minutes=.* must be a positive"):
            TrainConfig(budget_minutes=bad)


@pytest.mark.parametrize("restore", ["from_config", "keras_serialization"])
def test_schedule_round_trip_gives_the_same_rates(restore):
    """Every argument must survive the round trip: each differs from its default, and the rates
    at these steps (before, at and after the warmup) depend on all of them."""
    schedule = TransformerSchedule(d_model=256, warmup_steps=8000, scale=0.5, total_steps=60000)
    if restore == "from_config":
        restored = TransformerSchedule.from_config(schedule.get_config())
    else:
        restored = keras.optimizers.schedules.deserialize(
            keras.optimizers.schedules.serialize(schedule))
    assert isinstance(restored, TransformerSchedule)
    steps = [0, 1, 2000, 8000, 16000, 40000, 100000]
    expected = [float(schedule(step)) for step in steps]
    np.testing.assert_allclose([float(restored(step)) for step in steps], expected, rtol=1e-7)
    # The steps are discriminating: the default schedule gives other rates at every one of them.
    default = TransformerSchedule(d_model=256)
    assert all(float(default(step)) != rate for step, rate in zip(steps, expected))
    timed = TransformerSchedule.from_config(
        TransformerSchedule(d_model=256, warmup_steps=8000, timed=True).get_config())
    assert timed.timed and timed.budget_spent is not None and timed.total_steps is None


def test_optimizer_is_the_papers_adam():
    optimizer = create_optimizer(ModelConfig(), TrainConfig(accumulate_steps=3))
    assert isinstance(optimizer, FusedAdam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert optimizer.gradient_accumulation_steps is None  # the model's train_step accumulates
    assert isinstance(optimizer._learning_rate, TransformerSchedule)


def _fit_dense(make_optimizer, strategy):
    """A Dense layer's kernel before, then after 4 updates of `make_optimizer()` under
    `strategy`, with its first and second moments."""
    keras.utils.set_random_seed(0)
    x = np.random.RandomState(0).randn(32, 6).astype("float32")
    y = np.random.RandomState(1).randn(32, 3).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = make_optimizer()
        model.compile(optimizer=optimizer, loss="mse")
    initial = model.layers[0].kernel.numpy()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    kernel = model.layers[0].kernel
    m, v = compat.adam_moments(optimizer, kernel)
    return initial, [kernel.numpy(), m.numpy(), v.numpy()]


@pytest.mark.parametrize("devices", [1, 2])
def test_fused_adam_updates_as_keras_adam(devices):
    """The fused kernel computes Keras's Adam update (the float operations only reordered), on
    one device and on 2 replicas; both updates move the kernel far more than they differ."""
    def strategy():
        return tf.distribute.get_strategy() if devices == 1 else make_strategy("mirrored")

    args = dict(learning_rate=0.05, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    initial, fused = _fit_dense(lambda: FusedAdam(**args), strategy())
    _, reference = _fit_dense(lambda: keras.optimizers.Adam(**args), strategy())
    for ours, theirs in zip(fused, reference):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    assert np.abs(fused[0] - initial).min() > 1e-3


def test_fused_adam_round_trips_through_keras_serialization():
    optimizer = FusedAdam(learning_rate=TransformerSchedule(d_model=64), beta_2=0.98,
                          epsilon=1e-9)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, FusedAdam)
    assert (restored.beta_2, restored.epsilon) == (0.98, 1e-9)
    assert isinstance(restored._learning_rate, TransformerSchedule)
