"""Tensor helpers of the layers: reading weights, the matmul kernel choice, a dense projection
over a tensor's last axis, and the packed layout of a batch's real tokens. No model
arithmetic."""

import keras
import tensorflow as tf


def value(variable, dtype):
    """A Keras variable's (or a tensor's) value as a tensor of `dtype`."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    tensor = tf.convert_to_tensor(variable)
    return tensor if tensor.dtype == dtype else tf.cast(tensor, dtype)


def matmul(a, b, transpose_b=False):
    """`a @ b` (`b` transposed in its last two axes if `transpose_b`), batched over leading axes.

    Float32 operands go to the Eigen kernel of `BatchMatMulV3`, which TensorFlow's oneDNN graph
    rewrite leaves alone; it rewrites MatMul and BatchMatMulV2 into oneDNN kernels that pay, at
    every call, for a primitive per new shape and for reordering weights that are not graph
    constants. The decoding loop makes new shapes at every step (the self-attention cache grows,
    finished sentences leave the batch) on small matrices, where that cost dominates. Bfloat16
    keeps `tf.matmul`, whose oneDNN kernels use the CPU's bfloat16 units.
    """
    if a.dtype != tf.float32:
        return tf.matmul(a, b, transpose_b=transpose_b)
    return tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=tf.float32, adj_y=transpose_b)


def dense(x, kernel, bias):
    """`x @ kernel + bias` over the last axis: `x` `[..., in]`, `kernel` `[in, out]`, `bias`
    `[out]` -> `[..., out]`, as one 2-D matmul over the rows of `x`."""
    if x.shape.rank == 2:
        return matmul(x, kernel) + bias
    shape = tf.shape(x)
    y = matmul(tf.reshape(x, [-1, shape[-1]]), kernel) + bias
    units = kernel.shape[-1]
    y = tf.reshape(y, tf.concat([shape[:-1], [units if units is not None else -1]], axis=0))
    y.set_shape(x.shape[:-1].concatenate([units]))
    return y


class Packing:
    """A padded batch `[batch, length]` as rows of its real tokens only, `[tokens, ...]`.

    Dense layers, LayerNorms and residual sums need no padding: the decoding path runs them on
    the real tokens only, and attention alone sees the padded layout. A batch's sources differ
    in subwords even when sorted by words, and padding is work no output needs.

    Attributes:
        mask: bool `[batch, length]`, True at real tokens.
        batch, length: int32 scalars.
        rows: int32 `[tokens]`, the flat indices of the real tokens.
        padded_rows: int32 `[batch * length]`, for each flat position the packed row to gather
            it from: its own for a real token; for padding, the last real token before it (the
            first row if there is none). Attention masks padded positions, and the mask bias
            gives their logits exactly, so any finite key or value does there: a copy is as good
            as zeros, and one gather costs less than zeros and a scatter.
    """

    def __init__(self, mask):
        self.mask = mask
        self.batch, self.length = tf.shape(mask)[0], tf.shape(mask)[1]
        flat = tf.reshape(mask, [-1])
        self.rows = tf.cast(tf.where(flat)[:, 0], tf.int32)
        self.padded_rows = tf.maximum(tf.cumsum(tf.cast(flat, tf.int32)) - 1, 0)

    def pack(self, x):
        """`[batch * length, ...]` -> `[tokens, ...]`."""
        return tf.gather(x, self.rows)

    def unpack(self, x):
        """`[tokens, ...]` -> `[batch * length, ...]` (padding: copies of real rows)."""
        return tf.gather(x, self.padded_rows)
