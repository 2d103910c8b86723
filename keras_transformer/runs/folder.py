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

import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path

from keras_transformer.config import (ConfigError, ExperimentConfig, load_yaml_with_bases,
                                      map_paths, read_yaml)
from keras_transformer.data import corpora
from keras_transformer.data.text_io import PARTIAL_PREFIX, remove_dead_partials
from keras_transformer.data.tokenizers import (META_FILE, Tokenizer, build_tokenizers,
                                               load_tokenizers, vocabulary_checksum)
from keras_transformer.model import Transformer
from keras_transformer.runs.files import (atomic_path, check_weights_output, check_writable_folder,
                                          copy_file, write_errors)
from keras_transformer.runs.weights import (TRAINING_MINUTES_ATTR, DamagedWeightsError,
                                            load_weights, save_weights, warn_once,
                                            weight_file_attrs)

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
STATE_FILE = "state.json"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"
WEIGHT_NAMES = ("best", "last")
# HDF5 attributes of the weight files this package writes.
# What `--overwrite` deletes: everything `training.train` writes, and nothing else (backup/:
# Keras's BackupAndRestore folder, which runs made before state.json may hold).
RUN_ENTRIES = (CONFIG_FILE, STATE_FILE, "vocab", CHECKPOINT_DIR, "last.weights.h5",
               "best.weights.h5", "logs", "backup")


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
                warn_once("%s has no best weights (%s); using the last epoch's", self.path,
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
        warn_once("%s: %s %s is read from the working directory, as runs saved before paths "
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
