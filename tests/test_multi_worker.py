"""MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1 each read their own shard of
the training pairs and train in lockstep."""

import dataclasses
import gzip
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer import data as data_lib
from keras_transformer.config import ConfigError
from keras_transformer.runs.folder import Run
from keras_transformer.data.text_io import read_parallel_lines
from keras_transformer.data.tokenizers import load_tokenizers
from keras_transformer.training.runner import check_shared_vocabulary

from helpers import read_events


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def write_small_corpus(multi30k_dir, folder, train_pairs=400, val_pairs=40):
    """The first distinct Multi30k pairs as a files corpus: train.{de,en}.gz and val.{de,en}.gz."""
    folder.mkdir()
    for split, count in (("train", train_pairs), ("val", val_pairs)):
        pairs = []
        paths = {lang: multi30k_dir / f"{split}.{lang}.gz" for lang in ("de", "en")}
        for _, lines in read_parallel_lines(paths):
            pair = (lines["de"], lines["en"])
            if pair not in pairs:
                pairs.append(pair)
            if len(pairs) == count:
                break
        for column, lang in enumerate(("de", "en")):
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(pair[column] + "\n" for pair in pairs))


def examples(stream, count):
    """The (source ids, target_out ids) of every pair in the first `count` batches (or groups
    of batches), unpadded."""
    found = []
    for (source, _), target_out in stream.take(count).as_numpy_iterator():
        source = source.reshape(-1, source.shape[-1])
        target_out = target_out.reshape(-1, target_out.shape[-1])
        for s, t in zip(source, target_out):
            found.append((tuple(s[s != 0]), tuple(t[t != 0])))
    return found


@pytest.mark.parametrize("accumulate_steps", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_two_workers_read_disjoint_shards_that_make_the_epoch_and_end_equal(
        tiny_experiment, multi30k_dir, tmp_path, accumulate_steps):
    """With `accumulate_steps` 2 (`make test-all`), each step is one update over a group of two
    batches per replica."""
    write_small_corpus(multi30k_dir, tmp_path / "corpus")
    config = tiny_experiment(epochs=1, steps_per_epoch=None, strategy="auto",
                             validation_bleu_sentences=0, accumulate_steps=accumulate_steps,
                             log_every_steps=2)
    # Without carrying, a worker's pass holds each pair of its shard once, which the check
    # that the two passes make the epoch needs (tests/test_resume.py tests carrying).
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, data_dir=str(tmp_path / "corpus"), tokens_per_batch=1024,
        carry_remainders=False))
    config_path = tmp_path / "exp.yaml"
    config.to_yaml(config_path)
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    for index in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "keras_transformer.cli", "train", "--config", str(config_path),
             "--output", str(tmp_path / f"worker_{index}"), "--progress", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outputs = [p.communicate(timeout=400)[0] for p in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]

    # What each worker says it read: its shard, and the batches of its pass over it.
    tokenizers = load_tokenizers(config.data, config.data.vocab_dir)
    replica_data = dataclasses.replace(config.data, tokens_per_batch=512)  # 1024 / 2 replicas
    shards, passes = [], []
    for index, output in enumerate(outputs):
        said = re.search(rf"worker {index} of 2 reads training pairs {index}, {index + 2}, "
                         rf"{index + 4}, \.\.\. \(sharded before tokenization\): (\d+) steps per "
                         rf"pass here, (\d+) per epoch", output)
        assert said, output[-3000:]
        stream = data_lib.TrainingStream(
            data_lib.load_pairs(config.data, "train", shard=(index, 2)), *tokenizers,
            replica_data, seed=config.train.seed, accumulate_steps=accumulate_steps)
        assert stream.pass_length() == int(said[1])
        passes.append(int(said[1]))
        shards.append(examples(stream.batches(), stream.pass_length()))
    # Both take the mean of the two passes as their epoch, and run it.
    epoch = (passes[0] + passes[1]) // 2
    for output in outputs:
        assert f"{epoch} per epoch" in output and f"{epoch}/{epoch}" in output, output[-3000:]
    # Every 2 steps both workers read the metrics summed over all replicas (a collective, taken
    # at the same steps on both) for their step summaries.
    for index in range(2):
        steps = read_events(tmp_path / f"worker_{index}" / "logs" / "train_steps", steps=True)
        assert [step for step, _ in steps["step_loss"]] == list(range(2, epoch + 1, 2))
    # Disjoint, and together every pair of the epoch once.
    all_pairs = data_lib.load_pairs(config.data, "train")
    everything = examples(data_lib.make_batches(all_pairs, *tokenizers, config.data,
                                                training=False), 10**6)
    assert len(set(everything)) == len(everything)
    assert len(everything) == data_lib.pair_stats(all_pairs, *tokenizers, config.data).kept > 350
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(everything)

    # Different data on each worker: only gradients all-reduced across the workers keep their
    # weights equal.
    weights = [Run(tmp_path / f"worker_{i}").load_model("last").get_weights()
               for i in range(2)]
    for first, second in zip(*weights):
        np.testing.assert_array_equal(first, second)


def test_several_workers_need_one_vocabulary_built_beforehand(tiny_experiment, tmp_path):
    config = tiny_experiment()
    check_shared_vocabulary(config, 2)  # data.vocab_dir holds the session's vocabulary
    for vocab_dir in (None, str(tmp_path)):
        unshared = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                        vocab_dir=vocab_dir))
        check_shared_vocabulary(unshared, 1)
        with pytest.raises(ConfigError, match=r"2 workers must share one vocabulary: build it "
                                              r"once with `keras-transformer build-vocab`"):
            check_shared_vocabulary(unshared, 2)
