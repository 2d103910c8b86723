"""The Transformer's building blocks, one idea per layer, named as in the paper and tutorial."""

from keras_transformer.layers.attention import (  # noqa: F401
    BaseAttention,
    CausalSelfAttention,
    CrossAttention,
    GlobalSelfAttention,
)
from keras_transformer.layers.decoder import Decoder, DecoderLayer  # noqa: F401
from keras_transformer.layers.dropout import Dropout, dropout  # noqa: F401
from keras_transformer.layers.embedding import PositionalEmbedding, positional_encoding  # noqa: F401
from keras_transformer.layers.encoder import Encoder, EncoderLayer  # noqa: F401
from keras_transformer.layers.feed_forward import FeedForward  # noqa: F401
from keras_transformer.layers.normalization import LayerNormalization, layer_norm  # noqa: F401
