"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3 / TensorFlow 2.

The names below load their module on first use, so that `import keras_transformer` (and the
command line's `--help`) does not import TensorFlow.

    from keras_transformer import ExperimentConfig, Run, train, translator_from_run, export_run
"""

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it (below the package: a stage's folder, then the
# module), in the order of the data flow
_EXPORTS = {
    "ConfigError": "config", "ModelConfig": "config", "DataConfig": "config",
    "TrainConfig": "config", "DecodeConfig": "config", "CorpusConfig": "config",
    "ModifiersConfig": "config", "ExperimentConfig": "config",
    "load_tokenizers": "data.tokenizers", "build_tokenizers": "data.tokenizers",
    "load_pairs": "data.corpora", "make_batches": "data.streams",
    "Transformer": "model",
    "MaskedLabelSmoothedCrossEntropy": "training.losses", "MaskedAccuracy": "training.losses",
    "TransformerSchedule": "training.schedules", "create_optimizer": "training.schedules",
    "Run": "runs.folder",
    "Translator": "decoding.translator", "translator_from_run": "decoding.translator",
    "translate_texts": "decoding.texts", "translate_file": "decoding.bulk_translation",
    "Shard": "decoding.bulk_translation",
    "score": "decoding.evaluation",
    "export_run": "export.savedmodel", "export_translator": "export.savedmodel",
    "load_translator": "export.savedmodel",
    "train": "training.runner",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"keras_transformer.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
