"""The run folder (`keras_transformer.runs.folder`) without training: whole-or-nothing writes, weight
files that carry their model config, the run's state, refusing and overwriting another run,
falling back from a damaged checkpoint."""

import dataclasses
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from keras_transformer.runs import folder as runs
from keras_transformer.runs import files as run_files
from keras_transformer.runs import weights as run_weights
from keras_transformer.config import ConfigError, ExperimentConfig, ModelConfig, TrainConfig
from keras_transformer.model import Transformer
from keras_transformer.runs.folder import Run
from keras_transformer.runs.weights import DamagedWeightsError


def tiny_config(**train) -> ExperimentConfig:
    return ExperimentConfig(
        name="unit",
        model=ModelConfig.from_preset("tiny", source_vocab_size=50, target_vocab_size=50),
        train=TrainConfig(warmup_steps=10, validation_bleu_sentences=0, **train))


def compiled_model(config: ExperimentConfig, seed: int = 0) -> Transformer:
    """A compiled tiny model with a built optimizer, its weights drawn from `seed`."""
    from keras_transformer.training.runner import build_model

    model = build_model(config)
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_epoch_template(tmp_path_factory):
    """A run folder (no vocabulary) whose epochs 1 and 2 were saved by `Run.save_epoch`, with
    different weights, optimizer steps 3 and 7 and validation BLEU 10 and 5; returns (run path,
    [(weights, dropout seed states) of each epoch])."""
    config = tiny_config(epochs=5)
    run = Run.create(config, tmp_path_factory.mktemp("template") / "run")
    run.save_config(config)
    saved = []
    for epoch, (step, bleu) in enumerate([(3, 10.0), (7, 5.0)], start=1):
        model = compiled_model(config, seed=epoch)
        model.optimizer.iterations.assign(step)
        for variable in run_weights.random_states(model):
            variable.assign(variable.numpy() + epoch)
        run.save_epoch(model, epoch, val_bleu=bleu)
        saved.append((model.get_weights(), [v.numpy() for v in run_weights.random_states(model)]))
    return run.path, saved


@pytest.fixture
def run_with_two_epochs(two_epoch_template, tmp_path):
    """A copy of `two_epoch_template`: (Run, [(weights, seed states) of epochs 1 and 2])."""
    import shutil

    path, saved = two_epoch_template
    shutil.copytree(path, tmp_path / "run")
    return Run(tmp_path / "run"), saved


# ----------------------------------------------------------------------------- whole files

def test_atomic_path_replaces_the_file_only_when_the_write_completes(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with run_files.atomic_path(target) as partial:
            partial.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    with run_files.atomic_path(target) as partial:
        assert partial.name == f".partial-{os.getpid()}-state.json"
        partial.write_text("new")
    assert target.read_text() == "new" and len(list(tmp_path.iterdir())) == 1


def test_save_epoch_writes_checkpoint_last_best_and_state(run_with_two_epochs):
    run, models = run_with_two_epochs
    assert [p.name for p in run.epoch_checkpoints()] == ["epoch_001.weights.h5",
                                                         "epoch_002.weights.h5"]
    assert run.state() == {"epoch": 2, "optimizer_step": 7,
                           "checkpoint": "checkpoints/epoch_002.weights.h5",
                           "best": {"epoch": 1, "val_bleu": 10.0}, "stopped_early": False}
    # best stays epoch 1's (BLEU 10 > 5); last is epoch 2's.
    for name, (weights, _) in (("best", models[0]), ("last", models[1])):
        for got, want in zip(run.load_model(name).get_weights(), weights):
            np.testing.assert_array_equal(got, want)
    assert not list(run.path.rglob(".partial-*"))
    run.mark_stopped_early()
    assert run.state()["stopped_early"] is True


def test_averaged_weights_are_written_whole_with_a_checked_name(run_with_two_epochs, tmp_path):
    run, models = run_with_two_epochs
    path = run.average(2)
    expected = [(a + b) / 2 for a, b in zip(models[0][0], models[1][0])]
    for got, want in zip(run.load_model(path).get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(ConfigError, match=r"mean.h5: a weights file's name ends in .weights.h5"):
        run.average(2, tmp_path / "mean.h5")
    (tmp_path / "folder.weights.h5").mkdir()
    with pytest.raises(ConfigError, match=r"folder.weights.h5 is a folder, not a weights file"):
        run.average(2, tmp_path / "folder.weights.h5")
    before = snapshot(run.path)
    for own in ("best.weights.h5", "last.weights.h5", "checkpoints/epoch_002.weights.h5"):
        with pytest.raises(ConfigError, match=r"holds the run's own trained weights"):
            run.average(2, run.path / "checkpoints" / ".." / own)
    assert snapshot(run.path) == before
    nested = tmp_path / "new" / "folder" / "mean.weights.h5"
    assert run.average(2, nested) == nested and nested.is_file()
    with pytest.raises(ConfigError, match=r"is not a training run \(config.yaml not found\)"):
        Run(tmp_path / "nowhere").average(2)


def test_what_killed_writers_left_is_removed_and_a_running_ones_is_kept(run_with_two_epochs):
    """kill -9 of `average` left `.partial-PID-average_last2.weights.h5` in the run, and no
    later command removed it: the next average removes what dead processes left, and keeps a
    running one's (another average writing there now); so does a training's start, folders
    too."""
    import signal
    import subprocess

    run, _ = run_with_two_epochs
    dead = subprocess.Popen(["sleep", "60"])
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        left = run.path / f".partial-{dead.pid}-average_last2.weights.h5"
        writing = run.path / f".partial-{alive.pid}-average_last2.weights.h5"
        for path in (left, writing):
            path.write_bytes(b"\x89HDF\r\n")  # what a kill cut short
        run.average(2)
        assert not left.exists() and writing.exists()
        vocab = run.path / f".partial-{dead.pid}-vocab"
        (vocab / "sub").mkdir(parents=True)
        checkpoint = run.checkpoint_dir / f".partial-{dead.pid}-epoch_003.weights.h5"
        checkpoint.write_bytes(b"\x89HDF")
        run.remove_partial_files()
        assert not vocab.exists() and not checkpoint.exists() and writing.exists()
    finally:
        alive.kill()
        alive.wait()


# ----------------------------------------------------------------------------- what weights carry

def test_weights_carry_their_model_config_and_a_mismatch_names_the_first_field(tmp_path):
    config = tiny_config().model
    model = Transformer(config)
    model.build()
    path = run_weights.save_weights(model, tmp_path / "w.weights.h5")
    other = Transformer(dataclasses.replace(config, num_layers=1, d_model=64, num_heads=4))
    other.build()
    with pytest.raises(ConfigError) as error:
        run_weights.load_weights(other, path, other.config, "exp.yaml")
    assert str(error.value) == (f"{path} was trained with model.num_layers=2, but exp.yaml has "
                                "model.num_layers=1")
    # Dropout acts only in training: another value loads.
    run_weights.load_weights(model, path, dataclasses.replace(config, dropout=0.3))


def test_weights_written_by_keras_alone_still_load(tmp_path):
    model = Transformer(tiny_config().model)
    model.build()
    model.save_weights(tmp_path / "plain.weights.h5")
    run_weights.load_weights(model, tmp_path / "plain.weights.h5", model.config)


def test_a_truncated_weight_file_is_named(tmp_path):
    model = Transformer(tiny_config().model)
    model.build()
    path = run_weights.save_weights(model, tmp_path / "w.weights.h5")
    truncate(path)
    with pytest.raises(DamagedWeightsError, match=rf"^{path} is damaged \(.*truncated"):
        run_weights.load_weights(model, path, model.config)


def test_a_weight_file_with_damaged_metadata_is_named(tmp_path):
    """Bytes flipped in the HDF5 structures (not the arrays): h5py raises RuntimeError."""
    model = Transformer(tiny_config().model)
    model.build()
    path = run_weights.save_weights(model, tmp_path / "w.weights.h5")
    data = bytearray(path.read_bytes())
    data[600:1000] = bytes(b ^ 0xFF for b in data[600:1000])
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedWeightsError, match=rf"^{path} is damaged \("):
        run_weights.load_weights(model, path, model.config)


@pytest.mark.parametrize("field, old, new", [("num_layers", 2, 3), ("d_model", 32, 256)])
def test_a_run_config_edited_after_training_is_refused_in_one_line(run_with_two_epochs, field,
                                                                   old, new):
    """Issue 27: num_layers 4 -> 3 in config.yaml silently dropped a layer's weights, and
    d_model 256 gave an 87-object load traceback."""
    run, _ = run_with_two_epochs
    text = run.config_path.read_text()
    assert f"  {field}: {old}\n" in text
    run.config_path.write_text(text.replace(f"  {field}: {old}\n", f"  {field}: {new}\n"))
    with pytest.raises(ConfigError) as error:
        Run(run.path).load_model("last")
    assert str(error.value) == (f"{run.weights_file('last')} was trained with model.{field}="
                                f"{old}, but {run.config_path} has model.{field}={new}")


def test_a_run_config_with_an_unknown_key_or_a_folder_for_weights_is_named(run_with_two_epochs):
    run, _ = run_with_two_epochs
    run.config_path.write_text(run.config_path.read_text().replace("train:\n",
                                                                   "train:\n  epoch: 3\n"))
    with pytest.raises(ConfigError, match=rf"^{run.config_path}: unknown config key 'train.epoch'"):
        Run(run.path).config
    with pytest.raises(ConfigError, match=rf"^{run.checkpoint_dir} is a folder, not a weights"):
        run.weights_path(str(run.checkpoint_dir))


# ----------------------------------------------------------------------------- resume

def test_restore_loads_weights_optimizer_state_and_dropout_seeds(run_with_two_epochs):
    run, models = run_with_two_epochs
    weights, states = models[1]
    assert len(states) > 0
    model = compiled_model(run.config, seed=9)
    assert run.restore(model) == 2
    assert int(model.optimizer.iterations.numpy()) == 7
    for got, want in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(run_weights.random_states(model), states):
        np.testing.assert_array_equal(got.numpy(), want)


def restored_past_epoch_2(run, models, caplog, damage: str):
    """`run.restore` of a fresh model, asserting that it passed over the damaged checkpoint 2
    (the log names it and `damage`) to epoch 1's weights; returns the model."""
    model = compiled_model(run.config, seed=9)
    with caplog.at_level(logging.WARNING, logger="keras_transformer.runs.folder"):
        assert run.restore(model) == 1
    assert f"{run.checkpoint_file(2)} is damaged ({damage}" in caplog.text
    for got, want in zip(model.get_weights(), models[0][0]):
        np.testing.assert_array_equal(got, want)
    return model


def test_restore_reports_a_damaged_checkpoint_and_falls_back(run_with_two_epochs, caplog):
    run, models = run_with_two_epochs
    truncate(run.checkpoint_file(2))
    model = restored_past_epoch_2(run, models, caplog, "")
    assert (f"resuming from {run.checkpoint_file(1)}, the newest checkpoint that loads "
            "(damaged: epoch_002.weights.h5)") in caplog.text
    assert int(model.optimizer.iterations.numpy()) == 3
    truncate(run.checkpoint_file(1))
    with pytest.raises(ConfigError, match="no checkpoint in .* loads; add --overwrite"):
        run.restore(model)


def test_a_checkpoint_newer_than_the_state_is_recorded_when_restored(run_with_two_epochs):
    """A kill after epoch 2's checkpoint was renamed into place but before `last` and the
    state were: the run is not finished, and resuming records epoch 2 as its end would have."""
    run, models = run_with_two_epochs
    state = run.state()
    run.state_path.write_text(json.dumps({**state, "epoch": 1, "optimizer_step": 3}))
    run_files.copy_file(run.checkpoint_file(1), run.weights_file("last"))
    assert run.epochs_done() == 1 and run.finished(tiny_config(epochs=2)) is None
    assert run.restore(compiled_model(run.config, seed=9)) == 2
    assert (run.state()["epoch"], run.state()["optimizer_step"]) == (2, 7)
    for got, want in zip(run.load_model("last").get_weights(), models[1][0]):
        np.testing.assert_array_equal(got, want)
    # The same kill after the first epoch's checkpoint: no state, no last.
    run.state_path.unlink()
    run.weights_file("last").unlink()
    assert run.epochs_done() == 0


def test_finished_runs_say_so(run_with_two_epochs):
    run, _ = run_with_two_epochs
    assert run.finished(tiny_config(epochs=3)) is None
    assert run.finished(tiny_config(epochs=2)) == (
        f"{run.path} is finished: 2 epochs done, train.epochs=2; raise train.epochs "
        "(--set train.epochs=N) to extend it, or --overwrite to train it anew")
    assert "is finished: 2 epochs done, train.epochs=1" in run.finished(tiny_config(epochs=1))
    run.mark_stopped_early()
    assert "is finished: early stopping ended it after epoch 2" in run.finished(
        tiny_config(epochs=9))
    assert Run(run.path / "missing").finished(tiny_config()) is None


# ----------------------------------------------------------------------------- the output folder

def test_another_run_is_refused_without_overwrite_and_deleted_with_it(run_with_two_epochs,
                                                                      caplog):
    run, _ = run_with_two_epochs
    (run.path / "logs").mkdir()
    (run.path / "notes.txt").write_text("mine")
    run.average(1)
    before = snapshot(run.path)
    other = tiny_config(epochs=5, label_smoothing=0.2)
    with pytest.raises(ConfigError, match=r"holds another run's config \(differs in "
                                          r"train.label_smoothing\); choose another --output, "
                                          r"or add --overwrite"):
        Run.create(other, run.path)
    assert snapshot(run.path) == before
    with caplog.at_level(logging.WARNING, logger="keras_transformer.runs.folder"):
        Run.create(other, run.path, overwrite=True)
    assert sorted(p.name for p in run.path.iterdir()) == ["notes.txt"]
    assert (f"deleted the previous run in {run.path} (--overwrite): config.yaml, state.json, "
            "checkpoints/, last.weights.h5, best.weights.h5, logs/, "
            "average_last1.weights.h5") in caplog.text


def test_checkpoints_without_a_config_are_not_taken_over(run_with_two_epochs):
    run, _ = run_with_two_epochs
    run.config_path.unlink()
    with pytest.raises(ConfigError, match="holds checkpoints but no config.yaml"):
        Run.create(tiny_config(epochs=5), run.path)


def test_an_output_that_is_a_file_or_read_only_is_refused(tmp_path, read_only_dir):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"output folder .*/file is a file, not a folder"):
        Run.create(tiny_config(), tmp_path / "file")
    with pytest.raises(ConfigError, match=r"output folder .*/file/run: .*/file is a file"):
        Run.create(tiny_config(), tmp_path / "file" / "run")
    with pytest.raises(ConfigError, match=rf"output folder {read_only_dir}/run: cannot write in "
                                          rf"{read_only_dir} \(permission denied"):
        Run.create(tiny_config(), read_only_dir / "run")
    assert not list(read_only_dir.iterdir())


@pytest.mark.parametrize("text", ["{", "[]", "{}", '{"epoch": "one"}', '{"epoch": -1}'])
def test_state_json_damaged_by_hand_is_named(run_with_two_epochs, text):
    run, _ = run_with_two_epochs
    run.state_path.write_text(text)
    for check in (run.state, run.epochs_done, lambda: run.finished(tiny_config(epochs=5))):
        with pytest.raises(ConfigError, match=r"state.json is damaged \(.*\); delete it"):
            check()


def test_only_epoch_numbered_files_are_checkpoints_in_epoch_order(run_with_two_epochs):
    import shutil

    run, _ = run_with_two_epochs
    first = run.checkpoint_file(1)
    shutil.copy(first, run.checkpoint_dir / "epoch_final.weights.h5")
    shutil.copy(first, run.checkpoint_dir / "epoch_1000.weights.h5")
    assert [p.name for p in run.epoch_checkpoints()] == [
        "epoch_001.weights.h5", "epoch_002.weights.h5", "epoch_1000.weights.h5"]


# ----------------------------------------------------------------------------- checksums

def test_every_weight_file_records_the_checksum_of_what_it_holds(run_with_two_epochs):
    """Checkpoints, last and best (copies of checkpoints) and averages carry a SHA-256 of their
    arrays and attributes, which `verify_weights` recomputes."""
    run, _ = run_with_two_epochs
    average = run.average(2)
    for path in (run.checkpoint_file(1), run.checkpoint_file(2), run.weights_file("last"),
                 run.weights_file("best"), average):
        [recorded] = run_weights.weight_file_attrs(path, run_weights.CHECKSUM_ATTR)
        assert len(recorded) == 64 and run_weights.verify_weights(path) == recorded, path
    assert run_weights.verify_weights(run.weights_file("last")) == run_weights.verify_weights(
        run.checkpoint_file(2))


def test_flipped_bytes_in_a_weight_files_data_are_refused_before_loading(run_with_two_epochs):
    from helpers import flip_weight_bytes

    run, _ = run_with_two_epochs
    path = run.weights_file("last")
    flip_weight_bytes(path)
    model = Transformer(run.config.model)
    model.build()
    before = model.get_weights()
    with pytest.raises(DamagedWeightsError, match=rf"^{path} is damaged \(its contents differ "
                       r"from the SHA-256 recorded when it was written\)$"):
        run_weights.load_weights(model, path, run.config.model)
    for got, want in zip(model.get_weights(), before):  # nothing was loaded
        np.testing.assert_array_equal(got, want)
    with pytest.raises(DamagedWeightsError, match=rf"^{path} is damaged .*; choose other weights "
                       r"with --weights: best, last, or a checkpoint \("):
        run.load_model("last")


def test_non_finite_weights_are_refused_even_without_a_checksum(tmp_path):
    config = tiny_config()
    model = compiled_model(config)
    weights = model.get_weights()
    weights[0][0, 0] = np.nan
    model.set_weights(weights)
    model.save_weights(tmp_path / "keras.weights.h5")  # Keras alone: no checksum
    run_weights.save_weights(model, tmp_path / "ours.weights.h5")
    for name in ("keras", "ours"):
        path = tmp_path / f"{name}.weights.h5"
        with pytest.raises(DamagedWeightsError,
                           match=rf"^{path} is damaged \(non-finite values in .+\)$"):
            run_weights.load_weights(compiled_model(config), path, config.model)


def test_restore_passes_over_a_checkpoint_with_flipped_bytes(run_with_two_epochs, caplog):
    from helpers import flip_weight_bytes

    run, models = run_with_two_epochs
    flip_weight_bytes(run.checkpoint_file(2))
    restored_past_epoch_2(run, models, caplog, "its contents differ")


def test_average_refuses_a_damaged_checkpoint_and_averages_the_others(run_with_two_epochs):
    from helpers import flip_weight_bytes

    run, models = run_with_two_epochs
    flip_weight_bytes(run.checkpoint_file(2))
    with pytest.raises(DamagedWeightsError, match=rf"^{run.checkpoint_file(2)} is damaged \(.+\); "
                       r"average the others \(--upper-bound 1\)$"):
        run.average(2)
    assert not list(run.path.glob("average_*")) and not list(run.path.glob(".partial-*"))
    flip_weight_bytes(run.checkpoint_file(1))
    with pytest.raises(DamagedWeightsError, match=r"average the others \(--last 1 \(the newer "
                       r"ones\)\)$"):
        run.average(2, upper_bound=2)
    run_files.copy_file(run.weights_file("last"), run.checkpoint_file(3))  # a good epoch 3
    with pytest.raises(DamagedWeightsError, match=r"average the others \(--last 1 \(the newer "
                       r"ones\) or --upper-bound 1\)$"):
        run.average(2)
    average = run.average(1)
    for got, want in zip(run.load_model(str(average)).get_weights(), models[1][0]):
        np.testing.assert_array_equal(got, want)


def test_weights_trained_with_another_vocabulary_of_the_same_size_are_refused(tmp_path):
    """The shapes fit, so nothing else would notice: every id would stand for another piece."""
    from keras_transformer.data.tokenizers import META_FILE

    config = tiny_config()
    runs_ = {}
    for name, pieces in (("a", "ein\nhund\n"), ("b", "zwei\nkatzen\n")):
        run = Run.create(config, tmp_path / name)
        run.save_config(config)
        (run.path / "vocab").mkdir()
        (run.path / "vocab" / META_FILE).write_text("{}")
        (run.path / "vocab" / "pieces.vocab").write_text(pieces)
        runs_[name] = run
    model = compiled_model(config)
    runs_["a"].save_epoch(model, 1)
    trained = runs_["a"].weights_file("last")
    [recorded] = run_weights.weight_file_attrs(trained, run_weights.VOCABULARY_ATTR)
    assert recorded == runs_["a"].vocabulary_checksum() != runs_["b"].vocabulary_checksum()
    assert runs_["a"].load_model("last") is not None
    with pytest.raises(ConfigError, match=rf"^{trained} was trained with another vocabulary than "
                       rf"{runs_['b'].path / 'vocab'} \(its ids would stand for other pieces\)"):
        runs_["b"].load_model(str(trained))


def test_a_runs_config_reads_its_paths_relative_to_itself_and_moves_with_the_folder(
        run_with_two_epochs, tmp_path, monkeypatch, caplog):
    """The probe: `vocab_dir: ../../...` written into a run's config.yaml was read from the
    working directory. Now it is read relative to the file; the paths training writes there
    (inside the run: relative, elsewhere: absolute) name the same folders from any working
    directory and after the run folder is renamed or moved, and the same config still resumes
    it. A run saved before the rule, whose config gave a path relative to the working
    directory, is read that way where nothing is found beside the file, with a warning."""
    import shutil

    run, _ = run_with_two_epochs
    shared = tmp_path / "shared_vocab"
    shared.mkdir()
    monkeypatch.chdir(tmp_path)
    config = dataclasses.replace(run.config, data=dataclasses.replace(
        run.config.data, vocab_dir=os.path.relpath(shared), data_dir=str(run.path / "data")))
    run.save_config(config)
    text = run.config_path.read_text()
    assert f"vocab_dir: {shared}\n" in text and "data_dir: data\n" in text
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)
    moved = tmp_path / "elsewhere" / "deeper" / "renamed"
    shutil.move(run.path, moved)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert Run(moved).vocab_dir == shared
    assert Path(Run(moved).config.data.data_dir) == moved / "data"
    resumed = dataclasses.replace(config, data=dataclasses.replace(
        config.data, vocab_dir=str(shared), data_dir=str(moved / "data")))
    assert Run.create(resumed, moved).epochs_done() == 2  # the same run, at its new place

    # Written by hand, relative to the file (the probe): read from there.
    (moved / "config.yaml").write_text(text.replace(f"vocab_dir: {shared}",
                                                    "vocab_dir: ../../../shared_vocab"))
    assert Path(Run(moved).vocab_dir).resolve() == shared
    # Saved before the rule, relative to the working directory of the training.
    monkeypatch.chdir(tmp_path)
    (moved / "config.yaml").write_text(text.replace(f"vocab_dir: {shared}",
                                                    "vocab_dir: shared_vocab"))
    with caplog.at_level(logging.WARNING, logger="keras_transformer.runs.folder"):
        assert Run(moved).vocab_dir == Path("shared_vocab")
    assert (f"{moved / 'config.yaml'}: data.vocab_dir shared_vocab is read from the working "
            "directory, as runs saved before paths were read relative to the config file gave "
            "it") in caplog.text


def test_moving_the_tfds_data_cache_is_the_same_run(run_with_two_epochs):
    """data.tfds_data_dir says where a machine caches the data, not which data: a resume with
    another cache folder continues the run."""
    run, _ = run_with_two_epochs
    moved = run.config
    moved = dataclasses.replace(moved, data=dataclasses.replace(moved.data,
                                                                tfds_data_dir="/elsewhere"))
    assert Run.create(moved, run.path).epochs_done() == 2


# ----------------------------------------------------------------------------- the lock

def test_a_second_training_in_a_folder_in_use_is_refused_until_the_first_is_killed(tmp_path):
    """The lock is the kernel's (flock): kill -9 of its holder frees the folder at once."""
    import signal

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # holds the lock until it is killed
        try:
            with run_files.training_lock(tmp_path):
                os.write(write, b"locked")
                signal.pause()
        finally:
            os._exit(1)
    try:
        assert os.read(read, 6) == b"locked"
        with pytest.raises(ConfigError, match=rf"^{tmp_path} is in use by another training "
                           rf"\(process {child}\): wait for it to end, or choose another "
                           r"--output$"):
            with run_files.training_lock(tmp_path):
                pass
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    with run_files.training_lock(tmp_path):  # resuming after the kill
        assert (tmp_path / run_files.LOCK_FILE).read_text() == f"{os.getpid()}\n"
    # Workers of one multi-worker run share a folder, each with a lock of its own.
    with run_files.training_lock(tmp_path):
        os.environ["TF_CONFIG"] = '{"task": {"type": "worker", "index": 1}}'
        try:
            with run_files.training_lock(tmp_path):
                assert (tmp_path / ".train-worker-1.lock").is_file()
        finally:
            del os.environ["TF_CONFIG"]


def test_a_run_saved_before_carry_remainders_resumes_as_it_was_trained(tmp_path):
    """Runs saved without `data.carry_remainders` ended each bucket's pass with a smaller
    batch: their config reads false, so resuming with today's default is refused in one line
    naming the key, and resuming with the key off goes on."""
    import yaml

    config = ExperimentConfig()
    assert config.data.carry_remainders
    values = config.to_dict()
    del values["data"]["carry_remainders"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(values))
    assert Run(tmp_path).config.data.carry_remainders is False
    with pytest.raises(ConfigError, match=r"holds another run's config \(differs in "
                                          r"data\.carry_remainders\)"):
        Run.create(config, tmp_path)
    old = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                               carry_remainders=False))
    assert Run.create(old, tmp_path).config == old
    config.to_yaml(tmp_path / "new.yaml")  # a config saved now keeps the key
    assert "carry_remainders: true" in (tmp_path / "new.yaml").read_text()
