"""Dropout (Srivastava et al., 2014) that draws 16 random bits per activation."""

import keras
import tensorflow as tf

# A dropped activation is one whose 16 random bits fall below round(rate * 2**16).
_LEVELS = 2 ** 16


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (same rate, seed generator and config) that decides each
    activation with 16 random bits (`dropout`) instead of a random number of its dtype.

    A random number costs the same whatever its width, so two decisions per 32-bit draw halve
    the random number generation, the larger part of dropout's cost. `noise_shape` falls back
    to Keras.
    """

    def call(self, inputs, training=False):
        if not training or not 0 < self.rate < 1 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        seed = tf.cast(tf.math.floormod(self.seed_generator.next(), tf.int32.max - 1), tf.int32)
        return dropout(inputs, self.rate, seed)


def dropout(x, rate, seed):
    """Inverted dropout: zeros each activation with probability round(rate * 2**16) / 2**16
    (within 2**-17 of `rate`) and scales the others to keep the expectation.

    Args:
        x: a float tensor.
        rate: float in (0, 1).
        seed: int32 `[2]`, for `tf.random.stateless_uniform`.

    Returns:
        A tensor of the shape and dtype of `x`.
    """
    threshold = round(rate * _LEVELS)
    size = tf.size(x)
    bits = tf.random.stateless_uniform([(size + 1) // 2], seed, minval=None, maxval=None,
                                       dtype=tf.uint32)
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]  # two per draw
    keep = tf.reshape(halves >= threshold, tf.shape(x))
    scale = tf.cast(_LEVELS / (_LEVELS - threshold), x.dtype)
    return tf.where(keep, x * scale, tf.zeros((), x.dtype))
