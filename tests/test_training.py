"""The training runner: a distributed run's files and TensorBoard scalars, re-running a finished
run, checkpoint averaging, mixed precision, gradient accumulation, and errors for bad input.
Resuming and extending runs: test_resume.py."""

import dataclasses
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import data as data_lib
from keras_transformer.data import streams
from keras_transformer.training import runner as training
from keras_transformer.config import ConfigError
from keras_transformer.runs.folder import Run
from keras_transformer.training.schedules import TransformerSchedule
from keras_transformer.data.tokenizers import load_tokenizers
from helpers import load_benchmark, read_events, snapshot, write_config


@pytest.fixture(scope="module")
def mirrored_run(tiny_experiment, tmp_path_factory):
    """A 2-epoch run of 3 steps each of the tiny preset on Multi30k under MirroredStrategy on 2
    CPU devices, with step summaries every 2 steps: (run folder, History, warnings' texts)."""
    run_dir = tmp_path_factory.mktemp("run")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = training.train(tiny_experiment(log_every_steps=2), run_dir, verbose=0)
    return run_dir, history, [str(w.message) for w in caught]


def test_mirrored_run_writes_checkpoints_config_and_logs(mirrored_run):
    run_dir, history, caught = mirrored_run
    assert [p.name for p in Run(run_dir).epoch_checkpoints()] == [
        "epoch_001.weights.h5", "epoch_002.weights.h5"]
    assert (run_dir / "last.weights.h5").exists() and (run_dir / "best.weights.h5").exists()
    saved = Run(run_dir).config
    assert saved.model.source_vocab_size == saved.model.target_vocab_size == 1000
    state = Run(run_dir).state()
    assert (state["epoch"], state["optimizer_step"]) == (2, 6)
    assert state["checkpoint"] == "checkpoints/epoch_002.weights.h5"
    assert state["best"]["val_bleu"] == max(history.history["val_bleu"])
    assert not list(run_dir.rglob(".partial-*"))
    assert set(history.history) >= {"loss", "val_loss", "accuracy", "val_bleu", "val_chrf",
                                    "tokens_per_second"}
    assert all(np.isfinite(history.history["loss"]))
    assert history.history["tokens_per_second"][-1] > 0
    # Each evaluation reads the whole validation split once, without Keras's warning that the
    # input ran out of data (a finite dataset of unknown length gives it).
    config = saved.data
    source_tokenizer, target_tokenizer = load_tokenizers(config, config.vocab_dir)
    one_pass = data_lib.batch_stats(data_lib.make_batches(
        data_lib.load_pairs(config, config.validation_split), source_tokenizer, target_tokenizer,
        config, training=False, num_replicas=2)).target_tokens
    assert history.history["val_target_tokens"] == [one_pass, one_pass]
    assert not [message for message in caught if "ran out of data" in message]


def test_tensorboard_has_loss_learning_rate_bleu_and_translations(mirrored_run):
    run_dir, _, _ = mirrored_run
    train_events = read_events(run_dir / "logs" / "train")
    validation_events = read_events(run_dir / "logs" / "validation")
    assert len(train_events["epoch_loss"]) == 2
    assert len(train_events["epoch_learning_rate"]) == 2
    assert "epoch_tokens_per_second" in train_events
    assert len(validation_events["epoch_bleu"]) == 2
    assert "epoch_loss" in validation_events and "epoch_chrf" in validation_events
    table = validation_events["translations"][0].item().decode()
    assert table.startswith("| source | reference | translation |")
    assert len(table.splitlines()) == 2 + 5
    images = read_events(run_dir / "logs" / "validation", steps=True)["cross_attention"]
    assert [epoch for epoch, _ in images] == [0, 1]
    image = images[0][1]
    assert image.shape == (3,)  # width, height and the encoded PNG
    pixels = tf.io.decode_png(image[2]).numpy()
    # Epoch 1's translation is empty: one row (END) under 21 source pieces, in 4 panels.
    assert pixels.shape[2] == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 1000
    assert (int(image[0]), int(image[1])) == (pixels.shape[1], pixels.shape[0])


def test_tensorboard_has_loss_learning_rate_and_tokens_per_second_every_n_steps(mirrored_run):
    run_dir, history, _ = mirrored_run
    steps = read_events(run_dir / "logs" / "train_steps", steps=True)
    assert set(steps) == {"step_loss", "step_learning_rate", "step_tokens_per_second"}
    for tag in steps:
        assert [step for step, _ in steps[tag]] == [2, 4, 6], tag  # 2 epochs of 3 steps
    config = Run(run_dir).config
    schedule = TransformerSchedule(config.model.d_model, config.train.warmup_steps)
    np.testing.assert_allclose([float(value) for _, value in steps["step_learning_rate"]],
                               [float(schedule(step)) for step in (2, 4, 6)], rtol=1e-6)
    # Means per token over a few steps of an epoch: near that epoch's mean (not a sum, nor a
    # running mean of the whole run).
    epoch_means = [history.history["loss"][epoch] for epoch in (0, 1, 1)]
    assert [float(value) for _, value in steps["step_loss"]] == pytest.approx(epoch_means,
                                                                               rel=0.2)
    assert all(float(value) > 0 for _, value in steps["step_tokens_per_second"])


def test_average_is_the_elementwise_mean(mirrored_run):
    run_dir, _, _ = mirrored_run
    averaged = Run(run_dir).load_model(Run(run_dir).average(2))
    weights = [Run(run_dir).load_model(path).get_weights()
               for path in Run(run_dir).epoch_checkpoints()]
    for got, first, second in zip(averaged.get_weights(), *weights):
        np.testing.assert_allclose(got, (first + second) / 2, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, b) for a, b in zip(*weights))
    with pytest.raises(ConfigError, match="cannot average the last 3 checkpoints.*holds 2"):
        Run(run_dir).average(3)
    # --upper-bound: the model as it stood at epoch 1.
    first_only = Run(run_dir).average(1, upper_bound=1)
    assert first_only.name == "average_last1_to1.weights.h5"
    for got, want in zip(Run(run_dir).load_model(first_only).get_weights(),
                         weights[0]):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ConfigError, match="last 2 checkpoints up to epoch 1.*holds 1"):
        Run(run_dir).average(2, upper_bound=1)


def test_the_training_stream_ends_with_the_run(tiny_experiment):
    """What `fit` reads holds exactly the run's remaining steps, so that no element is in
    production when `fit` returns: destroying an iterator waits for that element."""
    config = tiny_experiment(epochs=3, steps_per_epoch=2, strategy="one_device")
    tokenizers = load_tokenizers(config.data, config.data.vocab_dir)
    stream = training.TrainingInput(config, tf.distribute.OneDeviceStrategy("/cpu:0"), *tokenizers)
    assert sum(1 for _ in stream.batches(initial_epoch=1, steps=2).take(5)) == 2 * 2


def test_loading_a_run_without_best_weights_falls_back_to_last(mirrored_run, tmp_path, caplog):
    """A run without validation BLEU (train.validation_bleu_sentences: 0) writes no
    best.weights.h5: loading its "best" model (the default of export, translate and evaluate)
    uses last.weights.h5. Here a copy of the run whose last weights are epoch 1's."""
    import shutil

    run_dir, _, _ = mirrored_run
    first, second = Run(run_dir).epoch_checkpoints()
    shutil.copy(run_dir / "config.yaml", tmp_path / "config.yaml")
    shutil.copy(first, tmp_path / "last.weights.h5")
    model = Run(run_dir).load_model(str(first))
    expected = model.get_weights()
    model.load_weights(second)
    assert any(not np.array_equal(a, b) for a, b in zip(expected, model.get_weights()))
    assert not (tmp_path / "best.weights.h5").exists()
    with caplog.at_level("WARNING", logger="keras_transformer.runs.folder"):
        loaded = Run(tmp_path).load_model()
    assert "has no best weights (best.weights.h5); using the last epoch's" in caplog.text
    for got, want in zip(loaded.get_weights(), expected):
        np.testing.assert_array_equal(got, want)
    (tmp_path / "last.weights.h5").unlink()
    with pytest.raises(ConfigError, match=r"no weights at .*best\.weights\.h5 or .*last\.weights\.h5"):
        Run(tmp_path).load_model()


def test_mixed_bfloat16_run_has_finite_loss_and_float32_logits(tiny_experiment, tmp_path,
                                                               capsys):
    config = tiny_experiment(epochs=1, steps_per_epoch=2,
                             precision="mixed_bfloat16", validation_bleu_sentences=4,
                             strategy="one_device")
    history = training.train(config, tmp_path, verbose=0)
    assert "starting from scratch (1 replica(s), mixed_bfloat16)" in capsys.readouterr().out
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    import keras

    assert keras.config.dtype_policy().name == "float32"  # restored after training
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = training.build_model(Run(tmp_path).config)
        assert model.compute_dtype == "bfloat16"
        logits = model((np.ones((1, 4), "int32"), np.ones((1, 3), "int32")))
        assert logits.dtype == "float32"
    finally:
        keras.config.set_dtype_policy("float32")


def test_profile_batches_trace_those_steps_for_tensorboard(tiny_experiment, tmp_path):
    config = tiny_experiment(epochs=1, steps_per_epoch=2, profile_batches="2,2",
                             validation_bleu_sentences=0, strategy="one_device")
    training.train(config, tmp_path, verbose=0)
    (trace,) = (tmp_path / "logs" / "train" / "plugins" / "profile").rglob("*.xplane.pb")
    counts = {}
    times = load_benchmark("train").op_times(trace, counts)
    assert counts["(span)"] > 0
    assert any("MatMul" in kind for kind in times) and all(n > 0 for n in counts.values())
    # the profile is only what TensorBoard shows: the run without it is the same run
    Run.create(dataclasses.replace(config, train=dataclasses.replace(
        config.train, profile_batches=None, epochs=2)), tmp_path)


def test_mixed_float16_run_computes_in_float16_with_float32_weights(tiny_experiment, tmp_path):
    """mixed_float16 (what `precision: auto` picks on GPUs of compute capability 7.x): float16
    activations, float32 variables and logits, a loss-scaling optimizer against float16
    underflow, a finite loss, and the global dtype policy restored after training."""
    config = tiny_experiment(epochs=1, steps_per_epoch=2, precision="mixed_float16",
                             validation_bleu_sentences=0, strategy="one_device")
    assert keras.config.dtype_policy().name == "float32"
    history = training.train(config, tmp_path, verbose=0)
    assert keras.config.dtype_policy().name == "float32"  # restored after training
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    model = history.model
    assert model.dtype_policy.name == "mixed_float16"
    assert (model.compute_dtype, model.variable_dtype) == ("float16", "float32")
    assert {variable.dtype for variable in model.trainable_weights} == {"float32"}
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(model.optimizer.iterations.numpy()) == 2
    source, target_in = np.ones((1, 4), "int32"), np.ones((1, 3), "int32")
    embedded = model.target_embedding(target_in)  # a sublayer's output: float16
    assert embedded.dtype == "float16"
    assert model((source, target_in)).dtype == "float32"  # logits for the loss and the search


@pytest.mark.parametrize("flags, native", [
    ("fpu sse2 avx2 fma avx512f amx_bf16 amx_tile", True),  # Sapphire Rapids
    ("fpu sse2 avx2 avx512f avx512_bf16", True),  # Cooper Lake, Zen 4
    ("fpu sse2 avx2 fma avx512f avx512bw", False),  # Skylake: bfloat16 only emulated
    ("fpu sse2 avx2 fma sha_ni", False),  # Zen 1-3
])
def test_cpu_bfloat16_support_is_read_from_the_flags(tmp_path, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n"
                       f"bogomips\t: 4000\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert training.cpu_has_native_bfloat16(cpuinfo) is native


def test_cpu_bfloat16_support_is_false_without_cpuinfo(tmp_path):
    assert training.cpu_has_native_bfloat16(tmp_path / "missing") is False
    (tmp_path / "no_flags").write_text("processor\t: 0\n")
    assert training.cpu_has_native_bfloat16(tmp_path / "no_flags") is False


@pytest.mark.parametrize("capabilities, native_cpu, policy", [
    ([], True, "mixed_bfloat16"),
    ([], False, "float32"),
    ([(8, 0), (9, 0)], False, "mixed_bfloat16"),  # A100, H100
    ([(7, 0), (8, 6)], True, "mixed_float16"),  # the oldest GPU decides
    ([(6, 1)], True, "float32"),  # no tensor cores
])
def test_auto_precision_follows_the_hardware(monkeypatch, capabilities, native_cpu, policy):
    gpus = [f"GPU:{i}" for i in range(len(capabilities))]
    details = dict(zip(gpus, capabilities))
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: list(gpus) if kind == "GPU" else ["CPU:0"])
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda gpu: {"compute_capability": details[gpu]})
    monkeypatch.setattr(training, "cpu_has_native_bfloat16", lambda: native_cpu)
    assert training.resolve_precision("auto") == policy
    for explicit in ("float32", "mixed_bfloat16", "mixed_float16"):
        assert training.resolve_precision(explicit) == explicit


def test_gradient_accumulation_trains_on_two_replicas_one_update_per_group(tiny_experiment,
                                                                           tmp_path, recwarn):
    config = tiny_experiment(epochs=1, steps_per_epoch=3, accumulate_steps=2,
                             validation_bleu_sentences=0)  # strategy "mirrored": 2 replicas
    history = training.train(config, tmp_path, verbose=0)
    optimizer = history.model.optimizer
    assert history.model.distribute_strategy.num_replicas_in_sync == 2
    assert optimizer.gradient_accumulation_steps is None
    assert int(optimizer.iterations.numpy()) == 3  # 3 steps of 2 batches: 3 updates
    assert np.isfinite(history.history["loss"][0])
    # The epoch's target tokens are those of the training stream's first 3 groups of 2.
    stream = data_lib.TrainingStream(
        data_lib.load_pairs(config.data, config.data.train_split), *Run(tmp_path).tokenizers(),
        config.data, seed=config.train.seed, num_replicas=2, accumulate_steps=2)
    groups = list(stream.batches().take(3))
    assert all(target_out.shape[1] == 2 for _, target_out in groups)
    assert history.history["target_tokens"][0] == sum(
        int(np.count_nonzero(target_out)) for _, target_out in groups)
    assert not [w for w in recwarn if "shuffle" in str(w.message)]  # fit's warning, not ours


def test_subword_sampling_reaches_the_training_batches_only(tiny_experiment, tmp_path,
                                                            monkeypatch):
    config = tiny_experiment(epochs=1, steps_per_epoch=2, validation_bleu_sentences=0,
                             strategy="one_device")
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, sp_nbest_size=-1, sp_alpha=0.5))
    seen = []  # (training, source samples, target samples) of every batching
    make_batches, stream = data_lib.make_batches, data_lib.TrainingStream

    def spy(pairs, source, target, data_config, *, training, **kwargs):
        seen.append((training, source.samples, target.samples))
        return make_batches(pairs, source, target, data_config, training=training, **kwargs)

    def spy_stream(pairs, source, target, data_config, **kwargs):
        seen.append((True, source.samples, target.samples))
        return stream(pairs, source, target, data_config, **kwargs)

    monkeypatch.setattr(streams, "make_batches", spy)  # where training.train looks them up
    monkeypatch.setattr(streams, "TrainingStream", spy_stream)
    history = training.train(config, tmp_path, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert sorted(set(seen)) == [(False, False, False), (True, True, True)]
    assert Run(tmp_path).config.data.sp_nbest_size == -1


def test_output_holding_another_run_is_refused_and_kept(mirrored_run, tiny_experiment):
    run_dir, _, _ = mirrored_run
    before = (run_dir / "config.yaml").read_text()
    other = tiny_experiment(label_smoothing=0.2)
    with pytest.raises(ConfigError, match=r"holds another run's config \(differs in "
                                          r"train.label_smoothing\)"):
        training.train(other, run_dir, verbose=0)
    assert (run_dir / "config.yaml").read_text() == before


# ----------------------------------------------------------------------------- command line

@pytest.mark.parametrize("override, message", [
    ("train.epoch=3", "unknown config key 'train.epoch'"),
    ("train.epochs=many", "train.epochs='many' has the wrong type: expected int"),
    ("data.data_dir=/nonexistent/m30k", "data.data_dir=/nonexistent/m30k: no such folder"),
])
def test_cli_bad_input_is_one_line_error(tiny_experiment, tmp_path, capsys, override, message):
    from keras_transformer import cli

    config = write_config(tiny_experiment(), tmp_path / "exp.yaml")
    assert cli.main(["train", "--config", str(config), "--set", override,
                     "--output", str(tmp_path / "run")]) == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert error.startswith("keras-transformer train: error:") and message in error
    assert not (tmp_path / "run").exists()


def test_cli_average_writes_the_mean(mirrored_run, tmp_path, capsys):
    from keras_transformer import cli

    run_dir, _, _ = mirrored_run
    output = tmp_path / "mean.weights.h5"
    assert cli.main(["average", "--run", str(run_dir), "--last", "2",
                     "--output", str(output)]) == 0
    assert f"wrote the average of the last 2 checkpoints to {output}" in capsys.readouterr().out
    expected = Run(run_dir).load_model(Run(run_dir).average(2))
    for got, want in zip(Run(run_dir).load_model(output).get_weights(),
                         expected.get_weights()):
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- finish

def test_a_spent_time_budget_stops_the_run_mid_epoch_saves_that_epoch_and_finishes_it(
        tiny_experiment, tmp_path, capsys):
    """A budget that the first step outlasts: the epoch stops after it, is validated and saved
    with its training minutes, and the run is finished; a resumed clock would start there."""
    from keras_transformer.training import callbacks

    config = tiny_experiment(epochs=5, steps_per_epoch=3, strategy="one_device",
                             decay="linear", budget_minutes=0.001)
    run_dir = tmp_path / "run"
    history = training.train(config, run_dir, verbose=0)
    assert history.epoch == [0] and np.isfinite(history.history["val_bleu"][0])
    run = Run(run_dir)
    state = run.state()
    assert (state["epoch"], state["optimizer_step"], state["budget_spent"]) == (1, 1, True)
    minutes = run.training_minutes(1)
    assert minutes > 0.001 and history.history["training_minutes"] == [minutes]
    assert float(read_events(run_dir / "logs" / "train")["epoch_training_minutes"][0]) == (
        pytest.approx(minutes))
    [clock] = [c for c in callbacks.default_callbacks(run.config, run, initial_epoch=1)
               if isinstance(c, callbacks.TrainingClock)]
    assert clock.minutes_before == minutes
    capsys.readouterr()
    before = snapshot(run_dir)
    assert training.train(config, run_dir, verbose=0) is None
    assert (f"{run_dir} is finished: its time budget (train.budget_minutes=0.001) was spent in "
            f"epoch 1") in capsys.readouterr().out
    assert snapshot(run_dir) == before


def test_a_time_budget_is_refused_with_several_workers(tiny_experiment, tmp_path, monkeypatch):
    from unittest import mock

    workers = mock.create_autospec(tf.distribute.MultiWorkerMirroredStrategy, instance=True)
    monkeypatch.setattr(training, "make_strategy", lambda name: workers)
    with pytest.raises(ConfigError, match=r"train.budget_minutes=30 follows one machine's clock"):
        training.train(tiny_experiment(budget_minutes=30), tmp_path / "run", verbose=0)
    assert not (tmp_path / "run").exists()


def test_rerunning_a_finished_run_says_so_and_touches_no_file(mirrored_run, tiny_experiment,
                                                              tmp_path, capsys):
    from keras_transformer import cli

    run_dir, _, _ = mirrored_run
    before = snapshot(run_dir)
    for epochs in (2, 1):
        assert training.train(tiny_experiment(epochs=epochs), run_dir, verbose=0) is None
        assert (f"keras-transformer train: {run_dir} is finished: 2 epochs done, "
                f"train.epochs={epochs}; raise train.epochs") in capsys.readouterr().out
    config = write_config(tiny_experiment(), tmp_path / "exp.yaml")
    assert cli.main(["train", "--config", str(config), "--output", str(run_dir)]) == 0
    assert f"{run_dir} is finished" in capsys.readouterr().out
    assert snapshot(run_dir) == before


def test_a_training_into_a_folder_in_use_is_refused(tiny_experiment, tmp_path, capsys):
    """Two trainings into one folder both ran to exit 0, their files and logs mixed."""
    import os

    from keras_transformer import cli
    from keras_transformer.runs.files import LOCK_FILE, training_lock

    config = write_config(tiny_experiment(), tmp_path / "exp.yaml")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with training_lock(run_dir):
        assert cli.main(["train", "--config", str(config), "--output", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"keras-transformer train: error: {run_dir} is in use by another training "
                   f"(process {os.getpid()}): wait for it to end, or choose another --output"]
    assert [p.name for p in run_dir.iterdir()] == [LOCK_FILE]


def test_the_same_seed_gives_the_same_weights_whether_or_not_the_data_was_prepared(
        tiny_experiment, tmp_path, monkeypatch):
    """Preparing the data the first time (a fresh tfds cache, a new vocabulary) draws from
    Python's `random` after the seed is set; the first `make demo` on a fresh machine trained
    other weights than the later ones (by up to 1.1 after an epoch). What `fit` starts from,
    the initial weights and dropout's seeds, is compared."""
    import random

    from keras_transformer.runs import folder as runs
    from keras_transformer.runs import weights as run_weights

    class Started(Exception):
        pass

    started = []

    def fit(model, *args, **kwargs):
        started.append([*model.get_weights(), *(s.numpy() for s in run_weights.random_states(model))])
        raise Started

    monkeypatch.setattr(keras.Model, "fit", fit)
    config = tiny_experiment(epochs=1, steps_per_epoch=2, validation_bleu_sentences=0)
    with pytest.raises(Started):
        training.train(config, tmp_path / "prepared", verbose=0)
    prepare = training.prepare_tokenizers

    def prepare_for_the_first_time(*args):
        random.random(), random.shuffle(list(range(100)))
        return prepare(*args)

    monkeypatch.setattr(training, "prepare_tokenizers", prepare_for_the_first_time)
    with pytest.raises(Started):
        training.train(config, tmp_path / "fresh", verbose=0)
    assert len(started[0]) == len(started[1]) > 0
    for got, want in zip(started[1], started[0]):
        np.testing.assert_array_equal(got, want)
