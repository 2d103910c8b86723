"""Multi-head attention sublayers (section 3.2): encoder self-attention, masked decoder
self-attention and encoder-decoder (cross) attention, each wrapped in its residual connection.

Padding is always masked with an explicit `attention_mask`, never with Keras' implicit masks:
`keras.layers.MultiHeadAttention` drops the implicit mask of its key/value inputs after the first
use, so cross-attention in every decoder layer but the first would attend to source padding.
"""

import math

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.residual import LAYER_NORM_EPSILON, residual_connection


@keras.saving.register_keras_serializable(package="keras_transformer")
class CachedMultiHeadAttention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` that can also attend to precomputed keys and values.

    Incremental decoding computes the keys and values of each token once: the encoder output's
    for cross-attention before the first step, and one new position of the decoder's
    self-attention cache per step. `project_key_value` and `attend` split the layer's `call`
    at that point, reusing its own projections, so the cached path has the same weights and
    the same arithmetic as the full one.
    """

    def project_key_value(self, x):
        """`[batch, length, d_model]` -> key and value, each head-major
        `[batch, heads, length, head_dim]`: the layout the attention matmuls read, so a cache
        is never transposed again at each step (Keras' einsums would copy it every time)."""
        return (tf.transpose(self.key_dense(x), [0, 2, 1, 3]),
                tf.transpose(self.value_dense(x), [0, 2, 1, 3]))

    def attend(self, query, key, value, attention_mask=None):
        """Attends from `query` `[batch, q_len, d_model]` to projected `key`/`value`
        `[batch, heads, kv_len, head_dim]`; `attention_mask` bool broadcastable to
        `[batch, q_len, kv_len]`. Returns `[batch, q_len, d_model]`. Inference only (no dropout).

        The arithmetic of Keras' `dot_product_attention` (scaled float32 logits, masked
        positions at the dtype's large negative, float32 softmax), as batched matmuls.
        """
        query = tf.transpose(self.query_dense(query), [0, 2, 1, 3])  # [batch, heads, q, dim]
        logits = tf.matmul(query, key, transpose_b=True)  # [batch, heads, q_len, kv_len]
        logits = tf.cast(logits, "float32") * (1.0 / math.sqrt(float(self.key_dim)))
        if attention_mask is not None:
            logits = tf.where(attention_mask[:, None], logits, _LARGE_NEGATIVE)
        probs = tf.cast(tf.nn.softmax(logits), value.dtype)
        output = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])  # [batch, q_len, heads, dim]
        return self.output_dense(output)


# What keras.ops.dot_product_attention fills masked float32 logits with.
_LARGE_NEGATIVE = -0.7 * 3.38953e38


class BaseAttention(keras.layers.Layer):
    """Multi-head attention with dropout, residual connection and LayerNorm.

    Args:
        d_model: model width; each of the `num_heads` heads has `d_model // num_heads`
            dimensions, as in the paper (the tutorial's `key_dim=d_model` is h times wider).
        num_heads: number of attention heads.
        dropout: rate on the attention output before the residual sum.
        norm: "post" (the paper) or "pre" LayerNorm placement.
    """

    def __init__(self, *, d_model, num_heads, dropout=0.1, norm="post", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dropout = dropout
        self.norm = norm
        self.mha = CachedMultiHeadAttention(
            num_heads=num_heads, key_dim=d_model // num_heads, dtype=self.dtype_policy, name="mha")
        self.layernorm = LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, dtype=self.dtype_policy, name="layernorm")
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self._build(input_shape, input_shape)

    def _build(self, x_shape, context_shape):
        self.mha.build(x_shape, context_shape)
        self.layernorm.build(x_shape)
        self.built = True

    def _residual(self, x, sublayer, training):
        return residual_connection(x, sublayer, layernorm=self.layernorm,
                                   dropout=self.dropout_layer, norm=self.norm, training=training)

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, dropout=self.dropout,
                      norm=self.norm)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class GlobalSelfAttention(BaseAttention):
    """Encoder self-attention: every position attends to every non-padding position.

    Call arguments:
        x: `[batch, source_len, d_model]`.
        padding_mask: bool `[batch, source_len]`, True at real tokens.

    Returns:
        `[batch, source_len, d_model]`.
    """

    def call(self, x, padding_mask=None, training=None):
        attention_mask = None if padding_mask is None else padding_mask[:, None, :]
        return self._residual(
            x, lambda h: self.mha(h, h, attention_mask=attention_mask, training=training),
            training)


@keras.saving.register_keras_serializable(package="keras_transformer")
class CausalSelfAttention(BaseAttention):
    """Masked decoder self-attention: position t attends to positions <= t only.

    Target padding needs no mask of its own: it only ever follows the real tokens, so the causal
    mask already hides it from every real position.

    Call arguments:
        x: `[batch, target_len, d_model]`.

    Returns:
        `[batch, target_len, d_model]`.
    """

    def call(self, x, training=None):
        return self._residual(
            x, lambda h: self.mha(h, h, use_causal_mask=True, training=training), training)

    def step(self, x, cache_key, cache_value, index, growing=False):
        """One decoding step with a key/value cache.

        Args:
            x: `[batch, 1, d_model]`, the input at position `index`.
            cache_key, cache_value: `[batch, heads, cache_len, head_dim]`. A fixed-length cache
                (`growing=False`, the shape XLA needs) is filled for positions `< index` and
                position `index` is written into it; a growing cache holds exactly the
                positions `< index` and the new one is appended, so attention and beam
                reordering cost what the sentence has produced, not what it might.
            index: int32 scalar, the current position.

        Returns:
            `(y [batch, 1, d_model], cache_key, cache_value)` with position `index` included.
        """
        if growing:
            attention_mask = None  # every cached position precedes or is the query's
        else:
            max_len = ops.shape(cache_key)[2]
            attention_mask = (tf.range(max_len) <= index)[None, None, :]  # [1, 1, max_len]
        caches = {}

        def attend(h):
            key, value = self.mha.project_key_value(h)  # [batch, heads, 1, head_dim]
            if growing:
                caches["key"] = tf.concat([cache_key, key], axis=2)
                caches["value"] = tf.concat([cache_value, value], axis=2)
            else:
                caches["key"] = write_position(cache_key, key, index)
                caches["value"] = write_position(cache_value, value, index)
            return self.mha.attend(h, caches["key"], caches["value"], attention_mask)

        y = self._residual(x, attend, training=False)
        return y, caches["key"], caches["value"]


@keras.saving.register_keras_serializable(package="keras_transformer")
class CrossAttention(BaseAttention):
    """Encoder-decoder attention: decoder positions attend to the encoder output.

    Call arguments:
        x: decoder states `[batch, target_len, d_model]`.
        context: encoder output `[batch, source_len, d_model]`.
        context_mask: bool `[batch, source_len]`, True at real source tokens.

    Returns:
        `[batch, target_len, d_model]`.
    """

    def build(self, x_shape, context_shape):
        self._build(x_shape, context_shape)

    def call(self, x, context, context_mask=None, training=None):
        attention_mask = None if context_mask is None else context_mask[:, None, :]
        return self._residual(
            x, lambda h: self.mha(h, context, attention_mask=attention_mask, training=training),
            training)

    def attention_scores(self, x, context, context_mask=None):
        """Attention weights `[batch, heads, target_len, source_len]` (for inspection)."""
        query = self.layernorm(x) if self.norm == "pre" else x
        attention_mask = None if context_mask is None else context_mask[:, None, :]
        _, scores = self.mha(query, context, attention_mask=attention_mask,
                             return_attention_scores=True)
        return scores

    def step(self, x, key, value, context_mask):
        """Cross-attention of one decoder position to precomputed encoder keys/values.

        Args:
            x: `[batch, 1, d_model]`.
            key, value: `[batch, heads, source_len, head_dim]` from `mha.project_key_value`.
            context_mask: bool `[batch, source_len]`.
        """
        return self._residual(
            x, lambda h: self.mha.attend(h, key, value, context_mask[:, None, :]), training=False)


def write_position(cache, update, index):
    """Writes `update` `[batch, heads, 1, head_dim]` into `cache` `[batch, heads, max_len,
    head_dim]` at position `index`.

    A scatter keeps the cache's shape fixed, which `tf.while_loop` under XLA needs, and uses
    only core TensorFlow ops, which TF Serving needs.
    """
    batch, heads = tf.shape(cache)[0], tf.shape(cache)[1]
    rows, head = tf.meshgrid(tf.range(batch), tf.range(heads), indexing="ij")  # [batch, heads]
    indices = tf.stack([rows, head, tf.fill(tf.shape(rows), index)], axis=-1)  # [batch, heads, 3]
    return tf.tensor_scatter_nd_update(cache, indices, update[:, :, 0])
