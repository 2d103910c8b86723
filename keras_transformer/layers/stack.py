"""What the encoder and decoder stacks share: N identical layers, then (pre-norm) a LayerNorm."""

import keras

from keras_transformer.layers.normalization import (LAYER_NORM_EPSILON, LayerNormalization,
                                                    normalize)


class LayerStack(keras.layers.Layer):
    """`num_layers` copies of `layer_class` (set by the subclass) applied in sequence.

    With pre-norm the residual stream is never normalized inside the layers, so a final
    LayerNorm normalizes the stack's output.
    """

    layer_class: type

    def __init__(self, *, num_layers, d_model, num_heads, dff, dropout=0.1, norm="post",
                 activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.activation = activation
        self.stack = [
            self.layer_class(d_model=d_model, num_heads=num_heads, dff=dff, dropout=dropout,
                             norm=norm, activation=activation, dtype=self.dtype_policy,
                             name=f"layer_{i}")
            for i in range(num_layers)
        ]
        self.final_layernorm = (
            LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype=self.dtype_policy,
                               name="final_layernorm")
            if norm == "pre" else None)

    def _build_final_layernorm(self, x_shape):
        if self.final_layernorm is not None:
            self.final_layernorm.build(x_shape)
        self.built = True

    def _finish(self, x):
        return x if self.final_layernorm is None else self.final_layernorm(x)

    def inference_weights(self, dtype) -> dict:
        """`{"layers": [each layer's inference_weights(dtype)]}`, and with pre-norm the final
        LayerNorm's `"final_norm"`."""
        weights = {"layers": [layer.inference_weights(dtype) for layer in self.stack]}
        if self.final_layernorm is not None:
            weights["final_norm"] = self.final_layernorm.inference_weights()
        return weights

    def _finish_rows(self, weights, x):
        """`_finish` in the decoding steps."""
        return normalize(x, weights["final_norm"]) if "final_norm" in weights else x

    def compute_output_shape(self, *shapes, **named_shapes):
        # The input's shape, however the build arguments name it (`summary()` passes them by
        # the names of `build`'s parameters).
        return (shapes or tuple(named_shapes.values()))[0]

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, d_model=self.d_model, num_heads=self.num_heads,
                      dff=self.dff, dropout=self.dropout, norm=self.norm,
                      activation=self.activation)
        return config
