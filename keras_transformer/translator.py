"""Translator: a `tf.Module` that turns a batch of strings into a batch of translations.

Everything runs in the TensorFlow graph (tokenize, encode, cached greedy or beam search,
detokenize), so the module exports as a SavedModel that TF Serving runs with no Python.

    translator = Translator(model, source_tokenizer, target_tokenizer, DecodeConfig(beam_size=4))
    translator.translate_greedy(tf.constant(["Ein Hund."]))  # {"translation", "score"}
    export_translator(translator, "saved_models/NAME/1")  # or export_run(run_dir, ...)

Exported signatures (input `source`: string `[batch]`, any batch size including 0):

    serving_default   beam search (the export's beam size and alpha)
                      -> translation string [batch], score float32 [batch]
    translate_beam    the same as serving_default, under an explicit name
    translate_greedy  greedy search -> translation string [batch], score float32 [batch]
    translate_nbest   beam search -> translations string [batch, beam], scores float32 [batch, beam]

Scores: greedy gives log P(translation | source); beam search gives log P / lp with the GNMT
length penalty lp = ((5 + length) / 6) ** alpha (see `decoding`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

import keras
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.config import ConfigError, DecodeConfig
from keras_transformer.model import Transformer
from keras_transformer.tokenizers import END_ID, START_ID, Tokenizer

STRINGS_SPEC = tf.TensorSpec([None], tf.string, name="source")
SIGNATURE_INPUT = "source"  # the input key of every exported signature
SIGNATURES = ("serving_default", "translate_greedy", "translate_beam", "translate_nbest")
WARMUP_FILE = "tf_serving_warmup_requests"  # in assets.extra/, replayed by TF Serving on load
WARMUP_SENTENCES = ("Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "")

# Under XLA every new input shape compiles the decoder loop again (seconds each), so shapes are
# rounded up to a few sizes: source columns to a multiple of 16 (padding is masked), the output
# buffer to a multiple of 32 (per-sentence caps still stop each sentence where it would stop).
XLA_SOURCE_BUCKET = 16
XLA_OUTPUT_BUCKET = 32


class Translator(tf.Module):
    """Strings `[batch]` in, `{"translation": string [batch], "score": float32 [batch]}` out.

    Sources longer than the model's `max_length` tokens are truncated to their first
    `max_length - 1` subwords plus END (documented, never an error). Outputs are at most
    source length + `max_extra_length` tokens, capped by the model's `max_length` (section 6.1),
    and the self-attention caches grow with the output (under XLA: sized to the batch's longest
    cap, not to `max_length`).

    Args:
        model: a trained `Transformer`.
        source_tokenizer, target_tokenizer: the run's tokenizers (the same object for a joint
            vocabulary).
        decode_config: beam size and length penalty of `__call__` (serving_default),
            `translate_beam` and `translate_nbest`.
        jit_compile: compile encoder + search with XLA (tokenizers stay outside: tf-text ops have
            no XLA kernels). Shapes are bucketed (see XLA_SOURCE_BUCKET). TF Serving runs such
            a model only with `--xla_cpu_compilation_enabled=true`.
    """

    def __init__(self, model: Transformer, source_tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer, decode_config: DecodeConfig = DecodeConfig(),
                 jit_compile: bool = False, name=None):
        super().__init__(name=name)
        # Not tracked: the SavedModel would store every weight twice, once through the Keras
        # variable wrappers and once as the tf.Variables below.
        object.__setattr__(self, "model", model)
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.decode_config = decode_config
        self.jit_compile = jit_compile
        # The session-based loader (saved_model_cli, TF Serving) finds variables only if the
        # module tracks the tf.Variables themselves, not Keras 3's wrappers around them. A
        # compiled model's optimizer is thus never tracked either.
        self.model_variables = [w.value for w in model.weights]
        self._greedy_ids = tf.function(self._greedy_search, jit_compile=jit_compile)
        self._beam_ids = tf.function(self._beam_search, jit_compile=jit_compile)

    @tf.function(input_signature=[STRINGS_SPEC])
    def __call__(self, source):
        """Beam search with the configured beam size and length penalty."""
        return self.translate_beam(source)

    @tf.function(input_signature=[STRINGS_SPEC])
    def translate_greedy(self, source):
        """Greedy decoding: `{"translation": string [batch], "score": float32 [batch]}` with the
        sum of the tokens' log-probabilities as score."""
        ids, scores = self._greedy_ids(*self._encode_inputs(source))  # [batch, len], [batch]
        return {"translation": self.target_tokenizer.detokenize(ids), "score": scores}

    @tf.function(input_signature=[STRINGS_SPEC])
    def translate_beam(self, source):
        """Beam search: `{"translation": string [batch], "score": float32 [batch]}` with the
        length-normalized log-probability log P / lp as score."""
        ids, scores = self._beam_ids(*self._encode_inputs(source), 1)  # [batch, 1, len]
        return {"translation": self.target_tokenizer.detokenize(ids[:, 0]),
                "score": scores[:, 0]}

    @tf.function(input_signature=[STRINGS_SPEC])
    def translate_nbest(self, source):
        """The `beam_size` best hypotheses, best first: `{"translations": string [batch, beam],
        "scores": float32 [batch, beam]}`; an empty slot (fewer possible sequences than beams)
        has translation "" and score `decoding.NEG_INF`."""
        beam_size = self.decode_config.beam_size
        ids, scores = self._beam_ids(*self._encode_inputs(source), beam_size)  # [batch, n, len]
        flat = tf.reshape(ids, [-1, tf.shape(ids)[2]])  # [batch * n, len]
        texts = tf.reshape(self.target_tokenizer.detokenize(flat), [-1, beam_size])
        return {"translations": texts, "scores": scores}

    def signatures(self) -> dict:
        """The concrete functions to export, keyed by signature name (see the module docstring)."""
        return {"serving_default": self.__call__.get_concrete_function(),
                "translate_greedy": self.translate_greedy.get_concrete_function(),
                "translate_beam": self.translate_beam.get_concrete_function(),
                "translate_nbest": self.translate_nbest.get_concrete_function()}

    def _encode_inputs(self, source):
        """Source strings -> (ids int32 [batch, len], per-sentence output caps int32 [batch],
        the output buffer length int32 [])."""
        limit = self.model.config.max_length
        tokens = self.source_tokenizer.tokenize(source)  # ragged [batch, (len)], START ... END
        lengths = tf.cast(tokens.row_lengths(), tf.int32)  # [batch]
        source_ids = tokens.to_tensor()[:, :limit]  # [batch, min(longest, limit)]
        # A truncated source still ends with END, as every training source did.
        last_column = tf.range(tf.shape(source_ids)[1]) == limit - 1
        source_ids = tf.where((lengths > limit)[:, None] & last_column[None, :], END_ID,
                              source_ids)
        lengths = tf.minimum(lengths, limit)
        max_lengths = tf.minimum(lengths + self.decode_config.max_extra_length, limit)
        max_length = tf.reduce_max(tf.concat([max_lengths, [1]], 0))
        if self.jit_compile:
            source_ids = _pad_columns(source_ids, _round_up(tf.shape(source_ids)[1],
                                                            XLA_SOURCE_BUCKET, limit))
            max_length = _round_up(max_length, XLA_OUTPUT_BUCKET, limit)
        return source_ids, max_lengths, max_length

    def _greedy_search(self, source_ids, max_lengths, max_length):
        """-> ids int32 [batch, max_length], scores float32 [batch] (see decoding.greedy_search)."""
        batch_size = tf.shape(source_ids)[0]
        cache, invariants = self._init_cache(batch_size, max_length)
        return decoding.greedy_search(
            self._step_function(source_ids), cache, batch_size=batch_size,
            max_length=max_length, start_id=START_ID, end_id=END_ID, max_lengths=max_lengths,
            state_shape_invariants=invariants)

    def _beam_search(self, source_ids, max_lengths, max_length, num_hypotheses):
        """-> ids int32 [batch, n, max_length], scores float32 [batch, n] (decoding.beam_search)."""
        batch_size = tf.shape(source_ids)[0]
        beam_size = self.decode_config.beam_size
        cache, invariants = self._init_cache(batch_size, max_length)
        return decoding.beam_search(
            self._step_function(source_ids, beam_size), cache, batch_size=batch_size,
            beam_size=beam_size, max_length=max_length, alpha=self.decode_config.alpha,
            start_id=START_ID, end_id=END_ID, max_lengths=max_lengths,
            num_hypotheses=num_hypotheses, state_shape_invariants=invariants)

    def _init_cache(self, batch_size, max_length):
        """The decoder's self-attention caches and their loop shape invariants.

        Without XLA the caches grow by one position per step, so attention and beam reordering
        cost the length decoded so far (a few tokens for most sentences) instead of the longest
        cap of the batch (source length + 50). XLA needs fixed shapes: caches of `max_length`.
        """
        if not self._growing_caches:
            return self.model.init_cache(batch_size, max_length), None
        cache = self.model.init_cache(batch_size)
        return cache, self.model.cache_shape_invariants(cache)

    @property
    def _growing_caches(self) -> bool:
        return not self.jit_compile

    def _step_function(self, source_ids, beam_size=1):
        """The search's `symbols_to_logits_fn`: the decoder step over the encoded source.

        The encoder output's cross-attention keys/values never change while decoding, so they
        are captured here (tiled to the beams) rather than carried, and reordered, in the state.
        """
        context, source_mask = self.model.encode(source_ids, training=False)
        memory = self.model.precompute_context(context, source_mask)
        if beam_size > 1:
            memory = tf.nest.map_structure(lambda t: decoding.tile_beams(t, beam_size), memory)
        growing = self._growing_caches
        # Every weight is read once per batch, here, instead of once per step inside the loop
        # (about 90 ReadVariableOps per step for the tutorial model): in a stateless scope the
        # layers see these tensors in place of their variables.
        weights = self.model.weights
        values = [tf.convert_to_tensor(weight.value) for weight in weights]

        def step_function(ids, step, state):
            with keras.StatelessScope(state_mapping=list(zip(weights, values))):
                return self.model.decode_step(ids, step, state, memory, growing=growing)

        return step_function


def _round_up(value, multiple, limit):
    """int32 scalar `value` rounded up to a multiple of `multiple`, at most `limit`."""
    return tf.minimum((value + multiple - 1) // multiple * multiple, limit)


def _pad_columns(ids, length):
    """int32 [batch, len] -> [batch, length] padded with PAD (length >= len)."""
    return tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]])


# ----------------------------------------------------------------------------- export

def uncompiled_copy(model: Transformer) -> Transformer:
    """A fresh, never-compiled `Transformer` with `model`'s config and weights.

    A compiled model tracks its optimizer, whose slot variables would be exported too (3x the
    size, and useless for serving).
    """
    copy = Transformer.from_config(model.get_config())
    copy.build()
    copy.set_weights(model.get_weights())
    return copy


def export_translator(translator: Translator, export_dir: str | os.PathLike, *,
                      warmup_sentences: Sequence[str] | None = WARMUP_SENTENCES) -> Path:
    """Writes `translator` as a SavedModel at `export_dir` (which must not exist).

    The SavedModel holds the signatures listed in the module docstring, the tokenizer files as
    assets, and, when `tensorflow_serving_api` is importable and `warmup_sentences` is not None,
    a TF Serving warmup file (one request per signature). It is written to a hidden sibling folder
    and renamed at the end, so that TF Serving, which watches the parent folder, never sees a
    half-written version. A compiled model is exported from an `uncompiled_copy`.

    Returns:
        the export folder.
    """
    export_dir = Path(export_dir)
    if export_dir.exists():
        raise FileExistsError(f"{export_dir} already exists: choose another version")
    if getattr(translator.model, "optimizer", None) is not None:
        translator = Translator(uncompiled_copy(translator.model), translator.source_tokenizer,
                                translator.target_tokenizer, translator.decode_config,
                                jit_compile=translator.jit_compile)
    partial = export_dir.with_name(f".{export_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(translator, str(partial), signatures=translator.signatures())
    if warmup_sentences is not None:
        write_warmup_requests(partial, warmup_sentences, model_name=export_dir.parent.name)
    os.replace(partial, export_dir)
    return export_dir


def write_warmup_requests(export_dir: str | os.PathLike, sentences: Sequence[str], *,
                          model_name: str = "translator") -> Path | None:
    """Writes `assets.extra/tf_serving_warmup_requests`: one PredictRequest per signature.

    TF Serving replays these before it serves a version, so the first real request does not pay
    for loading the tokenizers and (with XLA) compiling. Returns None, writing nothing, when
    tensorflow-serving-api is not installed (an optional extra).
    """
    try:
        from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2
    except ImportError:
        return None
    path = Path(export_dir) / "assets.extra" / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature in SIGNATURES:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            request.inputs[SIGNATURE_INPUT].CopyFrom(
                tf.make_tensor_proto(list(sentences), dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def next_version(model_root: str | os.PathLike) -> int:
    """1 + the highest numbered version folder in `model_root` (1 if there is none)."""
    root = Path(model_root)
    versions = [int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()] if (
        root.is_dir()) else []
    return max(versions, default=0) + 1


def translator_from_run(run_dir: str | os.PathLike, *, weights: str = "best",
                        beam_size: int | None = None, alpha: float | None = None,
                        jit_compile: bool = False) -> Translator:
    """A Translator over a training run's never-compiled model and tokenizers.

    Args:
        run_dir: a folder written by `training.train`.
        weights: "best", "last", or a weight file's path.
        beam_size, alpha: override the run's `decode` settings.
    """
    from keras_transformer.tokenizers import load_tokenizers
    from keras_transformer.training import load_run_config, load_trained_model

    config = load_run_config(run_dir)
    decode_config = DecodeConfig(
        beam_size=config.decode.beam_size if beam_size is None else beam_size,
        alpha=config.decode.alpha if alpha is None else alpha,
        max_extra_length=config.decode.max_extra_length)
    vocab_dir = Path(config.data.vocab_dir or Path(run_dir) / "vocab")
    source_tokenizer, target_tokenizer = load_tokenizers(config.data, vocab_dir)
    model = load_trained_model(run_dir, weights)
    return Translator(model, source_tokenizer, target_tokenizer, decode_config,
                      jit_compile=jit_compile)


def export_run(run_dir: str | os.PathLike, model_root: str | os.PathLike, *,
               version: int | None = None, **translator_args) -> Path:
    """Exports a training run to `model_root/<version>/` (default: the next free version).

    `translator_args` go to `translator_from_run` (weights, beam_size, alpha, jit_compile).
    """
    if version is not None and version < 1:
        raise ConfigError(f"--version {version}: TF Serving versions are positive integers")
    translator = translator_from_run(run_dir, **translator_args)
    version = next_version(model_root) if version is None else version
    return export_translator(translator, Path(model_root) / str(version))


def load_translator(export_dir: str | os.PathLike):
    """Loads an exported translator (its signatures are `.signatures[name]`, its functions
    `translate_greedy` etc.); registers the tf-text ops first, as every loader must."""
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    export_dir = Path(export_dir)
    if not (export_dir / "saved_model.pb").is_file():
        raise FileNotFoundError(f"{export_dir} is not a SavedModel (no saved_model.pb): pass a "
                                "version folder such as saved_models/NAME/1")
    return tf.saved_model.load(str(export_dir))
