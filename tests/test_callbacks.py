"""Training callbacks without training: step summaries from scripted batch logs, the attention
figure's panels and axis labels, the config field that turns step summaries on."""

import dataclasses
import types

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.training import callbacks
from keras_transformer.training.callbacks import (StepSummaries, TrainingClock, attention_figure,
                                         figure_to_image)
from keras_transformer.config import ConfigError, ExperimentConfig, TrainConfig
from keras_transformer.runs.folder import Run


def read_scalars(folder) -> dict:
    """{tag: {step: value}} of the scalar summaries in the event files of `folder`."""
    values = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                values.setdefault(value.tag, {})[event.step] = float(
                    tf.make_ndarray(value.tensor))
    return values


class FakeOptimizer:
    """The two attributes `StepSummaries` reads: `iterations`, and a rate of 0.001 * step."""

    iterations = 0

    @property
    def learning_rate(self):
        return 0.001 * self.iterations


def run_batches(callback, monkeypatch, epochs):
    """Feeds `callback` epochs of (optimizer step after the batch, batch tokens, batch mean loss),
    with the model's metrics as `fit` keeps them (running over the epoch); one second per batch,
    and 10 s of validation between epochs that must not count."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(callbacks, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    optimizer = FakeOptimizer()
    running = {}
    callback.set_model(types.SimpleNamespace(optimizer=optimizer,
                                             get_metrics_result=lambda: dict(running)))
    callback.on_train_begin()
    for epoch, batches in enumerate(epochs):
        callback.on_epoch_begin(epoch)
        tokens = losses = 0.0
        for batch, (step, batch_tokens, batch_loss) in enumerate(batches):
            clock.now += 1.0
            optimizer.iterations = step
            tokens += batch_tokens
            losses += batch_tokens * batch_loss
            running.update(loss=losses / tokens, target_tokens=tokens, accuracy=0.5)
            callback.on_train_batch_end(batch, {"loss": -1.0, "target_tokens": -1.0})
        callback.on_epoch_end(epoch)
        clock.now += 10.0
    callback.on_train_end()


def test_step_summaries_are_means_over_the_steps_since_the_last_write(tmp_path, monkeypatch):
    epochs = [[(1, 10, 4.0), (2, 20, 3.0), (3, 30, 2.0)],
              [(4, 20, 1.0), (5, 10, 2.0), (6, 20, 0.25)]]
    run_batches(StepSummaries(tmp_path, every_steps=2), monkeypatch, epochs)
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"step_loss", "step_learning_rate", "step_tokens_per_second"}
    np.testing.assert_allclose(list(scalars["step_learning_rate"].items()),
                               [(2, 0.002), (4, 0.004), (6, 0.006)])
    # Step 4 starts a new epoch: its window is step 4 alone, not step 3 nor the validation.
    np.testing.assert_allclose(list(scalars["step_loss"].items()),
                               [(2, (40 + 60) / 30), (4, 1.0), (6, (20 + 5) / 30)], rtol=1e-6)
    np.testing.assert_allclose(list(scalars["step_tokens_per_second"].items()),
                               [(2, 30 / 2), (4, 20 / 1), (6, 30 / 2)], rtol=1e-6)


def test_step_summaries_write_once_per_optimizer_step(tmp_path, monkeypatch):
    """Under Keras's gradient accumulation the step moves every other batch; a resume starts
    mid-way."""
    callback = StepSummaries(tmp_path, every_steps=2)
    FakeOptimizer.iterations = 4  # where the restored optimizer stands at `on_train_begin`
    try:
        run_batches(callback, monkeypatch, [[(4, 10, 1.0), (5, 10, 1.0), (5, 10, 1.0),
                                             (6, 10, 3.0), (6, 10, 1.0), (7, 10, 1.0)]])
    finally:
        del FakeOptimizer.iterations
    scalars = read_scalars(tmp_path)
    assert list(scalars["step_loss"]) == [6]
    assert scalars["step_loss"][6] == pytest.approx(1.5)  # the 4 batches since the epoch began


def test_training_clock_counts_on_from_the_checkpoint_and_stops_within_the_budget(monkeypatch):
    """One minute before this session, a 3-minute budget: a step may start while the time
    spent, another step like the last and an epoch end like the last (its validation, 10 s
    here) are within the budget."""
    now = [1000.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    spent = tf.Variable(-1.0)
    clock = TrainingClock(minutes_before=1.0, budget_minutes=3.0, budget_spent=spent)
    model = types.SimpleNamespace(stop_training=False)
    clock.set_model(model)

    def step(begin, end):
        now[0] = begin
        clock.on_train_batch_begin(0)
        share = float(spent.numpy())
        now[0] = end
        clock.on_train_batch_end(0)
        return share

    clock.on_train_begin()
    clock.on_epoch_begin(0)
    assert step(1030.0, 1030.0) == pytest.approx(90 / 180)  # no epoch has ended: no reserve
    now[0], logs = 1040.0, {}  # the epoch's validation: 10 s
    clock.on_epoch_end(0, logs)
    assert logs == {"training_minutes": pytest.approx(100 / 60)}
    clock.on_epoch_begin(1)
    # 180 s less the 10 s reserve; a 1 s step ending at 168 s leaves room for one more.
    assert step(1100.0, 1101.0) == pytest.approx(160 / 170)
    assert step(1107.0, 1108.0) == pytest.approx(167 / 170)
    assert not (model.stop_training or clock.spent)
    assert step(1108.0, 1109.0) == pytest.approx(168 / 170)  # 169 s + 1 s: no room left
    assert model.stop_training and clock.spent
    assert clock.seconds() == pytest.approx(169.0)
    # The reserve follows the last epoch end (2 s here).
    now[0] = 1111.0
    clock.on_epoch_begin(2)
    assert clock._steps_seconds() == pytest.approx(178.0)


def test_training_clock_without_a_budget_only_counts(monkeypatch):
    now = [50.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    clock = TrainingClock()
    model = types.SimpleNamespace(stop_training=False)
    clock.set_model(model)
    clock.on_train_begin()
    now[0] = 1e6
    clock.on_train_batch_begin(0)
    clock.on_train_batch_end(0)
    assert not (model.stop_training or clock.spent)
    logs = {}
    clock.on_epoch_end(0, logs)
    assert logs == {"training_minutes": pytest.approx((1e6 - 50.0) / 60)}


def test_log_every_steps_is_checked_and_zero_turns_step_summaries_off(tmp_path):
    with pytest.raises(ConfigError, match=r"train.log_every_steps=-1 must be >= 0"):
        TrainConfig(log_every_steps=-1)
    assert TrainConfig().log_every_steps == 50
    run = Run(tmp_path)

    def step_summaries(every):
        config = ExperimentConfig(train=TrainConfig(log_every_steps=every))
        return [c for c in callbacks.default_callbacks(config, run)
                if isinstance(c, StepSummaries)]

    [callback] = step_summaries(7)
    assert (callback.every_steps, callback.log_dir) == (7, str(tmp_path / "logs" / "train_steps"))
    assert step_summaries(0) == []


def test_another_log_every_steps_resumes_the_same_run(tmp_path):
    config = ExperimentConfig(train=TrainConfig(log_every_steps=50))
    Run.create(config, tmp_path).save_config(config)
    Run.create(dataclasses.replace(config, train=TrainConfig(log_every_steps=10)), tmp_path)
    with pytest.raises(ConfigError, match="differs in train.seed"):
        Run.create(dataclasses.replace(config, train=TrainConfig(seed=7)), tmp_path)


SOURCE = ["<s>", "▁Ein", "▁Mann", "▁fährt", "▁Fahr", "rad", ".", "</s>"]
OUTPUT = ["▁A", "▁man", "▁rides", "▁a", "▁bike", ".", "</s>"]


def uniform_attention(heads):
    return np.full((heads, len(OUTPUT), len(SOURCE)), 1.0 / len(SOURCE))


@pytest.mark.parametrize("heads, rows", [(4, 1), (8, 2), (6, 2)])
def test_attention_figure_has_a_panel_per_head_labelled_with_the_pieces(heads, rows):
    """The output pieces label the first panel of each row (four to a row), the source pieces
    every panel."""
    figure = attention_figure(uniform_attention(heads), SOURCE, OUTPUT)
    panels = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"]
    assert len(panels) == heads and len(figure.axes) == heads + 1
    assert len({round(axes.get_position().y0, 6) for axes in panels}) == rows
    for head, axes in enumerate(panels):
        assert axes.get_xlabel() == f"Head {head + 1}"
        assert [label.get_text() for label in axes.get_xticklabels()] == SOURCE
        labels = [label.get_text() for label in axes.get_yticklabels()]
        assert labels == (OUTPUT if head % 4 == 0 else [])
        assert axes.images[0].get_array().shape == (len(OUTPUT), len(SOURCE))


def test_attention_figure_leaves_room_for_its_longest_pieces():
    """The margins are measured from the labels: none is cut off at the image's edges or runs
    into the panel above."""
    source = ["<s>", "▁Donaudampfschifffahrtsgesellschaft", "▁W", "</s>"]
    output = ["▁Danube", "▁steamboat", "▁shipping", "▁companyWWWWWWWW", "</s>"]
    figure = attention_figure(np.full((8, len(output), len(source)), 0.25), source, output)
    figure_to_image(figure)
    renderer = figure.canvas.get_renderer()
    panels = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"]
    for axes in panels:
        for label in axes.get_xticklabels() + axes.get_yticklabels() + [axes.xaxis.label]:
            box = label.get_window_extent(renderer)
            assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1, label.get_text()
            assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1, label.get_text()
            for other in panels:
                assert not box.overlaps(other.get_window_extent(renderer)), label.get_text()


def test_attention_figure_refuses_pieces_that_do_not_fit_the_weights():
    with pytest.raises(ValueError, match=r"attention of shape \(4, 7, 8\) for 6 output and 8"):
        attention_figure(uniform_attention(4), SOURCE, OUTPUT[:-1])


def test_attention_image_is_rgb_and_grows_with_the_heads():
    four = figure_to_image(attention_figure(uniform_attention(4), SOURCE, OUTPUT))
    eight = figure_to_image(attention_figure(uniform_attention(8), SOURCE, OUTPUT))
    assert four.dtype == np.uint8 and four.shape[2] == 3
    assert four.shape[1] > 800 and four.shape[0] > 200
    assert eight.shape[0] > 1.8 * four.shape[0] and eight.shape[1] == four.shape[1]
    assert len(np.unique(four.reshape(-1, 3), axis=0)) > 10  # drawn, not blank


def test_the_epoch_logger_writes_one_plain_line_per_epoch_with_its_real_steps():
    import io

    from keras_transformer.training.callbacks import EpochLogger

    stream = io.StringIO()
    logger = EpochLogger(8, 100, stream=stream)
    logger.on_epoch_begin(2)
    for batch in range(100):
        logger.on_train_batch_end(batch)
    logger.on_epoch_end(2, {"loss": 3.82361, "val_bleu": 24.4392})
    budget = EpochLogger(60, 170, budget_minutes=29.5, stream=stream)
    budget.on_epoch_begin(14)
    budget.on_train_batch_end(0)
    budget.on_epoch_end(14, {"loss": 4.0185})
    first, second = stream.getvalue().splitlines()
    assert first.startswith("epoch 3/8: 100/100 steps, ")
    assert first.endswith(" s - loss 3.8236 - val_bleu 24.4392")
    assert second.startswith("epoch 15 (budget 29.5 min): 1/170 steps (the budget ended the "
                             "run), ")
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_the_final_figures_of_a_budget_cut_run_are_its_last_full_epochs():
    from keras_transformer import cli

    history = {"loss": [3.1, 2.7576, 4.0185], "target_tokens": [3e5, 3e5, 2e3],
               "val_bleu": [20.0, 25.0, 25.5], "training_minutes": [10.0, 20.0, 20.1]}
    text = cli._final_figures(history)
    assert "'loss': 2.7576" in text and "'val_bleu': 25.5" in text
    assert "'training_minutes': 20.1" in text
    assert text.endswith("(training figures of the last full epoch, 2 of these)")
    full = {"loss": [3.1, 2.9], "target_tokens": [3e5, 2.9e5]}
    assert cli._final_figures(full) == "{'loss': 2.9, 'target_tokens': 290000.0}"
