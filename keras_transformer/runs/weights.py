"""Weight files: written with the model config, dropout's seed states, the training minutes, the
vocabulary's checksum and a SHA-256 of their contents (HDF5 attributes), and checked before they
become a model (`load_weights`): a damaged file, or one with non-finite values, is refused by
name, never loaded."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

import h5py
import numpy as np

from keras_transformer.config import ConfigError, ModelConfig
from keras_transformer.data.text_io import first_line
from keras_transformer.model import Transformer
from keras_transformer.runs import legacy_weights
from keras_transformer.runs.files import atomic_path, check_free_space, write_errors

logger = logging.getLogger(__name__)

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


class DamagedWeightsError(ConfigError):
    """A weight file cannot be read (truncated, or not HDF5), does not match the checksum it was
    written with, or holds non-finite values."""



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


def warn_once(message: str, *args) -> None:
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


