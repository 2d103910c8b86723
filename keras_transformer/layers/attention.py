"""Multi-head attention sublayers (section 3.2): encoder self-attention, masked decoder
self-attention and encoder-decoder (cross) attention, each wrapped in its residual connection.

Each layer computes training and decoding with one function, `attend`, over one set of weights:
a fused q|k|v projection (self-attention) or a query and a fused k|v projection
(cross-attention), as CTranslate2, fairseq and OpenNMT-tf store them, with the query scaled by
1/sqrt(head_dim) in the kernel. `call` (training, teacher forcing) reads the weights from the
variables (`layer_weights`) at every call; the decoding steps (`packed_call` in the encoder,
`step` in the decoder) read them once per batch as tensors (`inference_weights`, where a pre-norm
LayerNorm's scale and offset are also folded into the projection that reads it). Keys and values
are head-major `[batch, heads, length, head_dim]`, so that a cache grows by a concat and is never
transposed, and one position per row is split into heads by a reshape alone: decoding inside a
`tf.while_loop` is bound by the number of ops per step.

Padding is always masked with an explicit additive bias (`attention_bias`), never with Keras'
implicit masks.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.normalization import (LAYER_NORM_EPSILON, LayerNormalization,
                                                    fold_norm)
from keras_transformer.layers.ops import dense, matmul, value
from keras_transformer.layers.residual import residual_connection, residual_input, residual_output

# What keras.ops.dot_product_attention fills masked float32 logits with.
LARGE_NEGATIVE = -0.7 * 3.38953e38


def attention_bias(mask):
    """float32 0 where `mask` is True, `LARGE_NEGATIVE` where it is False: added to attention
    logits, it gives exactly the masked logits (a logit is far below half an ulp of the bias),
    and an add costs less than a broadcasting select at every step."""
    return tf.where(mask, 0.0, LARGE_NEGATIVE)


def padding_bias(mask):
    """`attention_bias` of a padding mask, bool `[batch, len]` (True at real tokens), as
    `[batch, 1, 1, len]`: every query position of every head sees the real keys. None for
    None."""
    return None if mask is None else attention_bias(mask[:, None, None, :])


def causal_bias(length):
    """`attention_bias` of the causal mask: float32 `[1, 1, length, length]`, position t sees
    positions <= t."""
    mask = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
    return attention_bias(mask)[None, None]


def attention_weights(q, key, bias, fused_softmax=False):
    """The softmax of equation 1: float32 `[batch, heads, q_len, len]` for pre-scaled `q`
    `[batch, heads, q_len, dim]` over `key` `[batch, heads, len, dim]`; `bias` from
    `attention_bias`, broadcastable to the result, or None.

    `fused_softmax` computes the softmax with `tf.nn.softmax` (one kernel each way, what a
    training step wants); otherwise in element-wise ops: oneDNN's Softmax kernel, which
    TensorFlow substitutes for tf.nn.softmax, costs more per call on the small, changing
    shapes of a decoding loop. Both are the same function of the logits."""
    logits = matmul(q, key, transpose_b=True)  # [batch, heads, q_len, len]
    if logits.dtype != tf.float32:
        logits = tf.cast(logits, tf.float32)
    if bias is not None:
        logits += bias
    if fused_softmax:
        return tf.nn.softmax(logits)
    exp = tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
    return exp / tf.reduce_sum(exp, axis=-1, keepdims=True)


def dot_product_attention(q, key, value, bias, return_weights=False, fused_softmax=False):
    """Scaled dot-product attention (equation 1) of pre-scaled `q` `[batch, heads, q_len, dim]`
    over `key`/`value` `[batch, heads, len, dim]`; `bias` from `attention_bias`, broadcastable
    to `[batch, heads, q_len, len]`, or None. Returns `[batch, heads, q_len, dim]`, and with
    `return_weights` also `attention_weights` (float32 `[batch, heads, q_len, len]`;
    `fused_softmax`: see there)."""
    probs = attention_weights(q, key, bias, fused_softmax)
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

    The projections are `keras.layers.Dense` weights that `attend` reads (their `call` is never
    used), initialized as `keras.layers.MultiHeadAttention` initializes its per-head kernels:
    Glorot-uniform over `[d_model, heads, head_dim]` for each input projection and
    `[heads, head_dim, d_model]` for the output.
    """

    input_projections: dict  # attribute name -> number of d_model-wide parts (set by subclasses)

    def __init__(self, *, d_model, num_heads, dropout=0.1, norm="post", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dropout = dropout
        self.norm = norm
        self.head_dim = d_model // num_heads
        for name, parts in self.input_projections.items():  # per head: [d_model, head_dim]
            setattr(self, name, self._projection(parts * d_model, name,
                                                 fans=d_model * (num_heads + self.head_dim)))
        self.out = self._projection(d_model, "out", fans=d_model * (1 + num_heads))
        self.layernorm = LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, dtype=self.dtype_policy, name="layernorm")
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def _projection(self, units, name, *, fans):
        limit = math.sqrt(6.0 / fans)
        return keras.layers.Dense(
            units, kernel_initializer=keras.initializers.RandomUniform(-limit, limit),
            dtype=self.dtype_policy, name=name)

    def build(self, input_shape):
        self._build(input_shape)

    def _build(self, x_shape):
        for name in (*self.input_projections, "out"):
            getattr(self, name).build((None, self.d_model))
        self.layernorm.build(x_shape)
        self.built = True

    def _residual(self, x, sublayer, training):
        return residual_connection(x, sublayer, layernorm=self.layernorm,
                                   dropout=self.dropout_layer, norm=self.norm, training=training)

    def layer_weights(self, dtype) -> dict:
        """The weights `attend` reads, tensors of `dtype` read from the variables: each input
        projection `{name}_kernel` `[d_model, parts * d_model]` and `{name}_bias`, its query
        part scaled by 1/sqrt(head_dim), and `out_kernel` `[d_model, d_model]`, `out_bias`."""
        dtype = tf.as_dtype(dtype)
        weights = {}
        for name, parts in self.input_projections.items():
            layer = getattr(self, name)
            kernel, bias = value(layer.kernel, dtype), value(layer.bias, dtype)
            if name in ("qkv", "q"):  # the query comes first
                scale = np.ones(parts * self.d_model, np.float32)
                scale[:self.d_model] = self._scale()
                kernel, bias = kernel * tf.constant(scale, dtype), bias * tf.constant(scale, dtype)
            weights[f"{name}_kernel"], weights[f"{name}_bias"] = kernel, bias
        weights["out_kernel"] = value(self.out.kernel, dtype)
        weights["out_bias"] = value(self.out.bias, dtype)
        return weights

    def inference_weights(self, dtype) -> dict:
        """`layer_weights(dtype)` for the decoding steps: with post-norm also the LayerNorm's
        `norm`; with pre-norm the LayerNorm folded into the first input projection."""
        weights = self.layer_weights(dtype)
        norm = self.layernorm.inference_weights()
        if self.norm == "pre":
            first = next(iter(self.input_projections))
            kernel, bias = f"{first}_kernel", f"{first}_bias"
            weights[kernel], weights[bias] = fold_norm(norm, weights[kernel], weights[bias])
        else:
            weights["norm"] = norm
        return weights

    def projections(self, dtype=None) -> dict:
        """The four projections as `{"query", "key", "value", "output"}: (kernel, bias)`, read
        as `x @ kernel + bias`, unscaled: kernels `[d_model, d_model]` (heads major in the
        output of the query, key and value kernels and in the input of the output kernel),
        biases `[d_model]`; in `dtype` (default: the variables'). What the CTranslate2 export
        writes."""
        dtype = tf.as_dtype(dtype or self.out.kernel.dtype)
        names = iter(("query", "key", "value"))
        result = {}
        for name, parts in self.input_projections.items():
            layer = getattr(self, name)
            kernels = tf.split(value(layer.kernel, dtype), parts, axis=1)
            biases = tf.split(value(layer.bias, dtype), parts)
            result.update({next(names): pair for pair in zip(kernels, biases)})
        result["output"] = (value(self.out.kernel, dtype), value(self.out.bias, dtype))
        return result

    def _scale(self):
        return 1.0 / math.sqrt(float(self.head_dim))

    def _split_heads(self, x, parts, length=1):
        """`x` `[batch, length, parts * d_model]`, or its rows `[batch * length, parts *
        d_model]` with a static `length`, -> `parts` tensors `[batch, heads, length, head_dim]`.
        One position per row (rows, `length` 1) needs a reshape alone: a row is heads-major in
        memory."""
        heads, head_dim = self.num_heads, self.head_dim
        if x.shape.rank == 3:
            length = tf.shape(x)[1]
        elif length == 1:
            if parts == 1:
                return [tf.reshape(x, [-1, heads, 1, head_dim])]
            return tf.unstack(tf.reshape(x, [-1, parts, heads, 1, head_dim]), axis=1)
        if parts == 1:
            return [tf.transpose(tf.reshape(x, [-1, length, heads, head_dim]), [0, 2, 1, 3])]
        x = tf.reshape(x, [-1, length, parts, heads, head_dim])
        return tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]))

    def _merge_heads(self, y, rows):
        """`_split_heads`' inverse for one part: `[batch, heads, length, head_dim]` ->
        `[batch, length, d_model]`, or with `rows` `[batch * length, d_model]`."""
        if y.shape[2] != 1:
            y = tf.transpose(y, [0, 2, 1, 3])
        return tf.reshape(y, [-1, self.d_model] if rows else [tf.shape(y)[0], -1, self.d_model])

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
    """What the encoder's and the decoder's self-attention share: one fused q|k|v projection,
    `qkv`."""

    input_projections = {"qkv": 3}

    def attend(self, weights, h, bias, cache=None, packing=None):
        """The sublayer, without its residual connection: multi-head self-attention of `h`.

        Args:
            weights: `layer_weights(dtype)` or `inference_weights(dtype)`.
            h: `[batch, length, d_model]`; with `packing`, the real tokens' rows `[tokens,
                d_model]`; with `cache`, one position per row `[batch, d_model]`.
            bias: `attention_bias`, broadcastable to `[batch, heads, length, keys]`, or None.
            cache: `{"key", "value"}` `[batch, heads, t, head_dim]`, the positions before.
            packing: a `layers.ops.Packing` of the mask of `h`'s batch.

        Returns:
            The output, shaped as `h`, and the cache with the new position (None without one).
        """
        qkv = dense(h, weights["qkv_kernel"], weights["qkv_bias"])
        if packing is not None:
            qkv = tf.reshape(packing.unpack(qkv), [packing.batch, packing.length, -1])
        q, k, v = self._split_heads(qkv, 3)
        if cache is not None:
            k = tf.concat([cache["key"], k], axis=2)
            v = tf.concat([cache["value"], v], axis=2)
            cache = {"key": k, "value": v}
        sequences = h.shape.rank == 3  # teacher forcing; rows: the decoding steps
        y = self._merge_heads(dot_product_attention(q, k, v, bias, fused_softmax=sequences),
                              rows=not sequences)
        if packing is not None:
            y = packing.pack(y)
        return dense(y, weights["out_kernel"], weights["out_bias"]), cache


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
        bias = padding_bias(padding_mask)
        weights = self.layer_weights(self.compute_dtype)
        return self._residual(x, lambda h: self.attend(weights, h, bias)[0], training)

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
        y, _ = self.attend(weights, residual_input(x, self.norm), bias, packing=packing)
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
        bias = causal_bias(tf.shape(x)[1])
        weights = self.layer_weights(self.compute_dtype)
        return self._residual(x, lambda h: self.attend(weights, h, bias)[0], training)

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
        y, cache = self.attend(weights, residual_input(x, self.norm), None, cache=cache)
        return residual_output(x, y, self.norm, weights), cache


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

    input_projections = {"q": 1, "kv": 2}

    def build(self, x_shape, context_shape=None):
        self._build(x_shape)

    def call(self, x, context, context_mask=None, training=None):
        weights = self.layer_weights(self.compute_dtype)
        memory = self.precompute(weights, context)
        bias = padding_bias(context_mask)
        return self._residual(x, lambda h: self.attend(weights, h, memory, bias), training)

    def attention_scores(self, x, context, context_mask=None):
        """Attention weights float32 `[batch, heads, target_len, source_len]` (for
        inspection)."""
        weights = self.layer_weights(self.compute_dtype)
        bias = padding_bias(context_mask)
        h = self.layernorm(x) if self.norm == "pre" else x
        _, scores = self.attend(weights, h, self.precompute(weights, context), bias,
                                return_weights=True)
        return scores

    def precompute(self, weights, context, packing=None) -> dict:
        """The keys and values of the encoder output, once per batch.

        Args:
            weights: `layer_weights(dtype)` or `inference_weights(dtype)`.
            context: the encoder output `[batch, source_len, d_model]`, or with `packing` its
                real tokens' rows `[tokens, d_model]`.
            packing: a `layers.ops.Packing` of the source mask.

        Returns:
            `{"key", "value"}`, each `[batch, heads, source_len, head_dim]` (with `packing`, at
            padded positions copies of a real token's, which the source mask's bias hides).
        """
        kv = dense(context, weights["kv_kernel"], weights["kv_bias"])
        if packing is not None:
            kv = tf.reshape(packing.unpack(kv), [packing.batch, packing.length, -1])
        key, value_ = self._split_heads(kv, 2)
        return {"key": key, "value": value_}

    def attend(self, weights, h, memory, bias, return_weights=False, beams=1):
        """The sublayer, without its residual connection: `h` attends to `memory`.

        Args:
            weights: `layer_weights(dtype)` or `inference_weights(dtype)`.
            h: `[batch, length, d_model]`, or rows `[batch * beams, d_model]`: one position of
                each of a sentence's `beams` hypotheses, which attend to its memory together
                as the positions of a sequence would.
            memory: `precompute`'s keys and values, one row per sentence.
            bias: `attention_bias` of the source mask, `[batch, 1, 1, source_len]`, or None.
            return_weights: also return the attention weights.

        Returns:
            The output, shaped as `h`, and with `return_weights` the attention weights float32
            `[batch, heads, length, source_len]` (length `beams` for rows).
        """
        q = self._split_heads(dense(h, weights["q_kernel"], weights["q_bias"]), 1, beams)[0]
        sequences = h.shape.rank == 3  # teacher forcing; rows: the decoding steps
        y, probs = dot_product_attention(q, memory["key"], memory["value"], bias,
                                         return_weights=True, fused_softmax=sequences)
        y = dense(self._merge_heads(y, rows=not sequences), weights["out_kernel"],
                  weights["out_bias"])
        return (y, probs) if return_weights else y

    def step(self, weights, x, memory, bias, beams=1, return_attention=False):
        """Decodes one position: `call` over precomputed keys and values.

        Args:
            weights: `inference_weights(dtype)`.
            x: `[batch * beams, d_model]`, one position per row.
            memory: `precompute`'s keys and values, one row per sentence: the `beams`
                consecutive rows of `x` (the beams of one sentence) attend to one row together,
                as the positions of a sequence would: one `[beams, source_len]` attention per
                sentence and head, no tiled copies.
            bias: `attention_bias` of the source mask, `[batch, 1, 1, source_len]`.
            return_attention: also return the attention weights, averaged over the heads.

        Returns:
            `[batch * beams, d_model]`, and with `return_attention` also the attention weights
            float32 `[batch * beams, source_len]` (word alignments read them).
        """
        y, probs = self.attend(weights, residual_input(x, self.norm), memory, bias,
                               return_weights=True, beams=beams)
        y = residual_output(x, y, self.norm, weights)
        if not return_attention:
            return y
        # [batch, heads, beams, len] -> [batch * beams, len]
        return y, tf.reshape(tf.reduce_mean(probs, axis=1), [-1, tf.shape(probs)[-1]])
