"""Layer normalization (Ba et al., 2016) over the last axis, with its gradient written out."""

import keras
import tensorflow as tf

from keras_transformer.layers.ops import value

LAYER_NORM_EPSILON = 1e-6  # as in tensor2tensor, the paper's reference implementation


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

    def inference_weights(self) -> dict:
        """`{"gamma", "beta"}` float32 `[features]`, for `normalize`."""
        return {"gamma": value(self.gamma, tf.float32), "beta": value(self.beta, tf.float32)}


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
    def scale_and_shift(x, gamma, beta):
        centered, inverse_std = standardize(x, epsilon)
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

    return scale_and_shift(x, gamma, beta)


def standardize(x, epsilon=LAYER_NORM_EPSILON):
    """The statistics both LayerNorms compute (`layer_norm` in training, `normalize` in
    decoding), in float32 over the last axis of `x` `[..., d]`: `(x - mean, 1 / sqrt(variance
    + epsilon))`, float32 `[..., d]` and `[..., 1]`."""
    if x.dtype != tf.float32:
        x = tf.cast(x, tf.float32)
    centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    return centered, tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
                                   + epsilon)


def normalize(x, norm=None):
    """LayerNormalization for the decoding steps, with float32 statistics over the last axis of
    `x` `[..., d]`: (x - mean) * (gamma / sqrt(variance + eps)) + beta, Keras' arithmetic
    regrouped into one op fewer. Without `norm` (its gamma and beta folded into the next
    projection, `fold_norm`), (x - mean) / sqrt(variance + eps).

    Args:
        x: `[..., d]`.
        norm: `LayerNormalization.inference_weights()` or None.

    Returns:
        `[..., d]`, the dtype of `x`.
    """
    centered, inverse_std = standardize(x)
    y = centered * (inverse_std if norm is None else inverse_std * norm["gamma"])
    if norm is not None:
        y += norm["beta"]
    return y if x.dtype == tf.float32 else tf.cast(y, x.dtype)


def fold_norm(norm: dict, kernel, bias):
    """Folds a pre-norm LayerNorm's gamma and beta into the projection that reads its output:
    (n * gamma + beta) @ W + b = n @ (gamma[:, None] * W) + (beta @ W + b), as an inference
    graph folds a batch norm into its convolution (two ops fewer a norm at every step).

    Args:
        norm: `{"gamma", "beta"}` float32 `[d]`.
        kernel: `[d, out]`; bias: `[out]`, of one dtype.

    Returns:
        `(kernel, bias)`, computed in float32 and cast back to the kernel's dtype.
    """
    dtype = kernel.dtype
    w = tf.cast(kernel, tf.float32)
    folded_kernel = tf.cast(norm["gamma"][:, None] * w, dtype)
    folded_bias = tf.cast(bias, tf.float32) + tf.linalg.matvec(w, norm["beta"], transpose_a=True)
    return folded_kernel, tf.cast(folded_bias, dtype)
