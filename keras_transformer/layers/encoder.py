"""The encoder stack (section 3.1, left half of figure 1)."""

import keras

from keras_transformer.layers.attention import GlobalSelfAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
    """Self-attention then feed-forward, each with its residual connection.

    Args:
        d_model, num_heads, dropout, norm: see `BaseAttention`.
        dff, activation: see `FeedForward`.

    Call arguments:
        x: `[batch, source_len, d_model]`.
        padding_mask: bool `[batch, source_len]`, True at real tokens.

    Returns:
        `[batch, source_len, d_model]`.
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
        self.self_attention = GlobalSelfAttention(
            d_model=d_model, num_heads=num_heads, dropout=dropout, norm=norm,
            dtype=self.dtype_policy, name="self_attention")
        self.ffn = FeedForward(d_model=d_model, dff=dff, dropout=dropout, norm=norm,
                               activation=activation, dtype=self.dtype_policy, name="ffn")

    def build(self, input_shape):
        self.self_attention.build(input_shape)
        self.ffn.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, training=None):
        x = self.self_attention(x, padding_mask=padding_mask, training=training)
        return self.ffn(x, training=training)

    def inference_weights(self, dtype) -> dict:
        """`{"self_attention", "ffn"}`: the sublayers' `inference_weights(dtype)`."""
        return {"self_attention": self.self_attention.inference_weights(dtype),
                "ffn": self.ffn.inference_weights(dtype)}

    def packed_call(self, weights, x, packing, bias):
        """`call` for inference on the real tokens' rows `[tokens, d_model]` (see
        `GlobalSelfAttention.packed_call`)."""
        x = self.self_attention.packed_call(weights["self_attention"], x, packing, bias)
        return self.ffn.packed_call(weights["ffn"], x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, dff=self.dff,
                      dropout=self.dropout, norm=self.norm, activation=self.activation)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(LayerStack):
    """A stack of `num_layers` EncoderLayers over embedded source tokens.

    The embedding is not part of the stack: the model owns it, so that it can be shared with the
    decoder (section 3.4). With pre-norm a final LayerNorm normalizes the stack's output.

    Args:
        num_layers, d_model, num_heads, dff, dropout, norm, activation: see `EncoderLayer`.

    Call arguments:
        x: embedded source `[batch, source_len, d_model]`.
        padding_mask: bool `[batch, source_len]`, True at real tokens.

    Returns:
        `[batch, source_len, d_model]`.
    """

    layer_class = EncoderLayer

    def build(self, input_shape):
        for layer in self.stack:
            layer.build(input_shape)
        self._build_final_layernorm(input_shape)

    def call(self, x, padding_mask=None, training=None):
        for layer in self.stack:
            x = layer(x, padding_mask=padding_mask, training=training)
        return self._finish(x)

    def packed_call(self, weights, x, packing, bias):
        """`call` for inference on the real tokens' rows.

        Args:
            weights: `inference_weights(dtype)`.
            x: embedded source tokens `[tokens, d_model]`, the rows of `packing`.
            packing: a `layers.ops.Packing` of the source mask.
            bias: `attention.attention_bias` of the source mask, `[batch, 1, 1, source_len]`.

        Returns:
            `[tokens, d_model]`.
        """
        for layer, layer_weights in zip(self.stack, weights["layers"]):
            x = layer.packed_call(layer_weights, x, packing, bias)
        return self._finish_rows(weights, x)
