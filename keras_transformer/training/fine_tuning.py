"""Fine-tuning: a new run that starts from another run's weights (`train.init_from`).

    keras-transformer train --config experiments/NAME.yaml --init-from runs/parent --output runs/child

The new run has a fresh optimizer and its own learning-rate schedule; only the weights come
from the parent (its best, or a weight file such as an average of checkpoints). The parent's
model must have the run's shape (every `model` setting but the vocabulary sizes and dropout).

Vocabulary, as OpenNMT-tf's `update_vocab`: without `data.vocab_dir`, the run takes the
parent's vocabulary if the run's data settings describe it (`tokenizers.load_tokenizers` accepts
it), and otherwise learns its own. With another vocabulary, every piece in both keeps its
embedding row (and its output-layer column and bias); a new piece keeps the freshly initialized
row the model was built with.

The run records where it started in `init_from.json` (the file, its SHA-256, the vocabulary's
shared and new pieces), which its exports carry in their provenance.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_transformer.config import ConfigError, ExperimentConfig, ModelConfig
from keras_transformer.data.text_io import file_sha256
from keras_transformer.data.tokenizers import META_FILE, Tokenizer, load_tokenizers
from keras_transformer.model import Transformer
from keras_transformer.runs.folder import CONFIG_FILE, Run, vocab_dir

logger = logging.getLogger(__name__)

INIT_FILE = "init_from.json"  # in the run folder
# Model settings that may differ between a parent and its fine-tuned run.
FREE_MODEL_FIELDS = ("source_vocab_size", "target_vocab_size", "dropout")
# Weights with a vocabulary axis: (path suffix, "source" or "target", the axis).
VOCABULARY_WEIGHTS = (("source_embedding/token_embedding/embeddings", "source", 0),
                      ("target_embedding/token_embedding/embeddings", "target", 0),
                      ("final_layer/kernel", "target", 1),
                      ("final_layer/bias", "target", 0))


def parent_of(init_from: str | Path) -> tuple[Run, str]:
    """(the parent run, its weights: "best" or a file's path) of `train.init_from`: a run
    folder, or a weight file inside one (`last.weights.h5`, an average, a checkpoint)."""
    path = Path(init_from)
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise ConfigError(f"train.init_from {path}: not a training run (no {CONFIG_FILE})")
        return Run(path), "best"
    if not path.is_file():
        raise ConfigError(f"train.init_from {path}: no such run folder or weight file")
    for folder in (path.parent, path.parent.parent):
        if (folder / CONFIG_FILE).is_file():
            return Run(folder), str(path)
    raise ConfigError(f"train.init_from {path}: a weight file outside a run folder (its "
                      f"{CONFIG_FILE} and vocabulary say what the weights mean)")


def check_same_shape(parent: ModelConfig, model: ModelConfig, init_from) -> None:
    """ConfigError naming the first model setting (other than `FREE_MODEL_FIELDS`) in which
    the parent's model differs from the run's."""
    for field in dataclasses.fields(ModelConfig):
        name = field.name
        if name not in FREE_MODEL_FIELDS and getattr(parent, name) != getattr(model, name):
            raise ConfigError(f"train.init_from {init_from} has model.{name}="
                              f"{getattr(parent, name)!r}, this run model.{name}="
                              f"{getattr(model, name)!r}: a run starts only from a model of its "
                              "shape")


def check_parent(config: ExperimentConfig) -> None:
    """ConfigError, before a run starts, if `train.init_from` is missing or of another shape."""
    parent, _ = parent_of(config.train.init_from)
    check_same_shape(parent.config.model, config.model, config.train.init_from)


def adopt_parent_vocabulary(config: ExperimentConfig, run_path: str | Path) -> bool:
    """Copies the parent's vocabulary into the run's vocabulary folder when the run has none
    yet, sets no `data.vocab_dir`, and the run's data settings describe the parent's (else the
    run learns its own). Returns whether it did."""
    folder = vocab_dir(config, run_path)
    if config.data.vocab_dir or (folder / META_FILE).exists():
        return False
    parent, _ = parent_of(config.train.init_from)
    try:
        load_tokenizers(config.data, parent.vocab_dir)
    except ConfigError as error:
        logger.info("the parent's vocabulary does not fit (%s): learning one", error)
        return False
    shutil.copytree(parent.vocab_dir, folder)
    return True


def initialize_from(model: Transformer, init_from: str | Path,
                    tokenizers: tuple[Tokenizer, Tokenizer]) -> dict:
    """Sets `model`'s weights from the parent's (`parent_of(init_from)`), mapping the rows of
    pieces that both vocabularies hold; returns the record `init_from.json` keeps.

    Args:
        model: the run's built model, whose vocabularies are `tokenizers` (source, target).
    """
    parent, weights = parent_of(init_from)
    check_same_shape(parent.config.model, model.config, init_from)
    path = parent.weights_path(weights)
    parent_model = parent.load_model(weights)
    maps = {side: _row_map(old, new) for side, old, new in zip(
        ("source", "target"), parent.tokenizers(), tokenizers)}
    for variable, old in zip(model.weights, parent_model.weights):
        value = old.numpy()
        vocabulary = next(((side, axis) for suffix, side, axis in VOCABULARY_WEIGHTS
                           if variable.path.endswith(suffix)), None)
        if vocabulary is not None:
            side, axis = vocabulary
            new_rows, old_rows = maps[side]
            value = np.moveaxis(variable.numpy(), axis, 0)
            value[new_rows] = np.moveaxis(old.numpy(), axis, 0)[old_rows]
            value = np.moveaxis(value, 0, axis)
        variable.assign(value)
    return {"init_from": str(init_from), "weights_file": str(path),
            "weights_sha256": file_sha256(path),
            "vocabulary": {side: {"shared": int(len(maps[side][0])),
                                  "new": int(size - len(maps[side][0]))}
                           for side, size in (("source", model.config.source_vocab_size),
                                              ("target", model.config.target_vocab_size))}}


def _row_map(old: Tokenizer, new: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the new vocabulary, the rows of the same pieces in the old one), for every
    piece in both."""
    old_pieces = _pieces(old)
    index = {piece: row for row, piece in enumerate(old_pieces)}
    pairs = [(row, index[piece]) for row, piece in enumerate(_pieces(new)) if piece in index]
    new_rows, old_rows = zip(*pairs) if pairs else ((), ())
    return np.array(new_rows, np.int64), np.array(old_rows, np.int64)


def _pieces(tokenizer: Tokenizer) -> list[bytes]:
    return tokenizer.lookup(tf.range(tokenizer.vocab_size)).numpy().tolist()


def write_record(run_path: str | Path, record: dict) -> Path:
    path = Path(run_path) / INIT_FILE
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path


def read_record(run_path: str | Path) -> dict | None:
    """The run's `init_from.json`, None for a run trained from scratch."""
    path = Path(run_path) / INIT_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
