"""The CTranslate2 runtime: strings in, translations out, from a folder `export_ctranslate2`
wrote, without TensorFlow or Keras.

    CTranslate2Translator("exports/ct2").translate_beam(["Ein Hund."])  # {"translation", "score"}

`CTranslate2Translator` reproduces `translator.Translator`: the same input normalization
(`text_normalization.normalize`, the twin of `tokenizers.normalize_text`), truncation, caps,
greedy and beam results, and the same output dicts as the SavedModel signatures. It imports only
ctranslate2, sentencepiece, numpy and TensorFlow-free modules of this package, so a server that
runs it does not load TensorFlow.

Ranking and stopping are `search_rules`' (the rules of `decoding.beam_search`): hypotheses are
ranked by log P / lp with the GNMT length penalty lp = ((5 + |Y|) / 6) ** alpha, |Y| counting
END (a hypothesis cut at its cap has no END). CTranslate2 has no such penalty. With length
penalty 0 (raw log P) it stops a sentence once its best candidate by log P has ended and
`num_hypotheses` have finished, and returns only the best `num_hypotheses` by log P: both lose
longer hypotheses that ours ranks higher. So it is asked for every hypothesis its search
finishes, which are re-ranked here, and the exact early stopping bound
(`search_rules.cannot_improve`) decides when a search shorter than the cap suffices
(`CTranslate2Translator._beam`).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import ctranslate2
import numpy as np
import sentencepiece

from keras_transformer.config import (PROVENANCE_FILE, VOCABULARY_CHECKSUMS, ConfigError,
                                      DecodeConfig)
from keras_transformer.data import casing, placeholders
from keras_transformer.data.text_io import changed_file, file_sha256, first_line
from keras_transformer.data.text_normalization import normalize
from keras_transformer.decoding.search_rules import (NEG_INF, cannot_improve, finished_to_stop,
                                                     kept_source_tokens, length_penalty,
                                                     output_cap)
from keras_transformer.decoding.word_alignment import hard_alignment, word_attention, word_indices

# What an export holds besides CTranslate2's own files (model.bin, config.json,
# shared_vocabulary.json), written by `ctranslate2_export`: the SentencePiece model and the
# settings (beam size, alpha, caps, markers) with the provenance.
SETTINGS_FILE = PROVENANCE_FILE
MODEL_FILE = "model.bin"  # CTranslate2's weights
MODEL_CHECKSUM = "model_bin_sha256"  # in the settings: model.bin's SHA-256, checked on loading
MAX_BATCH_SIZE = 32  # sentences per CTranslate2 batch (beam search decodes beam_size times more)
BEAM_RULES = ("native", "exact")


class CTranslate2Translator:
    """Strings in, `{"translation": bytes [batch], "score": float32 [batch]}` out, from a
    CTranslate2 export: the results of `translator.Translator` on the same model.

    Sources are truncated to their first `max_source_length - 1` tokens plus END; outputs are at
    most min(source length + max_extra_length, max_positions) tokens, END included, the source
    length counting START and END. Empty or whitespace-only sources are not decoded (neither does
    `Translator`): their translation is "" with score 0.

    Beam search (`beam_rule`):
    - "native" (default): CTranslate2's own search, as fast as CTranslate2 is: one call per
      batch, with the batch's longest output cap (each output is then cut at its own cap, as
      `Translator` stops it; the rare output that runs into its cap keeps the longer search's
      score); beam search stops a sentence, as the export's "beam_full" rule does, once
      patience x beam_size hypotheses have finished, and returns the `beam_size` best of them
      by log P / lp: the best one is usually, not always, `Translator`'s (which also stops
      when no alive hypothesis can win any more, and which "exact" exports run to that bound).
    - "exact": asks CTranslate2 for every hypothesis it finishes, ranks them by log P / lp and
      stops as `decoding.beam_search` does (see `_beam`), and decodes sentences in groups of
      equal cap (CTranslate2 takes one length limit per call): `Translator`'s results exactly,
      at the cost of longer searches and smaller batches.

    Args:
        model_dir: a folder written by `export_ctranslate2`.
        device, inter_threads, intra_threads, compute_type: see `ctranslate2.Translator`
            (one thread each was fastest for small batches on a 2-core CPU).
        beam_rule: "native" or "exact", see above.
        max_batch_size: CTranslate2 splits a call's sentences into batches of at most this
            many (0: never, so a batch is decoded as given).
    """

    def __init__(self, model_dir: str | os.PathLike, *, device: str = "cpu",
                 inter_threads: int = 1, intra_threads: int = 1,
                 compute_type: str = "default", beam_rule: str = "native",
                 max_batch_size: int = MAX_BATCH_SIZE,
                 no_repeat_ngram_size: int | None = None,
                 repetition_penalty: float | None = None):
        if beam_rule not in BEAM_RULES:
            raise ConfigError(f"beam_rule={beam_rule!r} is not one of {', '.join(BEAM_RULES)}")
        self.beam_rule = beam_rule
        # DecodeConfig checks the guard's settings as every other decode setting
        DecodeConfig(no_repeat_ngram_size=no_repeat_ngram_size or 0,
                     repetition_penalty=(1.0 if repetition_penalty is None
                                         else repetition_penalty))
        self.options = dict(_SEARCH_OPTIONS, max_batch_size=max_batch_size)
        self.model_dir = Path(model_dir)
        settings_path = self.model_dir / SETTINGS_FILE
        if not settings_path.is_file():
            raise FileNotFoundError(f"{self.model_dir} is not an export of export_ctranslate2 "
                                    f"(no {SETTINGS_FILE})")
        # A damaged folder fails in json, sentencepiece or CTranslate2, each with its own error.
        try:
            self.settings = json.loads(settings_path.read_text(encoding="utf-8"))
            vocabulary = self.settings.get(VOCABULARY_CHECKSUMS, {})  # exports before: none
            changed = changed_file(self.model_dir, vocabulary)
            if changed is not None and not (self.model_dir / changed).is_file():
                raise ValueError(f"no {changed}")
            if changed is not None:
                raise ValueError(f"{changed} differs from the SHA-256 recorded in {SETTINGS_FILE} "
                                 "when it was exported (not the vocabulary the model was "
                                 "trained with); export the run again")
            self.processor = sentencepiece.SentencePieceProcessor(
                model_file=str(self.model_dir / self.settings["sentencepiece_model"]))
            # A vocabulary built with data.placeholders: as `Translator.placeholders`.
            self.placeholders = placeholders.in_vocabulary(self.processor.piece_to_id,
                                                           self.processor.unk_id())
            self.case_folding = bool(self.settings.get("case_folding", False))
            # the reserved ids (PAD 0, START 1, END 2 in every model `tokenizers` trains)
            self.pad_id = self.processor.pad_id()
            self.start_id = self.processor.bos_id()
            self.end_id = self.processor.eos_id()
            recorded = self.settings.get(MODEL_CHECKSUM)  # exports before it have none
            if recorded is not None and file_sha256(self.model_dir / MODEL_FILE) != recorded:
                raise ValueError(f"{MODEL_FILE} differs from the SHA-256 recorded in "
                                 f"{SETTINGS_FILE} when it was exported; export the run again")
            self.translator = ctranslate2.Translator(
                str(self.model_dir), device=device, compute_type=compute_type,
                inter_threads=inter_threads, intra_threads=intra_threads)
            self.beam_size = int(self.settings["beam_size"])
            self.alpha = float(self.settings["alpha"])
            # older exports: CTranslate2's default patience, the source length of the table
            self.patience = float(self.settings.get("patience", 1.0))
            self.max_extra_length = int(self.settings["max_extra_length"])
            # older exports: DecodeConfig's defaults (the full distribution at temperature 1)
            self.sampling_topk = int(self.settings.get("sampling_topk", 0))
            self.sampling_topp = float(self.settings.get("sampling_topp", 1.0))
            self.sampling_temperature = float(self.settings.get("sampling_temperature", 1.0))
            self.max_positions = int(self.settings["max_positions"])
            # the guard against loops, CTranslate2's options of these names (older exports:
            # off); every search takes them, scoring and alignment do not
            self.guard = {
                "no_repeat_ngram_size": int(self.settings.get("no_repeat_ngram_size", 0)
                                            if no_repeat_ngram_size is None
                                            else no_repeat_ngram_size),
                "repetition_penalty": float(self.settings.get("repetition_penalty", 1.0)
                                            if repetition_penalty is None
                                            else repetition_penalty)}
            self.search_options = {**self.options, **self.guard}
            source_limit = self.settings.get("max_source_length")  # older exports: none
            self.max_source_length = kept_source_tokens(
                None if source_limit is None else int(source_limit), self.max_positions)
        except (ValueError, KeyError, TypeError, AttributeError, RuntimeError, OSError) as error:
            detail = f"no {error} in {SETTINGS_FILE}" if isinstance(error, KeyError) else error
            raise ConfigError(f"{self.model_dir}: damaged CTranslate2 export "
                              f"({first_line(detail)})") from error

    def translate_greedy(self, batch) -> dict:
        """Greedy decoding: `{"translation": bytes [batch], "score": float32 [batch]}` with
        log P(translation | source) as score (END included)."""
        best = self.greedy_ids(batch)
        return {"translation": self._texts(best, self._spans(batch)), "score": _scores(best)}

    def translate_beam(self, batch) -> dict:
        """Beam search: `{"translation": bytes [batch], "score": float32 [batch]}` with the
        length-normalized log P / lp as score."""
        best = [hypotheses[0] for hypotheses in self.beam_ids(batch)]
        return {"translation": self._texts(best, self._spans(batch)), "score": _scores(best)}

    def translate_sampling(self, batch, seed: int = 0, *, top_k: int | None = None,
                           top_p: float | None = None,
                           temperature: float | None = None) -> dict:
        """Random sampling with CTranslate2's `sampling_topk`, `sampling_topp` and
        `sampling_temperature` (default: the export's decode settings):
        `{"translation": bytes [batch], "score": float32 [batch]}`, score log P under the model.

        Unlike the SavedModel's `translate_sampling`, which takes a seed per sentence and is
        reproducible, this seeds CTranslate2's generator with `seed` for the call, and
        CTranslate2's draws are not reproducible even so (OpenNMT/CTranslate2#1757, open for
        4.x): the same call may sample other tokens. With `top_k` 1 it is greedy search, as
        there. CTranslate2 scores a draw under the tempered distribution; the score here is
        log P under the model's, from the logits CTranslate2 returns with the draws.
        """
        best = self.sample_ids(batch, seed, top_k=top_k, top_p=top_p, temperature=temperature)
        return {"translation": self._texts(best, self._spans(batch)), "score": _scores(best)}

    def sample_ids(self, batch, seed: int = 0, *, top_k: int | None = None,
                   top_p: float | None = None,
                   temperature: float | None = None) -> list[tuple[list[int], float]]:
        """Per sentence (output ids, END included where produced; log P): the draws of
        `translate_sampling`."""
        top_k = self.sampling_topk if top_k is None else top_k
        options = dict(sampling_topk=top_k,
                       sampling_topp=self.sampling_topp if top_p is None else top_p,
                       sampling_temperature=(self.sampling_temperature if temperature is None
                                             else temperature))
        if not (isinstance(top_k, int) and top_k >= 0):
            raise ConfigError(f"top_k={top_k!r} must be an integer >= 0 (0: every token)")
        if not 0 < options["sampling_topp"] <= 1:
            raise ConfigError(f"top_p={options['sampling_topp']!r} must be in (0, 1]")
        temperature = options["sampling_temperature"]
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ConfigError(f"temperature={temperature!r} must be a finite number > 0")
        ctranslate2.set_random_seed(int(seed))
        drawn = self._translate(batch, lambda sources, cap: self._sample(sources, cap, **options),
                                not_decoded=([], np.zeros(0)))
        # Each output's log P up to its own cap (a batch is decoded to its longest cap).
        return [(ids, float(np.sum(log_probs[:len(ids)]))) for ids, log_probs in drawn]

    def translate_prefix(self, batch, prefixes, *, greedy: bool = False) -> dict:
        """`translate_beam` (or greedy search) whose outputs start with `prefixes` (one per
        sentence, normalized and tokenized as translations are; "" forces nothing), by
        CTranslate2's `target_prefix`: `{"translation": bytes [batch], "score": float32
        [batch]}`. A source without words gives "" as in `translate_beam`."""
        sources, prefixes = _strings(batch), _strings(prefixes)
        if len(sources) != len(prefixes):
            raise ConfigError(f"{len(sources)} sources for {len(prefixes)} prefixes")
        pieces = [self._source_pieces(self._masked(text)) for text in sources]
        forced = [self.processor.encode(normalize(text).decode("utf-8"), out_type=str)[
            :self.max_positions - 1] for text in prefixes]
        rows = [index for index, source in enumerate(pieces) if source is not None]
        best = [([], 0.0)] * len(sources)
        if rows:
            caps = [self._cap(pieces[i], len(forced[i])) for i in rows]
            results = self.translator.translate_batch(
                [pieces[i] for i in rows], target_prefix=[forced[i] or None for i in rows],
                beam_size=1 if greedy else self.beam_size, max_decoding_length=max(caps),
                **self.search_options)
            for index, cap, result in zip(rows, caps, results):
                best[index] = _cut(self._hypotheses(result)[0], cap)
        return {"translation": self._texts(best, self._spans(sources)), "score": _scores(best)}

    def score(self, sources, targets) -> dict:
        """log P(target | source) of each pair by CTranslate2's `score_batch`, as
        `Translator.score` defines it: `{"score": float32 [batch], "normalized_score": float32
        [batch] (log P / lp, the export's alpha), "tokens": int32 [batch] (END included)}`; the
        target normalized and tokenized as translations are, truncated to the model's positions
        with END kept."""
        source_pieces, target_pieces = self._pair_pieces(sources, targets)
        results = self.translator.score_batch(
            source_pieces, target_pieces, max_input_length=0,
            max_batch_size=self.options["max_batch_size"]) if source_pieces else []
        scores = np.array([sum(result.log_probs) for result in results], np.float32)
        tokens = np.array([len(pieces) + 1 for pieces in target_pieces], np.int32)
        count = len(source_pieces)
        return {"score": scores.reshape(count),
                "normalized_score": (scores / length_penalty(tokens, self.alpha)).astype(
                    np.float32).reshape(count),
                "tokens": tokens.reshape(count)}

    def align(self, sources, targets) -> dict:
        """Word alignments of given translations, as `Translator.align` defines them
        (`word_alignment`), from CTranslate2's `return_attention` (the export's
        `alignment_layer`, averaged over the heads) with each target forced as the prefix:
        `{"alignment": bytes [batch]}`, Pharaoh pairs."""
        matrices = self._word_attention(sources, targets)
        alignments = np.empty(len(matrices), dtype=object)
        alignments[:] = [hard_alignment(matrix).encode("utf-8") for matrix in matrices]
        return {"alignment": alignments}

    def word_attention(self, sources, targets) -> np.ndarray:
        """What `align` chooses from, as `Translator.word_attention`: float32 `[batch, target
        words, source words]` (0 past a row's words)."""
        matrices = self._word_attention(sources, targets)
        height = max((m.shape[0] for m in matrices), default=0)
        width = max((m.shape[1] for m in matrices), default=0)
        # as the graph's: at least one column, but none for no rows
        padded = np.zeros((len(matrices), height, max(width, min(len(matrices), 1))), np.float32)
        for row, matrix in enumerate(matrices):
            padded[row, :matrix.shape[0], :matrix.shape[1]] = matrix
        return padded

    def _word_attention(self, sources, targets) -> list[np.ndarray]:
        """Per pair, `word_alignment.word_attention` of CTranslate2's attention."""
        source_pieces, target_pieces = self._pair_pieces(sources, targets)
        results = self.translator.translate_batch(
            source_pieces, target_prefix=[pieces or None for pieces in target_pieces],
            beam_size=1, max_decoding_length=max(map(len, target_pieces), default=0) + 1,
            return_attention=True, **self.options) if source_pieces else []
        matrices = []
        for source, target, result in zip(source_pieces, target_pieces, results):
            # rows: the target's pieces, then END; columns: the source's pieces (CTranslate2
            # leaves out the START and END it adds)
            attention = np.asarray(result.attention[0], np.float64)[:len(target) + 1]
            matrices.append(word_attention(attention, word_indices(source),
                                           word_indices([*target, None])))
        return matrices

    def translate_nbest(self, batch) -> dict:
        """The `beam_size` best hypotheses, best first: `{"translations": bytes [batch, beam],
        "scores": float32 [batch, beam]}`; an empty slot has "" and `search_rules.NEG_INF` (an
        empty source: "" with score 0, then empty slots)."""
        nbest = self.beam_ids(batch)
        flat = [hypothesis for hypotheses in nbest for hypothesis in hypotheses]
        shape = (len(nbest), self.beam_size)
        spans = self._spans(batch)
        spans = spans and [row for row in spans for _ in range(self.beam_size)]
        return {"translations": self._texts(flat, spans).reshape(shape),
                "scores": _scores(flat).reshape(shape)}

    def greedy_ids(self, batch) -> list[tuple[list[int], float]]:
        """Per sentence (output ids, END included where produced; log P)."""
        return self._translate(batch, self._greedy, not_decoded=([], 0.0))

    def beam_ids(self, batch) -> list[list[tuple[list[int], float]]]:
        """Per sentence the `beam_size` best (output ids; log P / lp), padded with
        ([], NEG_INF)."""
        not_decoded = [([], 0.0)] + [([], NEG_INF)] * (self.beam_size - 1)
        return self._translate(batch, self._beam, not_decoded=not_decoded)

    def _translate(self, batch, decode, not_decoded) -> list:
        """Runs `decode(sources, cap)` on each group of sources with the same output cap (with
        the "native" rule: on all of them at once, with the longest cap, each output then cut
        at its own cap); `not_decoded` stands for empty sources."""
        sources = [self._source_pieces(self._masked(text)) for text in _strings(batch)]
        caps = {index: self._cap(pieces) for index, pieces in enumerate(sources)
                if pieces is not None}
        groups = defaultdict(list)
        for index, cap in caps.items():
            groups[max(caps.values()) if self.beam_rule == "native" else cap].append(index)
        results = [not_decoded] * len(sources)
        for cap, indices in groups.items():
            for index, result in zip(indices, decode([sources[i] for i in indices], cap)):
                results[index] = _cut(result, caps[index])
        return results

    def _pair_pieces(self, sources, targets) -> tuple[list, list]:
        """Line-aligned sources and given translations -> (source pieces, target pieces), as
        `Translator.score` and `align` read them: each normalized and tokenized, a source
        truncated as translation truncates it ([] without words), a target to the model's
        positions with END kept."""
        sources, targets = _strings(sources), _strings(targets)
        if len(sources) != len(targets):
            raise ConfigError(f"{len(sources)} sources for {len(targets)} targets")
        return ([self._source_pieces(normalize(text)) or [] for text in sources],
                [self.processor.encode(normalize(text).decode("utf-8"), out_type=str)[
                    :self.max_positions - 1] for text in targets])

    def _prepared(self, source) -> tuple[bytes, list[str] | None, int | None]:
        """A source as the model reads it, as `Translator.translate` prepares it: normalized,
        its spans masked if the vocabulary has placeholders (`placeholders.mask`), its case
        folded with case folding (`casing.fold_case`); and what puts the output back: the
        spans (None without placeholders) and the case form (None without case folding)."""
        text = normalize(source).decode("utf-8")
        spans = form = None
        if self.placeholders:
            text, spans = placeholders.mask(text)
        if self.case_folding:
            text, form = casing.fold_case(text)
        return text.encode("utf-8"), spans, form

    def _masked(self, source) -> bytes:
        """`_prepared`'s text of `source`."""
        return self._prepared(source)[0]

    def _spans(self, batch) -> list[tuple] | None:
        """Per source what puts its outputs back (`_prepared`), None when nothing does."""
        if not (self.placeholders or self.case_folding):
            return None
        return [self._prepared(text)[1:] for text in _strings(batch)]

    def _source_pieces(self, source: bytes) -> list[str] | None:
        """The pieces of a normalized source, truncated so that with START and END they fit
        the position table (as `Translator` truncates); None for an empty source."""
        if not source:
            return None
        pieces = self.processor.encode(source.decode("utf-8"), out_type=str)
        return pieces[:self.max_source_length - 2]

    def _cap(self, pieces: list[str], prefix_pieces: int = 0) -> int:
        """The most tokens generated for a source, END included (`search_rules.output_cap`;
        the source's tokens count START and END)."""
        return output_cap(len(pieces) + 2, self.max_extra_length, self.max_positions,
                          prefix_pieces)

    def _greedy(self, sources: list[list[str]], cap: int) -> list[tuple[list[int], float]]:
        results = self.translator.translate_batch(
            sources, beam_size=1, max_decoding_length=cap, **self.search_options)
        return [self._hypotheses(result)[0] for result in results]

    def _sample(self, sources: list[list[str]], cap: int,
                **sampling) -> list[tuple[list[int], np.ndarray]]:
        """One draw per source (CTranslate2's sampling_* options): (ids, each token's log P
        under the model, from the logits CTranslate2 returns; its own scores are under the
        sampling distribution)."""
        results = self.translator.translate_batch(
            sources, beam_size=1, max_decoding_length=cap, **self.search_options, **sampling,
            return_logits_vocab=True)
        draws = []
        for result in results:
            ids = self._hypotheses(result)[0][0]
            logits = np.stack([np.asarray(step, np.float64) for step in result.logits[0]])
            draws.append((ids, logits[np.arange(len(ids)), ids]
                          - np.logaddexp.reduce(logits, axis=-1)))
        return draws

    def _beam(self, sources: list[list[str]], cap: int, first_limit: int | None = None) -> list:
        """Beam search with our ranking and stopping rule; per source the `beam_size` best
        (ids, log P / lp).

        Run to the cap, CTranslate2's search finishes the hypotheses ours does (both keep the
        best `beam_size` of `2 * beam_size` candidates that do not end, and finish those that
        end among the best `beam_size`), so the best by log P / lp among all of them are ours.
        Ours stops earlier, once no longer output can rank among the best, and so does this:
        it searches up to `first_limit` tokens (default twice the longest source), checks that
        rule (`_settled`), and searches again with twice the limit the sources it cannot settle.
        """
        if self.beam_rule == "native":
            return self._native_beam(sources, cap)
        if first_limit is None:
            first_limit = 2 * (max(map(len, sources)) + 2)
        limit = cap if self.beam_size == 1 else min(cap, first_limit)
        ranked = [None] * len(sources)
        pending = list(range(len(sources)))
        while pending:
            found = self._search([sources[i] for i in pending], limit)
            for index, hypotheses in zip(pending, found):
                ranked[index] = self._settled(hypotheses, limit, cap)
            pending = [i for i in pending if ranked[i] is None]
            limit = min(2 * limit, cap)
        return [hypotheses + [([], NEG_INF)] * (self.beam_size - len(hypotheses))
                for hypotheses in ranked]

    def _native_beam(self, sources: list[list[str]], cap: int) -> list:
        """CTranslate2's own beam search, stopping as the export's "beam_full" rule does: a
        sentence is done once patience x beam_size hypotheses have finished. They are
        re-ranked by log P / lp, the `beam_size` best kept.

        CTranslate2 applies `patience` only with a nonzero length penalty (at 0 it stops a
        sentence as soon as its best hypothesis by log P has ended and `num_hypotheses` have
        finished), and it returns at most patience x beam_size of the hypotheses it finished,
        the best by log P / |Y| ** penalty. The call asks for `_NATIVE_LENGTH_PENALTY`, which
        changes no step of the search and keeps log P's order to within a fraction of a
        percent, and undoes it.
        """
        # CTranslate2 stops at round(patience x beam) finished hypotheses, the export at the
        # ceiling: the patience passed is the export's count over the beam, which rounds to it.
        finished = finished_to_stop(self.beam_size, self.patience)
        penalty = _NATIVE_LENGTH_PENALTY
        results = self.translator.translate_batch(
            sources, beam_size=self.beam_size, num_hypotheses=finished,
            patience=finished / self.beam_size,
            max_decoding_length=cap, **{**self.search_options, "length_penalty": penalty})
        ranked = [self._rank([(ids, score * len(ids) ** penalty)
                              for ids, score in self._hypotheses(result)])
                  for result in results]
        return [hypotheses + [([], NEG_INF)] * (self.beam_size - len(hypotheses))
                for hypotheses in ranked]

    def _search(self, sources: list[list[str]], limit: int) -> list:
        """Every hypothesis CTranslate2's beam search finishes with outputs cut at `limit`
        tokens: per source [(ids, log P)].

        With length penalty 0 CTranslate2 stops a sentence once its best by log P has ended
        and `num_hypotheses` have finished, and returns the best `num_hypotheses` by log P;
        asking for all it can finish (`beam_size` per step, which `patience=limit` permits)
        turns both off.
        """
        every = self.beam_size * limit if self.beam_size > 1 else 1
        results = self.translator.translate_batch(
            sources, beam_size=self.beam_size, num_hypotheses=every, patience=limit,
            max_decoding_length=limit, **self.search_options)
        return [self._hypotheses(result) for result in results]

    def _settled(self, hypotheses: list, limit: int, cap: int) -> list | None:
        """The `beam_size` best of `hypotheses` (from `_search` up to `limit`) by log P / lp,
        or None if a longer output up to `cap` could still rank among them.

        Below the cap, the hypotheses without END are beams cut at `limit` that our search
        continues. Any later hypothesis has a log P below the best of them (or, when all
        hypotheses at `limit` ended, below the worst of those) and lp at most lp(cap): the
        early stopping bound of `decoding.beam_search` (`search_rules.cannot_improve`).
        """
        if limit >= cap:
            return self._rank(hypotheses)
        best = self._rank([h for h in hypotheses if h[0][-1:] == [self.end_id]])
        if len(best) < self.beam_size:
            return None
        cut = [log_prob for ids, log_prob in hypotheses if ids[-1:] != [self.end_id]]
        at_limit = [log_prob for ids, log_prob in hypotheses if len(ids) == limit]
        bound = max(cut) if cut else min(at_limit, default=NEG_INF)
        if cannot_improve(bound, best[-1][1], length_penalty(cap, self.alpha)):
            return best
        return None

    def _rank(self, hypotheses: list) -> list:
        """(ids, log P) pairs -> the `beam_size` best (ids, log P / lp), best first."""
        scored = [(ids, log_prob / length_penalty(len(ids), self.alpha))
                  for ids, log_prob in hypotheses]
        return sorted(scored, key=lambda hypothesis: -hypothesis[1])[:self.beam_size]

    def _hypotheses(self, result) -> list[tuple[list[int], float]]:
        """A CTranslate2 TranslationResult -> [(ids, log P)]."""
        return [([self.processor.piece_to_id(piece) for piece in tokens], score)
                for tokens, score in zip(result.hypotheses, result.scores)]

    def _texts(self, hypotheses: list, restore: list[tuple] | None = None) -> np.ndarray:
        """(ids, score) pairs -> object array of UTF-8 bytes, as `Tokenizer.detokenize`
        makes them (PAD and START dropped, cut at the first END), each put back by its
        source's (spans, case form) in `restore` (`_spans`) if given: recased
        (`casing.restore_case`), then its spans put back (`placeholders.unmask`)."""
        texts = np.empty(len(hypotheses), dtype=object)
        for index, (ids, _) in enumerate(hypotheses):
            if self.end_id in ids:
                ids = ids[:ids.index(self.end_id)]
            text = self.processor.decode([i for i in ids if i not in (self.pad_id, self.start_id)])
            if restore is not None:
                spans, form = restore[index]
                text = text if form is None else casing.restore_case(text, form)
                text = text if spans is None else placeholders.unmask(text, spans)
            texts[index] = text.encode("utf-8")
        return texts


# Options of every CTranslate2 search. length_penalty 0: raw log P (CTranslate2 divides by
# len ** penalty); min_decoding_length 0: END may come first, as in ours; max_input_length 0:
# sources are truncated here, keeping their END; return_end_token: |Y| counts END.
_SEARCH_OPTIONS = dict(length_penalty=0.0, min_decoding_length=0,
                       max_input_length=0, return_scores=True, return_end_token=True)
# The native beam rule's length penalty: not 0, so that CTranslate2 honors `patience`.
_NATIVE_LENGTH_PENALTY = 1e-3


def _cut(result, cap: int):
    """A greedy (ids, score) or a beam's [(ids, score)] with every output cut at `cap` tokens."""
    if isinstance(result, tuple):
        return result[0][:cap], result[1]
    return [(ids[:cap], score) for ids, score in result]


def _scores(hypotheses: list) -> np.ndarray:
    return np.array([score for _, score in hypotheses], np.float32).reshape(len(hypotheses))


def _strings(batch) -> list[str | bytes]:
    """A list of str/bytes, a 1-D tf.string tensor or a numpy array -> list of str/bytes
    (`normalize` takes either; a tensor is read through its `numpy()`, without importing
    TensorFlow here)."""
    if hasattr(batch, "numpy"):
        batch = batch.numpy()
    return [s if isinstance(s, str) else bytes(s) for s in list(batch)]
