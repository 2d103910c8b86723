"""Keras callbacks of a training run: validation BLEU with translations and attention images for
TensorBoard, tokens per second, where training starts, and the run's checkpoints.

`default_callbacks` puts them in the order they must see each epoch's logs.
"""

from __future__ import annotations

import logging
import time
import keras
import numpy as np
import tensorflow as tf

from keras_transformer.config import ExperimentConfig
from keras_transformer.evaluation import score
from keras_transformer.runs import Run
from keras_transformer.translator import Translator, translate_texts

logger = logging.getLogger(__name__)


class TokensPerSecond(keras.callbacks.Callback):
    """Adds `tokens_per_second` (target tokens of the training epoch / its wall time)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "target_tokens" in logs:
            logs["tokens_per_second"] = logs["target_tokens"] / (time.perf_counter() - self._start)


class ResumeLogger(keras.callbacks.Callback):
    """Logs where training starts: epoch and optimizer step (non-zero after a resume), and on
    how many replicas and in which precision (what `train.precision: auto` resolved to)."""

    def __init__(self, initial_epoch: int = 0):
        super().__init__()
        self.initial_epoch = initial_epoch

    def on_train_begin(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        epoch = self.initial_epoch
        message = (f"resuming at epoch {epoch + 1}, optimizer step {step}" if step
                   else "starting from scratch")
        message += (f" ({self.model.distribute_strategy.num_replicas_in_sync} replica(s), "
                    f"{self.model.dtype_policy.name})")
        logger.info(message)
        print(f"keras-transformer train: {message}", flush=True)


def default_callbacks(config: ExperimentConfig, run: Run, validation_callback=None,
                      initial_epoch: int = 0):
    """Callbacks in the order they must see each epoch's logs: validation BLEU first, so that
    checkpoints, early stopping and TensorBoard find `val_bleu`. `initial_epoch`: the epochs
    the run had done before (a resumed or extended run)."""
    callbacks = [ResumeLogger(initial_epoch), TokensPerSecond(), keras.callbacks.TerminateOnNaN()]
    early_stopping = None
    if validation_callback is not None:
        callbacks.append(validation_callback)
        if config.train.early_stopping_patience:
            early_stopping = ResumedEarlyStopping(run, config.train.early_stopping_patience,
                                                  initial_epoch)
    callbacks.append(RunCheckpoints(run, validation_callback is not None, early_stopping))
    if early_stopping is not None:
        callbacks.append(early_stopping)
    callbacks.append(keras.callbacks.TensorBoard(str(run.logs_dir), update_freq="epoch"))
    return callbacks


class RunCheckpoints(keras.callbacks.Callback):
    """Records every finished epoch in the run folder (`Run.save_epoch`): its checkpoint,
    `last`, `best` (by `val_bleu` when `track_best`) and `state.json`, each written to a
    temporary name and renamed, so a kill never leaves half a file (Keras's ModelCheckpoint and
    BackupAndRestore write in place). An epoch whose loss is not finite (TerminateOnNaN stopped
    it) is not recorded: its weights would replace good ones. After early stopping the run is
    marked finished."""

    def __init__(self, run: Run, track_best: bool, early_stopping=None):
        super().__init__()
        self.run, self.track_best, self.early_stopping = run, track_best, early_stopping

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not np.isfinite(logs.get("loss", 0.0)):
            logger.warning("epoch %d ended with loss %s: its weights are not saved", epoch + 1,
                           logs.get("loss"))
            return
        self.run.save_epoch(self.model, epoch + 1,
                            logs.get("val_bleu") if self.track_best else None)

    def on_train_end(self, logs=None):
        if self.early_stopping is not None and self.early_stopping.stopped_epoch:
            self.run.mark_stopped_early()


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
    TensorBoard text summary and a cross-attention heat map as an image summary.

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
        self.log_dir = str(log_dir)
        self.examples = examples
        self.batch_size = batch_size
        self._writer = None
        self._translator = None

    def on_train_begin(self, logs=None):
        # Built once, so its tf.function traces once for the whole run.
        self._translator = Translator(self.model, self.source_tokenizer, self.target_tokenizer,
                                      self.decode_config)

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
        """Last decoder layer's cross-attention (mean over heads) for one pair, as an RGB image
        `[target_len, source_len, 3]` scaled up for visibility."""
        limit = self.model.config.max_positions  # a bad translation re-tokenizes longer
        source_ids = self.source_tokenizer.tokenize(tf.constant([source])).to_tensor()
        target_ids = self.target_tokenizer.tokenize(tf.constant([translation])).to_tensor()
        weights = self.model.cross_attention_scores(source_ids[:, :limit],
                                                    target_ids[:, :-1][:, :limit])
        heat = tf.reduce_mean(weights[0], axis=0)  # [target_len, source_len]
        heat = heat / tf.maximum(tf.reduce_max(heat), 1e-9)
        scale = 8
        heat = tf.repeat(tf.repeat(heat, scale, axis=0), scale, axis=1)
        return tf.stack([heat, heat * 0.5, 1.0 - heat], axis=-1)
