"""The Transformer (Vaswani et al., 2017): embeddings, encoder, decoder and output projection."""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf
from keras import ops

from keras_transformer import compat
from keras_transformer.config import PAD_ID, ModelConfig, from_dict
from keras_transformer.layers import Decoder, Encoder, PositionalEmbedding
from keras_transformer.layers.attention import padding_bias
from keras_transformer.layers.ops import Packing, value
from keras_transformer.training.losses import (sum_over_replicas, symmetric_kl_of_halves,
                                               target_weights)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer for translation, called with teacher forcing.

    Args:
        config: a `ModelConfig` (or its dict). `share_embeddings` selects the weight tying of
            section 3.4: "none" (the tutorial), "target" (decoder embedding = pre-softmax
            projection) or "all" (one joint vocabulary for both embeddings and the projection).

    Call arguments:
        inputs: `(source_ids, target_in_ids)`, int `[batch, source_len]` and
            `[batch, target_len]`, padded with 0. `target_in_ids` starts with START.

    Returns:
        float32 logits `[batch, target_len, target_vocab_size]` predicting `target_out_ids`
        (the target shifted left by one), whatever the compute dtype.

    Example:
        >>> model = Transformer(ModelConfig.from_preset("tiny"))
        >>> logits = model((source_ids, target_in_ids))

    Decoding reads `inference_weights` and calls `start_decoding` and `init_cache` once per
    batch, then `decode_step` once per token (`keras_transformer.decoding.strategies` drives the loop).
    """

    def __init__(self, config: ModelConfig | dict, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = from_dict(ModelConfig, config, "model")
        self.config = config
        self.rdrop_alpha = 0.0  # set by `compile`
        layer_args = dict(d_model=config.d_model, dropout=config.dropout, dtype=self.dtype_policy)
        stack_args = dict(layer_args, num_heads=config.num_heads, dff=config.dff,
                          norm=config.norm, activation=config.activation)
        self.source_embedding = PositionalEmbedding(
            vocab_size=config.source_vocab_size, max_positions=config.max_positions,
            name="source_embedding", **layer_args)
        if config.share_embeddings == "all":
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = PositionalEmbedding(
                vocab_size=config.target_vocab_size, max_positions=config.max_positions,
                name="target_embedding", **layer_args)
        self.encoder = Encoder(num_layers=config.num_layers, name="encoder", **stack_args)
        self.decoder = Decoder(num_layers=config.decoder_layers, name="decoder", **stack_args)
        self.final_layer = None
        if config.share_embeddings == "none":
            self.final_layer = keras.layers.Dense(
                config.target_vocab_size, dtype=self.dtype_policy, name="final_layer")

    def build(self, input_shape=None):
        source_shape, target_shape = input_shape or ((None, None), (None, None))
        d_model = self.config.d_model
        self.source_embedding.build(source_shape)
        self.target_embedding.build(target_shape)
        self.encoder.build((*source_shape, d_model))
        self.decoder.build((*target_shape, d_model), (*source_shape, d_model))
        if self.final_layer is not None:
            self.final_layer.build((*target_shape, d_model))
        self.built = True

    def compile(self, *args, rdrop_alpha=0.0, **kwargs):
        """Keras's `compile`, then builds the model and the optimizer's variables right away.

        Without a distribution strategy Keras defers the optimizer's build to the first trace of
        the training step, where every slot variable is created inside the traced function:
        that made the first `fit` several times slower than the steps it traced.

        Args:
            rdrop_alpha: R-Drop's weight (Liang et al., 2021; 0 turns it off): each training
                step runs the batch twice (one forward pass over the batch repeated, so each
                copy gets its own dropout masks) and minimizes the mean loss of both copies +
                alpha / 2 x the mean `symmetric_kl` between them, the paper's
                NLL_1 + NLL_2 + alpha KL over twice the tokens. Not with grouped batches.
        """
        if rdrop_alpha < 0:
            raise ValueError(f"rdrop_alpha={rdrop_alpha!r} must be >= 0")
        self.rdrop_alpha = float(rdrop_alpha)
        super().compile(*args, **kwargs)
        if not self.built:
            self.build()
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)

    def compile_from_config(self, config):
        # What `keras.models.load_model` calls; Keras's own skips models that override `compile`.
        self.compile(**keras.saving.deserialize_keras_object(config))

    def call(self, inputs, training=None):
        source_ids, target_in_ids = inputs
        context, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_in_ids, context, source_mask, training=training)

    def encode(self, source_ids, training=None):
        """Source ids `[batch, source_len]` -> (context `[batch, source_len, d_model]`,
        source padding mask bool `[batch, source_len]`)."""
        source_mask = ops.not_equal(source_ids, PAD_ID)
        x = self.source_embedding(source_ids, training=training)
        return self.encoder(x, padding_mask=source_mask, training=training), source_mask

    def decode(self, target_in_ids, context, source_mask, training=None):
        """Teacher-forced decoding: `[batch, target_len]` -> float32 logits
        `[batch, target_len, target_vocab_size]`."""
        x = self.target_embedding(target_in_ids, training=training)
        x = self.decoder(x, context, context_mask=source_mask, training=training)
        return self._logits(x)

    # The reported "loss" (fit's training loss and val_loss, evaluate's) is the mean over every
    # real target token of the epoch or evaluation set. Keras weights each batch's mean loss by
    # its number of sentences, which favours batches of short sentences (measured in
    # experiments/log/2026-11-25.md) and makes the figure depend on `tokens_per_batch` and
    # `bucket_step`.
    # Both steps are Keras's (TensorFlow backend) but for that weighting.

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if len(y.shape) == 3:
            if self.rdrop_alpha:
                raise ValueError("R-Drop (rdrop_alpha > 0) does not run on grouped batches")
            return self._accumulated_train_step(x, y, sample_weight)
        if self.rdrop_alpha:
            return self._rdrop_train_step(x, y, sample_weight)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                     training=True)
            self._track_loss(loss, y, sample_weight)
            loss = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _rdrop_train_step(self, x, y, sample_weight):
        """One update of R-Drop (see `compile`) on `x` = (source_ids `[batch, source_len]`,
        target_in_ids `[batch, target_len]`), `y` = target_out_ids `[batch, target_len]`.
        The metrics see the first copy's logits only."""
        batch = tf.shape(y)[0]

        def twice(tensor):
            return None if tensor is None else ops.concatenate([tensor, tensor], axis=0)

        weights = target_weights(y, sample_weight)
        all_tokens = ops.maximum(sum_over_replicas(ops.sum(weights)), 1.0)
        with tf.GradientTape() as tape:
            logits = self(tuple(twice(ids) for ids in x), training=True)  # [2 batch, len, vocab]
            loss = self.compute_loss(y=twice(y), y_pred=logits, sample_weight=twice(sample_weight),
                                     training=True)
            self._track_loss(loss, y, sample_weight)
            consistency = ops.sum(symmetric_kl_of_halves(logits) * weights)
            loss = self.optimizer.scale_loss(loss + 0.5 * self.rdrop_alpha * consistency
                                             / all_tokens)
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return self.compute_metrics(x, y, logits[:batch], sample_weight=sample_weight)

    def _accumulated_train_step(self, x, y, sample_weight):
        """One update from a group of micro-batches of equal shapes (`data.group_batches`):
        `x` = (source_ids `[batch, n, source_len]`, target_in_ids `[batch, n, target_len]`),
        `y` = target_out_ids `[batch, n, target_len]`.

        The n forward and backward passes run one after another in a `tf.while_loop` (the
        activations of one micro-batch at a time), their gradients are summed, and the
        optimizer applies the sum once: the update is that of one batch of all n micro-batches
        (the mean loss over the group's real target tokens, in every replica). Unlike Keras's
        `gradient_accumulation_steps`, nothing inside the loop calls `merge_call`, so it runs
        under MirroredStrategy and MultiWorkerMirroredStrategy with any number of replicas
        (keras-team/keras#17429).
        """
        if sample_weight is not None:
            raise ValueError("accumulated training steps take no sample_weight")
        source_ids, target_in_ids = (tf.transpose(ids, [1, 0, 2]) for ids in x)
        target_out_ids = tf.transpose(y, [1, 0, 2])  # [n, batch, target_len]
        # The only cross-replica reduction, before the loop: all of the group's tokens.
        all_tokens = ops.maximum(sum_over_replicas(ops.sum(target_weights(target_out_ids))), 1.0)
        variables = self.trainable_weights

        def body(i, gradients):
            inputs = (source_ids[i], target_in_ids[i])
            weights = target_weights(target_out_ids[i])
            with tf.GradientTape() as tape:
                logits = self(inputs, training=True)
                summed = ops.sum(self.loss.call(target_out_ids[i], logits) * weights)
                loss = self.optimizer.scale_loss(summed / all_tokens)
            added = tape.gradient(loss, variables)
            tokens = ops.sum(weights)
            compat.loss_tracker(self).update_state(summed / ops.maximum(tokens, 1.0),
                                                   sample_weight=tokens)
            self.compute_metrics(inputs, target_out_ids[i], logits, sample_weight=None)
            return i + 1, [total + tf.convert_to_tensor(g) for total, g in zip(gradients, added)]

        _, gradients = tf.while_loop(
            lambda i, _: i < tf.shape(target_out_ids)[0], body,
            (tf.constant(0), [tf.zeros_like(v) for v in variables]), parallel_iterations=1)
        self.optimizer.apply_gradients(zip(gradients, variables))
        return self.get_metrics_result()

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                 training=False)
        self._track_loss(loss, y, sample_weight)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _track_loss(self, loss, target_out_ids, sample_weight):
        """Adds a batch to the loss tracker weighted by its real target tokens. Assumes the
        compiled loss is the mean over the global batch's non-PAD target tokens, as
        `MaskedLabelSmoothedCrossEntropy` computes it."""
        tokens = ops.sum(target_weights(target_out_ids, sample_weight))
        # `loss` is this replica's share, (its summed token losses) / all tokens: the tracker
        # adds the summed losses and the token count, and sums both over replicas.
        compat.loss_tracker(self).update_state(
            loss * sum_over_replicas(tokens) / ops.maximum(tokens, 1.0), sample_weight=tokens)

    def cross_attention_scores(self, source_ids, target_in_ids, layer=-1):
        """The attention weights over the source of decoder layer `layer` (default the last),
        `[batch, heads, target_len, source_len]` (for visualization)."""
        context, source_mask = self.encode(source_ids)
        x = self.target_embedding(target_in_ids)
        return self.decoder.cross_attention_scores(x, context, source_mask, layer)

    def _logits(self, x):
        logits = self.final_layer(x) if self.final_layer is not None else (
            self.target_embedding.project(x))
        return ops.cast(logits, "float32")

    # ------------------------------------------------------------------ decoding
    # The searches' arithmetic: each layer's own inference step over its weights' tensors
    # (`inference_weights`), read once per batch so that the loop body reads no variable.
    # Tests check it against the teacher-forced `call`.

    def inference_weights(self) -> dict:
        """The weights of the decoding steps as tensors in their layout (fused, pre-scaled
        projections, folded pre-norm LayerNorms, the output projection `[d_model, vocab]`):
        `{"source_embedding", "encoder", "target_embedding", "decoder", "logits"}`. Call it
        inside the `tf.function` that decodes a batch, or freeze it into variables."""
        dtype = tf.as_dtype(self.compute_dtype)
        if self.final_layer is not None:
            logits = {"kernel": value(self.final_layer.kernel, dtype),  # [d_model, vocab]
                      "bias": value(self.final_layer.bias, dtype)}
        else:  # the shared embedding matrix, transposed once: oneDNN's matmul reads a
            # [d_model, vocab] kernel faster than a transposed [vocab, d_model] one
            logits = {"embeddings_t": tf.transpose(
                value(self.target_embedding.token_embedding.embeddings, dtype))}
        return {"source_embedding": self.source_embedding.inference_weights(),
                "encoder": self.encoder.inference_weights(dtype),
                "target_embedding": self.target_embedding.inference_weights(),
                "decoder": self.decoder.inference_weights(dtype),
                "logits": logits}

    def encode_rows(self, weights, source_ids):
        """`encode` for inference, on the source's real tokens only.

        Args:
            weights: `inference_weights()`.
            source_ids: int32 `[batch, source_len]`, padded with PAD.

        Returns:
            `(context, packing)`: the encoder output of the real tokens `[tokens, d_model]` in
            the compute dtype, and the `layers.ops.Packing` of the source mask that orders them.
        """
        dtype = tf.as_dtype(self.compute_dtype)
        packing = Packing(tf.not_equal(source_ids, PAD_ID))
        positions = tf.tile(tf.range(packing.length), [packing.batch])  # [batch * len]
        x = self.source_embedding.embed(weights["source_embedding"],
                                        packing.pack(tf.reshape(source_ids, [-1])),
                                        packing.pack(positions), dtype)  # [tokens, d_model]
        bias = padding_bias(packing.mask)  # [batch, 1, 1, source_len]
        return self.encoder.packed_call(weights["encoder"], x, packing, bias), packing

    def start_decoding(self, weights, source_ids) -> dict:
        """Encodes a batch for `decode_step`: the memory every step reads but never changes,
        `{"bias": float32 [batch, 1, 1, source_len] (the source mask as an attention bias),
        "layers": [per decoder layer {"key", "value"} [batch, heads, source_len, head_dim]]}`."""
        context, packing = self.encode_rows(weights, source_ids)
        return {"bias": padding_bias(packing.mask),
                "layers": self.decoder.precompute(weights["decoder"], context, packing)}

    def init_cache(self, batch_size) -> list:
        """The decoding state: per decoder layer, empty self-attention caches `{"key", "value"}`
        `[batch, heads, 0, head_dim]` that grow by one position per step."""
        return self.decoder.init_cache(batch_size, tf.as_dtype(self.compute_dtype))

    @staticmethod
    def cache_shape_invariants(cache) -> list:
        """`tf.TensorShape`s of the caches for a `tf.while_loop`: batch and length free."""
        return tf.nest.map_structure(
            lambda t: tf.TensorShape([None, t.shape[1], None, t.shape[3]]), cache)

    def decode_step(self, weights, ids, step, cache, memory, beams=1):
        """One cached decoding step.

        Args:
            weights: `inference_weights()`.
            ids: int32 `[batch * beams]`, the tokens at position `step` (START at step 0).
            step: int32 scalar.
            cache: from `init_cache` or the previous step (positions < `step`).
            memory: from `start_decoding`, one row per `beams` consecutive rows of `ids` (the
                beams of a sentence share its keys and values).

        Returns:
            `(logits float32 [batch * beams, target_vocab_size], cache)`: logits for position
            `step + 1`, the cache with position `step`.
        """
        dtype = tf.as_dtype(self.compute_dtype)
        x = self.target_embedding.embed(weights["target_embedding"], ids, step, dtype)
        x, cache = self.decoder.step(weights["decoder"], x, cache, memory["layers"],
                                     memory["bias"], beams)
        logits = weights["logits"]
        if "kernel" in logits:
            x = tf.matmul(x, logits["kernel"]) + logits["bias"]
        else:
            x = tf.matmul(x, logits["embeddings_t"])
        return (x if x.dtype == tf.float32 else tf.cast(x, tf.float32)), cache

    def attention_step(self, weights, ids, step, cache, memory, layer):
        """`decode_step` up to decoder layer `layer`'s cross-attention (an index >= 0), one row
        per sentence: `(attention weights float32 [batch, source_len] of position `step`,
        averaged over the heads, cache)`; the cache holds layers 0 to `layer` (`init_cache()`'s
        first `layer + 1` entries at step 0)."""
        dtype = tf.as_dtype(self.compute_dtype)
        x = self.target_embedding.embed(weights["target_embedding"], ids, step, dtype)
        return self.decoder.attention_step(weights["decoder"], x, cache, memory["layers"],
                                           memory["bias"], layer)

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def count_parameters(config: ModelConfig) -> int:
    """Number of trainable parameters of a built model with this config."""
    model = Transformer(config)
    model.build()
    return int(sum(ops.size(w) for w in model.trainable_weights))

