"""Training and evaluation under MirroredStrategy on 2 logical CPUs equal single-device ones."""

import re
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import MaskedLabelSmoothedCrossEntropy, ModelConfig, Transformer
from keras_transformer import compat
from keras_transformer.training import callbacks
from keras_transformer.config import ConfigError
from keras_transformer.training.losses import TargetTokens
from keras_transformer.training.runner import build_compiled_state, make_strategy

from helpers import read_events

VOCAB = 30


def batch_with_uneven_tokens():
    """Six pairs whose halves (one per replica) hold different numbers of target tokens."""
    rng = np.random.default_rng(0)
    source = rng.integers(4, VOCAB, size=(6, 8)).astype("int32")
    target = rng.integers(4, VOCAB, size=(6, 7)).astype("int32")
    target[:3, 2:] = 0  # replica 0: 6 tokens; replica 1: 21 tokens
    source[:3, 5:] = 0
    return (source, target[:, :-1]), target[:, 1:]


def tiny_model(strategy, initial_weights, learning_rate, metrics=None, dropout=0.0,
               rdrop_alpha=0.0):
    """The tiny preset (without dropout by default), compiled with plain SGD under `strategy`."""
    with strategy.scope():
        config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB,
                                         target_vocab_size=VOCAB, dropout=dropout)
        model = Transformer(config)
        model.build()
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=learning_rate),
                      loss=MaskedLabelSmoothedCrossEntropy(label_smoothing=0.1),
                      metrics=metrics, rdrop_alpha=rdrop_alpha)
    return model


def train_one_step(strategy, initial_weights, batch=None, rdrop_alpha=0.0, dropout=0.0):
    """(fit's loss, the gradient) of one step on `batch` (default `batch_with_uneven_tokens`)."""
    # The weight change is minus the gradient.
    model = tiny_model(strategy, initial_weights, 1.0, dropout=dropout, rdrop_alpha=rdrop_alpha)
    batch = batch_with_uneven_tokens() if batch is None else batch
    if len(batch[1].shape) == 3:  # a group: built first, as `training.train` builds it
        with strategy.scope():
            build_compiled_state(model, tf.data.Dataset.from_tensors(batch_with_uneven_tokens()))
        compat.skip_symbolic_build(model)
    history = model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 1
    gradients = [w0 - w1 for w0, w1 in zip(initial_weights, model.get_weights())]
    return history.history["loss"][0], gradients


def test_mirrored_loss_and_gradients_equal_single_device():
    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    weights = reference.get_weights()

    mirrored = make_strategy("mirrored")  # over the 2 logical CPUs of conftest.py
    assert mirrored.num_replicas_in_sync == 2
    single_loss, single_grads = train_one_step(tf.distribute.get_strategy(), weights)
    mirrored_loss, mirrored_grads = train_one_step(mirrored, weights)

    (inputs, target_out) = batch_with_uneven_tokens()
    expected = MaskedLabelSmoothedCrossEntropy(label_smoothing=0.1)(
        target_out, reference(inputs))
    np.testing.assert_allclose(single_loss, float(expected), rtol=1e-4)
    np.testing.assert_allclose(mirrored_loss, single_loss, rtol=1e-3)
    assert any(np.abs(g).max() > 1e-4 for g in single_grads)
    for single, replicated in zip(single_grads, mirrored_grads):
        np.testing.assert_allclose(replicated, single, rtol=1e-3, atol=1e-6)


def test_an_accumulated_update_equals_one_update_on_the_whole_group():
    """Gradient accumulation (`Transformer.train_step` on a `data.group_batches` group): one
    optimizer step over two micro-batches equals one step on both batches at once, on one
    device and on two replicas (which Keras's own accumulation refuses, keras-team/keras#17429)."""
    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    weights = reference.get_weights()
    first = batch_with_uneven_tokens()
    (source, target_in), target_out = first
    target_out = target_out[::-1].copy()
    target_out[:, 4:] = 0  # another token count per row and per micro-batch
    second = (source[::-1], target_in[::-1]), target_out
    group = tf.nest.map_structure(lambda a, b: np.stack([a, b], axis=1), first, second)
    whole = tf.nest.map_structure(lambda a, b: np.concatenate([a, b]), first, second)

    whole_loss, whole_grads = train_one_step(tf.distribute.get_strategy(), weights, whole)
    assert any(np.abs(g).max() > 1e-4 for g in whole_grads)
    for strategy in (tf.distribute.get_strategy(), make_strategy("mirrored")):
        loss, grads = train_one_step(strategy, weights, group)
        np.testing.assert_allclose(loss, whole_loss, rtol=1e-5)
        for accumulated, single in zip(grads, whole_grads):
            np.testing.assert_allclose(accumulated, single, rtol=1e-3, atol=1e-6)


def test_rdrop_without_dropout_is_the_plain_update():
    """Without dropout R-Drop's two copies of the batch agree: its consistency term and that
    term's gradient are 0, and the update is the plain step's, on one device and on two
    replicas (whose shares of the doubled batch hold different token counts)."""
    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    weights = reference.get_weights()
    plain_loss, plain_grads = train_one_step(tf.distribute.get_strategy(), weights)
    assert any(np.abs(g).max() > 1e-4 for g in plain_grads)
    for strategy in (tf.distribute.get_strategy(), make_strategy("mirrored")):
        loss, grads = train_one_step(strategy, weights, rdrop_alpha=5.0)
        np.testing.assert_allclose(loss, plain_loss, rtol=1e-4)
        for rdrop, plain in zip(grads, plain_grads):
            np.testing.assert_allclose(rdrop, plain, rtol=1e-3, atol=1e-6)


def test_rdrop_with_dropout_trains_and_counts_each_token_once():
    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    batch = batch_with_uneven_tokens()
    tokens = int((batch[1] != 0).sum())
    for strategy in (tf.distribute.get_strategy(), make_strategy("mirrored")):
        model = tiny_model(strategy, reference.get_weights(), 0.1, metrics=[TargetTokens()],
                           dropout=0.3, rdrop_alpha=5.0)
        history = model.fit(tf.data.Dataset.from_tensors(batch).repeat(3), epochs=1, verbose=0)
        assert history.history["target_tokens"] == [3 * tokens]
        assert np.isfinite(history.history["loss"][0])
        assert any(np.abs(w0 - w1).max() > 1e-4
                   for w0, w1 in zip(reference.get_weights(), model.get_weights()))


def test_rdrop_update_under_dropout_weighs_the_kl_by_half_alpha():
    """With dropout, one R-Drop step's update equals the gradient of the mean cross-entropy
    over both copies + alpha / 2 x the mean `symmetric_kl` between them, computed here from
    one forward pass over the repeated batch with the same dropout masks (the same seeds)."""
    from keras_transformer.training.losses import symmetric_kl

    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    weights = reference.get_weights()
    (source, target_in), target_out = batch_with_uneven_tokens()
    tokens = float((target_out != 0).sum())
    alpha = 5.0

    keras.utils.set_random_seed(7)
    model = tiny_model(tf.distribute.get_strategy(), weights, 0.0, dropout=0.3)
    twice = [tf.constant(np.concatenate([a, a])) for a in (source, target_in, target_out)]
    with tf.GradientTape(persistent=True) as tape:
        logits = model((twice[0], twice[1]), training=True)
        cross_entropy = MaskedLabelSmoothedCrossEntropy(label_smoothing=0.1)(twice[2], logits)
        consistency = tf.reduce_sum(symmetric_kl(logits[:len(source)], logits[len(source):])
                                    * tf.cast(target_out != 0, tf.float32)) / tokens
    ce_grads, kl_grads = ([tf.convert_to_tensor(g)  # the embedding's IndexedSlices, dense
                           for g in tape.gradient(term, model.trainable_weights)]
                          for term in (cross_entropy, consistency))
    assert float(consistency) > 1e-3  # the two copies' dropout masks differ
    assert max(float(tf.reduce_max(tf.abs(g))) for g in kl_grads) > 1e-3

    keras.utils.set_random_seed(7)
    _, grads = train_one_step(tf.distribute.get_strategy(), weights, rdrop_alpha=alpha,
                              dropout=0.3)
    for update, ce, kl in zip(grads, ce_grads, kl_grads):
        np.testing.assert_allclose(update, ce + 0.5 * alpha * kl, rtol=1e-3, atol=1e-5)


def test_rdrop_refuses_grouped_batches_and_a_negative_weight():
    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    model = Transformer(config)
    with pytest.raises(ValueError, match=r"rdrop_alpha=-1.0 must be >= 0"):
        model.compile(optimizer="sgd", loss=MaskedLabelSmoothedCrossEntropy(), rdrop_alpha=-1.0)
    model.compile(optimizer="sgd", loss=MaskedLabelSmoothedCrossEntropy(), rdrop_alpha=1.0)
    group = tf.nest.map_structure(lambda a: np.stack([a, a], axis=1), batch_with_uneven_tokens())
    with pytest.raises(ValueError, match="R-Drop .* does not run on grouped batches"):
        model.train_step(group)


def test_split_cpu_is_idempotent_and_refuses_a_late_change():
    from keras_transformer.config import ConfigError
    from keras_transformer.training.runner import split_cpu

    split_cpu(2)  # what conftest.py set: nothing to do
    assert len(tf.config.list_logical_devices("CPU")) == 2
    with pytest.raises(ConfigError, match="cannot split the CPU into 3 logical devices"):
        split_cpu(3)


def losses_over_two_batches(strategy, initial_weights):
    """(fit's training loss, evaluate's loss) over two batches of unequal sizes, weights
    unchanged (rate 0, no dropout)."""
    model = tiny_model(strategy, initial_weights, 0.0)
    (source, target_in), target_out = batch_with_uneven_tokens()
    batches = [((source, target_in), target_out),
               ((source[:2], target_in[:2]), target_out[:2])]
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(batches), output_signature=(
            (tf.TensorSpec([None, 8], tf.int32), tf.TensorSpec([None, 6], tf.int32)),
            tf.TensorSpec([None, 6], tf.int32)))
    training_loss = model.fit(dataset, epochs=1, verbose=0).history["loss"][0]
    return training_loss, model.evaluate(dataset, verbose=0, return_dict=True)["loss"]


def test_reported_losses_are_the_mean_over_all_target_tokens():
    """Keras would weight each batch's mean by its sentences; fit and evaluate report the mean
    over every target token, on one device and on two replicas."""
    from keras_transformer.training.losses import label_smoothed_cross_entropy

    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    weights = reference.get_weights()
    (inputs, target_out) = batch_with_uneven_tokens()
    token_losses = label_smoothed_cross_entropy(target_out, reference(inputs), 0.1).numpy()
    mask = target_out != 0
    # The second batch is the first two pairs of the first: 1 target token each, 21 in all.
    expected = ((token_losses * mask).sum() + (token_losses * mask)[:2].sum()) / (
        mask.sum() + mask[:2].sum())
    batch_means = [(token_losses * mask).sum() / mask.sum(),
                   (token_losses * mask)[:2].sum() / mask[:2].sum()]
    keras_default = (6 * batch_means[0] + 2 * batch_means[1]) / 8  # weighted by pairs
    assert abs(keras_default - expected) > 1e-3 * expected

    for strategy in (tf.distribute.get_strategy(), make_strategy("mirrored")):
        training_loss, evaluation_loss = losses_over_two_batches(strategy, weights)
        np.testing.assert_allclose(training_loss, expected, rtol=1e-5)
        np.testing.assert_allclose(evaluation_loss, expected, rtol=1e-5)


def test_step_summaries_count_the_tokens_of_every_replica(tmp_path, monkeypatch):
    """Under 2 replicas `fit`'s batch logs hold a mean of the replicas' own running values, not
    the step's 21 target tokens; the TensorBoard step summaries read the model's metrics
    instead: the step's tokens and its mean loss per token, as the epoch reports them."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(callbacks, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    tick = keras.callbacks.LambdaCallback(  # the step takes 1 s on this clock
        on_train_batch_begin=lambda batch, logs: setattr(clock, "now", clock.now + 1.0))
    batch_logs = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_logs.append(dict(logs)))
    config = ModelConfig.from_preset("tiny", source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    reference = Transformer(config)
    reference.build()
    model = tiny_model(make_strategy("mirrored"), reference.get_weights(), 0.1,
                       metrics=[TargetTokens()])
    history = model.fit(tf.data.Dataset.from_tensors(batch_with_uneven_tokens()), epochs=1,
                        verbose=0, callbacks=[tick, record,
                                              callbacks.StepSummaries(tmp_path, every_steps=1)])
    assert history.history["target_tokens"] == [21.0]
    assert batch_logs[0]["target_tokens"] < 21.0  # what the summaries must not read
    steps = read_events(tmp_path, steps=True)
    assert [(step, float(value)) for step, value in steps["step_tokens_per_second"]] == [
        (1, 21.0)]
    [(step, loss)] = steps["step_loss"]
    assert step == 1 and float(loss) == pytest.approx(history.history["loss"][0], rel=1e-6)


@pytest.mark.parametrize("tf_config, message", [
    ("{cluster", "TF_CONFIG: not JSON"),
    ("[1]", "TF_CONFIG: a JSON list, not an object"),
    ('{"cluster": "x"}', '"cluster" must map job names to lists of "host:port"'),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}',
     '"task" must name a job of the cluster'),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
     '"task" index 2 is not one of the 2 worker addresses'),
])
def test_a_malformed_tf_config_is_a_config_error_naming_the_field(monkeypatch, tf_config,
                                                                  message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_strategy("auto")


def test_the_tpu_strategy_without_a_tpu_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train.strategy=tpu: no TPU found"):
        make_strategy("tpu")
