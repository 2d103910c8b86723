"""The decoder's inference step over the trained weights' tensors, for the searches' loop.

`Transformer.decode_step` runs one decoding step through the Keras layers: every sublayer call
goes through Keras' `__call__` machinery and its einsums, transposes and casts, which inside a
`tf.while_loop` become graph nodes executed at every step. For the small models this package
trains, decoding is bound by that per-op overhead rather than by arithmetic. `DecoderStep` does
the same arithmetic with the fewest TensorFlow ops: it reads the weights of the model's own
layers (the one source of truth, read once per batch) and

- projects self-attention queries, keys and values with one fused `[d_model, 3 d_model]` matmul
  (query part pre-scaled by 1/sqrt(head_dim)), as CTranslate2 and fairseq do;
- keeps head-major caches `[batch, heads, length, head_dim]` and reshapes, never transposes, the
  one new position (`[batch, d_model]` is `[batch, heads, 1, head_dim]` in memory);
- projects the encoder output's cross-attention keys/values once per batch (fused k|v), and
  in beam search lets the beams of a sentence attend to them together (one `[beam,
  source_len]` attention per sentence and head, no tiled copies);
- computes LayerNorm with Keras' float32 statistics in as few ops as it takes, and in
  pre-norm layers folds its scale and offset into the projection that reads it (gamma into
  the kernel's rows, beta @ kernel into the bias), as an inference graph would fold a batch
  norm into its convolution;
- multiplies float32 matrices with Eigen's kernel rather than oneDNN's (see `_matmul`), except
  for the output projection, whose `[d_model, vocab]` kernel is large enough for oneDNN to win.

`EncoderPass` does the same for the encoder (one fused q|k|v matmul per layer instead of
Keras' three einsums and their transposes). Its dense layers, LayerNorms and residual sums
run on the real source tokens only, packed as `[tokens, d_model]` rows; only attention sees
the padded `[batch, source_len]` layout. A batch's sources differ in subwords even when sorted
by words, and padding is work no output needs. `DecoderStep.precompute` projects the
cross-attention keys/values of the real tokens alone the same way. XLA needs static shapes:
`pack=False` keeps every position.

`Transformer.decode_step` and `Transformer.encode` stay the references: tests check that both
paths give the same logits and encoder outputs.
"""

from __future__ import annotations

import functools
import math

import tensorflow as tf

from keras_transformer.layers.residual import LAYER_NORM_EPSILON
from keras_transformer.model import Transformer
from keras_transformer.tokenizers import PAD_ID

# What keras.ops.dot_product_attention fills masked float32 logits with (as layers.attention).
_LARGE_NEGATIVE = -0.7 * 3.38953e38


class DecoderStep:
    """One cached decoding step of a `Transformer` without its Keras layers.

    Usage, inside one `tf.function` per batch:

        fast = DecoderStep(model)
        weights = fast.read_weights()                    # tensors, read once per batch
        memory = fast.precompute(weights, context, source_mask)
        cache = fast.init_cache(batch_size)              # growing caches
        logits, cache = fast.step(weights, ids, step, cache, memory)

    The state and memory are nested structures whose tensors have the batch as leading
    dimension (beam search tiles and reorders them). Compared with `Transformer.decode_step`,
    the logits agree to float32 rounding.
    """

    def __init__(self, model: Transformer, pack: bool = True):
        self.model = model
        self.pack = pack  # precompute: project the real source tokens only
        config = model.config
        self.num_layers = config.num_layers
        self.d_model = config.d_model
        self.num_heads = config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.pre_norm = config.norm == "pre"
        self.dtype = tf.as_dtype(model.compute_dtype)

    # ------------------------------------------------------------------ weights

    def read_weights(self) -> dict:
        """The decoder's weights as tensors in the step's layout (call inside the tf.function,
        once per batch, so that the loop body reads no variable)."""
        model, d = self.model, self.d_model
        scale = 1.0 / math.sqrt(float(self.head_dim))
        value = functools.partial(_value, dtype=self.dtype)
        norm = _norm_weights

        layers = []
        for layer in model.decoder.stack:
            self_mha = layer.causal_self_attention.mha
            cross_mha = layer.cross_attention.mha
            layers.append({
                "self_norm": norm(layer.causal_self_attention.layernorm),
                **_fused_qkv(self_mha, d, scale, self.dtype),
                "self_out_kernel": tf.reshape(value(self_mha.output_dense.kernel), [d, d]),
                "self_out_bias": value(self_mha.output_dense.bias),
                "cross_norm": norm(layer.cross_attention.layernorm),
                "cross_q_kernel": tf.reshape(value(cross_mha.query_dense.kernel), [d, d]) * scale,
                "cross_q_bias": tf.reshape(value(cross_mha.query_dense.bias), [d]) * scale,
                "cross_kv_kernel": tf.concat([
                    tf.reshape(value(cross_mha.key_dense.kernel), [d, d]),
                    tf.reshape(value(cross_mha.value_dense.kernel), [d, d])], axis=1),  # [d, 2d]
                "cross_kv_bias": tf.concat([
                    tf.reshape(value(cross_mha.key_dense.bias), [d]),
                    tf.reshape(value(cross_mha.value_dense.bias), [d])], axis=0),  # [2d]
                "cross_out_kernel": tf.reshape(value(cross_mha.output_dense.kernel), [d, d]),
                "cross_out_bias": value(cross_mha.output_dense.bias),
                **_feed_forward_weights(layer.ffn, self.dtype),
            })
            if self.pre_norm:
                _fold_norm(layers[-1], "self_norm", "qkv_kernel", "qkv_bias")
                _fold_norm(layers[-1], "cross_norm", "cross_q_kernel", "cross_q_bias")
                _fold_norm(layers[-1], "ffn_norm", "inner_kernel", "inner_bias")
        embedding = model.target_embedding
        weights = _embedding_weights(embedding, layers)
        if model.decoder.final_layernorm is not None:
            weights["final_norm"] = norm(model.decoder.final_layernorm)
        if model.final_layer is not None:
            weights["logits_kernel"] = value(model.final_layer.kernel)  # [d, vocab]
            weights["logits_bias"] = value(model.final_layer.bias)
        else:  # the shared embedding matrix, transposed once per batch: oneDNN's matmul
            # reads a [d, vocab] kernel faster than a transposed [vocab, d] one
            weights["logits_embeddings_t"] = tf.transpose(
                value(embedding.token_embedding.embeddings))  # [d, vocab]
        return weights

    # ------------------------------------------------------------------ per batch

    def precompute(self, weights: dict, context, source_mask) -> dict:
        """The cross-attention keys/values of the encoder output and the source mask as an
        attention bias: `{"bias": float32 [batch, 1, 1, source_len], "layers": [{"key",
        "value"} [batch, heads, source_len, head_dim]]}`. With `pack`, a padded position's key
        and value are copies of a real token's (see `_padded_rows`)."""
        batch, length = tf.shape(context)[0], tf.shape(context)[1]
        flat = tf.reshape(tf.cast(context, self.dtype), [-1, self.d_model])  # [batch * len, d]
        if self.pack:
            flat = tf.gather(flat, _real_rows(source_mask))  # [tokens, d]
            padded_rows = _padded_rows(source_mask)
        layers = []
        for layer in weights["layers"]:
            kv = _matmul(flat, layer["cross_kv_kernel"]) + layer["cross_kv_bias"]
            if self.pack:
                kv = tf.gather(kv, padded_rows)  # [batch * len, 2d]
            kv = tf.reshape(kv, [batch, length, 2, self.num_heads, self.head_dim])
            kv = tf.transpose(kv, [2, 0, 3, 1, 4])  # [2, batch, heads, len, head_dim]
            layers.append({"key": kv[0], "value": kv[1]})
        return {"bias": _attention_bias(source_mask[:, None, None, :]), "layers": layers}

    def init_cache(self, batch_size, max_decode_length=None) -> list:
        """Per layer, self-attention `{"key", "value"}` caches of zeros, head-major
        `[batch, heads, length, head_dim]`: length 0 (growing, the default) or
        `max_decode_length` (fixed, for XLA; see `step`)."""
        length = 0 if max_decode_length is None else max_decode_length
        shape = [batch_size, self.num_heads, length, self.head_dim]
        zeros = tf.zeros(shape, self.dtype)
        return [{"key": zeros, "value": zeros} for _ in range(self.num_layers)]

    # ------------------------------------------------------------------ per step

    def step(self, weights: dict, ids, step, cache: list, memory: dict, growing: bool = True,
             beams: int = 1):
        """Decodes position `step`.

        Args:
            weights: from `read_weights`.
            ids: int32 `[batch]`, the tokens at position `step`.
            step: int32 scalar.
            cache: from `init_cache` or the previous step; growing caches hold the positions
                `< step` and are appended to, fixed ones are written at `step`.
            memory: from `precompute`, one row for every `beams` consecutive rows of `ids`
                (the beams of one sentence share its encoder keys and values).

        Returns:
            `(logits float32 [batch, vocab], cache)`.
        """
        d, heads, head_dim = self.d_model, self.num_heads, self.head_dim
        x = tf.gather(weights["embeddings"], ids)  # [batch, d]
        if x.dtype != self.dtype:
            x = tf.cast(x, self.dtype)
        x = x * tf.cast(math.sqrt(d), self.dtype)
        position = weights["positions"][step]
        x = x + (position if self.dtype == tf.float32 else tf.cast(position, self.dtype))
        if not growing:
            max_len = tf.shape(cache[0]["key"])[2]
            self_bias = _attention_bias((tf.range(max_len) <= step)[None, None, None, :])
            write = tf.cast(tf.equal(tf.range(max_len), step), self.dtype)[None, None, :, None]
        head_shape = [-1, heads, 1, head_dim]
        new_cache = []
        for layer, layer_cache, layer_memory in zip(weights["layers"], cache, memory["layers"]):
            # Masked self-attention over the cache and the new position.
            h = _layer_norm(x) if self.pre_norm else x  # gamma, beta: in the kernel
            qkv = _matmul(h, layer["qkv_kernel"]) + layer["qkv_bias"]
            # [batch, heads, 1, head_dim] each
            q, k, v = tf.unstack(tf.reshape(qkv, [-1, 3, heads, 1, head_dim]), axis=1)
            if growing:
                key = tf.concat([layer_cache["key"], k], axis=2)
                value = tf.concat([layer_cache["value"], v], axis=2)
                y = self._attend(q, key, value, None)
            else:
                key = layer_cache["key"] * (1 - write) + k * write
                value = layer_cache["value"] * (1 - write) + v * write
                y = self._attend(q, key, value, self_bias)
            new_cache.append({"key": key, "value": value})
            y = _matmul(y, layer["self_out_kernel"]) + layer["self_out_bias"]
            x = x + y if self.pre_norm else _layer_norm(x + y, layer["self_norm"])
            # Cross-attention over the precomputed encoder keys/values.
            h = _layer_norm(x) if self.pre_norm else x
            q = _matmul(h, layer["cross_q_kernel"]) + layer["cross_q_bias"]
            if beams == 1:
                y = self._attend(tf.reshape(q, head_shape), layer_memory["key"],
                                 layer_memory["value"], memory["bias"])
            else:  # one [beams, source_len] attention per sentence and head
                q = tf.transpose(tf.reshape(q, [-1, beams, heads, head_dim]), [0, 2, 1, 3])
                y = _attention(q, layer_memory["key"], layer_memory["value"], memory["bias"])
                y = tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [-1, d])
            y = _matmul(y, layer["cross_out_kernel"]) + layer["cross_out_bias"]
            x = x + y if self.pre_norm else _layer_norm(x + y, layer["cross_norm"])
            x = _feed_forward(x, layer, self.pre_norm)
        if "final_norm" in weights:
            x = _layer_norm(x, weights["final_norm"])
        if "logits_kernel" in weights:
            logits = tf.matmul(x, weights["logits_kernel"]) + weights["logits_bias"]
        else:
            logits = tf.matmul(x, weights["logits_embeddings_t"])
        if logits.dtype != tf.float32:
            logits = tf.cast(logits, tf.float32)
        return logits, new_cache

    def _attend(self, q, key, value, bias):
        """`q` `[batch, heads, 1, dim]` (pre-scaled) over `key`/`value` `[batch, heads, len,
        dim]`; `bias` from `_attention_bias`, broadcastable to `[batch, heads, 1, len]`, or None.
        Returns `[batch, d_model]`."""
        return tf.reshape(_attention(q, key, value, bias), [-1, self.d_model])


class EncoderPass:
    """The encoder of a `Transformer` without its Keras layers, for inference.

    Usage, inside the `tf.function` that decodes the batch:

        encoder = EncoderPass(model)
        context, source_mask = encoder(encoder.read_weights(), source_ids)

    Gives `Transformer.encode(source_ids, training=False)` to float32 rounding at the real
    positions; with `pack` (the default) a padded position of the context holds a copy of a
    real token's (see `_padded_rows`).
    """

    def __init__(self, model: Transformer, pack: bool = True):
        self.model = model
        self.pack = pack
        config = model.config
        self.d_model = config.d_model
        self.num_heads = config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.pre_norm = config.norm == "pre"
        self.dtype = tf.as_dtype(model.compute_dtype)

    def read_weights(self) -> dict:
        """The encoder's weights as tensors: per layer a fused, query-scaled q|k|v projection
        `[d_model, 3 d_model]`, the output projection, the feed-forward and the norms."""
        model, d = self.model, self.d_model
        scale = 1.0 / math.sqrt(float(self.head_dim))
        value = functools.partial(_value, dtype=self.dtype)
        layers = []
        for layer in model.encoder.stack:
            mha = layer.self_attention.mha
            layers.append({
                "self_norm": _norm_weights(layer.self_attention.layernorm),
                **_fused_qkv(mha, d, scale, self.dtype),
                "self_out_kernel": tf.reshape(value(mha.output_dense.kernel), [d, d]),
                "self_out_bias": value(mha.output_dense.bias),
                **_feed_forward_weights(layer.ffn, self.dtype),
            })
            if self.pre_norm:
                _fold_norm(layers[-1], "self_norm", "qkv_kernel", "qkv_bias")
                _fold_norm(layers[-1], "ffn_norm", "inner_kernel", "inner_bias")
        weights = _embedding_weights(model.source_embedding, layers)
        if model.encoder.final_layernorm is not None:
            weights["final_norm"] = _norm_weights(model.encoder.final_layernorm)
        return weights

    def __call__(self, weights: dict, source_ids):
        """Source ids int32 `[batch, source_len]` -> (context `[batch, source_len, d_model]`
        in the compute dtype, source padding mask bool `[batch, source_len]`)."""
        d, heads, head_dim = self.d_model, self.num_heads, self.head_dim
        source_mask = tf.not_equal(source_ids, PAD_ID)
        batch, length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        ids = tf.reshape(source_ids, [-1])  # [batch * len]
        position_ids = tf.tile(tf.range(length), [batch])
        if self.pack:  # x holds the real tokens' rows only
            rows = _real_rows(source_mask)  # [tokens]
            padded_rows = _padded_rows(source_mask)  # [batch * len]
            ids, position_ids = tf.gather(ids, rows), tf.gather(position_ids, rows)
        x = tf.gather(weights["embeddings"], ids)  # [rows, d]
        if x.dtype != self.dtype:
            x = tf.cast(x, self.dtype)
        x = x * tf.cast(math.sqrt(d), self.dtype)
        positions = tf.gather(weights["positions"], position_ids)
        x = x + (positions if self.dtype == tf.float32 else tf.cast(positions, self.dtype))
        bias = _attention_bias(source_mask[:, None, None, :])  # [batch, 1, 1, len]
        for layer in weights["layers"]:
            h = _layer_norm(x) if self.pre_norm else x
            qkv = _matmul(h, layer["qkv_kernel"]) + layer["qkv_bias"]  # [rows, 3d]
            if self.pack:
                qkv = tf.gather(qkv, padded_rows)  # [batch * len, 3d]
            qkv = tf.transpose(tf.reshape(qkv, [batch, length, 3, heads, head_dim]),
                               [2, 0, 3, 1, 4])  # [3, batch, heads, len, head_dim]
            y = _attention(qkv[0], qkv[1], qkv[2], bias)  # [batch, heads, len, head_dim]
            y = tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [-1, d])  # [batch * len, d]
            if self.pack:
                y = tf.gather(y, rows)
            y = _matmul(y, layer["self_out_kernel"]) + layer["self_out_bias"]
            x = x + y if self.pre_norm else _layer_norm(x + y, layer["self_norm"])
            x = _feed_forward(x, layer, self.pre_norm)
        if "final_norm" in weights:
            x = _layer_norm(x, weights["final_norm"])
        if self.pack:
            x = tf.gather(x, padded_rows)
        return tf.reshape(x, [batch, length, d]), source_mask


def _real_rows(mask):
    """int32 `[tokens]`: the indices of the True positions of `mask` `[batch, len]`, flattened."""
    return tf.cast(tf.where(tf.reshape(mask, [-1]))[:, 0], tf.int32)


def _padded_rows(mask):
    """int32 `[batch * len]`: for each position of `mask` `[batch, len]`, flattened, the row of
    the packed `[tokens, n]` layout to gather it from: its own for a real token; for padding,
    the row of the last real token before it (the first row if there is none).

    Gathering them gives the padded layout. Attention masks the padded positions, and the mask
    bias gives their logits exactly (`_attention_bias`), so any finite key or value does there:
    a copy is as good as zeros, and one gather costs less than zeros and a scatter."""
    return tf.maximum(tf.cumsum(tf.cast(tf.reshape(mask, [-1]), tf.int32)) - 1, 0)


def _value(variable, dtype):
    """A variable's value as a tensor of `dtype`."""
    tensor = tf.convert_to_tensor(variable.value)
    return tensor if tensor.dtype == dtype else tf.cast(tensor, dtype)


def _norm_weights(layer) -> dict:
    return {"gamma": _value(layer.gamma, tf.float32), "beta": _value(layer.beta, tf.float32)}


def _feed_forward_weights(ffn, dtype) -> dict:
    return {"ffn_norm": _norm_weights(ffn.layernorm),
            "inner_kernel": _value(ffn.inner.kernel, dtype),  # [d, dff]
            "inner_bias": _value(ffn.inner.bias, dtype),
            "outer_kernel": _value(ffn.outer.kernel, dtype),  # [dff, d]
            "outer_bias": _value(ffn.outer.bias, dtype)}


def _embedding_weights(embedding, layers: list) -> dict:
    return {"embeddings": tf.convert_to_tensor(embedding.token_embedding.embeddings.value),
            "positions": tf.constant(embedding.positions),  # [max_positions, d], float32
            "layers": layers}


def _feed_forward(x, layer: dict, pre_norm: bool):
    """The feed-forward sublayer with its residual connection and norm: `[rows, d_model]`."""
    h = _layer_norm(x) if pre_norm else x  # pre-norm: gamma and beta in the inner kernel
    h = tf.nn.relu(_matmul(h, layer["inner_kernel"]) + layer["inner_bias"])
    y = _matmul(h, layer["outer_kernel"]) + layer["outer_bias"]
    return x + y if pre_norm else _layer_norm(x + y, layer["ffn_norm"])


def _fused_qkv(mha, d: int, scale: float, dtype) -> dict:
    """A self-attention layer's q|k|v projections as one `[d, 3d]` kernel and `[3d]` bias,
    the query part scaled by 1/sqrt(head_dim)."""
    value = functools.partial(_value, dtype=dtype)
    return {
        "qkv_kernel": tf.concat([tf.reshape(value(mha.query_dense.kernel), [d, d]) * scale,
                                 tf.reshape(value(mha.key_dense.kernel), [d, d]),
                                 tf.reshape(value(mha.value_dense.kernel), [d, d])], axis=1),
        "qkv_bias": tf.concat([tf.reshape(value(mha.query_dense.bias), [d]) * scale,
                               tf.reshape(value(mha.key_dense.bias), [d]),
                               tf.reshape(value(mha.value_dense.bias), [d])], axis=0),
    }


def _attention_bias(mask):
    """float32 0 where `mask` is True, `_LARGE_NEGATIVE` where it is False: added to attention
    logits, it gives exactly the masked logits (a logit is far below half an ulp of the bias),
    and an add costs less than a broadcasting select at every step."""
    return tf.where(mask, 0.0, _LARGE_NEGATIVE)


def _attention(q, key, value, bias):
    """Scaled dot-product attention of pre-scaled `q` `[batch, heads, q_len, dim]` over
    `key`/`value` `[batch, heads, len, dim]`; `bias` from `_attention_bias`, broadcastable to
    `[batch, heads, q_len, len]`, or None. Returns `[batch, heads, q_len, dim]`."""
    logits = _matmul(q, key, transpose_b=True)  # [batch, heads, q_len, len]
    if logits.dtype != tf.float32:
        logits = tf.cast(logits, tf.float32)
    if bias is not None:
        logits += bias
    # Softmax's arithmetic in element-wise ops: oneDNN's Softmax kernel, which TensorFlow
    # substitutes for tf.nn.softmax, costs more per call on the loop's small, changing shapes.
    exp = tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
    probs = exp / tf.reduce_sum(exp, axis=-1, keepdims=True)
    if probs.dtype != value.dtype:
        probs = tf.cast(probs, value.dtype)
    return _matmul(probs, value)


def _matmul(a, b, transpose_b=False):
    """`a @ b` (`b` transposed in its last two axes if `transpose_b`), batched over leading axes.

    Float32 operands go to the Eigen kernel of `BatchMatMulV3`, which TensorFlow's oneDNN graph
    rewrite leaves alone; it rewrites MatMul and BatchMatMulV2 into oneDNN kernels that pay, at
    every call, for a primitive per new shape and for reordering weights that are not graph
    constants. The decoding loop makes new shapes at every step (the self-attention cache grows,
    finished sentences leave the batch) on small matrices, where that cost dominates. Bfloat16
    keeps `tf.matmul`, whose oneDNN kernels use the CPU's bfloat16 units.
    """
    if a.dtype != tf.float32:
        return tf.matmul(a, b, transpose_b=transpose_b)
    return tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=tf.float32, adj_y=transpose_b)


def _layer_norm(x, norm=None):
    """LayerNormalization with float32 statistics over the last axis of `x` `[..., d]`:
    (x - mean) * (gamma / sqrt(variance + eps)) + beta, Keras' arithmetic regrouped into one op
    fewer (the loop runs three per decoder layer at every step). Without `norm` (its gamma and
    beta folded into the next projection, `_fold_norm`), (x - mean) / sqrt(variance + eps)."""
    dtype = x.dtype
    if dtype != tf.float32:
        x = tf.cast(x, tf.float32)
    centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    if norm is None:
        y = centered * tf.math.rsqrt(variance + LAYER_NORM_EPSILON)
    else:
        y = (centered * (tf.math.rsqrt(variance + LAYER_NORM_EPSILON) * norm["gamma"])
             + norm["beta"])
    return y if dtype == tf.float32 else tf.cast(y, dtype)


def _fold_norm(layer: dict, norm: str, kernel: str, bias: str) -> None:
    """Folds `layer[norm]`'s gamma and beta into the projection that reads the norm's output:
    (n * gamma + beta) @ W + b = n @ (gamma[:, None] * W) + (beta @ W + b), for a pre-norm
    sublayer whose norm feeds that projection only. Removes `layer[norm]` (two ops fewer a
    norm at every step). Computed in float32, then cast to the kernel's dtype."""
    gamma, beta = layer[norm]["gamma"], layer[norm]["beta"]
    dtype = layer[kernel].dtype
    w = tf.cast(layer[kernel], tf.float32)
    layer[kernel] = tf.cast(gamma[:, None] * w, dtype)
    folded_bias = tf.cast(layer[bias], tf.float32) + tf.linalg.matvec(w, beta, transpose_a=True)
    layer[bias] = tf.cast(folded_bias, dtype)
    del layer[norm]
