"""Translator: a `tf.Module` that turns a batch of strings into a batch of translations.

Everything runs in the TensorFlow graph (tokenize, encode, cached greedy or beam search,
detokenize), so the module exports as a SavedModel that TF Serving runs with no Python.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.config import DecodeConfig
from keras_transformer.model import Transformer
from keras_transformer.tokenizers import END_ID, START_ID, Tokenizer

STRINGS_SPEC = tf.TensorSpec([None], tf.string, name="source")


class Translator(tf.Module):
    """Strings `[batch]` in, `{"translation": string [batch], "score": float32 [batch]}` out.

    Sources longer than the model's `max_length` tokens are truncated to their first
    `max_length - 1` subwords plus END (documented, never an error). Outputs are at most
    source length + `max_extra_length` tokens, capped by the model's `max_length` (section 6.1).

    Args:
        model: a trained `Transformer`.
        source_tokenizer, target_tokenizer: the run's tokenizers (the same object for a joint
            vocabulary).
        decode_config: beam size and length penalty of `__call__` (serving_default).
    """

    def __init__(self, model: Transformer, source_tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer, decode_config: DecodeConfig = DecodeConfig(),
                 name=None):
        super().__init__(name=name)
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.decode_config = decode_config
        # The session-based loader (saved_model_cli, TF Serving) finds variables only if the
        # module tracks the tf.Variables themselves, not Keras 3's wrappers around them.
        self.model_variables = [w.value for w in model.weights]

    @tf.function(input_signature=[STRINGS_SPEC])
    def __call__(self, source):
        """Beam search with the configured beam size and length penalty."""
        return self.translate_beam(source)

    @tf.function(input_signature=[STRINGS_SPEC])
    def translate_greedy(self, source):
        """Greedy decoding: `{"translation": string [batch], "score": float32 [batch]}` with the
        sum of the tokens' log-probabilities as score."""
        source_ids, max_lengths, max_length = self._encode_inputs(source)
        batch_size = tf.shape(source_ids)[0]
        step_fn = self._step_function(source_ids)
        ids, scores = decoding.greedy_search(
            step_fn, self.model.init_cache(batch_size, max_length), batch_size=batch_size,
            max_length=max_length, start_id=START_ID, end_id=END_ID, max_lengths=max_lengths)
        return {"translation": self.target_tokenizer.detokenize(ids), "score": scores}

    @tf.function(input_signature=[STRINGS_SPEC])
    def translate_beam(self, source):
        """Beam search: `{"translation": string [batch], "score": float32 [batch]}` with the
        length-normalized log-probability log P / lp as score."""
        source_ids, max_lengths, max_length = self._encode_inputs(source)
        batch_size = tf.shape(source_ids)[0]
        beam_size = self.decode_config.beam_size
        step_fn = self._step_function(source_ids, beam_size)
        ids, scores = decoding.beam_search(
            step_fn, self.model.init_cache(batch_size, max_length), batch_size=batch_size,
            beam_size=beam_size, max_length=max_length,
            alpha=self.decode_config.alpha, start_id=START_ID, end_id=END_ID,
            max_lengths=max_lengths)
        return {"translation": self.target_tokenizer.detokenize(ids[:, 0]),
                "score": scores[:, 0]}

    def _encode_inputs(self, source):
        """Source strings -> (ids int32 [batch, len], per-sentence output caps int32 [batch],
        the batch's longest cap int32 [])."""
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
        return source_ids, max_lengths, max_length

    def _step_function(self, source_ids, beam_size=1):
        """The search's `symbols_to_logits_fn`: the decoder step over the encoded source.

        The encoder output's cross-attention keys/values never change while decoding, so they
        are captured here (tiled to the beams) rather than carried, and reordered, in the state.
        """
        context, source_mask = self.model.encode(source_ids, training=False)
        memory = self.model.precompute_context(context, source_mask)
        if beam_size > 1:
            memory = tf.nest.map_structure(lambda t: decoding.tile_beams(t, beam_size), memory)
        return lambda ids, step, state: self.model.decode_step(ids, step, state, memory)
