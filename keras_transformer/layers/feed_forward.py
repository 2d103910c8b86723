"""The position-wise feed-forward network (section 3.3)."""

import keras
import tensorflow as tf

from keras_transformer.config import ACTIVATIONS
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.normalization import (LAYER_NORM_EPSILON, LayerNormalization,
                                                    fold_norm)
from keras_transformer.layers.ops import dense, value
from keras_transformer.layers.residual import residual_connection, residual_input, residual_output

# How each of `config.ACTIVATIONS` is computed: "relu" as in the paper (max(0, x)); "gelu"
# (Hendrycks & Gimpel 2016, the exact erf form), as BERT and many later Transformers use.
ACTIVATION_FUNCTIONS = {"relu": tf.nn.relu, "gelu": lambda x: tf.nn.gelu(x, approximate=False)}


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """FFN(x) = act(x W1 + b1) W2 + b2, with dropout, residual connection and LayerNorm; act is
    ReLU in the paper (max(0, x W1 + b1)).

    Args:
        d_model: input and output width.
        dff: inner width (2048 in the base model).
        dropout: rate on the FFN output before the residual sum.
        norm: "post" (the paper) or "pre" LayerNorm placement.
        activation: the inner activation, one of `config.ACTIVATIONS` ("relu" or "gelu").

    Call arguments:
        x: `[batch, length, d_model]`.

    Returns:
        `[batch, length, d_model]`.
    """

    def __init__(self, *, d_model, dff, dropout=0.1, norm="post", activation="relu", **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.d_model = d_model
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.activation = activation
        # weights that `transform` reads (their `call` is never used)
        self.inner = keras.layers.Dense(dff, dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="outer")
        self.layernorm = LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, dtype=self.dtype_policy, name="layernorm")
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build((*input_shape[:-1], self.dff))
        self.layernorm.build(input_shape)
        self.built = True

    def call(self, x, training=None):
        weights = self.layer_weights(self.compute_dtype)
        return residual_connection(
            x, lambda h: self.transform(weights, h), layernorm=self.layernorm,
            dropout=self.dropout_layer, norm=self.norm, training=training)

    def layer_weights(self, dtype) -> dict:
        """The weights `transform` reads, tensors of `dtype` read from the variables:
        `inner_kernel` `[d_model, dff]`, `inner_bias`, `outer_kernel` `[dff, d_model]`,
        `outer_bias`."""
        dtype = tf.as_dtype(dtype)
        return {"inner_kernel": value(self.inner.kernel, dtype),
                "inner_bias": value(self.inner.bias, dtype),
                "outer_kernel": value(self.outer.kernel, dtype),
                "outer_bias": value(self.outer.bias, dtype)}

    def inference_weights(self, dtype) -> dict:
        """`layer_weights(dtype)` for the decoding steps: with post-norm also the LayerNorm's
        `norm`; with pre-norm the LayerNorm folded into the inner projection."""
        weights = self.layer_weights(dtype)
        norm = self.layernorm.inference_weights()
        if self.norm == "pre":
            weights["inner_kernel"], weights["inner_bias"] = fold_norm(
                norm, weights["inner_kernel"], weights["inner_bias"])
        else:
            weights["norm"] = norm
        return weights

    def transform(self, weights, h):
        """The sublayer, without its residual connection: `[..., d_model]` -> `[...,
        d_model]`, with `weights` from `layer_weights` or `inference_weights`."""
        h = ACTIVATION_FUNCTIONS[self.activation](
            dense(h, weights["inner_kernel"], weights["inner_bias"]))
        return dense(h, weights["outer_kernel"], weights["outer_bias"])

    def packed_call(self, weights, x):
        """`call` for inference on rows: `[rows, d_model]` -> `[rows, d_model]`, with
        `weights` from `inference_weights`."""
        y = self.transform(weights, residual_input(x, self.norm))
        return residual_output(x, y, self.norm, weights)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, dff=self.dff, dropout=self.dropout, norm=self.norm,
                      activation=self.activation)
        return config
