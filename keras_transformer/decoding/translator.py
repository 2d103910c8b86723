"""Translator: a `tf.Module` that turns a batch of strings into a batch of translations.

Everything runs in the TensorFlow graph (tokenize, encode, cached greedy or beam search,
detokenize), so the module exports as a SavedModel that TF Serving runs with no Python.

    translator = Translator(model, source_tokenizer, target_tokenizer, DecodeConfig(beam_size=4))
    translator.translate_greedy(tf.constant(["Ein Hund."]))  # {"translation", "score"}
    translator = translator_from_run("runs/NAME")  # a trained run's model and tokenizers

`keras_transformer.export.savedmodel` writes a Translator as a SavedModel; `texts` runs lists
of sentences through its signatures from Python.

Exported signatures (input `source`: string `[batch]`, any batch size including 0):

    serving_default     beam search (the export's beam size and alpha)
                        -> translation string [batch], score float32 [batch]
    translate_greedy    greedy search -> translation string [batch], score float32 [batch]
    translate_beam      the same as serving_default, under an explicit name
    translate_sampling  random sampling (the export's decode.sampling_topk, sampling_topp and
                        sampling_temperature), inputs source and seed int64 [batch] (each
                        sentence's own seed) -> translation string [batch], score float32 [batch]
    translate_nbest     beam search -> translations string [batch, beam], scores float32 [batch, beam]
    translate_prefix    beam search whose output starts with the given prefix (interactive
                        completion), inputs source and prefix string [batch]
                        -> translation string [batch], score float32 [batch]
    score               the log-probability of given translations, inputs source and target string
                        [batch] -> score float32 [batch], normalized_score float32 [batch],
                        tokens int32 [batch]
    align               word alignments of given translations, inputs source and target string
                        [batch] -> alignment string [batch] (Pharaoh "i-j" pairs, one per target
                        word)

There is one `translate_<name>` per strategy registered in `decoding.STRATEGIES`, with the
inputs `signature_inputs` gives. `score` gives log P(target | source) of each pair, the target
tokenized as translations are (END included, `tokens` counting it) and truncated to the model's
positions, and log P / lp as beam search ranks it (the config's alpha): a search's score of its
own output is the score of that output's ids (`Translator.score_ids`). `align` reads decoder
layer `decode.alignment_layer`'s cross-attention, averaged over the heads, while the model
reads each target; each target word is aligned with the source word it attends to most
(`word_alignment`: approximate, as attention is). Scores: greedy search
and sampling give log P(translation | source); beam search gives
log P / lp with the GNMT length penalty lp = ((5 + length) / 6) ** alpha (see `decoding`).

Inputs are normalized as training text was (`tokenizers.normalize_text`: invisible characters
removed, NFC, whitespace runs made one space). A source with no words (nothing left after
that: "", whitespace, a byte-order mark, ...) is not decoded: its translation is "" with score 0
(in translate_nbest: "" with score 0 first, then "" with `decoding.NEG_INF`, the n-best's mark
of a slot without a hypothesis, since the empty translation is the only one).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from keras_transformer.config import ConfigError, DecodeConfig
from keras_transformer.data import tokenizers
from keras_transformer.data.tokenizers import (END_ID, PAD_ID, START_ID, Tokenizer, fold_case,
                                               mask_spans, normalize_text, restore_case,
                                               unmask_spans)
from keras_transformer.decoding import strategies as decoding
from keras_transformer.decoding.search_rules import STOPPING_RULES, kept_source_tokens, output_cap
from keras_transformer.model import Transformer
from keras_transformer.runs.folder import Run

STRINGS_SPEC = tokenizers.STRINGS_SPEC
ALPHA_SPEC = tf.TensorSpec([], tf.float32, name="alpha")
SIGNATURE_INPUT = "source"  # the input key of every exported signature
# `Translator.translate(search=...)`: every registered strategy, and the beam's n-best.
SEARCHES = (*decoding.STRATEGIES, "nbest")
SIGNATURES = ("serving_default", *(f"translate_{name}" for name in SEARCHES),
              "translate_prefix", "score", "align")
TranslateFn = Callable[[tf.Tensor], dict]  # string [batch] -> {"translation": string [batch], ...}


def signature_inputs(signature: str) -> dict:
    """The inputs of an exported signature: `{name: tf.TensorSpec}`, `source` first; every
    input has one row per sentence."""
    source = {SIGNATURE_INPUT: tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)}
    if signature in ("score", "align"):
        return {**source, "target": tf.TensorSpec([None], tf.string, name="target")}
    if signature == "translate_prefix":
        return {**source, "prefix": tf.TensorSpec([None], tf.string, name="prefix")}
    name = signature.removeprefix("translate_")
    strategy = decoding.STRATEGIES.get("beam" if name in ("nbest", "serving_default") else name)
    return {**source, **strategy.signature_inputs}


def signature_arguments(signature: str, sources: Sequence[str]) -> dict:
    """Keyword arguments that call `signature` on `sources`: `source`, and for every other
    input (`signature_inputs`) the sources again if it takes strings (`score`'s targets), else
    the row numbers 0, 1, ... (a sampling signature's seeds)."""
    arguments = {SIGNATURE_INPUT: tf.constant(list(sources), tf.string)}
    for name, spec in list(signature_inputs(signature).items())[1:]:
        arguments[name] = (arguments[SIGNATURE_INPUT] if spec.dtype == tf.string
                           else tf.range(len(sources), dtype=spec.dtype))
    return arguments


class Translator(tf.Module):
    """Strings `[batch]` in, `{"translation": string [batch], "score": float32 [batch]}` out.

    Sources longer than `max_source_length` tokens (START and END included) are truncated to
    their first `max_source_length - 1` tokens plus END (documented, never an error). Outputs
    are at most source length + `max_extra_length` tokens, capped by the model's
    `max_positions` (section 6.1), and the self-attention caches grow with the output.

    Args:
        model: a trained `Transformer`.
        source_tokenizer, target_tokenizer: the run's tokenizers (the same object for a joint
            vocabulary).
        decode_config: beam size and length penalty of `__call__` (serving_default),
            `translate_beam` and `translate_nbest`.
        max_source_length: the longest source, in tokens with START/END, before truncation;
            default and upper bound: the model's `max_positions` (`translator_from_run` passes
            the run's `data.max_pair_length`, the longest source training saw).
        frozen_weights: prepare the weights in the layout the decoding reads
            (`Transformer.inference_weights`: fused, pre-scaled q|k|v kernels, pre-norm
            LayerNorms folded into the projections they feed, the transposed output embedding,
            ...) once, here, as variables of their own, instead of at every call; the module then
            reads (and a SavedModel stores) those instead of the model's variables, and later
            changes to the model's weights do not reach it. For exports and fixed runs;
            training's validation translates with live weights.
        case_folding: translate a source in capitals or title case lowercased, and put its
            translation back into that case (`data.case_folding`, `tokenizers.fold_case`).
    """

    def __init__(self, model: Transformer, source_tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer, decode_config: DecodeConfig = DecodeConfig(),
                 max_source_length: int | None = None, frozen_weights: bool = False,
                 case_folding: bool = False, name=None):
        super().__init__(name=name)
        if decode_config.beam_size > target_tokenizer.vocab_size:
            raise ConfigError(f"decode.beam_size={decode_config.beam_size} is larger than the "
                              f"target vocabulary ({target_tokenizer.vocab_size} tokens)")
        # Not tracked: the SavedModel would store every weight twice, once through the Keras
        # variable wrappers and once as the tf.Variables below.
        object.__setattr__(self, "model", model)
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        # A vocabulary built with data.placeholders: numbers, addresses and emoji of the source
        # travel as placeholders (`tokenizers.mask_spans`) and are put back into the output.
        self.placeholders = source_tokenizer.placeholders and target_tokenizer.placeholders
        self.case_folding = case_folding
        self.decode_config = decode_config
        layers = model.config.decoder_layers
        if not -layers <= decode_config.alignment_layer < layers:
            raise ConfigError(f"decode.alignment_layer={decode_config.alignment_layer}: the "
                              f"decoder has {layers} layers (0 to {layers - 1}, or -1 to "
                              f"-{layers} from the last)")
        self.max_source_length = kept_source_tokens(max_source_length,
                                                    model.config.max_positions)
        # The session-based loader (saved_model_cli, TF Serving) finds variables only if the
        # module tracks the tf.Variables themselves, not Keras 3's wrappers around them. A
        # compiled model's optimizer is thus never tracked either.
        self.frozen_weights = frozen_weights
        if frozen_weights:
            weights = model.inference_weights()
            self.inference_variables = _shared_variables(tf.nest.flatten(weights))
            object.__setattr__(self, "_weight_structure",
                               tf.nest.map_structure(lambda _: None, weights))
        else:
            self.model_variables = [w.value for w in model.weights]
        # The searches are explicit tf.while_loops: autograph would only convert (slowly, the
        # first time in a process) the model code they call. Kept out of sight of
        # tf.saved_model.save (a plain dict, not an attribute of type tf.function): it would
        # trace each search again outside the signatures' graphs and store the copies.
        traced = {name: tf.function(functools.partial(self._search_ids, strategy=name),
                                    autograph=False) for name in decoding.STRATEGIES}
        traced["translate_beam"] = tf.function(
            lambda source, alpha: self.translate(source, "beam", alpha=alpha),
            input_signature=[STRINGS_SPEC, ALPHA_SPEC], autograph=False)
        traced["score"] = tf.function(self._score_ids, autograph=False)
        traced["attention"] = tf.function(self._attention_ids, autograph=False)
        object.__setattr__(self, "_traced", traced)
        # One signature function per search (`translate_greedy`, `translate_beam`, ...):
        # attributes of the module, so that a SavedModel keeps them as functions too.
        for search in SEARCHES:
            setattr(self, f"translate_{search}", self._signature_function(search))
        inputs = signature_inputs("score")
        self.score = tf.function(self._score, input_signature=list(inputs.values()),
                                 autograph=False)
        self.align = tf.function(self._align, input_signature=list(inputs.values()),
                                 autograph=False)
        inputs = signature_inputs("translate_prefix")
        self.translate_prefix = tf.function(
            lambda source, prefix: self.translate(source, "beam", prefix=prefix),
            input_signature=list(inputs.values()), autograph=False)

    @tf.function(input_signature=[STRINGS_SPEC], autograph=False)
    def __call__(self, source):
        """Beam search with the configured beam size and length penalty."""
        return self.translate_beam(source)

    def _signature_function(self, search: str):
        """The tf.function of `translate_<search>`: `translate(source, search, **inputs)` over
        the signature's inputs (`signature_inputs`)."""
        inputs = signature_inputs(f"translate_{search}")

        def translate(source, *values):  # tf.function passes the inputs by position
            return self.translate(source, search, **dict(zip(list(inputs)[1:], values)))

        # Named parameters, one per input: tf.function names the signature's inputs after them.
        translate.__signature__ = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in inputs])
        translate.__doc__ = f"`translate(source, {search!r})`: see the module docstring."
        return tf.function(translate, input_signature=list(inputs.values()), autograph=False)

    def beam_translator(self, alpha: float) -> TranslateFn:
        """`translate_beam` with length penalty `alpha` instead of the config's. Every alpha runs
        one traced function (the config's alpha is a constant of `translate_beam`'s graph), so a
        grid over alphas (`tune_search`) traces the search once; not exported."""
        if not alpha >= 0:
            raise ConfigError(f"alpha={alpha}: must be >= 0")
        alpha = tf.constant(alpha, tf.float32)
        return lambda source: self._traced["translate_beam"](source, alpha)

    def signatures(self) -> dict:
        """The tf.functions to export, keyed by signature name (see the module docstring).

        Functions, not concrete functions: `tf.saved_model.save` traces them itself, in its save
        context, and would trace them again if they had been traced outside it."""
        return {"serving_default": self.__call__,
                **{name: getattr(self, name) for name in SIGNATURES[1:]}}

    def translate(self, source, search: str = "beam", **options) -> dict:
        """The body of the signatures: string `[batch]` -> the outputs of `search`, a
        registered strategy (for one with n-best results, the best) or "nbest" (the beam's
        n-best, see the signatures), in input order. `options` go to the strategy's
        `from_config` (`alpha` for beam search, `seed` int64 `[batch]` and `top_k`,
        `temperature`, `top_p` for sampling), and `prefix`, a string per source that each
        translation must start with (any search; see `_decode`); the strategy's
        `signature_inputs` and `prefix` have a row per source.

        Sources are normalized (`normalize_text`), with a vocabulary that has placeholders
        their spans masked (`mask_spans`; put back into every output), and with
        `case_folding` those in capitals or title case lowercased (`fold_case`; every output
        put back into their case); the ones left without
        words get "" with
        score 0 (nbest: then empty slots) and are not decoded. The decoded sentences see
        exactly the batch they would see without the others (so their outputs are bitwise the
        same), and a batch without words runs no search at all.
        """
        if search not in SEARCHES:
            raise ValueError(f"search={search!r} is not one of {', '.join(SEARCHES)}")
        strategy = "beam" if search == "nbest" else search
        source = _batch_input(source)
        for name in (*decoding.STRATEGIES[strategy].signature_inputs, "prefix"):
            if options.get(name) is not None:
                options[name] = _batch_input(options[name])
        beam_size = self.decode_config.beam_size
        if search == "nbest":
            no_words = {"translations": [""] * beam_size,
                        "scores": [0.0] + [decoding.NEG_INF] * (beam_size - 1)}
        else:
            no_words = {"translation": "", "score": 0.0}
        no_words = {key: tf.constant(value) for key, value in no_words.items()}
        source = normalize_text(source)
        spans = forms = None
        if self.placeholders:
            source, spans = mask_spans(source)
        if self.case_folding:
            source, forms = fold_case(source)

        def detokenize(ids, rows):
            """ids `[n, len]` of the sources `rows` `[n]` -> string `[n]`, in the sources' case
            and with their spans put back."""
            texts = self.target_tokenizer.detokenize(ids)
            if forms is not None:
                texts = restore_case(texts, tf.gather(forms, rows))
            return texts if spans is None else unmask_spans(texts, tf.gather(spans, rows))

        has_words = tf.strings.length(source) > 0  # [batch]
        rows = tf.range(tf.size(source))
        decoded, skipped = tf.boolean_mask(rows, has_words), tf.boolean_mask(rows, ~has_words)
        for name in decoding.STRATEGIES[strategy].signature_inputs:  # one row per source
            options[name] = tf.gather(options[name], decoded)
        if options.get("prefix") is not None:  # one row per source too
            options["prefix"] = self.prefix_ids(tf.gather(options["prefix"], decoded))

        def translate_rows():
            ids, scores = self.search(self._tokenize(tf.gather(source, decoded)), strategy,
                                      **options)
            if search != "nbest":
                if decoding.STRATEGIES[strategy].nbest:  # the best is the first: one trace
                    ids, scores = ids[:, 0], scores[:, 0]
                return {"translation": detokenize(ids, decoded), "score": scores}
            flat = tf.reshape(ids, [-1, tf.shape(ids)[2]])  # [n * beam, len]
            texts = detokenize(flat, tf.repeat(decoded, beam_size))
            return {"translations": tf.reshape(texts, [-1, beam_size]), "scores": scores}

        def no_rows():
            return {key: tf.repeat(row[None], 0, axis=0) for key, row in no_words.items()}

        outputs = tf.cond(tf.size(decoded) > 0, translate_rows, no_rows)
        return {key: tf.dynamic_stitch(
                    [decoded, skipped],
                    [outputs[key], tf.repeat(row[None], tf.size(skipped), axis=0)])
                for key, row in no_words.items()}

    def _score(self, source, target):
        """The body of the `score` signature (see the module docstring)."""
        source, target = _batch_input(source), _batch_input(target)
        def score_rows():
            scores, tokens = self.score_ids(self.source_ids(source), self.target_ids(target))
            penalty = decoding.length_penalty(tf.cast(tokens, tf.float32),
                                              tf.constant(self.decode_config.alpha, tf.float32))
            return {"score": scores, "normalized_score": scores / penalty, "tokens": tokens}

        def no_rows():
            return {"score": tf.zeros([0]), "normalized_score": tf.zeros([0]),
                    "tokens": tf.zeros([0], tf.int32)}

        return tf.cond(tf.size(source) > 0, score_rows, no_rows)

    def prefix_ids(self, prefix):
        """Prefix strings `[batch]` -> int32 `[batch, length]`: the normalized text's tokens
        without START and END, then PAD (an empty prefix forces nothing). A prefix that ends
        inside a word is that word's first pieces, which the search continues."""
        tokens = self.target_tokenizer.tokenize(normalize_text(prefix))[:, 1:-1]
        return tokens.to_tensor()[:, :self.model.config.max_positions - 1]

    def target_ids(self, target):
        """Target strings `[batch]` -> int32 `[batch, length]`, as a search outputs them: the
        normalized text's tokens, END, then PAD (START dropped), truncated to the model's
        `max_positions` tokens with END kept last."""
        tokens = self.target_tokenizer.tokenize(normalize_text(target))[:, 1:]  # without START
        return self._truncated(tokens, self.model.config.max_positions)

    def score_ids(self, source_ids, target_ids):
        """log P(target | source) of id batches: source ids as `source_ids` makes them, target
        ids as a search outputs them (`target_ids`) -> (scores float32 `[batch]`, tokens int32
        `[batch]` up to END included)."""
        return self._traced["score"](tf.convert_to_tensor(source_ids, tf.int32),
                                     tf.convert_to_tensor(target_ids, tf.int32))

    def _score_ids(self, source_ids, target_ids):
        """`score_ids`' traced body: `decoding.ForcedDecoding` over `decode_step`."""
        tokens = tf.reduce_sum(tf.cast(tf.not_equal(target_ids, PAD_ID), tf.int32), axis=1)
        _, scores = self._decode(decoding.ForcedDecoding(target_ids), source_ids, tokens,
                                 tf.maximum(tf.shape(target_ids)[1], 1))
        return scores, tokens

    def _align(self, source, target):
        """The body of the `align` signature: `{"alignment": string [batch]}`, Pharaoh pairs
        (see `word_alignments`)."""
        source, target = _batch_input(source), _batch_input(target)
        return {"alignment": self._word_alignments(source, target)["alignment"]}

    def word_attention(self, source, target):
        """What `align` chooses from: float32 `[batch, target words, source words]`, each
        target word's attention over the source words (see `word_alignments`; 0 past a row's
        words), to draw. Not a signature: its width changes with the batch."""
        return self._word_alignments(tf.convert_to_tensor(source, tf.string),
                                     tf.convert_to_tensor(target, tf.string))["attention"]

    def _word_alignments(self, source, target):
        """`word_alignments` of string `source` and `target` `[batch]`."""
        def align_rows():
            source_ids, target_ids = self.source_ids(source), self.target_ids(target)
            return word_alignments(self.attention_ids(source_ids, target_ids),
                                   self.source_tokenizer.word_indices(source_ids),
                                   self.target_tokenizer.word_indices(target_ids))

        def no_rows():
            return {"alignment": tf.zeros([0], tf.string), "attention": tf.zeros([0, 0, 0])}

        return tf.cond(tf.size(source) > 0, align_rows, no_rows)

    def attention_ids(self, source_ids, target_ids):
        """The cross-attention of decoder layer `decode.alignment_layer`, averaged over the
        heads, as the model reads the targets: float32 `[batch, target_len, source_len]` (row t
        is the attention that predicts target token t). Ids as `score_ids` takes them."""
        return self._traced["attention"](tf.convert_to_tensor(source_ids, tf.int32),
                                         tf.convert_to_tensor(target_ids, tf.int32))

    def _attention_ids(self, source_ids, target_ids):
        """`attention_ids`' traced body: the decoding steps up to the alignment layer, fed the
        targets (START, then every target token but the last), one position per step."""
        model, weights = self.model, self._weights()
        layer = self.decode_config.alignment_layer % model.config.decoder_layers
        batch_size, length = tf.shape(target_ids)[0], tf.shape(target_ids)[1]
        inputs = tf.concat([tf.fill([batch_size, 1], START_ID), target_ids[:, :-1]], axis=1)
        memory = model.start_decoding(weights, source_ids)
        cache = model.init_cache(batch_size)[:layer + 1]

        def body(step, cache, rows):
            attention, cache = model.attention_step(weights, inputs[:, step], step, cache,
                                                    memory, layer)
            return step + 1, cache, rows.write(step, attention)

        _, _, rows = tf.while_loop(
            lambda step, *_: step < length, body,
            (tf.constant(0), cache, tf.TensorArray(tf.float32, size=length)),
            shape_invariants=(tf.TensorShape([]), model.cache_shape_invariants(cache),
                              tf.TensorShape(None)))
        return tf.transpose(rows.stack(), [1, 0, 2])

    def source_ids(self, source):
        """What the search reads of `source` string `[batch]`: normalized (`normalize_text`),
        tokenized and truncated (see the class), int32 `[batch, source_len]` START ... END,
        padded with PAD."""
        return self._tokenize(normalize_text(source))

    def search(self, source_ids, search: str = "beam", length_caps=None, **options):
        """The id-level search behind the signatures.

        Args:
            source_ids: int32 `[batch, source_len]`, START ... END padded with PAD (see
                `source_ids`); every row has at least START and END.
            search: a registered strategy's name (`decoding.STRATEGIES`), built from
                `decode_config` (beam: its beam size, stopping rule and patience).
            length_caps: int32 `[batch]`, the most tokens to generate per sentence (default:
                source length + `max_extra_length`, at most the model's `max_positions`).
            options: the strategy's `from_config` arguments, Python numbers or tensors: `alpha`
                (beam; default the config's), `seed` int64 `[batch]` (sampling, required),
                `top_k`, `temperature`, `top_p` (sampling; default the config's), and `prefix`:
                int32 `[batch, length]` ids to force first (`prefix_ids`; default none).

        Returns:
            `(ids, scores)`. Greedy search and sampling: ids int32 `[batch, max_len]` (END
            included where produced, PAD after it) and scores float32 `[batch]` (log P). Beam
            search: ids `[batch, beam, max_len]` and scores `[batch, beam]` (log P / lp), best
            first, the n-best of `decoding.BeamSearch`.
        """
        if search not in decoding.STRATEGIES:
            raise ValueError(f"search={search!r} is not one of {', '.join(decoding.STRATEGIES)}")
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        prefix = options.pop("prefix", None)
        if length_caps is None:
            lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
            prefix_lengths = 0 if prefix is None else tf.reduce_sum(
                tf.cast(tf.not_equal(prefix, PAD_ID), tf.int32), axis=1)
            length_caps = output_cap(lengths, self.decode_config.max_extra_length,
                                     self.model.config.max_positions, prefix_lengths,
                                     minimum=tf.minimum, maximum=tf.maximum)
        length_caps = tf.convert_to_tensor(length_caps, tf.int32)
        # Always a prefix, empty where none is given: a search with and without one is one
        # trace (and one decoding loop in an export).
        if prefix is None:  # of unknown width in a graph, as a given prefix is
            prefix = tf.compat.v1.placeholder_with_default(
                tf.zeros([tf.shape(source_ids)[0], 0], tf.int32), shape=[None, None])
        options["prefix_ids"] = tf.convert_to_tensor(prefix, tf.int32)
        max_decode_length = tf.reduce_max(tf.concat([length_caps, [1]], 0))
        if search == "beam":  # a tensor, so that every alpha runs one trace
            options["alpha"] = tf.convert_to_tensor(
                self.decode_config.alpha if options.get("alpha") is None else options["alpha"],
                tf.float32)
        return self._traced[search](source_ids, length_caps, max_decode_length,
                                    {key: tf.convert_to_tensor(value)
                                     for key, value in options.items()})

    def trace_counts(self) -> dict:
        """How many times each search has been traced: one entry per strategy name and
        "translate_beam" (`beam_translator`'s); an export or a process should trace each
        once."""
        return {name: function.experimental_get_tracing_count()
                for name, function in self._traced.items()}

    @property
    def stopping_rule(self) -> str:
        """How beam search decides a sentence is done (recorded in an export's provenance)."""
        rule = STOPPING_RULES[self.decode_config.stopping]
        if self.decode_config.stopping == "beam_full":
            rule += f"; patience {self.decode_config.patience:g}"
        return rule

    def _weights(self):
        """The decoding weights (`Transformer.inference_weights`), from the frozen variables
        or the live model; inside the traced function that decodes."""
        if self.frozen_weights:
            return tf.nest.pack_sequence_as(
                self._weight_structure,
                [tf.convert_to_tensor(v) for v in self.inference_variables])
        return self.model.inference_weights()

    def _tokenize(self, source):
        """Normalized source strings -> truncated ids int32 [batch, len]."""
        # ragged [batch, (len)], START ... END
        return self._truncated(self.source_tokenizer.tokenize(source), self.max_source_length)

    @staticmethod
    def _truncated(tokens, limit):
        """Ragged ids `[batch, (len)]` ending with END -> int32 `[batch, min(longest, limit)]`
        padded with PAD, a row longer than `limit` cut to its first `limit - 1` and END (as
        every training sentence ends with END)."""
        lengths = tf.cast(tokens.row_lengths(), tf.int32)  # [batch]
        ids = tokens.to_tensor()[:, :limit]
        last_column = tf.range(tf.shape(ids)[1]) == limit - 1
        return tf.where((lengths > limit)[:, None] & last_column[None, :], END_ID, ids)

    def _search_ids(self, source_ids, length_caps, max_decode_length, options, *, strategy):
        """`search`'s traced body: encode, then `decoding.decode` of the strategy named
        `strategy` over `decode_step`, every weight read once per batch (not once per step
        inside the loop)."""
        options = dict(options)
        prefix_ids = options.pop("prefix_ids", None)
        return self._decode(decoding.strategy_from_config(strategy, self.decode_config,
                                                          **options),
                            source_ids, length_caps, max_decode_length, prefix_ids)

    def _decode(self, strategy, source_ids, length_caps, max_decode_length, prefix_ids=None):
        """`decoding.decode` of `strategy` over `decode_step` for a batch of sources; with
        `prefix_ids` int32 `[batch, length]` (PAD after each row's tokens), each sentence's
        first tokens are forced to its prefix: at those steps every other token's logit is
        `decoding.NEG_INF`, so any strategy takes the prefix token, at no cost to its score."""
        model, weights = self.model, self._weights()
        batch_size = tf.shape(source_ids)[0]
        cache = model.init_cache(batch_size)
        state, invariants = cache, model.cache_shape_invariants(cache)
        # Searches are guarded against loops (decode.no_repeat_ngram_size, repetition_penalty);
        # a forced decoding (`score`, `align`) reads the model's own probabilities.
        guard = (None if isinstance(strategy, decoding.ForcedDecoding)
                 else decoding.RepetitionGuard.from_config(self.decode_config))
        if guard is not None:  # each row's output so far, reordered with the caches
            state = {"cache": cache,
                     "output": guard.initial_state(batch_size, max_decode_length)}
            invariants = {"cache": invariants, "output": guard.state_shape()}

        def step_function(ids, step, state, memory, beams):
            if guard is None:
                logits, cache = model.decode_step(weights, ids, step, state, memory, beams)
                state = cache
            else:
                logits, cache = model.decode_step(weights, ids, step, state["cache"], memory,
                                                  beams)
                output = guard.update(state["output"], ids, step)
                logits, state = guard.apply(logits, output, step), {"cache": cache,
                                                                     "output": output}
            if prefix_ids is None:
                return logits, state
            # [rows, prefix length + 1]: a PAD column, so that every step reads a column
            prefix = tf.repeat(memory["prefix"], beams, axis=0)
            token = tf.gather(prefix, tf.minimum(step, tf.shape(prefix)[1] - 1), axis=1)
            forced = tf.not_equal(token, PAD_ID)  # [rows]

            def force():
                forcing = tf.where(tf.one_hot(token, tf.shape(logits)[1]) > 0, 0.0,
                                   decoding.NEG_INF)
                return tf.where(forced[:, None], forcing, logits)

            # Most steps force nothing (every step of a search without a prefix).
            return tf.cond(tf.reduce_any(forced), force, lambda: logits), state

        context = model.start_decoding(weights, source_ids)
        if prefix_ids is not None:  # gathered with the context as sentences finish
            padded = tf.pad(prefix_ids, [[0, 0], [0, 1]], constant_values=PAD_ID)
            context = {**context, "prefix": padded}
        return decoding.decode(
            strategy, step_function, state, batch_size=batch_size,
            max_decode_length=max_decode_length, length_caps=length_caps,
            state_shape_invariants=invariants, context=context)


def _batch_input(value):
    """A signature input with one row per sentence, checked to be a batch `[batch]` as the call
    runs: a loaded signature binds an input of another rank without a check, and it failed deep
    in the graph ("Can not squeeze dim[1]"); this fails first, naming it ("Shape of tensor
    source [1,2] is not compatible with expected shape [?]"). Python values pass as they are."""
    return tf.ensure_shape(value, [None]) if isinstance(value, tf.Tensor) else value


def word_alignments(attention, source_words, target_words) -> dict:
    """`word_alignment`'s rule in the graph: subword attention float32 `[batch, target_len,
    source_len]` and the words of the subwords (`Tokenizer.word_indices`, `[batch,
    source_len]` and `[batch, target_len]`) -> `{"alignment": string [batch] (Pharaoh pairs
    "i-j", one per target word; "" without source words), "attention": float32 [batch, target
    words, source words] (0 past a row's words)}`."""
    source_count = tf.reduce_max(source_words, axis=1) + 1  # [batch]
    target_count = tf.reduce_max(target_words, axis=1) + 1
    width = tf.maximum(tf.reduce_max(source_count), 1)
    height = tf.maximum(tf.reduce_max(target_count), 0)
    source_onehot = tf.one_hot(source_words, width)  # [batch, source_len, words]; -1: zeros
    target_onehot = tf.one_hot(target_words, height)  # [batch, target_len, words]
    summed = tf.matmul(target_onehot, tf.matmul(attention, source_onehot), transpose_a=True)
    words = summed / tf.maximum(tf.reduce_sum(target_onehot, axis=1), 1.0)[:, :, None]
    best = tf.argmax(words, axis=2, output_type=tf.int32)  # [batch, target words]
    pairs = tf.strings.as_string(best) + "-" + tf.strings.as_string(tf.range(height))[None]
    shown = (tf.range(height)[None] < target_count[:, None]) & (source_count[:, None] > 0)
    return {"alignment": tf.strings.reduce_join(tf.ragged.boolean_mask(pairs, shown), axis=1,
                                                separator=" "),
            "attention": words}


def _shared_variables(tensors: list) -> list:
    """One non-trainable `tf.Variable` per tensor, the same variable for tensors of equal
    values (the embedding matrix that the encoder and the decoder of a shared vocabulary both
    read is stored once)."""
    variables, seen = [], {}
    for tensor in tensors:
        value = tensor.numpy()
        candidates = seen.setdefault((value.dtype, value.shape), [])
        variable = next((v for other, v in candidates if np.array_equal(other, value)), None)
        if variable is None:
            variable = tf.Variable(tensor, trainable=False)
            candidates.append((value, variable))
        variables.append(variable)
    return variables


# ----------------------------------------------------------------------------- running it

def translator_from_run(run_dir: str | os.PathLike, *, weights: str = "best",
                        beam_size: int | None = None, alpha: float | None = None,
                        case_folding: bool | None = None, **decode_settings) -> Translator:
    """A Translator over a training run's never-compiled model and tokenizers, its weights
    frozen (`Translator(frozen_weights=True)`).

    Args:
        run_dir: a folder written by `training.train`.
        weights: "best", "last", or a weight file's path.
        beam_size, alpha, decode_settings: override the run's `decode` settings (None: keep
            the run's), e.g. `sampling_topk=10`.
        case_folding: override the run's `data.case_folding` (None: keep the run's).
    """
    run = Run(run_dir)
    config = run.config
    overrides = {key: value for key, value in dict(
        decode_settings, beam_size=beam_size, alpha=alpha).items() if value is not None}
    try:
        decode_config = dataclasses.replace(config.decode, **overrides)
    except TypeError as error:  # an unknown setting: a bug of the caller
        raise ValueError(f"not a decode setting: {error}") from None
    source_tokenizer, target_tokenizer = run.tokenizers()
    model = run.load_model(weights)
    return Translator(model, source_tokenizer, target_tokenizer, decode_config,
                      max_source_length=config.data.max_pair_length, frozen_weights=True,
                      case_folding=config.data.case_folding if case_folding is None
                      else case_folding)
