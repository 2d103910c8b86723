"""Multi-head attention sublayers (section 3.2): encoder self-attention, masked decoder
self-attention and encoder-decoder (cross) attention, each wrapped in its residual connection.

Each layer holds its training computation (`call`, through `keras.layers.MultiHeadAttention`)
and beside it its decoding computation over its own weights' tensors (`inference_weights`,
then `packed_call` in the encoder, `step` in the decoder): one fused q|k|v projection with the
query pre-scaled by 1/sqrt(head_dim), as CTranslate2 and fairseq do; head-major
`[batch, heads, length, head_dim]` keys and values, so that a cache is reshaped and never
transposed; in pre-norm layers the LayerNorm's scale and offset folded into the projection that
reads it. Decoding inside a `tf.while_loop` is bound by the number of ops per step, which these
steps keep small; tests check them against the teacher-forced `call`.

Padding is always masked with an explicit `attention_mask`, never with Keras' implicit masks:
`keras.layers.MultiHeadAttention` drops the implicit mask of its key/value inputs after the first
use, so cross-attention in every decoder layer but the first would attend to source padding.
"""

import math

import keras
import tensorflow as tf

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.normalization import LAYER_NORM_EPSILON, LayerNormalization, fold_norm
from keras_transformer.layers.ops import matmul, value
from keras_transformer.layers.residual import residual_connection, residual_input, residual_output

# What keras.ops.dot_product_attention fills masked float32 logits with.
LARGE_NEGATIVE = -0.7 * 3.38953e38


def attention_bias(mask):
    """float32 0 where `mask` is True, `LARGE_NEGATIVE` where it is False: added to attention
    logits, it gives exactly the masked logits (a logit is far below half an ulp of the bias),
    and an add costs less than a broadcasting select at every step."""
    return tf.where(mask, 0.0, LARGE_NEGATIVE)


def attention_weights(q, key, bias):
    """The softmax of equation 1: float32 `[batch, heads, q_len, len]` for pre-scaled `q`
    `[batch, heads, q_len, dim]` over `key` `[batch, heads, len, dim]`; `bias` from
    `attention_bias`, broadcastable to the result, or None."""
    logits = matmul(q, key, transpose_b=True)  # [batch, heads, q_len, len]
    if logits.dtype != tf.float32:
        logits = tf.cast(logits, tf.float32)
    if bias is not None:
        logits += bias
    # Softmax's arithmetic in element-wise ops: oneDNN's Softmax kernel, which TensorFlow
    # substitutes for tf.nn.softmax, costs more per call on the loop's small, changing shapes.
    exp = tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
    return exp / tf.reduce_sum(exp, axis=-1, keepdims=True)


def dot_product_attention(q, key, value, bias, return_weights=False):
    """Scaled dot-product attention (equation 1) of pre-scaled `q` `[batch, heads, q_len, dim]`
    over `key`/`value` `[batch, heads, len, dim]`; `bias` from `attention_bias`, broadcastable
    to `[batch, heads, q_len, len]`, or None. Returns `[batch, heads, q_len, dim]`, and with
    `return_weights` also `attention_weights` (float32 `[batch, heads, q_len, len]`)."""
    probs = attention_weights(q, key, bias)
    y = matmul(probs if probs.dtype == value.dtype else tf.cast(probs, value.dtype), value)
    return (y, probs) if return_weights else y


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
        self.head_dim = d_model // num_heads
        self.mha = keras.layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=self.head_dim, dtype=self.dtype_policy, name="mha")
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

    def projections(self, dtype=None) -> dict:
        """The four projections as `{"query", "key", "value", "output"}: (kernel, bias)`, read
        as `x @ kernel + bias`: kernels `[d_model, d_model]` (heads major in the output of the
        query, key and value kernels and in the input of the output kernel), biases `[d_model]`;
        in `dtype` (default: the variables'). What the decoding steps fuse and the CTranslate2
        export transposes."""
        d, mha = self.d_model, self.mha
        denses = {"query": mha.query_dense, "key": mha.key_dense, "value": mha.value_dense,
                  "output": mha.output_dense}
        dtype = dtype or tf.as_dtype(mha.query_dense.kernel.dtype)
        return {name: (tf.reshape(value(dense.kernel, dtype), [d, d]),
                       tf.reshape(value(dense.bias, dtype), [d]))
                for name, dense in denses.items()}

    def _output_weights(self, projections, weights: dict, first_projection: str) -> dict:
        """Adds the output projection and the norm to `weights`; pre-norm: folds the norm into
        the sublayer's first projection, `{first_projection}_kernel` and `_bias`."""
        weights["out_kernel"], weights["out_bias"] = projections["output"]
        norm = self.layernorm.inference_weights()
        if self.norm == "pre":
            kernel, bias = f"{first_projection}_kernel", f"{first_projection}_bias"
            weights[kernel], weights[bias] = fold_norm(norm, weights[kernel], weights[bias])
        else:
            weights["norm"] = norm
        return weights

    def _scale(self):
        return 1.0 / math.sqrt(float(self.head_dim))

    def compute_output_shape(self, *shapes, **named_shapes):
        # The input's shape, however the build arguments name it (`summary()` passes them by
        # the names of `build`'s parameters).
        return (shapes or tuple(named_shapes.values()))[0]

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, dropout=self.dropout,
                      norm=self.norm)
        return config


class _SelfAttention(BaseAttention):
    """What the encoder's and the decoder's self-attention share: one fused q|k|v projection
    in the decoding steps."""

    def inference_weights(self, dtype) -> dict:
        """The weights the decoding steps read, tensors of `dtype`: a fused, query-scaled
        `qkv_kernel` `[d_model, 3 d_model]` and `qkv_bias` `[3 d_model]`, `out_kernel`
        `[d_model, d_model]` and `out_bias`, and (post-norm) the LayerNorm's `norm`."""
        projections, scale = self.projections(dtype), self._scale()
        (q_kernel, q_bias), (k_kernel, k_bias), (v_kernel, v_bias) = (
            projections[name] for name in ("query", "key", "value"))
        weights = {"qkv_kernel": tf.concat([q_kernel * scale, k_kernel, v_kernel], axis=1),
                   "qkv_bias": tf.concat([q_bias * scale, k_bias, v_bias], axis=0)}
        return self._output_weights(projections, weights, "qkv")


@keras.saving.register_keras_serializable(package="keras_transformer")
class GlobalSelfAttention(_SelfAttention):
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

    def packed_call(self, weights, x, packing, bias):
        """`call` for inference on the real tokens' rows.

        Args:
            weights: `inference_weights(dtype)`.
            x: `[tokens, d_model]`, the rows of `packing`.
            packing: a `layers.ops.Packing` of the source mask.
            bias: `attention_bias` of the source mask, `[batch, 1, 1, source_len]`.

        Returns:
            `[tokens, d_model]`.
        """
        heads, head_dim = self.num_heads, self.head_dim
        h = residual_input(x, self.norm)
        qkv = packing.unpack(matmul(h, weights["qkv_kernel"]) + weights["qkv_bias"])
        qkv = tf.transpose(tf.reshape(qkv, [packing.batch, packing.length, 3, heads, head_dim]),
                           [2, 0, 3, 1, 4])  # [3, batch, heads, len, head_dim]
        y = dot_product_attention(qkv[0], qkv[1], qkv[2], bias)  # [batch, heads, len, head_dim]
        y = packing.pack(tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [-1, self.d_model]))
        y = matmul(y, weights["out_kernel"]) + weights["out_bias"]
        return residual_output(x, y, self.norm, weights)


@keras.saving.register_keras_serializable(package="keras_transformer")
class CausalSelfAttention(_SelfAttention):
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

    def init_cache(self, batch_size, dtype) -> dict:
        """Empty keys and values `{"key", "value"}`, each `[batch, heads, 0, head_dim]`: the
        cache grows by one position per step, so attention and beam reordering cost what the
        sentence has produced, not what it might."""
        zeros = tf.zeros([batch_size, self.num_heads, 0, self.head_dim], dtype)
        return {"key": zeros, "value": zeros}

    def step(self, weights, x, cache):
        """Decodes one position: `call` at the position after the cache's.

        Args:
            weights: `inference_weights(dtype)`.
            x: `[batch, d_model]`, one position per row.
            cache: `{"key", "value"}` `[batch, heads, t, head_dim]`, the positions before.

        Returns:
            `([batch, d_model], cache)`, the cache `[batch, heads, t + 1, head_dim]`.
        """
        heads, head_dim = self.num_heads, self.head_dim
        h = residual_input(x, self.norm)
        qkv = matmul(h, weights["qkv_kernel"]) + weights["qkv_bias"]
        # [batch, d_model] is [batch, heads, 1, head_dim] in memory: a reshape, no transpose
        q, k, v = tf.unstack(tf.reshape(qkv, [-1, 3, heads, 1, head_dim]), axis=1)
        key = tf.concat([cache["key"], k], axis=2)
        value = tf.concat([cache["value"], v], axis=2)
        y = tf.reshape(dot_product_attention(q, key, value, None), [-1, self.d_model])
        y = matmul(y, weights["out_kernel"]) + weights["out_bias"]
        return residual_output(x, y, self.norm, weights), {"key": key, "value": value}


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

    def inference_weights(self, dtype) -> dict:
        """The weights the decoding steps read, tensors of `dtype`: the query-scaled `q_kernel`
        `[d_model, d_model]` and `q_bias`, a fused `kv_kernel` `[d_model, 2 d_model]` and
        `kv_bias`, `out_kernel` and `out_bias`, and (post-norm) the LayerNorm's `norm`."""
        projections, scale = self.projections(dtype), self._scale()
        (q_kernel, q_bias), (k_kernel, k_bias), (v_kernel, v_bias) = (
            projections[name] for name in ("query", "key", "value"))
        weights = {"q_kernel": q_kernel * scale, "q_bias": q_bias * scale,
                   "kv_kernel": tf.concat([k_kernel, v_kernel], axis=1),
                   "kv_bias": tf.concat([k_bias, v_bias], axis=0)}
        return self._output_weights(projections, weights, "q")

    def precompute(self, weights, context, packing) -> dict:
        """The keys and values of the encoder output, once per batch.

        Args:
            weights: `inference_weights(dtype)`.
            context: the encoder output's real tokens `[tokens, d_model]`, rows of `packing`.
            packing: a `layers.ops.Packing` of the source mask.

        Returns:
            `{"key", "value"}`, each `[batch, heads, source_len, head_dim]` (at padded positions,
            copies of a real token's, which the source mask's bias hides).
        """
        kv = packing.unpack(matmul(context, weights["kv_kernel"]) + weights["kv_bias"])
        kv = tf.reshape(kv, [packing.batch, packing.length, 2, self.num_heads, self.head_dim])
        kv = tf.transpose(kv, [2, 0, 3, 1, 4])  # [2, batch, heads, len, head_dim]
        return {"key": kv[0], "value": kv[1]}

    def step(self, weights, x, memory, bias, beams=1, return_attention=False):
        """Decodes one position: `call` over precomputed keys and values.

        Args:
            weights: `inference_weights(dtype)`.
            x: `[batch * beams, d_model]`, one position per row.
            memory: `precompute`'s keys and values, one row per sentence: the `beams`
                consecutive rows of `x` (the beams of one sentence) attend to one row together,
                one `[beams, source_len]` attention per sentence and head, no tiled copies.
            bias: `attention_bias` of the source mask, `[batch, 1, 1, source_len]`.
            return_attention: also return the attention weights, averaged over the heads.

        Returns:
            `[batch * beams, d_model]`, and with `return_attention` also the attention weights
            float32 `[batch * beams, source_len]` (word alignments read them).
        """
        heads, head_dim, d = self.num_heads, self.head_dim, self.d_model
        h = residual_input(x, self.norm)
        q = matmul(h, weights["q_kernel"]) + weights["q_bias"]
        if beams == 1:
            y, probs = dot_product_attention(tf.reshape(q, [-1, heads, 1, head_dim]),
                                             memory["key"], memory["value"], bias,
                                             return_weights=True)
        else:
            q = tf.transpose(tf.reshape(q, [-1, beams, heads, head_dim]), [0, 2, 1, 3])
            y, probs = dot_product_attention(q, memory["key"], memory["value"], bias,
                                             return_weights=True)
            y = tf.transpose(y, [0, 2, 1, 3])
        y = matmul(tf.reshape(y, [-1, d]), weights["out_kernel"]) + weights["out_bias"]
        y = residual_output(x, y, self.norm, weights)
        if not return_attention:
            return y
        # [batch, heads, beams, len] -> [batch * beams, len]
        return y, tf.reshape(tf.reduce_mean(probs, axis=1), [-1, tf.shape(probs)[-1]])
