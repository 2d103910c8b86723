"""The position-wise feed-forward network (section 3.3)."""

import keras
import tensorflow as tf

from keras_transformer.config import ACTIVATIONS
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.normalization import LAYER_NORM_EPSILON, LayerNormalization, fold_norm
from keras_transformer.layers.ops import matmul, value
from keras_transformer.layers.residual import residual_connection, residual_input, residual_output

# How each of `config.ACTIVATIONS` is computed: "relu" as in the paper (max(0, x)); "gelu"
# (Hendrycks & Gimpel 2016, the exact erf form), as BERT and many later Transformers use.
# Training runs Keras' own activation of that name, which computes the same op.
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
        self.inner = keras.layers.Dense(dff, activation=activation,
                                        dtype=self.dtype_policy, name="inner")
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
        return residual_connection(
            x, lambda h: self.outer(self.inner(h)), layernorm=self.layernorm,
            dropout=self.dropout_layer, norm=self.norm, training=training)

    def inference_weights(self, dtype) -> dict:
        """The weights `packed_call` reads, tensors of `dtype`: `inner_kernel` `[d_model, dff]`,
        `inner_bias`, `outer_kernel` `[dff, d_model]`, `outer_bias`, and (post-norm) the
        LayerNorm's `norm` (pre-norm: folded into the inner projection)."""
        weights = {"inner_kernel": value(self.inner.kernel, dtype),
                   "inner_bias": value(self.inner.bias, dtype),
                   "outer_kernel": value(self.outer.kernel, dtype),
                   "outer_bias": value(self.outer.bias, dtype)}
        norm = self.layernorm.inference_weights()
        if self.norm == "pre":
            weights["inner_kernel"], weights["inner_bias"] = fold_norm(
                norm, weights["inner_kernel"], weights["inner_bias"])
        else:
            weights["norm"] = norm
        return weights

    def packed_call(self, weights, x):
        """`call` for inference on rows: `[rows, d_model]` -> `[rows, d_model]`, with
        `weights` from `inference_weights`."""
        h = residual_input(x, self.norm)
        h = ACTIVATION_FUNCTIONS[self.activation](matmul(h, weights["inner_kernel"]) + weights["inner_bias"])
        y = matmul(h, weights["outer_kernel"]) + weights["outer_bias"]
        return residual_output(x, y, self.norm, weights)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, dff=self.dff, dropout=self.dropout, norm=self.norm,
                      activation=self.activation)
        return config
