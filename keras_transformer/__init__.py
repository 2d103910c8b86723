"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3 / TensorFlow 2."""

__version__ = "0.1.0"

from keras_transformer.config import (  # noqa: F401
    DataConfig,
    DecodeConfig,
    ExperimentConfig,
    ModelConfig,
    TrainConfig,
)
from keras_transformer.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy  # noqa: F401
from keras_transformer.model import Transformer  # noqa: F401
from keras_transformer.schedules import TransformerSchedule, create_optimizer  # noqa: F401
