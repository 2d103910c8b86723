"""Every workaround of a Keras / TensorFlow bug, in one place.

Each workaround names the upstream report (or the script that shows the bug), states the Keras
versions it was written and tested for (`TESTED_KERAS`; setup.cfg pins tensorflow 2.21), and
checks that any private attribute it needs still exists before it touches it: a renamed
attribute raises `CompatError` instead of making the patch silently do nothing.
`tests/test_compat.py` checks every private attribute used here on the installed Keras and
TensorFlow, so an upgrade fails loudly in CI. setup.cfg bounds keras to `TESTED_KERAS`.
"""

from __future__ import annotations

import functools
import types

import keras
import tensorflow as tf

TESTED_KERAS = ((3, 15), (3, 15))  # oldest and newest minor version the workarounds are tested on


class CompatError(RuntimeError):
    """A private Keras attribute that a workaround needs is missing (an untested Keras version)."""


def keras_version() -> tuple[int, int]:
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int(minor)


def check_keras_version() -> None:
    """Raises CompatError outside `TESTED_KERAS`: the workarounds below may not apply there."""
    low, high = TESTED_KERAS
    if not low <= keras_version() <= high:
        raise CompatError(
            f"keras {keras.__version__} is outside the versions keras_transformer.compat was "
            f"tested with ({low[0]}.{low[1]} to {high[0]}.{high[1]}); install keras "
            f"{high[0]}.{high[1]}.* or update keras_transformer/compat.py and its tests")


def _require(owner, attribute: str, workaround: str):
    """`getattr(owner, attribute)`, or CompatError naming the workaround that needs it."""
    if not hasattr(owner, attribute):
        named = isinstance(owner, (type, types.ModuleType))
        name = owner.__name__ if named else type(owner).__name__
        raise CompatError(f"keras {keras.__version__}, tensorflow {tf.__version__}: "
                          f"{name}.{attribute} is gone, so keras_transformer.compat.{workaround} "
                          "cannot work; see its docstring")
    return getattr(owner, attribute)


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuning thread turned off (`Options.autotune.enabled`).

    TensorFlow 2.21 bug: deleting an iterator whose pipeline has reached the end of its input
    (a prefetching thread reaching it is enough) waits for the autotuning thread's next
    wake-up, and that thread sleeps longer the longer the iterator lived, up to 60 s. Every
    finite pass pays it when its iterator goes: the end of `fit`, each validation pass,
    building a vocabulary; an iterator in a reference cycle (Keras keeps `fit`'s in one)
    stalls whatever line the garbage collector interrupts. `benchmarks/input.py` shows
    the wait; no upstream report was found. Without autotuning, AUTOTUNE parallelism is the
    number of cores and prefetch buffers still grow as needed. Public API: options pass on to
    the datasets made from `dataset`.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def device_datasets_without_autotuning() -> None:
    """Turns autotuning off (`without_autotuning`) in the per-device datasets through which
    every distribution strategy feeds its replicas. Idempotent.

    tf.distribute's `MultiDeviceIterator` builds each device's `prefetch(1)` over the
    multi-device buffer (`multi_device_iterator_ops._create_device_dataset`) with default
    options, so each runs an autotuning thread although it has nothing to tune, and reaches
    the end of its input whenever `fit`'s stream ends: the stall of `without_autotuning` again,
    out of reach of the options of the dataset given to `fit`. No public option gets there
    (`tf.distribute.InputOptions` sets only the buffer sizes).
    """
    from tensorflow.python.data.ops import multi_device_iterator_ops

    create = _require(multi_device_iterator_ops, "_create_device_dataset",
                      "device_datasets_without_autotuning")
    if getattr(create, "without_autotuning", False):
        return

    @functools.wraps(create)
    def create_without_autotuning(*args, **kwargs):
        return without_autotuning(create(*args, **kwargs))

    create_without_autotuning.without_autotuning = True
    multi_device_iterator_ops._create_device_dataset = create_without_autotuning


def skip_symbolic_build(model: keras.Model) -> None:
    """Stops Keras 3.15 from re-building a built model from a distributed batch in every
    `fit` and `evaluate` (so once per epoch for the validation data).

    Under any distribution strategy `Trainer._maybe_symbolic_build` opens an iterator over the
    data, takes one distributed batch, reduces it across replicas and abandons the iterator,
    whose pending reads are then cancelled ("Local rendezvous is aborting ...
    GetNextFromShard was cancelled"). Under MirroredStrategy on 2 CPU devices this hung a
    Multi30k run at the start of epoch 11's validation; under MultiWorkerMirroredStrategy it
    fails outright ("Attempt to convert a value (PerReplica...)"; related upstream report:
    keras-team/keras#21069). Call it after the model, loss, metrics and optimizer are built
    (`training.build_compiled_state`): there is nothing left to build.
    """
    _require(model, "_maybe_symbolic_build", "skip_symbolic_build")
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def apply_multi_worker_workarounds(model: keras.Model) -> None:
    """Works around a Keras 3.15 bug of `fit` under MultiWorkerMirroredStrategy.

    The trainer averages each step's logs across workers with `strategy.reduce("MEAN", v,
    axis=0)`, which fails on scalars ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388): the steps return 1-element vectors instead,
    which that reduction turns back into scalars. Public API only; kept here because it exists
    for a Keras bug and goes with it.
    """
    train_step, test_step = model.train_step, model.test_step

    def as_vectors(logs):
        return {name: tf.reshape(value, [1]) for name, value in logs.items()}

    model.train_step = lambda data: as_vectors(train_step(data))
    model.test_step = lambda data: as_vectors(test_step(data))


def loss_tracker(model: keras.Model) -> keras.metrics.Mean:
    """The `Mean` metric behind the reported `loss` (Keras 3.15's `Trainer._loss_tracker`).

    `Transformer.train_step`/`test_step` weight its updates by target tokens instead of
    sentences; no public API reaches the tracker that `fit` and `evaluate` report as `loss`.
    """
    return _require(model, "_loss_tracker", "loss_tracker")


def adam_moments(optimizer: keras.optimizers.Adam, variable) -> tuple:
    """The first and second moments, `(m, v)`, that Keras 3.15's Adam keeps for `variable`
    (`Optimizer._get_variable_index`, `Adam._momentums`, `Adam._velocities`).

    `schedules.FusedAdam` gives them to TensorFlow's fused `ResourceApplyAdam` kernel. Keras
    has no public accessor for an optimizer's per-variable state (none was found among its
    issues), and making the moments anew would break the checkpoints of Keras's Adam.
    """
    index = _require(optimizer, "_get_variable_index", "adam_moments")(variable)
    return (_require(optimizer, "_momentums", "adam_moments")[index],
            _require(optimizer, "_velocities", "adam_moments")[index])
