"""Keras callbacks of a training run: validation BLEU with translations and attention images for
TensorBoard, loss, learning rate and tokens per second every N steps, where training starts, the
training clock and time budget, and the run's checkpoints.

`default_callbacks` puts them in the order they must see each epoch's logs.
"""

from __future__ import annotations

import logging
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

from keras_transformer.config import ExperimentConfig
from keras_transformer.decoding.evaluation import score
from keras_transformer.decoding.texts import translate_texts
from keras_transformer.decoding.translator import Translator
from keras_transformer.runs.folder import Run

logger = logging.getLogger(__name__)

_CELL = 0.2  # inches a piece in the attention figure (20 pixels)
_LABEL_POINTS = 8  # its pieces' font size


class TokensPerSecond(keras.callbacks.Callback):
    """Adds `tokens_per_second` (target tokens of the training epoch / its wall time)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "target_tokens" in logs:
            logs["tokens_per_second"] = logs["target_tokens"] / (time.perf_counter() - self._start)


class StepSummaries(keras.callbacks.Callback):
    """Writes to TensorBoard every `every_steps` optimizer steps, at the optimizer's step (so
    that the curves continue across a resume):

    - `step_loss`: the mean loss per target token over the steps since the last write;
    - `step_learning_rate`: the learning rate at the optimizer's step;
    - `step_tokens_per_second`: target tokens over wall time since the last write.

    Reads the model's `loss` and `target_tokens` metrics (`model.get_metrics_result()`): both
    run over the epoch so far, the loss weighted by target tokens (`Transformer.train_step` and
    `losses.TargetTokens`). Not the batch logs: under N replicas `fit` gives each batch the mean
    of the replicas' own running values, N times fewer tokens than the step trained on.

    Keras 3.15's `TensorBoard(update_freq=N)` does not do this job: its step counts the batches
    of the current `fit` (1 again after a resume), its `batch_loss` is the running mean of the
    epoch, and it leaves `tf.summary.record_if(step % N == 0)` on between batches, so that every
    summary written at the end of an epoch whose last step is not a multiple of N is dropped
    (Keras's own epoch scalars, `val_bleu`, the translations).

    Args:
        log_dir: a folder of its own (not Keras's `logs/train`): TensorBoard's Python loader
            (`--load_fast=false`) follows only the newest event file of a folder while it runs.
        every_steps: N.
    """

    def __init__(self, log_dir, every_steps: int):
        super().__init__()
        self.log_dir = str(log_dir)
        self.every_steps = every_steps
        self._writer = None
        self._last_step = 0
        self._mark = (0.0, 0.0, 0.0)  # time, epoch's target tokens, summed token losses

    def on_train_begin(self, logs=None):
        self._last_step = self._step()

    def on_epoch_begin(self, epoch, logs=None):
        self._mark = (time.perf_counter(), 0.0, 0.0)  # the logs' running values restart

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        # The step stays put for several batches under Keras's `gradient_accumulation_steps`.
        if step == self._last_step or step % self.every_steps:
            return
        self._last_step = step
        running = self.model.get_metrics_result()
        now, tokens = time.perf_counter(), float(running["target_tokens"])
        losses = float(running["loss"]) * tokens
        then, tokens_then, losses_then = self._mark
        self._mark = (now, tokens, losses)
        window = tokens - tokens_then
        self._write(step, loss=(losses - losses_then) / max(window, 1.0),
                    learning_rate=float(keras.ops.convert_to_numpy(
                        self.model.optimizer.learning_rate)),
                    tokens_per_second=window / max(now - then, 1e-9))

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is not None:
            self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _step(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _write(self, step: int, **values: float) -> None:
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=step), tf.summary.record_if(True):
            for name, value in values.items():
                tf.summary.scalar(f"step_{name}", value, description=_STEP_DESCRIPTIONS[name])


_STEP_DESCRIPTIONS = {
    "loss": "Training loss per target token, mean over the steps since the previous point.",
    "learning_rate": "Learning rate of the schedule at this optimizer step.",
    "tokens_per_second": "Target tokens per second of wall time since the previous point.",
}


class TrainingClock(keras.callbacks.Callback):
    """Training time, and the run's time budget (`train.budget_minutes`).

    Training time is wall clock from the start of `fit` (tracing, steps, validation: what the
    user waits for), continuing from `minutes_before`, what a resumed run's checkpoint
    recorded. Adds `training_minutes` to each epoch's logs, for the checkpoint
    (`RunCheckpoints`) and TensorBoard (`epoch_training_minutes`).

    With `budget_minutes`, stops training after the last step that leaves time for one more
    like it and for an epoch's end (its validation and checkpoint, which the stopped epoch
    still pays: as long as the last one; the first, which traces the validation, is longer):
    `spent` is then True. Before each step it sets
    `budget_spent`, a timed schedule's variable (`schedules.TransformerSchedule`), to the
    share spent of the time the steps may take, so that a linear decay reaches 0 at the last
    step.
    """

    def __init__(self, minutes_before: float = 0.0, budget_minutes: float | None = None,
                 budget_spent: tf.Variable | None = None):
        super().__init__()
        self.minutes_before = minutes_before
        self.budget_seconds = None if budget_minutes is None else 60.0 * budget_minutes
        self.budget_spent = budget_spent
        self.spent = False
        self._start = self._step_start = self._last_step_end = None
        self._step_seconds = 0.0  # the last step's
        self._epoch_end_seconds = 0.0  # the last epoch's validation and epoch-end callbacks

    def seconds(self) -> float:
        """Training seconds so far, sessions before this one included."""
        return 60.0 * self.minutes_before + time.perf_counter() - self._start

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()
        self.spent = False

    def on_epoch_begin(self, epoch, logs=None):
        if self._last_step_end is not None:
            self._epoch_end_seconds = time.perf_counter() - self._last_step_end

    def on_train_batch_begin(self, batch, logs=None):
        self._step_start = time.perf_counter()
        if self.budget_spent is not None:
            self.budget_spent.assign(min(self.seconds() / self._steps_seconds(), 1.0))

    def on_train_batch_end(self, batch, logs=None):
        self._last_step_end = time.perf_counter()
        self._step_seconds = self._last_step_end - self._step_start
        if (self.budget_seconds is not None
                and self.seconds() + self._step_seconds >= self._steps_seconds()):
            self.spent = True
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["training_minutes"] = self.seconds() / 60.0

    def _steps_seconds(self) -> float:
        """The part of the budget the steps may take."""
        return max(self.budget_seconds - self._epoch_end_seconds, 1e-9)


class ResumeLogger(keras.callbacks.Callback):
    """Logs where training starts: epoch and optimizer step (non-zero after a resume), and on
    how many replicas and in which precision (what `train.precision: auto` resolved to)."""

    def __init__(self, initial_epoch: int = 0, fine_tuning: bool = False):
        super().__init__()
        self.initial_epoch, self.fine_tuning = initial_epoch, fine_tuning

    def on_train_begin(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        epoch = self.initial_epoch
        start = ("starting a new run from those weights, with a new optimizer and schedule"
                 if self.fine_tuning else "starting from scratch")
        message = f"resuming at epoch {epoch + 1}, optimizer step {step}" if step else start
        message += (f" ({self.model.distribute_strategy.num_replicas_in_sync} replica(s), "
                    f"{self.model.dtype_policy.name})")
        logger.info(message)
        print(f"keras-transformer train: {message}", flush=True)


class EpochLogger(keras.callbacks.Callback):
    """One plain line per epoch on standard output, for a log file or a pipe (`train
    --progress 2`): the epoch of how many (with `train.budget_minutes`, the budget instead,
    since it decides the count), the steps it ran of how many, its seconds, and its logs.

        epoch 3/8: 100/100 steps, 71 s - loss 3.8236 - accuracy 0.4948 - val_bleu 24.4392 ...
        epoch 15 (budget 29.5 min): 1/170 steps (the budget ended the run), 4 s - loss ...

    Keras's own line (`model.fit(verbose=2)`) says `Epoch 1/60` of a run the budget will end at
    15, and gives a cut epoch's full step count."""

    def __init__(self, epochs: int, steps_per_epoch: int | None,
                 budget_minutes: float | None = None, stream=None):
        super().__init__()
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.budget_minutes = budget_minutes
        self.stream = stream
        self._steps = self._start = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._steps, self._start = 0, time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start
        head = (f"epoch {epoch + 1} (budget {self.budget_minutes:g} min)"
                if self.budget_minutes is not None else f"epoch {epoch + 1}/{self.epochs}")
        steps = (f"{self._steps}/{self.steps_per_epoch} steps" if self.steps_per_epoch
                 else f"{self._steps} steps")
        if self.steps_per_epoch and self._steps < self.steps_per_epoch:
            steps += " (the budget ended the run)"
        values = " - ".join(f"{key} {value:.4f}" for key, value in (logs or {}).items()
                            if isinstance(value, (int, float, np.floating)))
        print(f"{head}: {steps}, {seconds:.0f} s - {values}", file=self.stream or sys.stdout,
              flush=True)


def default_callbacks(config: ExperimentConfig, run: Run, validation_callback=None,
                      initial_epoch: int = 0, budget_spent: tf.Variable | None = None):
    """Callbacks in the order they must see each epoch's logs: validation BLEU first, so that
    checkpoints, early stopping and TensorBoard find `val_bleu`, then the training clock, so
    that the checkpoint records the minutes after validation. `initial_epoch`: the epochs the
    run had done before (a resumed or extended run); `budget_spent`: the timed schedule's
    variable (`train.budget_minutes` with `train.decay: linear`)."""
    callbacks = [ResumeLogger(initial_epoch, fine_tuning=bool(config.train.init_from)),
                 TokensPerSecond(), keras.callbacks.TerminateOnNaN()]
    early_stopping = None
    if config.train.log_every_steps:
        callbacks.append(StepSummaries(run.logs_dir / "train_steps", config.train.log_every_steps))
    if validation_callback is not None:
        callbacks.append(validation_callback)
        if config.train.early_stopping_patience:
            early_stopping = ResumedEarlyStopping(run, config.train.early_stopping_patience,
                                                  initial_epoch)
    clock = TrainingClock(run.training_minutes(initial_epoch), config.train.budget_minutes,
                          budget_spent)
    callbacks.append(clock)
    callbacks.append(RunCheckpoints(run, validation_callback is not None, early_stopping, clock))
    if early_stopping is not None:
        callbacks.append(early_stopping)
    callbacks.append(keras.callbacks.TensorBoard(
        str(run.logs_dir), update_freq="epoch", profile_batch=config.train.profile_range() or 0))
    return callbacks


class RunCheckpoints(keras.callbacks.Callback):
    """Records every finished epoch in the run folder (`Run.save_epoch`): its checkpoint,
    `last`, `best` (by `val_bleu` when `track_best`) and `state.json`, each written to a
    temporary name and renamed, so a kill never leaves half a file (Keras's ModelCheckpoint and
    BackupAndRestore write in place). An epoch whose loss is not finite (TerminateOnNaN stopped
    it) is not recorded: its weights would replace good ones. Each checkpoint records the
    training minutes (`TrainingClock`'s `training_minutes` in the logs). After early stopping,
    or once the time budget is spent (`clock.spent`), the run is marked finished."""

    def __init__(self, run: Run, track_best: bool, early_stopping=None, clock=None):
        super().__init__()
        self.run, self.track_best, self.early_stopping = run, track_best, early_stopping
        self.clock = clock

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not np.isfinite(logs.get("loss", 0.0)):
            logger.warning("epoch %d ended with loss %s: its weights are not saved", epoch + 1,
                           logs.get("loss"))
            return
        self.run.save_epoch(self.model, epoch + 1,
                            logs.get("val_bleu") if self.track_best else None,
                            training_minutes=logs.get("training_minutes"))

    def on_train_end(self, logs=None):
        if self.early_stopping is not None and self.early_stopping.stopped_epoch:
            self.run.mark_stopped_early()
        elif self.clock is not None and self.clock.spent:
            self.run.mark_budget_spent()


class ResumedEarlyStopping(keras.callbacks.EarlyStopping):
    """EarlyStopping on `val_bleu` that goes on counting where a resumed run left off: from its
    best score and the epochs since (the run's `state.json`), not from scratch."""

    def __init__(self, run: Run, patience: int, initial_epoch: int = 0):
        super().__init__(monitor="val_bleu", mode="max", patience=patience)
        self.run, self.initial_epoch = run, initial_epoch

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        best = (self.run.state() or {}).get("best") if self.initial_epoch else None
        if best is not None:
            self.best, self.best_epoch = best["val_bleu"], best["epoch"] - 1
            self.wait = max(0, self.initial_epoch - best["epoch"])


class ValidationBleu(keras.callbacks.Callback):
    """Greedy-decodes validation sentences after each epoch and adds `val_bleu` and `val_chrf`
    (sacreBLEU on detokenized, cased text) to the epoch logs; writes a few translations as a
    TensorBoard text summary and the first sentence's cross-attention as an image summary
    (`attention_figure`).

    Args:
        pairs: a dataset of (source, reference) strings.
        source_tokenizer, target_tokenizer: the run's tokenizers.
        config: the run's `ExperimentConfig` (decode settings).
        log_dir: TensorBoard folder for the text and image summaries.
        examples: how many translations to show in TensorBoard.
    """

    def __init__(self, pairs: tf.data.Dataset, source_tokenizer, target_tokenizer, config,
                 log_dir, examples: int = 5, batch_size: int = 100):
        super().__init__()
        rows = list(pairs.as_numpy_iterator())
        self.sources = [s.decode("utf-8") for s, _ in rows]
        self.references = [t.decode("utf-8") for _, t in rows]
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.decode_config = config.decode
        self.case_folding = config.data.case_folding
        self.log_dir = str(log_dir)
        self.examples = examples
        self.batch_size = batch_size
        self._writer = None
        self._translator = None

    def on_train_begin(self, logs=None):
        # Built once, so its tf.function traces once for the whole run.
        self._translator = Translator(self.model, self.source_tokenizer, self.target_tokenizer,
                                      self.decode_config, case_folding=self.case_folding)

    def on_epoch_end(self, epoch, logs=None):
        hypotheses = translate_texts(self._translator.translate_greedy, self.sources,
                                     batch_size=self.batch_size)
        scores = score(hypotheses, self.references)
        if logs is not None:
            logs["val_bleu"] = scores["bleu"]
            logs["val_chrf"] = scores["chrf"]
        self._write_summaries(epoch, hypotheses)

    def _write_summaries(self, epoch, hypotheses):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        rows = ["| source | reference | translation |", "|---|---|---|"]
        for source, reference, hypothesis in list(zip(self.sources, self.references,
                                                      hypotheses))[:self.examples]:
            rows.append(f"| {source} | {reference} | {hypothesis} |")
        with self._writer.as_default(step=epoch):
            tf.summary.text("translations", "\n".join(rows))
            if self.sources:
                tf.summary.image("cross_attention", self._attention_image(
                    self.sources[0], hypotheses[0])[None])
        self._writer.flush()

    def _attention_image(self, source: str, translation: str) -> np.ndarray:
        """The last decoder layer's cross-attention for one pair, one panel per head, as an RGB
        image uint8 `[height, width, 3]`."""
        limit = self.model.config.max_positions  # a bad translation re-tokenizes longer
        source_ids = self.source_tokenizer.tokenize(tf.constant([source])).to_tensor()[:, :limit]
        target_ids = self.target_tokenizer.tokenize(tf.constant([translation])).to_tensor()
        target_in, target_out = target_ids[:, :-1][:, :limit], target_ids[:, 1:][:, :limit]
        weights = self.model.cross_attention_scores(source_ids, target_in)  # [1, heads, out, in]
        figure = attention_figure(tf.cast(weights[0], tf.float32).numpy(),
                                  _pieces(self.source_tokenizer, source_ids[0]),
                                  _pieces(self.target_tokenizer, target_out[0]))
        return figure_to_image(figure)


def _pieces(tokenizer, ids) -> list[str]:
    """The subword strings of int ids `[len]`."""
    return [piece.decode("utf-8", "replace") for piece in tokenizer.lookup(ids).numpy()]


def attention_figure(weights: np.ndarray, source_pieces: list[str],
                     output_pieces: list[str]) -> Figure:
    """Attention `weights` `[heads, output_len, source_len]` drawn as the tf.text tutorial's
    attention plot: one panel per head (four to a row), the source pieces along the x axis of
    every panel, the output pieces along the y axis of each row's first panel, on one color
    scale with a color bar.

    `output_pieces[i]` is the piece the decoder produced while attending with row i (so it
    starts with the first piece after START and ends with END).
    """
    heads, rows, columns = weights.shape
    if (rows, columns) != (len(output_pieces), len(source_pieces)):
        raise ValueError(f"attention of shape {weights.shape} for {len(output_pieces)} output "
                         f"and {len(source_pieces)} source pieces")
    per_row = min(heads, 4)
    panel_rows = -(-heads // per_row)
    figure = Figure()
    # The margins are the widest labels, measured once: a layout engine (constrained or tight)
    # measures every label of every panel at each draw, and took most of the drawing time.
    renderer = FigureCanvasAgg(figure).get_renderer()
    font = FontProperties(size=_LABEL_POINTS)

    def widest(pieces):  # inches
        return max((renderer.get_text_width_height_descent(piece, font, ismath=False)[0]
                    for piece in pieces), default=0.0) / figure.dpi

    tick = 0.12  # a tick and its padding
    panel_width, panel_height = _CELL * columns, _CELL * rows
    left, gap, bar = widest(output_pieces) + tick + 0.1, 0.25, 1.1
    above, below = widest(source_pieces) + tick + 0.05, 0.35  # pieces above, "Head n" below
    width = left + per_row * panel_width + (per_row - 1) * gap + bar
    height = panel_rows * (above + panel_height + below)
    figure.set_size_inches(width, height)
    vmax = max(float(weights.max()), 1e-9)
    for head in range(heads):
        row, column = divmod(head, per_row)
        x = left + column * (panel_width + gap)
        y = height - (row + 1) * (above + panel_height) - row * below
        axes = figure.add_axes((x / width, y / height, panel_width / width,
                                panel_height / height))
        image = axes.matshow(weights[head], vmin=0.0, vmax=vmax, aspect="auto")
        axes.set_xticks(range(columns), source_pieces, rotation=90, fontsize=_LABEL_POINTS)
        if column == 0:
            axes.set_yticks(range(rows), output_pieces, fontsize=_LABEL_POINTS)
        else:
            axes.set_yticks([])
        axes.set_xlabel(f"Head {head + 1}")
    bar_axes = figure.add_axes(((width - bar + 0.2) / width, 0.1, 0.15 / width, 0.8),
                               label="<colorbar>")
    figure.colorbar(image, cax=bar_axes, label="attention weight")
    return figure


def figure_to_image(figure: Figure) -> np.ndarray:
    """A matplotlib figure rendered by Agg, as RGB uint8 `[height, width, 3]`."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
