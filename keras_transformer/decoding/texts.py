"""Lists of sentences through a translator's signatures from Python: translated
(`translate_texts`), scored (`score_texts`) and aligned (`align_texts`) in length-sorted
batches, and the beam size and length penalty chosen on held-out pairs (`tune_search`).

    translate_texts(translator.translate_beam, sentences)  # a list of str, batched by length
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from keras_transformer.decoding.evaluation import score
from keras_transformer.decoding.translator import TranslateFn, Translator


def translate_texts(translate: TranslateFn, sentences: Sequence[str], *,
                    batch_size: int = 64, progress: Callable[[int], None] | None = None,
                    workers: int = 1, seeds: Sequence[int] | None = None,
                    prefixes: Sequence[str] | None = None) -> list[str]:
    """Translates `sentences` in batches of similar length; returns them in input order.

    Sorting by length keeps padding, and wasted decoder steps, small. `translate` is a Translator
    signature (`translate_greedy`, `translate_beam`, or a loaded SavedModel's function); with
    `seeds` (one per sentence, as `translate_sampling` takes them) it is called as
    `translate(batch, seeds int64 [batch])`, with `prefixes` (one per sentence, as
    `translate_prefix` takes them) as `translate(batch, prefixes string [batch])`. `workers` > 1 runs that many batches at once from a
    thread pool, as concurrent requests to a server would (TensorFlow releases the GIL while a
    batch runs).
    """
    if batch_size < 1 or workers < 1:
        raise ValueError(f"batch_size={batch_size} and workers={workers} must be >= 1")
    second = seeds if seeds is not None else prefixes
    if second is not None and len(second) != len(sentences):
        raise ValueError(f"{len(second)} seeds or prefixes for {len(sentences)} sentences")
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i].split()))
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]

    def run(indices):
        batch = tf.constant([sentences[i] for i in indices], tf.string)
        if second is None:
            outputs = translate(batch)["translation"]
        else:
            outputs = translate(batch, tf.constant([second[i] for i in indices],
                                                   tf.int64 if seeds is not None else tf.string))[
                "translation"]
        return indices, outputs.numpy() if hasattr(outputs, "numpy") else outputs

    results: list[str] = [""] * len(sentences)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for indices, outputs in pool.map(run, batches):
            for index, text in zip(indices, outputs):
                results[index] = text.decode("utf-8")
            if progress is not None:
                progress(len(indices))
    return results


def score_texts(score: Callable, sources: Sequence[str], targets: Sequence[str], *,
                batch_size: int = 64, workers: int = 1) -> list[tuple[float, float, int]]:
    """Scores line-aligned (source, target) texts in batches of similar length, `workers`
    batches in flight; returns (log P, log P / lp, tokens) per pair, in input order. `score` is
    a `score` signature (`Translator.score`, a loaded SavedModel's, or
    `CTranslate2Translator.score`)."""
    def rows(outputs):
        values = [np.asarray(outputs[key]) for key in ("score", "normalized_score", "tokens")]
        return [(float(log_p), float(normalized), int(tokens))
                for log_p, normalized, tokens in zip(*values)]

    return _pairs_in_batches(score, rows, sources, targets, batch_size, workers)


def align_texts(align: Callable, sources: Sequence[str], targets: Sequence[str], *,
                batch_size: int = 64) -> list[str]:
    """The word alignments of line-aligned (source, target) texts, in batches of similar
    length: per pair, Pharaoh pairs "i-j" (see `word_alignment`), in input order. `align` is
    an `align` signature (`Translator.align`, a loaded SavedModel's, or
    `CTranslate2Translator.align`)."""
    return _pairs_in_batches(
        align, lambda outputs: [bytes(text).decode("utf-8")
                                for text in np.asarray(outputs["alignment"])],
        sources, targets, batch_size)


def _pairs_in_batches(function: Callable, rows: Callable, sources: Sequence[str],
                      targets: Sequence[str], batch_size: int, workers: int = 1) -> list:
    """`function(source batch, target batch)` over line-aligned texts in batches of similar
    length, `workers` at a time (threads); `rows(outputs)` makes one result per pair; the
    results in input order."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources for {len(targets)} targets")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    order = sorted(range(len(sources)),
                   key=lambda i: (len(sources[i].split()), len(targets[i].split())))
    results: list = [None] * len(sources)

    def run(batch):
        outputs = function(tf.constant([sources[i] for i in batch], tf.string),
                           tf.constant([targets[i] for i in batch], tf.string))
        for index, result in zip(batch, rows(outputs)):
            results[index] = result

    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if workers > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, batches))
    else:
        for batch in batches:
            run(batch)
    return results


def tune_search(translator, sources: Sequence[str], references: Sequence[str],
                beam_sizes: Sequence[int], alphas: Sequence[float], *, batch_size: int = 64,
                workers: int = 1, stoppings: Sequence[str] | None = None,
                patiences: Sequence[float] | None = None) -> dict:
    """Cased sacreBLEU of beam search for every beam size, length penalty and stopping rule,
    on held-out pairs.

    The paper chose its beam size and alpha on the development set (section 6.1); run this on
    the validation split, never on a test set. The grid shares `translator`'s model and
    tokenizers. Comparing the stopping rules at the exported beam and alpha shows what the
    faster "beam_full" rule costs in BLEU (see `decoding.beam_search`).

    Args:
        translator: a `Translator` (e.g. `translator_from_run`).
        sources, references: line-aligned held-out sentences.
        beam_sizes, alphas: the grid; every setting is decoded once.
        stoppings: `decode.stopping` rules to try (default: the translator's).
        patiences: `decode.patience` values to try with "beam_full" (default: the
            translator's); "exact" has none.

    Returns:
        {"results": [{"beam_size", "alpha", "stopping", "patience", "bleu", "chrf"}, ...] in
         grid order (beam, then alpha, then rule and patience; patience None for "exact"),
         "best": the result with the highest BLEU (the first of equals), "bleu_signature"}.
    """
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references")
    if not beam_sizes or not alphas:
        raise ValueError("an empty grid: give at least one beam size and one alpha")
    stoppings = stoppings or [translator.decode_config.stopping]
    patiences = patiences or [translator.decode_config.patience]
    rules = [(stopping, patience) for stopping in stoppings
             for patience in (patiences if stopping == "beam_full" else [None])]
    searches = {}  # one Translator per beam size and rule, whose one trace serves every alpha

    def search(beam_size, stopping, patience):
        if (beam_size, stopping, patience) not in searches:
            decode_config = dataclasses.replace(
                translator.decode_config, beam_size=beam_size, stopping=stopping,
                patience=translator.decode_config.patience if patience is None else patience)
            searches[beam_size, stopping, patience] = Translator(
                translator.model, translator.source_tokenizer, translator.target_tokenizer,
                decode_config, max_source_length=translator.max_source_length,
                case_folding=translator.case_folding)
        return searches[beam_size, stopping, patience]

    results, signature = [], None
    for beam_size, alpha, (stopping, patience) in itertools.product(beam_sizes, alphas, rules):
        hypotheses = translate_texts(search(beam_size, stopping, patience).beam_translator(alpha),
                                     sources, batch_size=batch_size, workers=workers)
        scores = score(hypotheses, references)
        signature = scores["bleu_signature"]
        results.append({"beam_size": beam_size, "alpha": alpha, "stopping": stopping,
                        "patience": patience, "bleu": scores["bleu"], "chrf": scores["chrf"]})
    return {"results": results, "best": max(results, key=lambda row: row["bleu"]),
            "bleu_signature": signature}
