"""The decoder stack (section 3.1, right half of figure 1), with incremental decoding."""

import keras
import tensorflow as tf

from keras_transformer.layers.attention import CausalSelfAttention, CrossAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, cross-attention to the encoder output, then feed-forward.

    Call arguments:
        x: `[batch, target_len, d_model]`.
        context: encoder output `[batch, source_len, d_model]`.
        context_mask: bool `[batch, source_len]`, True at real source tokens.

    Returns:
        `[batch, target_len, d_model]`.
    """

    def __init__(self, *, d_model, num_heads, dff, dropout=0.1, norm="post", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        sublayer_args = dict(d_model=d_model, dropout=dropout, norm=norm, dtype=self.dtype_policy)
        self.causal_self_attention = CausalSelfAttention(
            num_heads=num_heads, name="causal_self_attention", **sublayer_args)
        self.cross_attention = CrossAttention(
            num_heads=num_heads, name="cross_attention", **sublayer_args)
        self.ffn = FeedForward(dff=dff, name="ffn", **sublayer_args)

    def build(self, x_shape, context_shape):
        self.causal_self_attention.build(x_shape)
        self.cross_attention.build(x_shape, context_shape)
        self.ffn.build(x_shape)
        self.built = True

    def call(self, x, context, context_mask=None, training=None):
        x = self.causal_self_attention(x, training=training)
        x = self.cross_attention(x, context, context_mask=context_mask, training=training)
        return self.ffn(x, training=training)

    def cross_attention_scores(self, x, context, context_mask=None):
        """The cross-attention weights `[batch, heads, target_len, source_len]` of this layer."""
        x = self.causal_self_attention(x)
        return self.cross_attention.attention_scores(x, context, context_mask)

    def precompute_context(self, context):
        """The cross-attention keys and values of the encoder output, computed once per batch:
        `{"key", "value"}`, each `[batch, heads, source_len, head_dim]`."""
        key, value = self.cross_attention.mha.project_key_value(context)
        return {"key": key, "value": value}

    def init_cache(self, batch_size, max_decode_length, dtype):
        """Zero self-attention caches `{"key", "value"}`, each `[batch, heads, max_decode_length,
        head_dim]`, written one position per decoding step (`max_decode_length` 0: a growing cache,
        see `CausalSelfAttention.step`)."""
        shape = [batch_size, self.num_heads, max_decode_length, self.d_model // self.num_heads]
        zeros = tf.zeros(shape, dtype=dtype)
        return {"key": zeros, "value": zeros}

    def step(self, x, index, cache, context, context_mask, growing=False):
        """Decodes position `index`.

        Args:
            x: `[batch, 1, d_model]`.
            index: int32 scalar.
            cache: this layer's self-attention cache (`init_cache`), filled below `index`.
            context: this layer's `precompute_context`.
            context_mask: bool `[batch, source_len]`.
            growing: whether `cache` grows by one position per step (see
                `CausalSelfAttention.step`) or has a fixed length.

        Returns:
            `([batch, 1, d_model], cache)` with position `index` written into the cache.
        """
        x, key, value = self.causal_self_attention.step(x, cache["key"], cache["value"], index,
                                                        growing=growing)
        x = self.cross_attention.step(x, context["key"], context["value"], context_mask)
        x = self.ffn(x, training=False)
        return x, {"key": key, "value": value}

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, dff=self.dff,
                      dropout=self.dropout, norm=self.norm)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(LayerStack):
    """A stack of `num_layers` DecoderLayers over embedded target tokens.

    As in the Encoder, the model owns the embedding; with pre-norm a final LayerNorm follows.

    Args:
        num_layers, d_model, num_heads, dff, dropout, norm: see `DecoderLayer`.

    Call arguments:
        x: embedded target `[batch, target_len, d_model]`.
        context: encoder output `[batch, source_len, d_model]`.
        context_mask: bool `[batch, source_len]`, True at real source tokens.

    Returns:
        `[batch, target_len, d_model]`.
    """

    layer_class = DecoderLayer

    def build(self, x_shape, context_shape):
        for layer in self.stack:
            layer.build(x_shape, context_shape)
        self._build_final_layernorm(x_shape)

    def call(self, x, context, context_mask=None, training=None):
        for layer in self.stack:
            x = layer(x, context, context_mask=context_mask, training=training)
        return self._finish(x)

    def cross_attention_scores(self, x, context, context_mask=None):
        """The last layer's cross-attention weights `[batch, heads, target_len, source_len]`."""
        for layer in self.stack[:-1]:
            x = layer(x, context, context_mask=context_mask)
        return self.stack[-1].cross_attention_scores(x, context, context_mask)

    def precompute_context(self, context):
        """Per layer, the cross-attention keys/values of `context` (see `DecoderLayer`)."""
        return [layer.precompute_context(context) for layer in self.stack]

    def init_cache(self, batch_size, max_decode_length, dtype):
        """Per layer, zero self-attention caches (see `DecoderLayer.init_cache`)."""
        return [layer.init_cache(batch_size, max_decode_length, dtype) for layer in self.stack]

    def step(self, x, index, caches, contexts, context_mask, growing=False):
        """Decodes position `index`: `x` `[batch, 1, d_model]` -> `([batch, 1, d_model], caches)`."""
        new_caches = []
        for layer, cache, context in zip(self.stack, caches, contexts):
            x, cache = layer.step(x, index, cache, context, context_mask, growing=growing)
            new_caches.append(cache)
        return self._finish(x), new_caches
