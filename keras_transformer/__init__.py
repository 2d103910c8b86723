"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3 / TensorFlow 2.

The names below load their module on first use, so that `import keras_transformer` (and the
command line's `--help`) does not import TensorFlow.

    from keras_transformer import ExperimentConfig, Run, train, translator_from_run, export_run
"""

import importlib
import sys

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


def lazy_attributes(package: str, exports: dict):
    """A `__getattr__` for the package named `package` (PEP 562): each name of `exports`
    ({name: module below the package}) imports its module on first use, and is then kept in
    the package's namespace."""
    def __getattr__(name):
        if name in exports:
            value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__


__getattr__ = lazy_attributes(__name__, _EXPORTS)


def __dir__():
    return sorted(__all__)
