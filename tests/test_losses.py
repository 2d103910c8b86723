"""Label-smoothed cross-entropy and masked accuracy against reference computations."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from keras_transformer.training.losses import symmetric_kl, symmetric_kl_of_halves


def example(seed=0, vocab=11):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(2, 5, vocab)).astype("float32")
    labels = rng.integers(1, vocab, size=(2, 5)).astype("int32")
    labels[0, 3:] = 0
    labels[1, 4:] = 0
    return labels, logits


def reference(labels, logits, epsilon):
    """Mean over real tokens of -sum_v q_v log softmax(z)_v with q the smoothed one-hot."""
    vocab = logits.shape[-1]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q = np.eye(vocab)[labels] * (1 - epsilon) + epsilon / vocab
    per_token = -(q * log_probs).sum(-1)
    mask = labels != 0
    return per_token[mask].mean()


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_matches_one_hot_reference(epsilon):
    labels, logits = example()
    loss = MaskedLabelSmoothedCrossEntropy(label_smoothing=epsilon)(labels, logits)
    np.testing.assert_allclose(float(loss), reference(labels, logits, epsilon), rtol=1e-5)


def test_matches_keras_categorical_crossentropy_with_smoothing():
    labels, logits = example(seed=1)
    mask = labels != 0
    keras_loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)(
        np.eye(logits.shape[-1])[labels[mask]], logits[mask])
    ours = MaskedLabelSmoothedCrossEntropy(label_smoothing=0.1)(labels, logits)
    np.testing.assert_allclose(float(ours), float(keras_loss), rtol=1e-5)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradient_matches_autodiff_of_the_one_hot_formula(epsilon):
    """The hand-written gradient (fused kernel + smoothing term) equals autodiff of the textbook
    loss, padding and per-sentence weights included, also in a graph with unknown shapes."""
    labels, logits = example(seed=4, vocab=13)
    weights = np.array([0.5, 2.0], np.float32)
    vocab = logits.shape[-1]
    q = tf.constant(np.eye(vocab)[labels] * (1 - epsilon) + epsilon / vocab, tf.float32)
    mask = tf.constant(labels != 0, tf.float32) * weights[:, None]

    def reference_loss(z):
        per_token = -tf.reduce_sum(q * tf.nn.log_softmax(z), axis=-1)
        return tf.reduce_sum(per_token * mask) / tf.reduce_sum(mask)  # weighted token mean

    loss_fn = MaskedLabelSmoothedCrossEntropy(label_smoothing=epsilon)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    def ours(z):
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = loss_fn(labels, z, sample_weight=weights)
        return loss, tape.gradient(loss, z)

    z = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(z)
        expected_loss = reference_loss(z)
    expected_gradient = tape.gradient(expected_loss, z)
    loss, gradient = ours(z)
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-5)
    np.testing.assert_allclose(gradient.numpy(), expected_gradient.numpy(), atol=1e-6)
    assert np.all(gradient.numpy()[labels == 0] == 0)


def test_zero_epsilon_equals_sparse_crossentropy():
    labels, logits = example(seed=2)
    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    ours = MaskedLabelSmoothedCrossEntropy(label_smoothing=0.0)
    np.testing.assert_allclose(float(ours(labels, logits)), float(sparse(labels, logits)),
                               rtol=1e-5)


def test_padding_contributes_nothing():
    labels, logits = example(seed=3)
    changed = logits.copy()
    changed[labels == 0] = np.random.default_rng(9).normal(scale=50, size=changed[labels == 0].shape)
    loss = MaskedLabelSmoothedCrossEntropy()
    np.testing.assert_allclose(float(loss(labels, logits)), float(loss(labels, changed)), rtol=1e-6)
    # Appending padded positions does not dilute the mean.
    padded_labels = np.pad(labels, [(0, 0), (0, 4)])
    padded_logits = np.pad(logits, [(0, 0), (0, 4), (0, 0)])
    np.testing.assert_allclose(float(loss(padded_labels, padded_logits)),
                               float(loss(labels, logits)), rtol=1e-5)


def test_masked_accuracy_counts_real_tokens_only():
    labels = np.array([[5, 6, 7, 0], [8, 9, 0, 0]])
    logits = np.zeros((2, 4, 10), "float32")
    for (b, t), label in np.ndenumerate(labels):
        logits[b, t, label if (b, t) != (0, 1) else 1] = 1.0  # one real token wrong
    logits[:, :, 3] = np.where(labels == 0, 5.0, 0.0)  # padding predicted wrong
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    np.testing.assert_allclose(float(metric.result()), 4 / 5)
    metric.update_state(labels[:1, :1], logits[:1, :1])  # one more right token: 5 of 6
    np.testing.assert_allclose(float(metric.result()), 5 / 6)
    metric.reset_state()
    assert float(metric.result()) == 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_masked_accuracy_matches_argmax(dtype):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(3, 7, 50)).astype("float32")
    labels = rng.integers(1, 50, size=(3, 7))
    labels[:, 5:] = 0
    labels[0, :4] = logits[0, :4].argmax(-1)  # some right, the rest mostly wrong
    metric = MaskedAccuracy()
    metric.update_state(labels, tf.cast(logits, dtype))
    real = labels != 0
    expected = (logits.argmax(-1) == labels)[real].mean()
    assert expected > 0
    np.testing.assert_allclose(float(metric.result()), expected)


def test_loss_config_round_trip():
    loss = MaskedLabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=3)
    clone = MaskedLabelSmoothedCrossEntropy.from_config(loss.get_config())
    assert (clone.label_smoothing, clone.pad_id) == (0.2, 3)


def numpy_symmetric_kl(logits_1, logits_2):
    p1, p2 = (np.exp(z) / np.exp(z).sum(-1, keepdims=True) for z in (logits_1, logits_2))
    return 0.5 * ((p1 * np.log(p1 / p2)).sum(-1) + (p2 * np.log(p2 / p1)).sum(-1))


def test_symmetric_kl_is_the_mean_of_both_kl_directions():
    _, logits_1 = example(seed=2)
    _, logits_2 = example(seed=3)
    expected = numpy_symmetric_kl(logits_1, logits_2)
    kl = symmetric_kl(logits_1, tf.constant(logits_2, tf.bfloat16))  # any float dtype
    assert kl.shape == (2, 5) and kl.dtype == tf.float32
    np.testing.assert_allclose(symmetric_kl(logits_1, logits_2), expected, rtol=1e-4)
    np.testing.assert_allclose(symmetric_kl(logits_2, logits_1), expected, rtol=1e-4)
    np.testing.assert_allclose(symmetric_kl(logits_1, logits_1), 0.0, atol=1e-6)
    np.testing.assert_allclose(kl, expected, rtol=0.05)


def test_symmetric_kl_of_halves_pairs_row_i_with_row_batch_plus_i():
    _, logits_1 = example(seed=2)
    _, logits_2 = example(seed=3)
    both = tf.constant(np.concatenate([logits_1, logits_2]), tf.bfloat16)  # [4, 5, vocab]
    kl = symmetric_kl_of_halves(both)
    assert kl.shape == (2, 5) and kl.dtype == tf.float32
    np.testing.assert_allclose(kl, symmetric_kl(both[:2], both[2:]), rtol=1e-6)
    np.testing.assert_allclose(kl, numpy_symmetric_kl(logits_1, logits_2), rtol=0.05)
    assert not np.allclose(kl, numpy_symmetric_kl(logits_1[::-1], logits_2))


def test_symmetric_kl_gradient_reaches_both_passes():
    """The gradient against central differences of the float64 reference, for both inputs."""
    logits_1, logits_2 = (example(seed=seed)[1].astype("float64") for seed in (4, 5))
    z1, z2 = tf.Variable(logits_1, dtype=tf.float32), tf.Variable(logits_2, dtype=tf.float32)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(symmetric_kl(z1, z2))
    gradients = tape.gradient(total, [z1, z2])
    epsilon = 1e-6
    for index, gradient in enumerate(gradients):
        expected = np.zeros(logits_1.shape[-1])
        for v in range(logits_1.shape[-1]):
            moved = []
            for sign in (1, -1):
                pair = [logits_1.copy(), logits_2.copy()]
                pair[index][1, 2, v] += sign * epsilon
                moved.append(numpy_symmetric_kl(*pair).sum())
            expected[v] = (moved[0] - moved[1]) / (2 * epsilon)
        assert np.abs(expected).max() > 1e-2
        np.testing.assert_allclose(gradient[1, 2], expected, rtol=1e-3, atol=1e-5)
