"""The decoder stack (section 3.1, right half of figure 1), with incremental decoding."""

import keras

from keras_transformer.layers.attention import CausalSelfAttention, CrossAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, cross-attention to the encoder output, then feed-forward.

    Args:
        d_model, num_heads, dropout, norm: see `BaseAttention`.
        dff, activation: see `FeedForward`.

    Call arguments:
        x: `[batch, target_len, d_model]`.
        context: encoder output `[batch, source_len, d_model]`.
        context_mask: bool `[batch, source_len]`, True at real source tokens.

    Returns:
        `[batch, target_len, d_model]`.
    """

    def __init__(self, *, d_model, num_heads, dff, dropout=0.1, norm="post", activation="relu",
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.activation = activation
        sublayer_args = dict(d_model=d_model, dropout=dropout, norm=norm, dtype=self.dtype_policy)
        self.causal_self_attention = CausalSelfAttention(
            num_heads=num_heads, name="causal_self_attention", **sublayer_args)
        self.cross_attention = CrossAttention(
            num_heads=num_heads, name="cross_attention", **sublayer_args)
        self.ffn = FeedForward(dff=dff, activation=activation, name="ffn", **sublayer_args)

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

    def inference_weights(self, dtype) -> dict:
        """`{"causal_self_attention", "cross_attention", "ffn"}`: the sublayers'
        `inference_weights(dtype)`."""
        return {"causal_self_attention": self.causal_self_attention.inference_weights(dtype),
                "cross_attention": self.cross_attention.inference_weights(dtype),
                "ffn": self.ffn.inference_weights(dtype)}

    def step(self, weights, x, cache, memory, bias, beams=1):
        """Decodes one position: `call` at the position after the cache's.

        Args:
            weights: `inference_weights(dtype)`.
            x: `[batch * beams, d_model]`, one position per row.
            cache: the self-attention cache (`CausalSelfAttention.init_cache`).
            memory: the encoder output's keys and values (`CrossAttention.precompute`), one
                row per `beams` rows of `x`.
            bias: `attention.attention_bias` of the source mask, `[batch, 1, 1, source_len]`.

        Returns:
            `([batch * beams, d_model], cache)` with the new position in the cache.
        """
        x, cache = self.causal_self_attention.step(weights["causal_self_attention"], x, cache)
        x = self.cross_attention.step(weights["cross_attention"], x, memory, bias, beams)
        return self.ffn.packed_call(weights["ffn"], x), cache

    def compute_output_shape(self, *shapes, **named_shapes):
        # The input's shape, however the build arguments name it (`summary()` passes them by
        # the names of `build`'s parameters).
        return (shapes or tuple(named_shapes.values()))[0]

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, dff=self.dff,
                      dropout=self.dropout, norm=self.norm, activation=self.activation)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(LayerStack):
    """A stack of `num_layers` DecoderLayers over embedded target tokens.

    As in the Encoder, the model owns the embedding; with pre-norm a final LayerNorm follows.

    Args:
        num_layers, d_model, num_heads, dff, dropout, norm, activation: see `DecoderLayer`.

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

    def cross_attention_scores(self, x, context, context_mask=None, layer=-1):
        """The cross-attention weights `[batch, heads, target_len, source_len]` of layer
        `layer` (default the last; negative counts from the end)."""
        index = range(len(self.stack))[layer]
        for decoder_layer in self.stack[:index]:
            x = decoder_layer(x, context, context_mask=context_mask)
        return self.stack[index].cross_attention_scores(x, context, context_mask)

    def precompute(self, weights, context, packing) -> list:
        """Per layer, the cross-attention keys and values of the encoder output's real tokens
        `context` `[tokens, d_model]` (see `CrossAttention.precompute`)."""
        return [layer.cross_attention.precompute(layer_weights["cross_attention"], context,
                                                 packing)
                for layer, layer_weights in zip(self.stack, weights["layers"])]

    def init_cache(self, batch_size, dtype) -> list:
        """Per layer, an empty self-attention cache (see `CausalSelfAttention.init_cache`)."""
        return [layer.causal_self_attention.init_cache(batch_size, dtype) for layer in self.stack]

    def step(self, weights, x, caches, memory, bias, beams=1):
        """Decodes one position: `[batch * beams, d_model]` -> `([batch * beams, d_model],
        caches)` (see `DecoderLayer.step`; `memory` from `precompute`)."""
        new_caches = []
        for layer, layer_weights, cache, layer_memory in zip(self.stack, weights["layers"],
                                                             caches, memory):
            x, cache = layer.step(layer_weights, x, cache, layer_memory, bias, beams)
            new_caches.append(cache)
        return self._finish_rows(weights, x), new_caches

    def attention_step(self, weights, x, caches, memory, bias, layer):
        """`step` up to the cross-attention of layer `layer` (an index into the stack, >= 0),
        for one position per sentence: `[batch, d_model]` -> `(attention weights float32
        [batch, source_len] averaged over the heads, caches)`; `caches` and the result hold
        layers 0 to `layer` only (the layers after it are not run)."""
        new_caches = []
        for decoder_layer, layer_weights, cache, layer_memory in zip(
                self.stack[:layer], weights["layers"], caches, memory):
            x, cache = decoder_layer.step(layer_weights, x, cache, layer_memory, bias)
            new_caches.append(cache)
        decoder_layer, layer_weights = self.stack[layer], weights["layers"][layer]
        x, cache = decoder_layer.causal_self_attention.step(
            layer_weights["causal_self_attention"], x, caches[layer])
        _, attention = decoder_layer.cross_attention.step(
            layer_weights["cross_attention"], x, memory[layer], bias, return_attention=True)
        return attention, [*new_caches, cache]
