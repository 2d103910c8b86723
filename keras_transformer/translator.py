"""Translator: a `tf.Module` that turns a batch of strings into a batch of translations.

Everything runs in the TensorFlow graph (tokenize, encode, cached greedy or beam search,
detokenize), so the module exports as a SavedModel that TF Serving runs with no Python.

    translator = Translator(model, source_tokenizer, target_tokenizer, DecodeConfig(beam_size=4))
    translator.translate_greedy(tf.constant(["Ein Hund."]))  # {"translation", "score"}
    translator = translator_from_run("runs/NAME")  # a trained run's model and tokenizers
    translate_texts(translator.translate_beam, sentences)  # a list of str, batched by length

`keras_transformer.export` writes a Translator as a SavedModel.

Exported signatures (input `source`: string `[batch]`, any batch size including 0):

    serving_default   beam search (the export's beam size and alpha)
                      -> translation string [batch], score float32 [batch]
    translate_beam    the same as serving_default, under an explicit name
    translate_greedy  greedy search -> translation string [batch], score float32 [batch]
    translate_nbest   beam search -> translations string [batch, beam], scores float32 [batch, beam]

Scores: greedy gives log P(translation | source); beam search gives log P / lp with the GNMT
length penalty lp = ((5 + length) / 6) ** alpha (see `decoding`).

Inputs are normalized as training text was (`tokenizers.normalize_text`: invisible characters
removed, NFC, whitespace runs made one space). A source with no words (nothing left after
that: "", whitespace, a byte-order mark, ...) is not decoded: its translation is "" with score 0
(in translate_nbest: "" with score 0 first, then "" with `decoding.NEG_INF`, the n-best's mark
of a slot without a hypothesis, since the empty translation is the only one).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import os
from typing import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.config import ConfigError, DecodeConfig
from keras_transformer.evaluation import score
from keras_transformer.inference import DecoderStep, EncoderPass
from keras_transformer.model import Transformer
from keras_transformer.runs import Run
from keras_transformer.tokenizers import END_ID, START_ID, Tokenizer, normalize_text

STRINGS_SPEC = tf.TensorSpec([None], tf.string, name="source")
ALPHA_SPEC = tf.TensorSpec([], tf.float32, name="alpha")
SIGNATURE_INPUT = "source"  # the input key of every exported signature
SIGNATURES = ("serving_default", "translate_greedy", "translate_beam", "translate_nbest")
TranslateFn = Callable[[tf.Tensor], dict]  # string [batch] -> {"translation": string [batch], ...}

# Under XLA every new input shape compiles the decoder loop again (seconds each), so shapes are
# rounded up to a few sizes: source columns to a multiple of 16 (padding is masked), the output
# buffer to a multiple of 32 (per-sentence caps still stop each sentence where it would stop).
XLA_SOURCE_BUCKET = 16
XLA_OUTPUT_BUCKET = 32


class Translator(tf.Module):
    """Strings `[batch]` in, `{"translation": string [batch], "score": float32 [batch]}` out.

    Sources longer than `max_source_length` tokens (START and END included) are truncated to
    their first `max_source_length - 1` tokens plus END (documented, never an error). Outputs
    are at most source length + `max_extra_length` tokens, capped by the model's
    `max_positions` (section 6.1), and the self-attention caches grow with the output (under
    XLA: sized to the batch's longest cap).

    Args:
        model: a trained `Transformer`.
        source_tokenizer, target_tokenizer: the run's tokenizers (the same object for a joint
            vocabulary).
        decode_config: beam size and length penalty of `__call__` (serving_default),
            `translate_beam` and `translate_nbest`.
        jit_compile: compile encoder + search with XLA (tokenizers stay outside: tf-text ops have
            no XLA kernels). Shapes are bucketed (see XLA_SOURCE_BUCKET). TF Serving runs such
            a model only with `--xla_cpu_compilation_enabled=true`.
        max_source_length: the longest source, in tokens with START/END, before truncation;
            default and upper bound: the model's `max_positions` (`translator_from_run` passes
            the run's `data.max_pair_length`, the longest source training saw).
        frozen_weights: prepare the weights in the layout the decoding reads (fused, pre-scaled
            q|k|v kernels, pre-norm LayerNorms folded into the projections they feed, the
            transposed output embedding, ...) once, here, as variables of
            their own, instead of at every call; the module then reads (and a SavedModel
            stores) those instead of the model's variables, and later changes to the model's
            weights do not reach it. For exports and fixed runs; training's validation
            translates with live weights.
    """

    def __init__(self, model: Transformer, source_tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer, decode_config: DecodeConfig = DecodeConfig(),
                 jit_compile: bool = False, max_source_length: int | None = None,
                 frozen_weights: bool = False, name=None):
        super().__init__(name=name)
        if decode_config.beam_size > target_tokenizer.vocab_size:
            raise ConfigError(f"decode.beam_size={decode_config.beam_size} is larger than the "
                              f"target vocabulary ({target_tokenizer.vocab_size} tokens)")
        # Not tracked: the SavedModel would store every weight twice, once through the Keras
        # variable wrappers and once as the tf.Variables below.
        object.__setattr__(self, "model", model)
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.decode_config = decode_config
        self.jit_compile = jit_compile
        positions = model.config.max_positions
        self.max_source_length = min(max_source_length or positions, positions)
        # The session-based loader (saved_model_cli, TF Serving) finds variables only if the
        # module tracks the tf.Variables themselves, not Keras 3's wrappers around them. A
        # compiled model's optimizer is thus never tracked either.
        self.frozen_weights = frozen_weights
        if frozen_weights:
            weights = {"encoder": EncoderPass(model).read_weights(),
                       "decoder": DecoderStep(model).read_weights()}
            self.inference_variables = _shared_variables(tf.nest.flatten(weights))
            object.__setattr__(self, "_weight_structure",
                               tf.nest.map_structure(lambda _: None, weights))
        else:
            self.model_variables = [w.value for w in model.weights]
        # The searches are explicit tf.while_loops: autograph would only convert (slowly, the
        # first time in a process) the model code they call. Kept out of sight of
        # tf.saved_model.save (a plain dict, not an attribute of type tf.function): it would
        # trace each search again outside the signatures' graphs and store the copies.
        object.__setattr__(self, "_searches", {
            "greedy": tf.function(self._greedy_search, jit_compile=jit_compile, autograph=False),
            "beam": tf.function(self._beam_search, jit_compile=jit_compile, autograph=False),
            "beam_at_alpha": tf.function(self._translate_beam_at_alpha,
                                         input_signature=[STRINGS_SPEC, ALPHA_SPEC],
                                         autograph=False)})

    @tf.function(input_signature=[STRINGS_SPEC], autograph=False)
    def __call__(self, source):
        """Beam search with the configured beam size and length penalty."""
        return self.translate_beam(source)

    @tf.function(input_signature=[STRINGS_SPEC], autograph=False)
    def translate_greedy(self, source):
        """Greedy decoding: `{"translation": string [batch], "score": float32 [batch]}` with the
        sum of the tokens' log-probabilities as score."""
        return self._translate_words(source, self._greedy_rows,
                                     {"translation": "", "score": 0.0})

    @tf.function(input_signature=[STRINGS_SPEC], autograph=False)
    def translate_beam(self, source):
        """Beam search: `{"translation": string [batch], "score": float32 [batch]}` with the
        length-normalized log-probability log P / lp as score."""
        return self._translate_beam_at_alpha(
            source, tf.constant(self.decode_config.alpha, tf.float32))

    def beam_translator(self, alpha: float) -> TranslateFn:
        """`translate_beam` with length penalty `alpha` instead of the config's. Every alpha runs
        one traced function (the config's alpha is a constant of `translate_beam`'s graph), so a
        grid over alphas (`tune_search`) traces the search once; not exported."""
        if not alpha >= 0:
            raise ConfigError(f"alpha={alpha}: must be >= 0")
        alpha = tf.constant(alpha, tf.float32)
        return lambda source: self._searches["beam_at_alpha"](source, alpha)

    def _translate_beam_at_alpha(self, source, alpha):
        """`translate_beam`'s body, with `alpha` a float32 scalar tensor."""
        return self._translate_words(source, functools.partial(self._beam_rows, alpha=alpha),
                                     {"translation": "", "score": 0.0})

    @tf.function(input_signature=[STRINGS_SPEC], autograph=False)
    def translate_nbest(self, source):
        """The `beam_size` best hypotheses, best first: `{"translations": string [batch, beam],
        "scores": float32 [batch, beam]}`; an empty slot (fewer possible sequences than beams)
        has translation "" and score `decoding.NEG_INF`."""
        beam_size = self.decode_config.beam_size
        nothing = {"translations": [""] * beam_size,
                   "scores": [0.0] + [decoding.NEG_INF] * (beam_size - 1)}
        return self._translate_words(source, self._nbest_rows, nothing)

    def signatures(self) -> dict:
        """The tf.functions to export, keyed by signature name (see the module docstring).

        Functions, not concrete functions: `tf.saved_model.save` traces them itself, in its save
        context, and would trace them again if they had been traced outside it."""
        return {"serving_default": self.__call__, "translate_greedy": self.translate_greedy,
                "translate_beam": self.translate_beam, "translate_nbest": self.translate_nbest}

    def _translate_words(self, source, translate_rows, no_words: dict) -> dict:
        """Normalizes `source` string [batch] (`normalize_text`), runs `translate_rows` on the
        sentences that have words, and gives the others the row `no_words`.

        Args:
            translate_rows: string [n] -> {key: [n, ...]}, the n >= 1 sentences' outputs.
            no_words: {key: one row of that key's output} for "" and whitespace-only sources.

        Returns:
            {key: [batch, ...]} in input order. The decoded sentences see exactly the batch
            they would see without the others (so their outputs are bitwise the same), and a
            batch without words runs no search at all.
        """
        source = normalize_text(source)
        has_words = tf.strings.length(source) > 0  # [batch]
        rows = tf.range(tf.size(source))
        decoded, skipped = tf.boolean_mask(rows, has_words), tf.boolean_mask(rows, ~has_words)
        no_words = {key: tf.constant(value) for key, value in no_words.items()}

        def no_rows():
            return {key: tf.repeat(row[None], 0, axis=0) for key, row in no_words.items()}

        outputs = tf.cond(tf.size(decoded) > 0,
                          lambda: translate_rows(tf.gather(source, decoded)), no_rows)
        return {key: tf.dynamic_stitch(
                    [decoded, skipped],
                    [outputs[key], tf.repeat(row[None], tf.size(skipped), axis=0)])
                for key, row in no_words.items()}

    def _greedy_ids(self, source_ids, length_caps, max_decode_length):
        """`_greedy_search` as a tf.function (compiled with XLA under `jit_compile`)."""
        return self._searches["greedy"](source_ids, length_caps, max_decode_length)

    def _beam_ids(self, source_ids, length_caps, max_decode_length, num_hypotheses=None,
                  alpha=None):
        """`_beam_search` as a tf.function (compiled with XLA under `jit_compile`), returning
        `num_hypotheses` (default: all `beam_size`) hypotheses per sentence, ranked with length
        penalty `alpha` (float32 scalar tensor; default: the config's)."""
        if num_hypotheses is None:
            num_hypotheses = self.decode_config.beam_size
        if alpha is None:
            alpha = tf.constant(self.decode_config.alpha, tf.float32)
        return self._searches["beam"](source_ids, length_caps, max_decode_length, num_hypotheses,
                                      alpha)

    def _greedy_rows(self, source):
        """string [n] -> {"translation": string [n], "score": float32 [n]} by greedy search."""
        ids, scores = self._greedy_ids(*self._encode_inputs(source))  # [n, len], [n]
        return {"translation": self.target_tokenizer.detokenize(ids), "score": scores}

    def _beam_rows(self, source, alpha):
        """string [n] -> {"translation": string [n], "score": float32 [n]}, the best beam.

        The best is the first of the n-best: both beam signatures call one search (one trace,
        one copy in an export), which differs from a search for the best alone only in how many
        finished hypotheses it hands back."""
        ids, scores = self._beam_ids(*self._encode_inputs(source), alpha=alpha)  # [n, beam, len]
        return {"translation": self.target_tokenizer.detokenize(ids[:, 0]),
                "score": scores[:, 0]}

    def _nbest_rows(self, source):
        """string [n] -> {"translations": string [n, beam], "scores": float32 [n, beam]}."""
        beam_size = self.decode_config.beam_size
        ids, scores = self._beam_ids(*self._encode_inputs(source))  # [n, beam, len], [n, beam]
        flat = tf.reshape(ids, [-1, tf.shape(ids)[2]])  # [n * beam, len]
        texts = tf.reshape(self.target_tokenizer.detokenize(flat), [-1, beam_size])
        return {"translations": texts, "scores": scores}

    def _encode_inputs(self, source):
        """Source strings -> (ids int32 [batch, len], per-sentence output caps int32 [batch],
        the output buffer length int32 [])."""
        limit = self.max_source_length
        positions = self.model.config.max_positions
        tokens = self.source_tokenizer.tokenize(source)  # ragged [batch, (len)], START ... END
        lengths = tf.cast(tokens.row_lengths(), tf.int32)  # [batch]
        source_ids = tokens.to_tensor()[:, :limit]  # [batch, min(longest, limit)]
        # A truncated source still ends with END, as every training source did.
        last_column = tf.range(tf.shape(source_ids)[1]) == limit - 1
        source_ids = tf.where((lengths > limit)[:, None] & last_column[None, :], END_ID,
                              source_ids)
        lengths = tf.minimum(lengths, limit)
        length_caps = tf.minimum(lengths + self.decode_config.max_extra_length, positions)
        max_decode_length = tf.reduce_max(tf.concat([length_caps, [1]], 0))
        if self.jit_compile:
            source_ids = _pad_columns(source_ids, _round_up(tf.shape(source_ids)[1],
                                                            XLA_SOURCE_BUCKET, limit))
            max_decode_length = _round_up(max_decode_length, XLA_OUTPUT_BUCKET, positions)
        return source_ids, length_caps, max_decode_length

    def _greedy_search(self, source_ids, length_caps, max_decode_length):
        """-> ids int32 [batch, max_decode_length], scores float32 [batch]
        (see decoding.greedy_search)."""
        batch_size = tf.shape(source_ids)[0]
        cache, invariants = self._init_cache(batch_size, max_decode_length)
        step_function, memory = self._step_function(source_ids)
        return decoding.greedy_search(
            step_function, cache, batch_size=batch_size,
            max_decode_length=max_decode_length, start_id=START_ID, end_id=END_ID,
            length_caps=length_caps, state_shape_invariants=invariants, context=memory,
            compact=self._compact)

    def _beam_search(self, source_ids, length_caps, max_decode_length, num_hypotheses, alpha):
        """-> ids int32 [batch, n, max_decode_length], scores float32 [batch, n]
        (see decoding.beam_search; `alpha` a float32 scalar tensor)."""
        batch_size = tf.shape(source_ids)[0]
        beam_size = self.decode_config.beam_size
        cache, invariants = self._init_cache(batch_size, max_decode_length)
        step_function, memory = self._step_function(source_ids, beams=beam_size)
        return decoding.beam_search(
            step_function, cache, batch_size=batch_size,
            beam_size=beam_size, max_decode_length=max_decode_length,
            alpha=alpha, stopping=self.decode_config.stopping,
            patience=self.decode_config.patience,
            start_id=START_ID, end_id=END_ID, length_caps=length_caps,
            num_hypotheses=num_hypotheses, state_shape_invariants=invariants, context=memory,
            tile_context=not self._fast_step, compact=self._compact,
            first_step_fn=functools.partial(step_function, beams=1))

    def _init_cache(self, batch_size, max_decode_length):
        """The decoder's self-attention caches and their loop shape invariants.

        Without XLA the caches grow by one position per step, so attention and beam reordering
        cost the length decoded so far (a few tokens for most sentences) instead of the longest
        cap of the batch (source length + 50). XLA needs fixed shapes: caches of `max_decode_length`.
        """
        init_cache = self._decoder_step.init_cache if self._fast_step else self.model.init_cache
        if not self._growing_caches:
            return init_cache(batch_size, max_decode_length), None
        cache = init_cache(batch_size)
        return cache, self.model.cache_shape_invariants(cache)

    @property
    def stopping_rule(self) -> str:
        """How beam search decides a sentence is done (recorded in an export's provenance)."""
        rule = decoding.STOPPING_RULES[self.decode_config.stopping]
        if self.decode_config.stopping == "beam_full":
            rule += f"; patience {self.decode_config.patience:g}"
        return rule

    @property
    def _growing_caches(self) -> bool:
        return not self.jit_compile

    @property
    def _compact(self) -> bool:
        """Whether the searches drop finished sentences from the batch (not under XLA, whose
        shapes are fixed)."""
        return not self.jit_compile

    @property
    def _decoder_step(self) -> DecoderStep:
        return DecoderStep(self.model, pack=not self.jit_compile)

    def _step_function(self, source_ids, beams: int = 1):
        """The search's `symbols_to_logits_fn` over the encoded source, and its context (the
        memory it reads at every step but never changes: the encoder output's cross-attention
        keys/values and the source mask, `[batch, ...]`; the searches drop finished sentences
        from it, but never reorder it). `DecoderStep` takes it untiled, one row per `beams`
        consecutive rows of ids (`beams=1` for step 0 of beam search, which runs on one row
        per sentence); the Keras reference step takes it tiled to its rows whatever `beams`.

        The source is encoded by `EncoderPass` and the decoder step is `DecoderStep`'s, both
        over the weights' tensors read here once per batch (not once per step inside the loop).
        `Transformer.encode` and `Transformer.decode_step` through the Keras layers are the
        references they are tested against (`_fast_step` False).
        """
        growing = self._growing_caches
        if self._fast_step:
            encoder = EncoderPass(self.model, pack=not self.jit_compile)
            decoder = self._decoder_step
            if self.frozen_weights:
                weights = tf.nest.pack_sequence_as(
                    self._weight_structure, [tf.convert_to_tensor(v)
                                             for v in self.inference_variables])
                encoder_weights, weights = weights["encoder"], weights["decoder"]
            else:
                encoder_weights, weights = encoder.read_weights(), decoder.read_weights()
            context, source_mask = encoder(encoder_weights, source_ids)

            def step_function(ids, step, state, memory, beams=beams):
                return decoder.step(weights, ids, step, state, memory, growing=growing,
                                    beams=beams)

            return step_function, decoder.precompute(weights, context, source_mask)

        context, source_mask = self.model.encode(source_ids, training=False)
        memory = self.model.precompute_context(context, source_mask)
        # Every weight is read once per batch, here, instead of once per step inside the loop
        # (about 90 ReadVariableOps per step for the tutorial model): in a stateless scope the
        # layers see these tensors in place of their variables.
        weights = self.model.weights
        values = [tf.convert_to_tensor(weight.value) for weight in weights]

        def keras_step_function(ids, step, state, memory, beams=None):
            with keras.StatelessScope(state_mapping=list(zip(weights, values))):
                return self.model.decode_step(ids, step, state, memory, growing=growing)

        return keras_step_function, memory

    _fast_step = True  # False: the Keras layers' `encode` and `decode_step` (the reference)



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


def _round_up(value, multiple, limit):
    """int32 scalar `value` rounded up to a multiple of `multiple`, at most `limit`."""
    return tf.minimum((value + multiple - 1) // multiple * multiple, limit)


def _pad_columns(ids, length):
    """int32 [batch, len] -> [batch, length] padded with PAD (length >= len)."""
    return tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]])


# ----------------------------------------------------------------------------- running it

def translator_from_run(run_dir: str | os.PathLike, *, weights: str = "best",
                        beam_size: int | None = None, alpha: float | None = None,
                        jit_compile: bool = False) -> Translator:
    """A Translator over a training run's never-compiled model and tokenizers, its weights
    frozen (`Translator(frozen_weights=True)`).

    Args:
        run_dir: a folder written by `training.train`.
        weights: "best", "last", or a weight file's path.
        beam_size, alpha: override the run's `decode` settings.
    """
    run = Run(run_dir)
    config = run.config
    decode_config = dataclasses.replace(
        config.decode, beam_size=config.decode.beam_size if beam_size is None else beam_size,
        alpha=config.decode.alpha if alpha is None else alpha)
    source_tokenizer, target_tokenizer = run.tokenizers()
    model = run.load_model(weights)
    return Translator(model, source_tokenizer, target_tokenizer, decode_config,
                      jit_compile=jit_compile, max_source_length=config.data.max_pair_length,
                      frozen_weights=True)


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
        outputs = translate(batch)["translation"]
        return indices, outputs.numpy() if hasattr(outputs, "numpy") else outputs

    results: list[str] = [""] * len(sentences)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for indices, outputs in pool.map(run, batches):
            for index, text in zip(indices, outputs):
                results[index] = text.decode("utf-8")
            if progress is not None:
                progress(len(indices))
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
                decode_config, max_source_length=translator.max_source_length)
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
