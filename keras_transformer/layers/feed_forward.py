"""The position-wise feed-forward network (section 3.3)."""

import keras

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.residual import LAYER_NORM_EPSILON, residual_connection


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, with dropout, residual connection and LayerNorm.

    Args:
        d_model: input and output width.
        dff: inner width (2048 in the base model).
        dropout: rate on the FFN output before the residual sum.
        norm: "post" (the paper) or "pre" LayerNorm placement.

    Call arguments:
        x: `[batch, length, d_model]`.

    Returns:
        `[batch, length, d_model]`.
    """

    def __init__(self, *, d_model, dff, dropout=0.1, norm="post", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.inner = keras.layers.Dense(dff, activation="relu", dtype=self.dtype_policy,
                                        name="inner")
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

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, dff=self.dff, dropout=self.dropout, norm=self.norm)
        return config
