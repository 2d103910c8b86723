"""Batch translation of text and scoring with sacreBLEU and chrF; validation BLEU in training."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
from typing import Callable, Sequence

import keras
import numpy as np
import sacrebleu
import tensorflow as tf

TranslateFn = Callable[[tf.Tensor], dict]  # string [batch] -> {"translation": string [batch], ...}


def translate_texts(translate: TranslateFn, sentences: Sequence[str], *,
                    batch_size: int = 64, progress: Callable[[int], None] | None = None,
                    workers: int = 1) -> list[str]:
    """Translates `sentences` in batches of similar length; returns them in input order.

    Sorting by length keeps padding, and wasted decoder steps, small. `translate` is a Translator
    signature (`translate_greedy`, `translate_beam`, or a loaded SavedModel's function).
    `workers` > 1 runs that many batches at once from a thread pool, as concurrent requests to a
    server would (TensorFlow releases the GIL while a batch runs).
    """
    if batch_size < 1 or workers < 1:
        raise ValueError(f"batch_size={batch_size} and workers={workers} must be >= 1")
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i].split()))
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]

    def run(indices):
        batch = tf.constant([sentences[i] for i in indices], tf.string)
        return indices, translate(batch)["translation"].numpy()

    results: list[str] = [""] * len(sentences)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for indices, outputs in pool.map(run, batches):
            for index, text in zip(indices, outputs):
                results[index] = text.decode("utf-8")
            if progress is not None:
                progress(len(indices))
    return results


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU (13a tokenization, detokenized input) and chrF, cased and lowercased.

    Returns {"bleu", "bleu_lowercase", "chrf", "chrf_lowercase"} and their signatures.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    result = {}
    for suffix, lowercase in (("", False), ("_lowercase", True)):
        bleu = sacrebleu.metrics.BLEU(lowercase=lowercase)
        chrf = sacrebleu.metrics.CHRF(lowercase=lowercase)
        result[f"bleu{suffix}"] = bleu.corpus_score(hypotheses, [references]).score
        result[f"chrf{suffix}"] = chrf.corpus_score(hypotheses, [references]).score
        result[f"bleu{suffix}_signature"] = str(bleu.get_signature())
        result[f"chrf{suffix}_signature"] = str(chrf.get_signature())
    return result


def tune_search(translator, sources: Sequence[str], references: Sequence[str],
                beam_sizes: Sequence[int], alphas: Sequence[float], *, batch_size: int = 64,
                workers: int = 1) -> dict:
    """Cased sacreBLEU of beam search for every beam size and length penalty, on held-out pairs.

    The paper chose its beam size and alpha on the development set (section 6.1); run this on
    the validation split, never on a test set. The grid shares `translator`'s model and
    tokenizers.

    Args:
        translator: a `Translator` (e.g. `translator_from_run`).
        sources, references: line-aligned held-out sentences.
        beam_sizes, alphas: the grid; every pair is decoded once.

    Returns:
        {"results": [{"beam_size", "alpha", "bleu", "chrf"}, ...] in grid order,
         "best": the result with the highest BLEU (the first of equals), "bleu_signature"}.
    """
    from keras_transformer.translator import Translator

    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references")
    if not beam_sizes or not alphas:
        raise ValueError("an empty grid: give at least one beam size and one alpha")
    results, signature = [], None
    for beam_size in beam_sizes:
        for alpha in alphas:
            decode_config = dataclasses.replace(translator.decode_config, beam_size=beam_size,
                                                alpha=alpha)
            candidate = Translator(translator.model, translator.source_tokenizer,
                                   translator.target_tokenizer, decode_config)
            hypotheses = translate_texts(candidate.translate_beam, sources,
                                         batch_size=batch_size, workers=workers)
            scores = score(hypotheses, references)
            signature = scores["bleu_signature"]
            results.append({"beam_size": beam_size, "alpha": alpha, "bleu": scores["bleu"],
                            "chrf": scores["chrf"]})
    return {"results": results, "best": max(results, key=lambda row: row["bleu"]),
            "bleu_signature": signature}


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
        from keras_transformer.translator import Translator

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
        limit = self.model.config.max_length  # a bad translation re-tokenizes longer
        source_ids = self.source_tokenizer.tokenize(tf.constant([source])).to_tensor()
        target_ids = self.target_tokenizer.tokenize(tf.constant([translation])).to_tensor()
        weights = self.model.cross_attention_scores(source_ids[:, :limit],
                                                    target_ids[:, :-1][:, :limit])
        heat = tf.reduce_mean(weights[0], axis=0)  # [target_len, source_len]
        heat = heat / tf.maximum(tf.reduce_max(heat), 1e-9)
        scale = 8
        heat = tf.repeat(tf.repeat(heat, scale, axis=0), scale, axis=1)
        return tf.stack([heat, heat * 0.5, 1.0 - heat], axis=-1)


def write_lines(path, lines: Sequence[str]) -> None:
    with io.open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")
