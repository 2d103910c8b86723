"""MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1 train in lockstep."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from keras_transformer.runs import Run


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_two_workers_end_with_identical_weights(tiny_experiment, tmp_path):
    config = tiny_experiment(epochs=1, steps_per_epoch=3,
                             strategy="auto", validation_bleu_sentences=0)
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
        assert "3/3" in output  # three steps ran

    weights = [Run(tmp_path / f"worker_{i}").load_model("last").get_weights()
               for i in range(2)]
    # The workers read different shards of the data (tf.data's DATA auto-sharding), so only
    # gradients all-reduced across the workers keep their weights equal.
    for first, second in zip(*weights):
        np.testing.assert_array_equal(first, second)
