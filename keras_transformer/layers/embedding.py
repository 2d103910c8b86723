"""Token embeddings plus the paper's sinusoidal positional encoding (section 3.4 and 3.5)."""

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_transformer.layers.dropout import Dropout


def positional_encoding(length: int, depth: int) -> np.ndarray:
    """The sinusoidal table of section 3.5, float32 `[length, depth]`.

    PE(pos, 2i) = sin(pos / 10000^(2i / depth)), PE(pos, 2i + 1) = cos(pos / 10000^(2i / depth)):
    sines on even and cosines on odd dimensions, interleaved as in the paper (the tutorial
    concatenates them instead, an equivalent permutation that is not the paper's table).
    """
    positions = np.arange(length, dtype=np.float64)[:, None]  # [length, 1]
    rates = 1.0 / np.power(10000.0, np.arange(0, depth, 2, dtype=np.float64) / depth)  # [depth/2]
    angles = positions * rates[None, :]  # [length, depth / 2]
    table = np.zeros((length, depth), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : depth // 2])
    return table.astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), plus sinusoidal positions, then dropout.

    The embedding matrix can also serve as the pre-softmax projection (`project`), which is how
    the paper shares weights between the embeddings and the output layer (section 3.4). It is
    initialized N(0, d_model^-0.5), so that the scaled embeddings have unit variance.

    Args:
        vocab_size: number of token ids.
        d_model: embedding width.
        max_positions: longest sequence the positional table covers.
        dropout: rate applied to the sum of embeddings and positions.

    Call arguments:
        token_ids: int `[batch, length]`.
        start_position: position of the first token (int scalar); decoding one token at a time
            passes the step index.
        training: whether dropout is active.

    Returns:
        `[batch, length, d_model]` in the layer's compute dtype.
    """

    def __init__(self, *, vocab_size, d_model, max_positions, dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_positions = max_positions
        self.dropout = dropout
        self.token_embedding = keras.layers.Embedding(
            vocab_size,
            d_model,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=d_model**-0.5),
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)
        self.positions = positional_encoding(max_positions, d_model)
        # `embed` gathers rows of the float32 matrix and casts them, as keras.layers.Embedding
        # does: autocasting would cast the whole matrix at every call
        self.autocast = False

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.built = True

    def call(self, token_ids, start_position=0, training=None):
        positions = start_position + tf.range(tf.shape(token_ids)[1])
        x = self.embed(self.inference_weights(), token_ids, positions,
                       tf.as_dtype(self.compute_dtype))
        return self.dropout_layer(x, training=training)

    def inference_weights(self) -> dict:
        """What `embed` reads: `{"embeddings": [vocab_size, d_model]` in the variable's dtype,
        `"positions": float32 [max_positions, d_model]}`."""
        return {"embeddings": tf.convert_to_tensor(self.token_embedding.embeddings.value),
                "positions": tf.constant(self.positions)}

    def embed(self, weights, ids, positions, dtype):
        """`call` without dropout, what training and decoding both compute: token ids int32
        `[rows]` at `positions` (int32 `[rows]`, or a scalar for every row) -> `[rows, d_model]`
        in `dtype`; or ids `[batch, length]` at `positions` `[length]` -> `[batch, length,
        d_model]`."""
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:  # as keras.layers.Embedding: Keras builds with float inputs
            ids = tf.cast(ids, tf.int32)
        x = tf.gather(weights["embeddings"], ids)  # [rows, d_model]
        if x.dtype != dtype:
            x = tf.cast(x, dtype)
        x = x * tf.cast(math.sqrt(self.d_model), dtype)
        position = tf.gather(weights["positions"], positions)
        return x + (position if dtype == tf.float32 else tf.cast(position, dtype))

    def project(self, x):
        """Pre-softmax projection with the shared matrix: `[..., d_model]` -> `[..., vocab_size]`."""
        kernel = ops.cast(self.token_embedding.embeddings, x.dtype)  # [vocab, d_model]
        # A 2-D matmul that reads the matrix transposed in place: `x @ transpose(kernel)` copied
        # the vocab x d_model matrix at every call, i.e. at every decoding step.
        logits = tf.matmul(tf.reshape(x, [-1, self.d_model]), kernel, transpose_b=True)
        logits = tf.reshape(logits, tf.concat([tf.shape(x)[:-1], [self.vocab_size]], axis=0))
        logits.set_shape(x.shape[:-1] + (self.vocab_size,))
        return logits  # [..., vocab_size]

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.d_model)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model,
                      max_positions=self.max_positions, dropout=self.dropout)
        return config
