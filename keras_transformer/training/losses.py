"""Masked, label-smoothed cross-entropy (section 5.4), R-Drop's consistency term, masked token
accuracy and token counts."""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.config import PAD_ID


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedLabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against (1 - epsilon) * one_hot(y) + epsilon / vocab, padding ignored.

    Computed by `label_smoothed_cross_entropy` (one XLA fusion each way): no one-hot
    `[batch, length, vocab]` tensor and no log-softmax is materialized.

    The result is the mean over the real (non-padding) target tokens of the global batch. Under a
    distribution strategy each replica weights its per-token losses by 1 / (tokens in all
    replicas) and Keras sums them ("sum" reduction, which Keras does not rescale by the replica
    count): the sum of the replicas' losses, and of their gradients, is then exactly the
    single-device value, however unevenly the tokens fall between replicas.

    Args:
        label_smoothing: epsilon (0.1 in the paper); 0 gives plain sparse cross-entropy.
        pad_id: target id that contributes nothing.

    Call arguments:
        y_true: int `[batch, length]`.
        y_pred: logits `[batch, length, vocab]`.
        sample_weight: optional float `[batch]` or `[batch, length]` token weights.
    """

    def __init__(self, label_smoothing=0.1, pad_id=PAD_ID, name="label_smoothed_ce", **kwargs):
        kwargs["reduction"] = "sum"
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def __call__(self, y_true, y_pred, sample_weight=None):
        weights = target_weights(y_true, sample_weight, self.pad_id)  # [batch, length]
        tokens = sum_over_replicas(ops.sum(weights))
        return super().__call__(y_true, y_pred,
                                sample_weight=weights / ops.maximum(tokens, 1.0))

    def call(self, y_true, y_pred):
        """Per-token losses `[batch, length]` (padding included; `__call__` weights it by 0)."""
        return label_smoothed_cross_entropy(
            tf.cast(y_true, tf.int32), tf.cast(y_pred, tf.float32), self.label_smoothing)

    def get_config(self):
        config = super().get_config()
        config.pop("reduction", None)
        return {**config, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}


def label_smoothed_cross_entropy(labels, logits, epsilon):
    """-sum_v q_v log softmax(logits)_v with q = (1 - epsilon) one_hot(labels) + epsilon / vocab.

    = logsumexp(z) - (1 - epsilon) z_y - epsilon mean(z), with gradient
    (softmax(z) - q) * upstream. At vocab 8000 the `[tokens, vocab]` passes over the logits are a
    large part of a small model's training step, so the loss and its gradient are each one
    XLA-compiled function: XLA fuses the softmax, the smoothed target distribution (a one-hot
    it never materializes) and the upstream scaling into a single loop over the logits for the
    forward pass and a single loop for the backward pass, where TensorFlow's kernels (even the
    fused sparse cross-entropy one) write several `[tokens, vocab]` float32 tensors.

    Args:
        labels: int32 `[...]`, ids in [0, vocab).
        logits: float `[..., vocab]` (bfloat16 logits are read as float32 inside the fusion;
            the gradient has their dtype).
        epsilon: label smoothing (Python float).

    Returns:
        float32 `[...]` losses.
    """
    shape = tf.shape(labels)
    flat_labels = tf.reshape(labels, [-1])

    @tf.custom_gradient
    def fused(flat_logits):
        losses, logsumexp = _smoothed_cross_entropy(flat_logits, flat_labels, epsilon)

        def grad(upstream):  # [n]
            return _smoothed_cross_entropy_gradient(flat_logits, flat_labels, logsumexp,
                                                    upstream, epsilon)

        return losses, grad

    losses = fused(tf.reshape(logits, [-1, tf.shape(logits)[-1]]))
    return tf.reshape(losses, shape)


def _smoothed_target(labels, vocab_size, epsilon):
    """q = (1 - epsilon) one_hot(labels) + epsilon / vocab, float32 `[n, vocab]` (fused by XLA,
    never written out)."""
    return ((1.0 - epsilon) * tf.one_hot(labels, vocab_size, dtype=tf.float32)
            + epsilon / tf.cast(vocab_size, tf.float32))


@tf.function(jit_compile=True)
def _smoothed_cross_entropy(logits, labels, epsilon):
    """logits `[n, vocab]`, labels int32 `[n]` -> (losses float32 `[n]`, logsumexp `[n]`)."""
    logits = tf.cast(logits, tf.float32)
    logsumexp = tf.reduce_logsumexp(logits, axis=-1)
    target = _smoothed_target(labels, tf.shape(logits)[-1], epsilon)
    return logsumexp - tf.reduce_sum(target * logits, axis=-1), logsumexp


@tf.function(jit_compile=True)
def _smoothed_cross_entropy_gradient(logits, labels, logsumexp, upstream, epsilon):
    """(softmax(logits) - q) * upstream, `[n, vocab]` in the logits' dtype."""
    probs = tf.exp(tf.cast(logits, tf.float32) - logsumexp[:, None])
    target = _smoothed_target(labels, tf.shape(logits)[-1], epsilon)
    return tf.cast((probs - target) * upstream[:, None], logits.dtype)


def symmetric_kl(logits_1, logits_2):
    """R-Drop's consistency term (Liang et al., 2021): 1/2 (KL(P1 || P2) + KL(P2 || P1)) at every
    position, where P1 and P2 are the softmaxes of two forward passes with different dropout.

    = 1/2 sum_v (p1_v - p2_v) (log p1_v - log p2_v), one XLA fusion over the logits (and one
    for its gradient, which reaches both passes).

    Args:
        logits_1, logits_2: float `[..., vocab]` (read as float32).

    Returns:
        float32 `[...]`, >= 0, 0 where the two distributions are equal.
    """
    return symmetric_kl_of_halves(
        tf.concat([tf.cast(logits, tf.float32) for logits in (logits_1, logits_2)], axis=0))


def symmetric_kl_of_halves(logits):
    """`symmetric_kl(logits[:batch], logits[batch:])` for the logits of both passes in one
    tensor, as R-Drop's step has them.

    The halves are split inside the XLA function: slicing them outside would make each
    slice's gradient a zero-padded `[2 batch, ..., vocab]` tensor (`StridedSliceGrad`).

    Args:
        logits: float `[2 batch, ..., vocab]` (read as float32), the first pass's rows first.

    Returns:
        float32 `[batch, ...]`, >= 0.
    """
    shape = tf.shape(logits)
    halves = tf.reshape(logits, [2, -1, shape[-1]])
    return tf.reshape(_symmetric_kl_of_halves(halves),
                      tf.concat([[shape[0] // 2], shape[1:-1]], axis=0))


@tf.function(jit_compile=True)
def _symmetric_kl_of_halves(halves):
    """`[2, n, vocab]` -> float32 `[n]`."""
    log_p = tf.nn.log_softmax(tf.cast(halves, tf.float32))
    return 0.5 * tf.reduce_sum((tf.exp(log_p[0]) - tf.exp(log_p[1])) * (log_p[0] - log_p[1]),
                               axis=-1)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of non-padding target tokens whose label has the largest logit.

    That is argmax accuracy, except that a label tied for the largest logit counts as right.
    Counts tokens over the whole epoch, so long and short batches weigh by their token count.
    """

    def __init__(self, pad_id=PAD_ID, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        # A max and a gather, not an argmax: ops.argmax adds a float32 copy of the logits and
        # four passes over them (to order -0.0 before 0.0), measured in experiments/log/2026-11-25.md.
        label_logits = tf.gather(y_pred, y_true, batch_dims=len(y_true.shape))
        hits = ops.cast(label_logits >= ops.max(y_pred, axis=-1), "float32")
        self.correct.assign_add(ops.sum(hits * mask))
        self.total.assign_add(ops.sum(mask))

    def result(self):
        return ops.divide_no_nan(self.correct, self.total)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


def target_weights(target_out_ids, sample_weight=None, pad_id=PAD_ID):
    """float32 `[batch, length]`: `sample_weight` (`[batch]` or `[batch, length]`; default 1)
    on the real target tokens, 0 on padding."""
    weights = ops.cast(ops.not_equal(target_out_ids, pad_id), "float32")
    if sample_weight is None:
        return weights
    sample_weight = ops.cast(sample_weight, "float32")
    return weights * (sample_weight[:, None] if len(sample_weight.shape) == 1 else sample_weight)


def sum_over_replicas(value):
    """`value` summed over the replicas in sync; `value` itself outside a distribution
    strategy's replica context or with one replica."""
    replica_context = tf.distribute.get_replica_context()
    if replica_context is not None and replica_context.num_replicas_in_sync > 1:
        return replica_context.all_reduce("sum", value)
    return value


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Metric):
    """Non-padding target tokens seen in the epoch (summed over replicas): the numerator of
    tokens per second."""

    def __init__(self, pad_id=PAD_ID, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.tokens = self.add_variable(shape=(), initializer="zeros", name="tokens")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.tokens.assign_add(tf.reduce_sum(tf.cast(tf.not_equal(y_true, self.pad_id),
                                                     "float32")))

    def result(self):
        # A copy: returning the variable itself lets validation overwrite the training logs.
        return tf.identity(self.tokens.value)

    def reset_state(self):
        self.tokens.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}
