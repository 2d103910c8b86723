"""A training run's folder as one object: its config, vocabulary, weights and checkpoints.

    run = Run("runs/NAME")
    run.config                  # the resolved ExperimentConfig (vocabulary sizes filled in)
    run.tokenizers()            # (source, target), from run.vocab_dir
    run.load_model("best")      # never compiled: "best", "last" or a weight file's path
    run.average(last=5)         # the mean of the last 5 epoch checkpoints, as a weight file

The folder, as `training.train` writes it:

    runs/NAME/config.yaml              the resolved config
    runs/NAME/vocab/                   tokenizer files (unless data.vocab_dir points elsewhere)
    runs/NAME/checkpoints/epoch_NNN.weights.h5   weights after every epoch (for averaging)
    runs/NAME/last.weights.h5, best.weights.h5   last epoch, best epoch by validation BLEU
    runs/NAME/backup/                  BackupAndRestore state (preemption-safe resume)
    runs/NAME/logs/{train,validation}  TensorBoard event files (and train_steps: every N steps)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from keras_transformer import data as data_lib
from keras_transformer.config import ConfigError, ExperimentConfig
from keras_transformer.model import Transformer
from keras_transformer.tokenizers import META_FILE, Tokenizer, build_tokenizers, load_tokenizers

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"
WEIGHT_NAMES = ("best", "last")


class Run:
    """The run folder at `path` (which `Run.create` makes, and `training.train` fills)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._config: ExperimentConfig | None = None

    @classmethod
    def create(cls, config: ExperimentConfig, path: str | os.PathLike) -> "Run":
        """Creates the run folder, or checks that it holds this same run (to resume).

        Raises ConfigError, and writes nothing, if the folder holds another run's config.
        """
        run = cls(path)
        if run.config_path.exists():
            previous = _comparable(run.config)
            if previous != _comparable(config):
                changed = sorted(_diff(previous, _comparable(config)))
                raise ConfigError(f"{run.path} holds another run's config (differs in "
                                  f"{', '.join(changed)}); choose a new --output or delete it")
        run.path.mkdir(parents=True, exist_ok=True)
        return run

    # ------------------------------------------------------------------------- paths

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def backup_dir(self) -> Path:
        return self.path / "backup"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    def weights_file(self, name: str) -> Path:
        """`best.weights.h5` or `last.weights.h5` in the run folder."""
        return self.path / f"{name}.weights.h5"

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
            self._config = ExperimentConfig.from_yaml(self.config_path)
        return self._config

    def save_config(self, config: ExperimentConfig) -> None:
        config.to_yaml(self.config_path)
        self._config = config

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
                logger.warning("%s has no best weights (%s); using the last epoch's",
                               self.path, path.name)
                path = self.weights_file("last")
        if not path.exists():
            raise ConfigError(f"no weights at {path}")
        return path

    def load_model(self, weights: str = "best") -> Transformer:
        """The run's model (never compiled) with `best`, `last`, or a weight file's path."""
        path = self.weights_path(weights)
        model = Transformer(self.config.model)
        model.build()
        model.load_weights(path)
        return model

    def epoch_checkpoints(self) -> list[Path]:
        """The run's per-epoch weight files, oldest first."""
        return sorted(self.checkpoint_dir.glob("epoch_*.weights.h5"))

    def average(self, last: int, output: str | os.PathLike | None = None, *,
                upper_bound: int | None = None) -> Path:
        """Writes the elementwise mean of the weights of the last `last` epochs (section 6.1:
        the paper averaged the last 5 or 20 checkpoints), or of the `last` epochs up to epoch
        `upper_bound` (fairseq's --checkpoint-upper-bound: the model as it stood at that epoch).
        Returns the written file's path (default `average_lastN[_toE].weights.h5` in the run)."""
        paths = self.epoch_checkpoints()
        if upper_bound is not None:
            paths = [p for p in paths if _epoch_of(p) <= upper_bound]
        if last < 1 or len(paths) < last:
            bound = "" if upper_bound is None else f" up to epoch {upper_bound}"
            raise ConfigError(f"cannot average the last {last} checkpoints{bound}: "
                              f"{self.checkpoint_dir} holds {len(paths)}")
        model = Transformer(self.config.model)
        model.build()
        total = None
        for path in paths[-last:]:
            model.load_weights(path)
            weights = model.get_weights()
            total = weights if total is None else [t + w for t, w in zip(total, weights)]
        model.set_weights([(t / last).astype(w.dtype) for t, w in zip(total, model.get_weights())])
        suffix = "" if upper_bound is None else f"_to{upper_bound}"
        output = Path(output or self.path / f"average_last{last}{suffix}.weights.h5")
        model.save_weights(output)
        return output


def vocab_dir(config: ExperimentConfig, run_path: str | os.PathLike) -> Path:
    """Where a run's vocabulary lives: `data.vocab_dir`, else `vocab/` in the run folder."""
    return Path(config.data.vocab_dir or Path(run_path) / "vocab")


def prepare_tokenizers(config: ExperimentConfig, run: Run) -> tuple[Tokenizer, Tokenizer]:
    """Loads the run's vocabularies, learning them from the training split the first time."""
    folder = vocab_dir(config, run.path)
    if (folder / META_FILE).exists():
        return load_tokenizers(config.data, folder)
    pairs = data_lib.load_pairs(config.data, config.data.train_split)
    return build_tokenizers(config.data, pairs, folder)


def with_vocab_sizes(config: ExperimentConfig, source: Tokenizer,
                     target: Tokenizer) -> ExperimentConfig:
    """`config` with the model's vocabulary sizes set to the tokenizers'."""
    model = dataclasses.replace(config.model, source_vocab_size=source.vocab_size,
                                target_vocab_size=target.vocab_size)
    return dataclasses.replace(config, model=model)


def _epoch_of(path: Path) -> int:
    return int(path.name.split(".")[0].split("_")[1])  # epoch_007.weights.h5 -> 7


def _comparable(config: ExperimentConfig) -> dict:
    """The config without what training fills in (vocabulary sizes), may extend (epochs) or
    only changes what TensorBoard shows (log_every_steps)."""
    values = config.to_dict()
    for key in ("source_vocab_size", "target_vocab_size"):
        values["model"].pop(key)
    values["train"].pop("epochs")
    values["train"].pop("log_every_steps")
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
