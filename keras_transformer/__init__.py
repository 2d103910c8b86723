"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3 / TensorFlow 2.

The names below load their module on first use, so that `import keras_transformer` (and the
command line's `--help`) does not import TensorFlow.

    from keras_transformer import ExperimentConfig, Run, train, translator_from_run, export_run
"""

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it, in the order of the data flow
_EXPORTS = {
    "ConfigError": "config", "ModelConfig": "config", "DataConfig": "config",
    "TrainConfig": "config", "DecodeConfig": "config", "CorpusConfig": "config",
    "ModifiersConfig": "config", "ExperimentConfig": "config",
    "load_tokenizers": "tokenizers", "build_tokenizers": "tokenizers",
    "load_pairs": "data", "make_batches": "data",
    "Transformer": "model",
    "MaskedLabelSmoothedCrossEntropy": "losses", "MaskedAccuracy": "losses",
    "TransformerSchedule": "schedules", "create_optimizer": "schedules",
    "Run": "runs",
    "Translator": "translator", "translator_from_run": "translator",
    "translate_texts": "translator", "translate_file": "bulk_translation",
    "Shard": "bulk_translation",
    "score": "evaluation",
    "export_run": "export", "export_translator": "export", "load_translator": "export",
    "train": "training",
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
