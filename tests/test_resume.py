"""Resuming and extending training runs: a run killed with SIGKILL resumes where it stopped and
ends with the weights of the uninterrupted run, a larger train.epochs extends a finished run as
if it had never stopped, a damaged checkpoint is named and training goes on from the one before,
and the training stream restarts at the batch where it stopped."""

import collections
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.training import runner as training
from keras_transformer import data as data_lib
from keras_transformer.config import ConfigError, ExperimentConfig
from keras_transformer.runs.folder import Run
from keras_transformer.data.tokenizers import load_tokenizers
from helpers import read_events, write_config


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def assert_same_weights(run_dir: Path, other_dir: Path, weights="last") -> None:
    got = Run(run_dir).load_model(weights).get_weights()
    for got_array, want in zip(got, Run(other_dir).load_model("last").get_weights()):
        np.testing.assert_array_equal(got_array, want)


def resumable_config(tiny_experiment, epochs: int) -> ExperimentConfig:
    """The run the resume tests stop and continue: 2 steps per epoch on one device, with
    dropout (0.1), and validation BLEU on 4 sentences (so best weights are tracked)."""
    return tiny_experiment(epochs=epochs, steps_per_epoch=2, strategy="one_device",
                           validation_bleu_sentences=4)


@pytest.fixture(scope="module")
def uninterrupted_run(tiny_experiment, tmp_path_factory):
    """`resumable_config` trained for 3 epochs in one go."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    training.train(resumable_config(tiny_experiment, 3), run_dir, verbose=0)
    return run_dir


def test_a_larger_epochs_extends_a_run_as_if_it_had_never_stopped(uninterrupted_run,
                                                                  tiny_experiment, tmp_path,
                                                                  capsys):
    """One epoch, then train.epochs=3 on the same folder: epochs 2 and 3 follow with the
    optimizer's step count and moments, dropout's seeds and the training stream where epoch 1
    left them, so the weights equal those of the run trained for 3 epochs in one go."""
    run_dir = tmp_path / "run"
    training.train(resumable_config(tiny_experiment, 1), run_dir, verbose=0)
    capsys.readouterr()
    history = training.train(resumable_config(tiny_experiment, 3), run_dir, verbose=0)
    assert ("keras-transformer train: resuming at epoch 2, optimizer step 2 (1 replica(s), "
            "float32)") in capsys.readouterr().out
    assert history.epoch == [1, 2]
    assert int(history.model.optimizer.iterations.numpy()) == 6
    run = Run(run_dir)
    assert (run.state()["epoch"], run.state()["optimizer_step"]) == (3, 6)
    assert run.config.train.epochs == 3
    assert [p.name for p in run.epoch_checkpoints()] == [
        "epoch_001.weights.h5", "epoch_002.weights.h5", "epoch_003.weights.h5"]
    assert len(read_events(run_dir / "logs" / "validation")["epoch_bleu"]) == 3
    assert_same_weights(run_dir, uninterrupted_run)


def test_a_damaged_checkpoint_is_named_and_training_goes_on_from_the_one_before(
        uninterrupted_run, tiny_experiment, tmp_path, capsys, caplog):
    """The newest checkpoint truncated (what a failing disk or a careless copy leaves; a kill
    cannot: files are renamed into place whole): extending the run says which file is damaged,
    resumes from epoch 2's checkpoint, and trains epoch 3 again to the same weights."""
    import logging

    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted_run, run_dir)
    checkpoint = run_dir / "checkpoints" / "epoch_003.weights.h5"
    truncate(checkpoint)
    with caplog.at_level(logging.WARNING, logger="keras_transformer.runs.folder"):
        history = training.train(resumable_config(tiny_experiment, 4), run_dir, verbose=0)
    assert f"{checkpoint} is damaged (Unable to synchronously open file (truncated" in caplog.text
    assert (f"resuming from {run_dir / 'checkpoints' / 'epoch_002.weights.h5'}, the newest "
            "checkpoint that loads (damaged: epoch_003.weights.h5)") in caplog.text
    assert "resuming at epoch 3, optimizer step 4" in capsys.readouterr().out
    assert history.epoch == [2, 3]
    assert Run(run_dir).state()["epoch"] == 4
    assert_same_weights(run_dir, uninterrupted_run, weights=checkpoint)


def test_a_killed_run_resumes_where_it_stopped_and_ends_as_if_never_killed(
        uninterrupted_run, tiny_experiment, tmp_path, capsys):
    """SIGKILL once epoch 1 is recorded; the same command, run in this process, resumes from the
    newest checkpoint (optimizer step and moments, dropout's seeds) at the batch of the training
    stream where that epoch ended, and ends with exactly the weights of the run trained without
    a kill (in this process: the same CPU kernels on the same batches give the same floats)."""
    config_path = write_config(resumable_config(tiny_experiment, 3), tmp_path / "exp.yaml")
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--config",
               str(config_path), "--output", str(run_dir), "--progress", "2"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    state = run_dir / "state.json"
    deadline = time.time() + 400
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert state.exists(), "no epoch was recorded before the deadline"
    assert json.loads(state.read_text())["epoch"] < 3, "the run ended before it was killed"

    capsys.readouterr()
    assert cli.main(command[3:]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines()
                if "keras-transformer train: " in line)
    epoch = int(line.split("resuming at epoch ")[1].split(",")[0])
    step = int(line.split("optimizer step ")[1].split()[0])
    assert epoch in (2, 3) and step == 2 * (epoch - 1), line
    assert line.endswith("(1 replica(s), float32)"), line
    assert Run(run_dir).state()["epoch"] == 3
    assert not list(run_dir.rglob(".partial-*"))
    assert_same_weights(run_dir, uninterrupted_run)


def test_the_training_stream_resumed_at_a_batch_reads_what_the_uninterrupted_one_read(
        sentencepiece_vocab, multi30k_config):
    """What makes a resumed run see the uninterrupted run's batches: the stream from batch N,
    built anew (as in a new process), equals the whole stream from its N-th batch, across pass
    boundaries; each pass is shuffled anew."""
    config = multi30k_config(tokens_per_batch=1024, max_pair_length=32)
    pairs = data_lib.load_pairs(config, "train").take(2000)
    tokenizers = load_tokenizers(*sentencepiece_vocab)

    def fingerprints(stream, count):
        return [hashlib.sha1(source.numpy().tobytes() + target.numpy().tobytes()).hexdigest()
                for (source, _), target in stream.take(count)]

    def new_stream(seed=7):
        return data_lib.TrainingStream(pairs, *tokenizers, config, seed=seed)

    length = new_stream().pass_length()
    whole = fingerprints(new_stream().batches(), 2 * length + 3)
    for start in (3, length, length + 2):
        assert fingerprints(new_stream().batches(start), 3) == whole[start:start + 3], start
    assert set(whole[:length]) != set(whole[length:2 * length])  # another shuffle, other batches
    assert fingerprints(new_stream(seed=8).batches(), 3) != whole[:3]


def test_the_training_stream_order_depends_on_its_seed_alone(sentencepiece_vocab,
                                                            multi30k_config):
    """The passes are shuffled by `seed` and the pass index whatever TensorFlow's global seed
    (`train.seed`, set by training, may be 0, which once failed tracing the shuffle)."""
    config = multi30k_config(tokens_per_batch=1024, max_pair_length=32)

    @functools.cache  # each (global seed, seed) built once
    def first_batches(global_seed, seed):
        tf.random.set_seed(global_seed)  # clears the kernel cache: tokenizers are loaded after
        stream = data_lib.TrainingStream(data_lib.load_pairs(config, "train").take(500),
                                         *load_tokenizers(*sentencepiece_vocab), config,
                                         seed=seed)
        # Shapes unknown to the graph: `fit` traces its step once for every bucket's batches
        # (test_model.test_fit_traces_the_train_step_once_for_batches_of_every_shape).
        assert [spec.shape.as_list() for spec in tf.nest.flatten(
            stream.batches().element_spec)] == [[None, None]] * 3
        return [target.numpy().tobytes() for _, target in stream.batches().take(3)]

    for seed in (0, 2 ** 31 - 1, 7):
        assert first_batches(0, seed) == first_batches(5, seed) == first_batches(None, seed)
    assert first_batches(None, 0) != first_batches(None, 7)  # and leaves no global seed set


@pytest.mark.parametrize("accumulate_steps", [1, 3])
def test_a_carrying_stream_makes_only_full_batches_and_resumes_anywhere(
        sentencepiece_vocab, multi30k_config, accumulate_steps):
    """With `data.carry_remainders` every element is full (one shape per bucket), the first P
    passes' elements hold their pairs but those still carried, each once, and a stream started
    at any element equals the whole stream from there, carried pairs included."""
    config = multi30k_config(tokens_per_batch=1024, max_pair_length=32)
    assert config.carry_remainders
    pairs = data_lib.load_pairs(config, "validation").take(400)
    stream = data_lib.TrainingStream(pairs, *load_tokenizers(*sentencepiece_vocab), config,
                                     seed=7, accumulate_steps=accumulate_steps)
    counts = stream.bucket_counts()
    passes = 3
    made = sum(passes * count // unit for count, unit in zip(*stream._emission_units()[1:]))
    whole = list(stream.batches().take(made + 5))
    sizes = {}
    for (source, _), target in whole:
        key = (source.shape[-1], target.shape[-1])
        assert sizes.setdefault(key, source.shape[0]) == source.shape[0]  # one shape a bucket
        assert source.shape[0] == 1024 // max(key)  # full
        if accumulate_steps > 1:
            assert source.shape[1] == accumulate_steps
    _, _, carried = stream.position(made)
    pairs_made = sum(source.shape[0] * accumulate_steps for (source, _), _ in whole[:made])
    assert pairs_made == passes * sum(counts.values()) - sum(carried.values())
    rows = [row.tobytes() for (source, _), target in whole[:made]
            for row in np.concatenate([source.numpy(), target.numpy()], axis=-1).reshape(
                -1, source.shape[-1] + target.shape[-1])]
    assert max(collections.Counter(rows).values()) <= passes
    for start in (1, made // 3, made // 2 + 1, made - 1, made):
        resumed = list(stream.batches(start).take(len(whole) - start))
        assert len(resumed) == len(whole) - start
        for got, want in zip(resumed, whole[start:]):
            for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert any(stream.position(start)[2] for start in (made // 2 + 1, made))  # pairs carried


def test_a_grouped_training_stream_holds_each_pass_once_and_resumes_at_a_group(
        sentencepiece_vocab, multi30k_config):
    """Without carrying, with gradient accumulation the stream's elements are groups of
    batches of one shape: a pass still holds every kept pair once, and a stream started at
    group N equals the whole stream from its N-th group."""
    config = multi30k_config(tokens_per_batch=1024, max_pair_length=32, carry_remainders=False)
    pairs = data_lib.load_pairs(config, "train").take(1000)
    tokenizers = load_tokenizers(*sentencepiece_vocab)

    def new_stream(accumulate_steps):
        return data_lib.TrainingStream(pairs, *tokenizers, config, seed=7,
                                       accumulate_steps=accumulate_steps)

    def rows(elements):
        return sorted(row.tobytes() for (source, _), target in elements
                      for row in np.concatenate([source.numpy(), target.numpy()], axis=-1)
                      .reshape(-1, source.shape[-1] + target.shape[-1]))

    batches, grouped = new_stream(1), new_stream(3)
    groups = list(grouped.batches().take(grouped.pass_length()))
    assert batches.pass_length() // 3 <= len(groups) < batches.pass_length()
    assert max(source.shape[1] for (source, _), _ in groups) == 3
    pass_rows = rows(batches.batches().take(batches.pass_length()))
    assert rows(groups) == pass_rows  # every pair of the pass once, as ungrouped
    start = len(groups) - 1
    [resumed] = new_stream(3).batches(start).take(1)
    for a, b in zip(tf.nest.flatten(resumed), tf.nest.flatten(groups[start])):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("carry", [True, False])
def test_a_stream_whose_pairs_are_all_dropped_says_so_in_one_line(sentencepiece_vocab,
                                                                   multi30k_config, carry):
    config = multi30k_config(max_pair_length=3, carry_remainders=carry)  # START, 1 piece, END
    pairs = data_lib.load_pairs(config, "validation").take(50)
    stream = data_lib.TrainingStream(pairs, *load_tokenizers(*sentencepiece_vocab), config,
                                     seed=1)
    with pytest.raises(ConfigError, match=r"^data.train_split='train' gives no batches: every "
                                          r"pair is empty or longer than "
                                          r"data.max_pair_length=3$"):
        stream.pass_length()
