"""A training run's folder as one object: its config, vocabulary, weights and checkpoints.

    run = Run("runs/NAME")
    run.config                  # the resolved ExperimentConfig (vocabulary sizes filled in)
    run.tokenizers()            # (source, target), from run.vocab_dir
    run.load_model("best")      # never compiled: "best", "last" or a weight file's path
    run.average(last=5)         # the mean of the last 5 epoch checkpoints, as a weight file

The folder, as `training.train` writes it:

    runs/NAME/config.yaml              the resolved config
    runs/NAME/vocab/                   tokenizer files (unless data.vocab_dir points elsewhere)
    runs/NAME/checkpoints/epoch_NNN.weights.h5   weights after every epoch (for averaging and
                                       resuming: with the optimizer state, dropout's seeds and
                                       the training minutes so far)
    runs/NAME/last.weights.h5, best.weights.h5   last epoch, best epoch by validation BLEU
    runs/NAME/state.json               epochs done, optimizer step, best epoch, early stop,
                                       time budget spent
    runs/NAME/logs/{train,validation}  TensorBoard event files (and train_steps: every N steps)

Every file but the TensorBoard logs is written to a temporary name (`.partial-PID-NAME`) and
renamed, so a kill leaves the previous version whole, never half a file. `state.json` is written
last at the end of an epoch: a killed run resumes from its newest epoch checkpoint that loads,
and a run whose `state.json` says it is done is finished. Weight files carry the model config
they were trained with and a SHA-256 of their contents (HDF5 attributes), which `load_weights`
checks before a file becomes a model: a damaged file, or one with non-finite values, is refused
by name, never loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from keras_transformer.config import (ConfigError, ExperimentConfig, ModelConfig,
                                      load_yaml_with_bases, map_paths, read_yaml)
from keras_transformer.data import corpora
from keras_transformer.data.text_io import (PARTIAL_PREFIX, errno_of, first_line, partial_path,
                                            remove_dead_partials, write_error)
from keras_transformer.data.tokenizers import (META_FILE, Tokenizer, build_tokenizers,
                                               load_tokenizers, vocabulary_checksum)
from keras_transformer.model import Transformer
from keras_transformer.runs import legacy_weights

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
STATE_FILE = "state.json"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"
WEIGHT_NAMES = ("best", "last")
LOCK_FILE = ".train.lock"  # held by the training that writes in the folder (`training_lock`)
# HDF5 attributes of the weight files this package writes.
MODEL_CONFIG_ATTR = "keras_transformer.model_config"
RANDOM_STATES_ATTR = "keras_transformer.random_states"
TRAINING_MINUTES_ATTR = "keras_transformer.training_minutes"  # epoch checkpoints
# The SHA-256 of the file's arrays and of the attributes above (`weights_checksum`). It lives in
# the file, not in a list beside it, so that it is renamed into place with the file (a kill
# cannot leave the two out of step) and goes with a copy of it (`--weights PATH`).
CHECKSUM_ATTR = "keras_transformer.weights_sha256"
# The vocabulary the ids index (`tokenizers.vocabulary_checksum`): another vocabulary of the
# same size fits the model's shapes and turns every output into other words.
VOCABULARY_ATTR = "keras_transformer.vocabulary_sha256"
CHECKED_ATTRS = (MODEL_CONFIG_ATTR, RANDOM_STATES_ATTR, TRAINING_MINUTES_ATTR, VOCABULARY_ATTR)
# What `--overwrite` deletes: everything `training.train` writes, and nothing else (backup/:
# Keras's BackupAndRestore folder, which runs made before state.json may hold).
RUN_ENTRIES = (CONFIG_FILE, STATE_FILE, "vocab", CHECKPOINT_DIR, "last.weights.h5",
               "best.weights.h5", "logs", "backup")


class DamagedWeightsError(ConfigError):
    """A weight file cannot be read (truncated, or not HDF5), does not match the checksum it was
    written with, or holds non-finite values."""


class Run:
    """The run folder at `path` (which `Run.create` makes, and `training.train` fills)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._config: ExperimentConfig | None = None
        self._vocabulary: str | None = None

    @classmethod
    def create(cls, config: ExperimentConfig, path: str | os.PathLike, *,
               overwrite: bool = False) -> "Run":
        """Creates the run folder, or checks that it holds this same run (to resume or extend).

        Raises ConfigError, and writes nothing, if `path` is a file or cannot be written in, or
        holds another run (another config, or checkpoints without a config). With `overwrite`
        the files of the run it holds are deleted first, with a warning that lists them.
        """
        run = cls(path)
        check_writable_folder(run.path)
        if overwrite:
            run.delete()
        elif run.config_path.exists():
            previous = _comparable(run.config)
            if previous != _comparable(config):
                changed = sorted(_diff(previous, _comparable(config)))
                raise ConfigError(f"{run.path} holds another run's config (differs in "
                                  f"{', '.join(changed)}); choose another --output, or add "
                                  "--overwrite to delete that run and train this one")
        elif run.state_path.exists() or run.epoch_checkpoints():
            raise ConfigError(f"{run.path} holds checkpoints but no {CONFIG_FILE}; choose another "
                              "--output, or add --overwrite to delete them")
        run.path.mkdir(parents=True, exist_ok=True)
        return run

    def delete(self) -> list[str]:
        """Deletes the files `training.train` writes (nothing else in the folder); returns
        their names and says which in a warning."""
        entries = [self.path / name for name in RUN_ENTRIES]
        entries += sorted(self.path.glob("average_*.weights.h5"))
        entries += sorted(self.path.glob(f"{PARTIAL_PREFIX}*"))
        deleted = []
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
                deleted.append(f"{entry.name}/")
            elif entry.exists() or entry.is_symlink():
                entry.unlink()
                deleted.append(entry.name)
        if deleted:
            logger.warning("deleted the previous run in %s (--overwrite): %s", self.path,
                           ", ".join(deleted))
        self._config = self._vocabulary = None
        return deleted

    # ------------------------------------------------------------------------- paths

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def state_path(self) -> Path:
        return self.path / STATE_FILE

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    def weights_file(self, name: str) -> Path:
        """`best.weights.h5` or `last.weights.h5` in the run folder."""
        return self.path / f"{name}.weights.h5"

    def checkpoint_file(self, epoch: int) -> Path:
        """`checkpoints/epoch_NNN.weights.h5`: the weights after epoch `epoch` (from 1)."""
        return self.checkpoint_dir / CHECKPOINT_PATTERN.format(epoch=epoch)

    @property
    def vocab_dir(self) -> Path:
        """`data.vocab_dir` if the config sets it, else `vocab/` in the run folder."""
        return vocab_dir(self.config, self.path)

    # ------------------------------------------------------------------------- contents

    @property
    def config(self) -> ExperimentConfig:
        """The run's saved config; ConfigError if the folder holds no run."""
        if self._config is None:
            if not self.config_path.is_file():
                raise ConfigError(f"{self.path} is not a training run ({CONFIG_FILE} not found)")
            try:
                config = _with_legacy_paths(ExperimentConfig.from_yaml(self.config_path),
                                            self.config_path)
            except ConfigError as error:
                if str(error).startswith(str(self.config_path)):
                    raise
                raise ConfigError(f"{self.config_path}: {error}") from None
            self._config = _as_trained(config, self.config_path)
        return self._config

    def save_config(self, config: ExperimentConfig) -> None:
        with write_errors(self.config_path), atomic_path(self.config_path) as partial:
            config.to_yaml(partial)
        self._config = config

    def vocabulary_checksum(self) -> str | None:
        """`tokenizers.vocabulary_checksum` of the run's vocabulary (None before it is
        written), read once."""
        if self._vocabulary is None:
            self._vocabulary = vocabulary_checksum(self.vocab_dir)
        return self._vocabulary

    def tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        """(source, target) tokenizers from the run's vocabulary."""
        return load_tokenizers(self.config.data, self.vocab_dir)

    def weights_path(self, weights: str = "best") -> Path:
        """The weight file for "best", "last" or a path. "best" falls back to "last" with a
        warning when the run has no best weights (validation BLEU was off, or no epoch ended
        with it yet); ConfigError if the file does not exist."""
        if weights not in WEIGHT_NAMES:
            path = Path(weights)
        else:
            path = self.weights_file(weights)
            if weights == "best" and not path.exists():
                if not self.weights_file("last").exists():
                    raise ConfigError(f"no weights at {path} or {self.weights_file('last')}")
                _warn_once("%s has no best weights (%s); using the last epoch's", self.path,
                           path.name)
                path = self.weights_file("last")
        if not path.exists():
            raise ConfigError(f"no weights at {path}")
        if path.is_dir():
            raise ConfigError(f"{path} is a folder, not a weights file")
        return path

    def load_model(self, weights: str = "best") -> Transformer:
        """The run's model (never compiled) with `best`, `last`, or a weight file's path.

        ConfigError, naming the file, if it is damaged (`verify_weights`: the line says which
        other weights to choose) or was trained with another model config than the run's
        `config.yaml`."""
        path = self.weights_path(weights)
        model = Transformer(self.config.model)
        model.build()
        try:
            load_weights(model, path, self.config.model, self.config_path,
                         vocabulary=self.vocabulary_checksum(), vocab_dir=self.vocab_dir)
        except DamagedWeightsError as error:
            raise DamagedWeightsError(
                f"{error}; choose other weights with --weights: best, last, or a checkpoint "
                f"({self.checkpoint_dir}/epoch_NNN.weights.h5)") from None
        return model

    def epoch_checkpoints(self) -> list[Path]:
        """The run's per-epoch weight files (`epoch_NNN.weights.h5`; other files in the folder
        are not checkpoints), oldest first."""
        found = [p for p in self.checkpoint_dir.glob("epoch_*.weights.h5")
                 if _CHECKPOINT_NAME.fullmatch(p.name)]
        return sorted(found, key=_epoch_of)

    # ------------------------------------------------------------------------- training state

    def state(self) -> dict | None:
        """What `save_epoch` last recorded (None before the first epoch ends): `epoch` (epochs
        done), `optimizer_step`, `best` ({"epoch", "val_bleu"} or None), `stopped_early`,
        `budget_spent` (`train.budget_minutes`; absent in runs written before it)."""
        if not self.state_path.is_file():
            return None
        try:
            state = json.loads(self.state_path.read_text())
        except ValueError as error:
            raise self._damaged_state(error) from None
        if not isinstance(state, dict):
            raise self._damaged_state(f"a JSON {type(state).__name__}, not an object")
        epoch = state.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise self._damaged_state(f"epoch {epoch!r} is not a number of epochs")
        return state

    def _damaged_state(self, why) -> ConfigError:
        return ConfigError(f"{self.state_path} is damaged ({why}); delete it to resume from the "
                           "newest epoch checkpoint")

    def epochs_done(self) -> int:
        """Epochs the run has recorded as finished: `state.json`'s, or without it the newest
        checkpoint's if `last` exists too (a run written before `state.json`; a kill after the
        first checkpoint leaves no `last`)."""
        state = self.state()
        if state is not None:
            return state["epoch"]
        checkpoints = self.epoch_checkpoints()
        if not checkpoints or not self.weights_file("last").exists():
            return 0
        return _epoch_of(checkpoints[-1])

    def finished(self, config: ExperimentConfig) -> str | None:
        """Why the run needs no more training with `config`, or None if it does."""
        done = self.epochs_done()
        state = self.state() or {}
        if state.get("stopped_early"):
            return (f"{self.path} is finished: early stopping ended it after epoch {done} "
                    f"(train.early_stopping_patience); --overwrite trains it anew")
        if state.get("budget_spent"):
            return (f"{self.path} is finished: its time budget (train.budget_minutes="
                    f"{config.train.budget_minutes:g}) was spent in epoch {done}; --overwrite "
                    f"trains it anew")
        if done and done >= config.train.epochs:
            return (f"{self.path} is finished: {done} epochs done, "
                    f"train.epochs={config.train.epochs}; raise train.epochs (--set "
                    "train.epochs=N) to extend it, or --overwrite to train it anew")
        return None

    def save_epoch(self, model, epoch: int, val_bleu: float | None = None, *,
                   training_minutes: float | None = None) -> None:
        """Records a finished epoch: its checkpoint (weights, optimizer state, dropout's seeds,
        and the training minutes so far if given), `last`, `best` if `val_bleu` beats the best
        so far, then `state.json`, each written whole or not at all, in that order (so the
        state never names a missing file)."""
        checkpoint = self.checkpoint_file(epoch)
        checkpoint.parent.mkdir(exist_ok=True)
        save_weights(model, checkpoint, training_minutes=training_minutes,
                     vocabulary=self.vocabulary_checksum())
        copy_file(checkpoint, self.weights_file("last"))
        state = self.state() or {}
        best = state.get("best")
        if val_bleu is not None and (best is None or val_bleu > best["val_bleu"]):
            copy_file(checkpoint, self.weights_file("best"))
            best = {"epoch": epoch, "val_bleu": float(val_bleu)}
        self._write_state({"epoch": epoch,
                           "optimizer_step": int(model.optimizer.iterations.numpy()),
                           "checkpoint": str(checkpoint.relative_to(self.path)),
                           "best": best, "stopped_early": False})

    def mark_stopped_early(self) -> None:
        """Records that early stopping ended the run: it is finished."""
        state = self.state()
        if state is not None:
            self._write_state({**state, "stopped_early": True})

    def mark_budget_spent(self) -> None:
        """Records that the time budget ended the run: it is finished."""
        state = self.state()
        if state is not None:
            self._write_state({**state, "budget_spent": True})

    def training_minutes(self, epoch: int) -> float:
        """The training minutes that epoch `epoch`'s checkpoint recorded; 0 for epoch 0, and for
        a checkpoint written without them (before `train.budget_minutes` existed)."""
        if not epoch:
            return 0.0
        [minutes] = weight_file_attrs(self.checkpoint_file(epoch), TRAINING_MINUTES_ATTR)
        return 0.0 if minutes is None else float(minutes)

    def _write_state(self, state: dict) -> None:
        with write_errors(self.state_path), atomic_path(self.state_path) as partial:
            partial.write_text(json.dumps(state, indent=1) + "\n")

    def restore(self, model) -> int:
        """Loads the newest epoch checkpoint that loads into `model` (compiled, optimizer
        built): weights, optimizer state and dropout's seeds. Returns its epoch, 0 if the run
        has no checkpoint. A damaged checkpoint is reported by name and the one before it is
        tried; ConfigError if none loads. A checkpoint newer than `state.json` (a kill came
        between writing the two) is recorded now, as its epoch's end would have."""
        checkpoints = self.epoch_checkpoints()
        damaged = []
        for path in reversed(checkpoints):
            try:
                load_weights(model, path, self.config.model, self.config_path,
                             vocabulary=self.vocabulary_checksum(), vocab_dir=self.vocab_dir)
            except DamagedWeightsError as error:
                logger.warning("%s", error)
                damaged.append(path.name)
                continue
            if damaged:
                logger.warning("resuming from %s, the newest checkpoint that loads (damaged: %s)",
                               path, ", ".join(damaged))
            epoch = _epoch_of(path)
            if epoch > self.epochs_done():
                self.save_epoch(model, epoch, training_minutes=self.training_minutes(epoch))
            return epoch
        if checkpoints:
            raise ConfigError(f"no checkpoint in {self.checkpoint_dir} loads; add --overwrite "
                              "to train the run anew")
        return 0

    def remove_partial_files(self) -> None:
        """Deletes what killed processes left half-written in the run (`.partial-PID-*` files
        and folders: `text_io.remove_dead_partials`); those of a running one, an `average`
        writing into the run folder, are kept."""
        for folder in (self.path, self.checkpoint_dir):
            remove_dead_partials(folder)

    def average(self, last: int, output: str | os.PathLike | None = None, *,
                upper_bound: int | None = None) -> Path:
        """Writes the elementwise mean of the weights of the last `last` epochs (section 6.1:
        the paper averaged the last 5 or 20 checkpoints), or of the `last` epochs up to epoch
        `upper_bound` (fairseq's --checkpoint-upper-bound: the model as it stood at that epoch).
        Returns the written file's path (default `average_lastN[_toE].weights.h5` in the run)."""
        config = self.config  # ConfigError if the folder is not a run
        suffix = "" if upper_bound is None else f"_to{upper_bound}"
        output = Path(output or self.path / f"average_last{last}{suffix}.weights.h5")
        check_weights_output(output)
        paths = self.epoch_checkpoints()
        trained = [self.weights_file("best"), self.weights_file("last"), *paths]
        if any(output.resolve() == path.resolve() for path in trained):
            raise ConfigError(f"{output} holds the run's own trained weights: write the average "
                              "to another file (--output)")
        if upper_bound is not None:
            paths = [p for p in paths if _epoch_of(p) <= upper_bound]
        if last < 1 or len(paths) < last:
            bound = "" if upper_bound is None else f" up to epoch {upper_bound}"
            raise ConfigError(f"cannot average the last {last} checkpoints{bound}: "
                              f"{self.checkpoint_dir} holds {len(paths)}")
        model = Transformer(config.model)
        model.build()
        total = None
        for index, path in enumerate(paths[-last:]):
            try:
                load_weights(model, path, config.model, self.config_path,
                             vocabulary=self.vocabulary_checksum(), vocab_dir=self.vocab_dir)
            except DamagedWeightsError as error:
                newer = last - index - 1
                others = [f"--last {newer} (the newer ones)"] if newer else []
                if _epoch_of(path) > 1:
                    others.append(f"--upper-bound {_epoch_of(path) - 1}")
                advice = (f"average the others ({' or '.join(others)})" if others
                          else "no other checkpoint to average")
                raise DamagedWeightsError(f"{error}; {advice}") from None
            weights = model.get_weights()
            total = weights if total is None else [t + w for t, w in zip(total, weights)]
        model.set_weights([(t / last).astype(w.dtype) for t, w in zip(total, model.get_weights())])
        output.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_partials(output.parent)  # what an average killed with -9 left
        save_weights(model, output, vocabulary=self.vocabulary_checksum())
        return output


# ----------------------------------------------------------------------------- files

@contextlib.contextmanager
def training_lock(path: str | os.PathLike):
    """Holds an exclusive lock on the run folder `path` (an existing folder) while a training
    writes in it: `process_lock` on `path/.train.lock`.

    A second training in the folder is refused (ConfigError) in one line naming the first
    one's process. The kernel releases the lock when that process ends, by kill -9 too, so a
    killed run resumes at once. Workers of one multi-worker run (TF_CONFIG) may share a folder:
    each locks a file of its own.
    """
    path = Path(path)
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    except (ValueError, AttributeError):
        task = {}
    name = f".train-{task.get('type')}-{task.get('index')}.lock" if task else LOCK_FILE
    with process_lock(path / name, lambda holder: (
            f"{path} is in use by another training (process {holder}): wait for it to end, "
            "or choose another --output")):
        yield


@contextlib.contextmanager
def process_lock(lock_file: str | os.PathLike, busy: Callable[[str], str], *,
                 wait: bool = False, remove: bool = False):
    """Holds an exclusive lock on `lock_file` (created if need be) while the block runs: the
    kernel's `flock`, which it releases when the process ends, by kill -9 too, so that nothing
    is left to clean up. The file holds the holder's process id, for the others to name.

    If another holds it (a process, or another open of the file in this one): ConfigError
    `busy(its process id)`, at once; or with `wait`, `busy(its process id)` logged as a warning,
    and the lock waited for. With `remove`, the holder deletes the file as it lets go (one who
    then locks the deleted file notices, and locks the new one). A lock file that cannot be
    created is a one-line OSError naming it; one whose process id cannot be written (a full
    disk) still locks.

    What `training_lock` (the run folder), `bulk_translation.translate_file` (an output file)
    and `export.export_run` (a model folder's versions) hold.
    """
    lock_file = Path(lock_file)
    fd = _lock_descriptor(lock_file, busy, wait)
    try:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError:  # a full disk: the others name the holder "unknown"
            pass
        yield
    finally:
        if remove:
            lock_file.unlink(missing_ok=True)
        os.close(fd)


def _lock_descriptor(lock_file: Path, busy: Callable[[str], str], wait: bool) -> int:
    """An open descriptor of `lock_file` whose `flock` this process holds (`process_lock`)."""
    while True:
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise write_error(lock_file, error) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                if not wait:
                    raise ConfigError(busy(holder)) from None
                logger.warning("%s", busy(holder))
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:  # still the file at `lock_file`, not one its holder deleted meanwhile
                locked = os.path.samestat(os.fstat(fd), os.stat(lock_file))
            except FileNotFoundError:
                locked = False
        except BaseException:
            os.close(fd)
            raise
        if locked:
            return fd
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary name beside `path` to write to; renames it to `path` when the block
    ends without an error (after syncing it to disk), deletes it otherwise. The name keeps
    `path`'s suffix (Keras wants `.weights.h5`) and holds the process id (workers of one run
    may write the same file): `text_io.partial_path`."""
    path = Path(path)
    partial = partial_path(path)
    try:
        yield partial
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def copy_file(source: Path, target: Path) -> None:
    """Copies `source` to `target` through a temporary file (`atomic_path`); a full disk is
    a one-line OSError (`write_errors`) that leaves `target` as it was."""
    check_free_space(target, source.stat().st_size)
    with write_errors(target), atomic_path(target) as partial:
        shutil.copyfile(source, partial)


def check_writable_folder(path: str | os.PathLike, what: str = "output folder") -> None:
    """ConfigError unless `path` is a folder, or can be made one, that this process may write in
    (checked without writing anything)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} is a file, not a folder")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path}: cannot write in {existing} (permission denied or a "
                          "read-only file system)")


def check_weights_output(path: Path) -> None:
    """ConfigError unless `path` names a `.weights.h5` file that can be written."""
    if not path.name.endswith(".weights.h5"):
        raise ConfigError(f"{path}: a weights file's name ends in .weights.h5")
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a weights file")
    check_writable_folder(path.parent, f"the folder of {path}:")


@contextlib.contextmanager
def write_errors(path: str | os.PathLike):
    """Turns what writing `path` raises when the disk is full or the folder unwritable
    (OSError; h5py's RuntimeError, whose message holds the errno) into a one-line OSError that
    names the file and says that nothing was written."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        if errno_of(error) is None:  # not the file system's refusal: a bug, with its traceback
            raise
        _quiet_h5py_cleanup()
        raise write_error(path, error) from None


def _quiet_h5py_cleanup() -> None:
    """After a failed write h5py says so again, as a traceback on stderr, whenever it frees the
    file's objects (Python calls that an unraisable exception): the one-line error has said it."""
    previous = sys.unraisablehook
    if getattr(previous, "keras_transformer_h5py", False):
        return

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, RuntimeError)
                and "h5py" in repr(unraisable.object)):
            previous(unraisable)

    hook.keras_transformer_h5py = True
    sys.unraisablehook = hook


def check_free_space(path: str | os.PathLike, size: int) -> None:
    """OSError (ENOSPC) unless the file system of `path`'s folder has `size` bytes free."""
    folder = Path(path).parent
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < size:
        raise write_error(path, OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: "
                                        f"{size / 1e6:.1f} MB needed, {free / 1e6:.1f} MB free"))


def save_weights(model: Transformer, path: str | os.PathLike, *,
                 training_minutes: float | None = None, vocabulary: str | None = None) -> Path:
    """`model.save_weights(path)` (with the optimizer's state if it is compiled) written through
    a temporary file, with the model config, dropout's seed states, `training_minutes` and the
    `vocabulary`'s checksum (`tokenizers.vocabulary_checksum`), if given, and the checksum of
    all of them (`weights_checksum`) as HDF5 attributes.

    A full disk or an unwritable folder is an OSError in one line, checked before writing
    where it can be (h5py has crashed the process on a full disk), with nothing left behind:
    a previous file at `path` stays as it was.
    """
    path = Path(path)
    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None and model.compiled:
        variables += list(model.optimizer.variables)
    # The arrays, and HDF5's few kilobytes of names and headers for each.
    check_free_space(path, sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize + 4096
                               for v in variables))
    with write_errors(path), atomic_path(path) as partial:
        model.save_weights(partial)
        with h5py.File(partial, "a") as f:
            f.attrs[MODEL_CONFIG_ATTR] = json.dumps(dataclasses.asdict(model.config))
            f.attrs[RANDOM_STATES_ATTR] = json.dumps(
                [state.numpy().tolist() for state in random_states(model)])
            if training_minutes is not None:
                f.attrs[TRAINING_MINUTES_ATTR] = float(training_minutes)
            if vocabulary is not None:
                f.attrs[VOCABULARY_ATTR] = vocabulary
            f.attrs[CHECKSUM_ATTR] = weights_checksum(f)
    return path


def weights_checksum(f: h5py.File) -> str:
    """The SHA-256 of a weight file's arrays (each with its name, dtype and shape, in name
    order) and of its attributes `CHECKED_ATTRS`: what `save_weights` records and
    `verify_weights` recomputes."""
    digest = hashlib.sha256()
    names = []
    f.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    for name in sorted(names):
        array = np.ascontiguousarray(f[name][()])
        digest.update(f"{name} {array.dtype.str} {array.shape}\n".encode())
        digest.update(array.tobytes())
    for name in CHECKED_ATTRS:
        value = f.attrs.get(name)
        digest.update(f"{name}={'' if value is None else value}\n".encode())
    return digest.hexdigest()


def verify_weights(path: str | os.PathLike) -> str | None:
    """Checks a weight file before it becomes a model; returns the checksum it records (None
    for a file written by Keras alone, whose values are still checked).

    Raises DamagedWeightsError naming the file if it cannot be read, if its arrays or
    attributes differ from the checksum `save_weights` recorded (bytes changed on disk), or if
    an array holds NaN or infinity (a diverged training saved them).
    """
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            recorded = f.attrs.get(CHECKSUM_ATTR)
            actual = weights_checksum(f) if recorded is not None else None
            not_finite = _first_not_finite(f)
    except (OSError, RuntimeError, KeyError, ValueError) as error:  # h5py: RuntimeError for
        raise DamagedWeightsError(f"{path} is damaged ({first_line(error)})") from None  # metadata
    if recorded is not None and actual != str(recorded):
        raise DamagedWeightsError(f"{path} is damaged (its contents differ from the SHA-256 "
                                  "recorded when it was written)")
    if not_finite:
        raise DamagedWeightsError(f"{path} is damaged (non-finite values in {not_finite})")
    return None if recorded is None else str(recorded)


def _first_not_finite(f: h5py.File) -> str | None:
    """The name of the first floating-point array of `f` holding NaN or infinity, or None."""
    names = []
    f.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    for name in sorted(names):
        array = f[name][()]
        if np.asarray(array).dtype.kind == "f" and not np.isfinite(array).all():
            return name
    return None


def weight_file_attrs(path: Path, *names: str) -> list:
    """The HDF5 attributes `names` of a weight file (None where one is missing); raises
    DamagedWeightsError naming the file if it cannot be read."""
    try:
        with h5py.File(path, "r") as f:
            return [f.attrs.get(name) for name in names]
    except (OSError, RuntimeError) as error:  # h5py: RuntimeError for damaged metadata
        raise DamagedWeightsError(f"{path} is damaged ({first_line(error)})") from None


def load_weights(model: Transformer, path: str | os.PathLike, config: ModelConfig,
                 where: str | os.PathLike = "the config", *, vocabulary: str | None = None,
                 vocab_dir: str | os.PathLike | None = None) -> None:
    """Loads a weight file into `model`, and dropout's seed states if the file has them.

    Raises DamagedWeightsError naming the file if it cannot be read, does not match its
    checksum or holds non-finite values (`verify_weights`, before anything is loaded), and
    ConfigError naming the first model field that differs between the file's config and
    `config` (read from `where`), with both values. Dropout is not compared: it acts only in
    training. ConfigError too if the file was trained with another vocabulary than the one whose
    checksum is `vocabulary` (read from `vocab_dir`). Files written without these attributes
    (by Keras directly) are loaded unchecked.
    """
    path = Path(path)
    trained, states, trained_vocabulary = weight_file_attrs(
        path, MODEL_CONFIG_ATTR, RANDOM_STATES_ATTR, VOCABULARY_ATTR)
    verify_weights(path)
    if None not in (vocabulary, trained_vocabulary) and trained_vocabulary != vocabulary:
        raise ConfigError(f"{path} was trained with another vocabulary than {vocab_dir} (its "
                          "ids would stand for other pieces): use weights trained with this "
                          "vocabulary")
    if trained is not None:
        try:
            trained = json.loads(trained)
        except ValueError as error:
            raise DamagedWeightsError(f"{path} is damaged (its model config attribute: "
                                      f"{first_line(error)})") from None
        for field in dataclasses.fields(ModelConfig):
            name = field.name
            if name != "dropout" and name in trained and trained[name] != getattr(config, name):
                raise ConfigError(f"{path} was trained with model.{name}={trained[name]!r}, but "
                                  f"{where} has model.{name}={getattr(config, name)!r}")
    try:
        with legacy_weights.loadable(path, model) as loadable_path:
            model.load_weights(loadable_path)
    except (OSError, KeyError, RuntimeError) as error:
        raise DamagedWeightsError(f"{path} is damaged ({first_line(error)})") from None
    except ValueError as error:
        raise ConfigError(f"{path} does not fit the model of {where} "
                          f"({first_line(error)})") from None
    if states is not None:
        saved, variables = json.loads(states), random_states(model)
        if len(saved) == len(variables):
            for variable, value in zip(variables, saved):
                variable.assign(value)


_warned = set()


def _warn_once(message: str, *args) -> None:
    """Logs a warning once per process: a command looks the same weights up several times."""
    if (message, args) not in _warned:
        _warned.add((message, args))
        logger.warning(message, *args)


def random_states(model: Transformer) -> list:
    """The model's random seed states (Keras `SeedGenerator`s, which drive dropout): what
    `model.variables` holds beyond its weights and metrics, in a fixed order."""
    known = {id(v) for v in model.weights}
    known |= {id(v) for metric in model.metrics for v in metric.variables}
    return [v for v in model.variables if id(v) not in known]


def vocab_dir(config: ExperimentConfig, run_path: str | os.PathLike) -> Path:
    """Where a run's vocabulary lives: `data.vocab_dir`, else `vocab/` in the run folder."""
    return Path(config.data.vocab_dir or Path(run_path) / "vocab")


def prepare_tokenizers(config: ExperimentConfig, run: Run) -> tuple[Tokenizer, Tokenizer]:
    """Loads the run's vocabularies, learning them from the training split the first time."""
    folder = vocab_dir(config, run.path)
    if (folder / META_FILE).exists():
        return load_tokenizers(config.data, folder)
    pairs = corpora.load_pairs(config.data, config.data.train_split)
    return build_tokenizers(config.data, pairs, folder)


def with_vocab_sizes(config: ExperimentConfig, source: Tokenizer,
                     target: Tokenizer) -> ExperimentConfig:
    """`config` with the model's vocabulary sizes set to the tokenizers'."""
    model = dataclasses.replace(config.model, source_vocab_size=source.vocab_size,
                                target_vocab_size=target.vocab_size)
    return dataclasses.replace(config, model=model)


_CHECKPOINT_NAME = re.compile(r"epoch_(\d+)\.weights\.h5")


def _epoch_of(path: Path) -> int:
    return int(_CHECKPOINT_NAME.fullmatch(path.name).group(1))  # epoch_007.weights.h5 -> 7


def _as_trained(config: ExperimentConfig, path: Path) -> ExperimentConfig:
    """A saved config with the defaults its run was trained with where the file predates a
    key: runs saved before `data.carry_remainders` ended each bucket's pass with a smaller
    batch (so a resumed run reads the stream it read, or is refused when told otherwise)."""
    saved = load_yaml_with_bases(path).get("data") or {}
    if "carry_remainders" not in saved:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                      carry_remainders=False))
    return config


def _with_legacy_paths(config: ExperimentConfig, path: Path) -> ExperimentConfig:
    """A run's saved config with the paths that runs saved before paths were read relative to
    the config file gave relative to the working directory, read from there: where one is not
    found beside the file but is from the working directory (with a warning, once)."""
    given = {}
    map_paths(read_yaml(path) or {}, lambda name, value: given.setdefault(name, value))

    def legacy(name: str, value: str) -> str:
        old = given.get(name)
        if old is None or old == value or os.path.exists(value) or not os.path.exists(old):
            return value
        _warn_once("%s: %s %s is read from the working directory, as runs saved before paths "
                   "were read relative to the config file gave it; write it relative to the "
                   "file, or absolute", path, name, old)
        return old

    values = map_paths(config.to_dict(), legacy)
    return config if values == config.to_dict() else ExperimentConfig.from_dict(values)


def _comparable(config: ExperimentConfig) -> dict:
    """The config without what training fills in (vocabulary sizes), may extend (epochs),
    only changes what TensorBoard shows (log_every_steps, profile_batches) or says where the
    same data is cached (tfds_data_dir: a machine's folder, not the data); paths by the file or
    folder they name (a run's config.yaml gives them relative to itself)."""
    values = map_paths(config.to_dict(),
                       lambda name, value: os.path.realpath(os.path.expanduser(value)))
    for key in ("source_vocab_size", "target_vocab_size"):
        values["model"].pop(key)
    values["train"].pop("epochs")
    values["train"].pop("log_every_steps")
    values["train"].pop("profile_batches")
    values["data"].pop("tfds_data_dir")
    return values


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = set(a) | set(b)
    out = []
    for key in keys:
        name = f"{prefix}{key}"
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            out += _diff(a[key], b[key], f"{name}.")
        elif a.get(key) != b.get(key):
            out.append(name)
    return out
