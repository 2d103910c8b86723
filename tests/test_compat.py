"""Every workaround in keras_transformer.compat: it works on the tested Keras, and the private
attributes it needs exist (a Keras upgrade that renames one fails here, not silently in a run)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import compat
from keras_transformer.config import ModelConfig
from keras_transformer.model import Transformer


def test_installed_keras_is_a_tested_version():
    compat.check_keras_version()  # raises CompatError otherwise


def test_version_gate_refuses_an_untested_keras(monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    with pytest.raises(compat.CompatError, match=r"keras 3.99.0 is outside .*\(3.15 to 3.15\)"):
        compat.check_keras_version()


def test_private_attributes_the_workarounds_need_exist():
    model = Transformer(ModelConfig.from_preset("tiny", source_vocab_size=50,
                                                target_vocab_size=50))
    model.compile(optimizer="adam", loss="mse")
    assert callable(model._maybe_symbolic_build)
    assert isinstance(compat.loss_tracker(model), keras.metrics.Mean)
    adam = keras.optimizers.Adam()
    kernel = keras.Variable(np.ones([2, 3], "float32"))
    adam.build([keras.Variable(np.ones([4], "float32")), kernel])
    m, v = compat.adam_moments(adam, kernel)
    assert m.shape == v.shape == (2, 3) and m is not v
    assert m is adam._momentums[1] and v is adam._velocities[1]
    from tensorflow.python.data.ops import multi_device_iterator_ops

    assert callable(multi_device_iterator_ops._create_device_dataset)


def test_a_missing_private_attribute_fails_loudly():
    renamed = type("RenamedTrainer", (), {})()  # what a Keras that renamed the attributes gives
    with pytest.raises(compat.CompatError, match=r"RenamedTrainer._loss_tracker is gone"):
        compat.loss_tracker(renamed)
    with pytest.raises(compat.CompatError, match=r"_maybe_symbolic_build is gone.*"
                                                 r"skip_symbolic_build"):
        compat.skip_symbolic_build(renamed)
    with pytest.raises(compat.CompatError, match=r"_get_variable_index is gone.*adam_moments"):
        compat.adam_moments(renamed, None)


def test_a_missing_private_tensorflow_function_fails_loudly(monkeypatch):
    from tensorflow.python.data.ops import multi_device_iterator_ops

    monkeypatch.delattr(multi_device_iterator_ops, "_create_device_dataset")
    with pytest.raises(compat.CompatError, match=r"tensorflow 2\.\d+.*multi_device_iterator_ops"
                                                 r"\._create_device_dataset is gone"):
        compat.device_datasets_without_autotuning()


def test_strategies_feed_their_replicas_without_tf_data_autotuning():
    """The per-device datasets tf.distribute reads `fit`'s batches through have autotuning off
    (`compat.device_datasets_without_autotuning`, applied by `make_strategy`)."""
    from keras_transformer.training.runner import make_strategy

    for name in ("mirrored", "one_device"):
        strategy = make_strategy(name)
        dataset = compat.without_autotuning(tf.data.Dataset.range(8).batch(4))
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        device_iterators = iterator._iterators[0]._iterator._device_iterators
        assert len(device_iterators) == strategy.num_replicas_in_sync
        for device_iterator in device_iterators:
            assert device_iterator._dataset.options().autotune.enabled is False, name
        values = strategy.experimental_local_results(next(iterator))
        assert sorted(int(v) for part in values for v in part) == [0, 1, 2, 3]
    compat.device_datasets_without_autotuning()  # a second call changes nothing
    from tensorflow.python.data.ops import multi_device_iterator_ops

    assert not hasattr(multi_device_iterator_ops._create_device_dataset.__wrapped__,
                       "without_autotuning")  # wrapped once


def test_skip_symbolic_build_replaces_the_build_step():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    compat.skip_symbolic_build(model)
    assert model._maybe_symbolic_build(iterator=object()) is None
