"""Layer normalization (Ba et al., 2016) over the last axis, with its gradient written out."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (same weights, float32 statistics, output in the
    compute dtype) that normalizes over the last axis with `layer_norm`.

    Keras derives the gradient op by op from its moments; `layer_norm` states it in closed
    form, in fewer ops over the activations. Other settings (several axes, no center or
    scale, RMS scaling) fall back to Keras.

    Call arguments:
        inputs: `[..., features]`.

    Returns:
        `[..., features]` in the layer's compute dtype.
    """

    def call(self, inputs):
        if (self.axis not in ([-1], [len(inputs.shape) - 1]) or not (self.center and self.scale)
                or self.rms_scaling):
            return super().call(inputs)
        outputs = layer_norm(inputs, tf.convert_to_tensor(self.gamma),
                             tf.convert_to_tensor(self.beta), self.epsilon)
        return tf.cast(outputs, self.compute_dtype)


def layer_norm(x, gamma, beta, epsilon):
    """gamma * (x - mean) / sqrt(variance + epsilon) + beta over the last axis.

    The statistics and the arithmetic are float32 whatever the dtype of `x`; the result and
    the gradient of `x` have its dtype. With x_hat the normalized input, g = dy * gamma and
    means over the last axis, the gradients are

        dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(variance + epsilon)
        dgamma = sum(dy * x_hat),  dbeta = sum(dy)   (sums over every axis but the last)

    Args:
        x: `[..., features]`.
        gamma, beta: float32 `[features]`.
        epsilon: float.

    Returns:
        `[..., features]`, the dtype of `x`.
    """

    @tf.custom_gradient
    def normalize(x, gamma, beta):
        x32 = tf.cast(x, tf.float32)
        centered = x32 - tf.reduce_mean(x32, axis=-1, keepdims=True)
        inverse_std = tf.math.rsqrt(
            tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True) + epsilon)
        x_hat = centered * inverse_std

        def grad(dy):
            dy = tf.cast(dy, tf.float32)
            batch_axes = tf.range(tf.rank(dy) - 1)
            g = dy * gamma
            dx = inverse_std * (g - tf.reduce_mean(g, axis=-1, keepdims=True)
                                - x_hat * tf.reduce_mean(g * x_hat, axis=-1, keepdims=True))
            return (tf.cast(dx, x.dtype), tf.reduce_sum(dy * x_hat, axis=batch_axes),
                    tf.reduce_sum(dy, axis=batch_axes))

        return tf.cast(x_hat * gamma + beta, x.dtype), grad

    return normalize(x, gamma, beta)
