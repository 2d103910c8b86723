"""CTranslate2 export of a trained Transformer; `ctranslate2_translator` runs the export.

    export_ctranslate2(model, tokenizer, tokenizer, DecodeConfig(), "exports/ct2")
    ctranslate2_translator.CTranslate2Translator("exports/ct2").translate_beam(["Ein Hund."])

The export is a CTranslate2 model folder (model.bin, config.json, shared_vocabulary.json) plus the
joint SentencePiece model and `keras_transformer.json` (beam size, alpha, output caps, source
markers); the file names are the runtime's (`ctranslate2_translator.SETTINGS_FILE`, ...), which
reads them without TensorFlow.

How our layout maps onto CTranslate2's `TransformerSpec`:

- Positions: our table interleaves sin/cos (section 3.5) from position 0; CTranslate2's built-in
  table (OpenNMT-tf's) concatenates sin|cos, with rates 10000^(-i / (d_model/2 - 1)), from
  position 1. The spec therefore carries our table (`position_encodings.encodings`). CTranslate2
  then refuses positions past the table rather than stopping there, so sources are truncated and
  output caps bounded by `max_positions` here, as `Translator` does. Embeddings are scaled by
  sqrt(d_model) in both.
- Keras kernels are [in, out] (MultiHeadAttention: query/key/value [d_model, heads, head_dim],
  output [heads, head_dim, d_model]); CTranslate2 wants [out, in] with heads major. Self-attention
  takes one fused q|k|v projection, cross-attention q then a fused k|v.
- Post-norm stacks have LayerNorms in their sublayers only; pre-norm stacks also end with one.
  The LayerNorm epsilon is ours (1e-6).
- The SentencePiece reserved ids 0-3 (`<pad> <s> </s> <unk>`) are CTranslate2's default tokens;
  `add_source_bos`/`add_source_eos` put START and END around every source, as `tokenize` does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import ctranslate2
import numpy as np
import sentencepiece
import tensorflow as tf
from ctranslate2.specs import common_spec, transformer_spec

from keras_transformer.config import (SENTENCEPIECE_FILE, VOCABULARY_CHECKSUMS, ConfigError,
                                      DecodeConfig)
from keras_transformer.data.text_io import (errno_of, file_sha256, partial_path,
                                            remove_dead_partials, rename_new, write_error)
from keras_transformer.data.tokenizers import SentencePieceTokenizer, Tokenizer
from keras_transformer.decoding.search_rules import kept_source_tokens
from keras_transformer.export.ctranslate2_runtime import MODEL_CHECKSUM, MODEL_FILE, SETTINGS_FILE
from keras_transformer.layers.normalization import LAYER_NORM_EPSILON
from keras_transformer.model import Transformer

QUANTIZATIONS = ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES  # float32, int8, bfloat16, ...


# ----------------------------------------------------------------------------- export

def export_ctranslate2(model: Transformer, source_tokenizer: Tokenizer,
                       target_tokenizer: Tokenizer, decode_config: DecodeConfig,
                       output_dir: str | os.PathLike, *, quantization: str = "float32",
                       provenance: dict | None = None,
                       max_source_length: int | None = None,
                       case_folding: bool = False) -> Path:
    """Writes `model` as a CTranslate2 model folder at `output_dir` (which must not exist).

    The folder holds CTranslate2's files, the SentencePiece model and `keras_transformer.json`
    (the decoding settings, the source markers, `quantization`, the SHA-256 of `model.bin` and
    of the vocabulary files, SentencePiece's and CTranslate2's, that `CTranslate2Translator`
    checks before loading them, and `provenance` merged in). It is
    written to a hidden sibling folder (`text_io.partial_path`) and renamed at the end, so it is
    never seen half-written; what an export killed with -9 left beside it is removed first
    (`text_io.remove_dead_partials`).

    Args:
        model: a trained `Transformer`.
        source_tokenizer, target_tokenizer: the run's joint `SentencePieceTokenizer` (twice).
        decode_config: beam size, alpha and output caps that `CTranslate2Translator` will use.
        quantization: weight type, one of `QUANTIZATIONS` (float32, int8, bfloat16, ...).
        provenance: optional JSON-serializable facts about the model (run, weights, commit).
        max_source_length: sources are truncated to this many tokens, START and END included
            (default and upper bound: the model's `max_positions`), as `Translator` does.
        case_folding: the runtime folds the case of sources in capitals or title case and
            recases their translations, as `Translator(case_folding=True)` does.

    Returns:
        the export folder.

    Raises:
        ConfigError: for a tokenizer other than SentencePiece, an unknown quantization, or
            `provenance` keys that would overwrite the settings.
    """
    sentencepiece_path = _sentencepiece_model_path(source_tokenizer, target_tokenizer)
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization={quantization!r} is not one of "
                          f"{', '.join(map(repr, QUANTIZATIONS))}")
    settings = export_settings(model, decode_config, quantization, max_source_length,
                               case_folding)
    clashes = sorted((set(settings) | {MODEL_CHECKSUM, VOCABULARY_CHECKSUMS})
                     & set(provenance or {}))
    if clashes:
        raise ConfigError(f"provenance keys {clashes} would overwrite the export's settings")

    output_dir = Path(output_dir)
    if output_dir.exists():
        raise FileExistsError(f"{output_dir} already exists: choose another folder")
    remove_dead_partials(output_dir.parent)
    partial = partial_path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        converter = KerasTransformerConverter(model, _vocabulary(sentencepiece_path),
                                              alignment_layer=decode_config.alignment_layer)
        converter.convert(str(partial), quantization=quantization, force=True)
        shutil.copyfile(sentencepiece_path, partial / SENTENCEPIECE_FILE)
        # What the runtime checks before loading: CTranslate2 loads damaged weights silently,
        # and another vocabulary of the same size turns every translation into other words.
        settings[MODEL_CHECKSUM] = file_sha256(partial / MODEL_FILE)
        settings[VOCABULARY_CHECKSUMS] = {path.name: file_sha256(path) for path in sorted(
            [partial / SENTENCEPIECE_FILE, *partial.glob("*vocabulary*")])}
        (partial / SETTINGS_FILE).write_text(
            json.dumps({**settings, **(provenance or {})}, indent=2) + "\n")
        rename_new(partial, output_dir, "choose a new --output")
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, OSError) and errno_of(error):  # a full disk: one line
            raise write_error(output_dir, error) from None
        raise
    return output_dir


def export_settings(model: Transformer, decode_config: DecodeConfig, quantization: str,
                    max_source_length: int | None = None, case_folding: bool = False) -> dict:
    """The contents of `keras_transformer.json` (before provenance)."""
    positions = model.config.max_positions
    return {
        "beam_size": decode_config.beam_size,
        "alpha": decode_config.alpha,
        # CTranslate2's own beam search waits for patience x beam finished hypotheses, as
        # decode.stopping "beam_full" does; "exact" has no patience (1 is CTranslate2's default).
        "patience": decode_config.patience if decode_config.stopping == "beam_full" else 1.0,
        "max_extra_length": decode_config.max_extra_length,
        "sampling_topk": decode_config.sampling_topk,
        "sampling_topp": decode_config.sampling_topp,
        "sampling_temperature": decode_config.sampling_temperature,
        "alignment_layer": decode_config.alignment_layer,
        "no_repeat_ngram_size": decode_config.no_repeat_ngram_size,
        "repetition_penalty": decode_config.repetition_penalty,
        "max_positions": positions,
        "max_source_length": kept_source_tokens(max_source_length, positions),
        "source_start": "<s>",  # START and END around every source, as Tokenizer.tokenize does
        "source_end": "</s>",
        "sentencepiece_model": SENTENCEPIECE_FILE,
        "quantization": quantization,
        "case_folding": case_folding,  # data.case_folding: the runtime folds and recases
    }


def _sentencepiece_model_path(source_tokenizer: Tokenizer, target_tokenizer: Tokenizer) -> str:
    """The joint SentencePiece model file of the tokenizers; ConfigError for anything else."""
    for tokenizer in (source_tokenizer, target_tokenizer):
        if not isinstance(tokenizer, SentencePieceTokenizer):
            raise ConfigError(
                f"CTranslate2 export needs the joint SentencePiece tokenizer, got "
                f"{type(tokenizer).__name__}: CTranslate2 translates pieces, which "
                "CTranslate2Translator makes with the sentencepiece library from the .model file "
                "copied into the export (the segmentation tf-text computes), while WordPiece "
                "splitting, lowercasing and natural-spacing detokenization exist here only as "
                "TensorFlow (tf-text) ops, over two per-language vocabularies whose markers are "
                "[START]/[END]/[UNK], not CTranslate2's <s>/</s>/<unk>; "
                "train with data.tokenizer=sentencepiece")
    paths = {t.model_file.asset_path.numpy().decode("utf-8")
             for t in (source_tokenizer, target_tokenizer)}
    if len({Path(p).read_bytes() for p in paths}) != 1:
        raise ConfigError(f"source and target SentencePiece models differ ({sorted(paths)}): "
                          "the export holds one joint model")
    return paths.pop()


def _vocabulary(sentencepiece_path: str) -> list[str]:
    """The pieces in id order: CTranslate2 maps pieces to ids through this list."""
    processor = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_path)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


class KerasTransformerConverter(ctranslate2.converters.Converter):
    """A `Transformer` and its vocabulary (pieces in id order) -> CTranslate2's TransformerSpec.

    `convert(output_dir, quantization=...)` (CTranslate2's) validates, quantizes and writes it.
    """

    def __init__(self, model: Transformer, vocabulary: Sequence[str], *,
                 alignment_layer: int = -1):
        config = model.config
        for side in ("source", "target"):
            size = getattr(config, f"{side}_vocab_size")
            if size != len(vocabulary):
                raise ConfigError(f"model.{side}_vocab_size={size} but the SentencePiece model "
                                  f"has {len(vocabulary)} pieces")
        self.model = model
        self.vocabulary = list(vocabulary)
        self.alignment_layer = alignment_layer

    def _load(self) -> transformer_spec.TransformerSpec:
        spec = ctranslate2_spec(self.model, alignment_layer=self.alignment_layer)
        spec.register_source_vocabulary(self.vocabulary)
        spec.register_target_vocabulary(self.vocabulary)
        return spec


def ctranslate2_spec(model: Transformer, *,
                     alignment_layer: int = -1) -> transformer_spec.TransformerSpec:
    """The filled CTranslate2 spec of `model` (weights as float32 numpy arrays), read from what
    each layer says its weights are (`BaseAttention.projections`, the Dense and LayerNorm
    sublayers, `PositionalEmbedding.positions`); CTranslate2's `return_attention` gives decoder
    layer `alignment_layer`'s cross-attention averaged over all heads, as `Translator.align`
    reads it."""
    config = model.config
    pre_norm = config.norm == "pre"
    options = dict(pre_norm=pre_norm, activation=CTRANSLATE2_ACTIVATIONS[config.activation])
    encoder = transformer_spec.TransformerEncoderSpec(config.num_layers, config.num_heads,
                                                      **options)
    decoder = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.num_heads, alignment_layer=alignment_layer,
        alignment_heads=config.num_heads, **options)
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.config.add_source_bos = True
    spec.config.add_source_eos = True

    _set_positional_embedding(encoder.embeddings[0], encoder.position_encodings,
                              model.source_embedding)
    for layer_spec, layer in zip(encoder.layer, model.encoder.stack):
        _set_attention(layer_spec.self_attention, layer.self_attention, self_attention=True)
        _set_feed_forward(layer_spec.ffn, layer.ffn)

    _set_positional_embedding(decoder.embeddings, decoder.position_encodings,
                              model.target_embedding)
    for layer_spec, layer in zip(decoder.layer, model.decoder.stack):
        _set_attention(layer_spec.self_attention, layer.causal_self_attention,
                       self_attention=True)
        _set_attention(layer_spec.attention, layer.cross_attention, self_attention=False)
        _set_feed_forward(layer_spec.ffn, layer.ffn)

    if pre_norm:
        _set_layer_norm(encoder.layer_norm, model.encoder.final_layernorm)
        _set_layer_norm(decoder.layer_norm, model.decoder.final_layernorm)
    if model.final_layer is not None:
        _set_linear(decoder.projection, model.final_layer.kernel, model.final_layer.bias)
    else:  # tied to the target embedding (section 3.4), no bias
        decoder.projection.weight = _numpy(model.target_embedding.token_embedding.embeddings)
    return spec


# Each of `config.ACTIVATIONS` -> CTranslate2's; "gelu" is the exact (erf) form in both.
CTRANSLATE2_ACTIVATIONS = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}


def _numpy(tensor) -> np.ndarray:
    return np.asarray(tensor.numpy(), dtype=np.float32)


def _set_positional_embedding(embeddings_spec, positions_spec, layer) -> None:
    embeddings_spec.weight = _numpy(layer.token_embedding.embeddings)  # [vocab, d_model]
    positions_spec.encodings = np.asarray(layer.positions, np.float32)  # [max_positions, d_model]


def _set_linear(spec: common_spec.LinearSpec, kernel, bias) -> None:
    """A kernel read as `x @ kernel` `[in, out]` -> CTranslate2's `[out, in]` weight."""
    spec.weight = _numpy(kernel).T
    spec.bias = _numpy(bias)


def _set_layer_norm(spec: common_spec.LayerNormSpec, layer_norm) -> None:
    spec.gamma = _numpy(layer_norm.gamma)
    spec.beta = _numpy(layer_norm.beta)


def _set_feed_forward(spec, feed_forward) -> None:
    _set_linear(spec.linear_0, feed_forward.inner.kernel, feed_forward.inner.bias)
    _set_linear(spec.linear_1, feed_forward.outer.kernel, feed_forward.outer.bias)
    _set_layer_norm(spec.layer_norm, feed_forward.layernorm)


def _set_attention(spec, attention, *, self_attention: bool) -> None:
    """Fills a MultiHeadAttentionSpec from a `BaseAttention` sublayer: its projections (heads
    major, as CTranslate2 splits them) and LayerNorm. Self-attention takes one fused q|k|v
    projection, cross-attention q then a fused k|v."""
    projections = {name: (_numpy(kernel).T, _numpy(bias))
                   for name, (kernel, bias) in attention.projections(tf.float32).items()}
    query, key, value = (projections[name] for name in ("query", "key", "value"))
    fused = [query, key, value] if self_attention else [key, value]
    linears = iter(spec.linear)
    if not self_attention:
        linear = next(linears)
        linear.weight, linear.bias = query
    linear = next(linears)
    linear.weight, linear.bias = (np.concatenate(parts) for parts in zip(*fused))
    spec.linear[-1].weight, spec.linear[-1].bias = projections["output"]
    _set_layer_norm(spec.layer_norm, attention.layernorm)
