"""Repository-wide pytest setup that must run before TensorFlow executes any op."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer.training.runner import split_cpu  # noqa: E402

# Two logical CPU devices, so MirroredStrategy tests run two replicas on this machine. The
# configuration is only possible before the runtime initializes, hence here and not in a fixture.
split_cpu(2)
