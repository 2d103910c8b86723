"""Repository-wide pytest setup that must run before TensorFlow executes any op."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

# Two logical CPU devices, so MirroredStrategy tests run two replicas on this machine. The
# configuration is only possible before the runtime initializes, hence here and not in a fixture.
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
