"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3 / TensorFlow 2."""

__version__ = "0.1.0"

from keras_transformer.config import (  # noqa: F401
    DataConfig,
    DecodeConfig,
    ExperimentConfig,
    ModelConfig,
    TrainConfig,
)
