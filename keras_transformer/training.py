"""The training runner: strategy, precision, data, callbacks and `model.fit` from one config.

    history = keras_transformer.train(ExperimentConfig.from_yaml("experiments/NAME.yaml"),
                                      "runs/NAME")

A run folder holds everything the run made and needs to resume:

    runs/NAME/config.yaml              the resolved config (vocabulary sizes filled in)
    runs/NAME/vocab/                   tokenizer files (unless data.vocab_dir points elsewhere)
    runs/NAME/checkpoints/epoch_NNN.weights.h5   weights after every epoch (for averaging)
    runs/NAME/last.weights.h5, best.weights.h5   last epoch, best epoch by validation BLEU
    runs/NAME/backup/                  BackupAndRestore state (preemption-safe resume)
    runs/NAME/logs/{train,validation}  TensorBoard event files
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from pathlib import Path

import keras
import tensorflow as tf

from keras_transformer import data as data_lib
from keras_transformer.config import ConfigError, ExperimentConfig
from keras_transformer.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from keras_transformer.model import PAD_ID, Transformer
from keras_transformer.schedules import create_optimizer
from keras_transformer.tokenizers import (META_FILE, Tokenizer, build_tokenizers, load_tokenizers,
                                          training_tokenizers)

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"


# ----------------------------------------------------------------------------- strategy

def split_cpu(count: int) -> None:
    """Splits the CPU into `count` logical devices, so that MirroredStrategy can run `count`
    replicas on a machine without accelerators (for testing). Must run before TF's first op."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        raise ConfigError(f"cannot split the CPU into {count} logical devices after TensorFlow "
                          f"has started ({error}); do it first thing in the process") from error


def _cluster_workers() -> int:
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def make_strategy(name: str) -> tf.distribute.Strategy:
    """The distribution strategy named by `train.strategy`.

    auto: MultiWorkerMirroredStrategy when TF_CONFIG names several workers, else
    MirroredStrategy over the local GPUs, or over the logical CPU devices without GPUs.
    """
    if name == "auto":
        name = "multi_worker" if _cluster_workers() > 1 else "mirrored"
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    if gpus:
        return tf.distribute.MirroredStrategy(devices)
    # Logical CPU devices share memory, so reducing on one of them costs nothing; the default
    # collective all-reduce would also fail in the second MirroredStrategy of a process
    # ("Shape mismatch in the collective instance": the instance keys of the two clash).
    return tf.distribute.MirroredStrategy(devices,
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


# ----------------------------------------------------------------------------- precision

def resolve_precision(precision: str, strategy: tf.distribute.Strategy | None = None) -> str:
    """The Keras dtype policy for `train.precision`; "auto" picks one for this machine.

    auto: mixed_bfloat16 where matmuls run natively in bfloat16 (TPUs, GPUs of compute
    capability 8.0 and up, CPUs with AMX-BF16 or AVX512-BF16), mixed_float16 on GPUs of compute
    capability 7.x, float32 elsewhere. On a CPU without native bfloat16 the emulated mixed
    policy is slower, not faster: 3x slower than float32 for the tutorial preset on an AVX2 CPU.
    """
    if precision != "auto":
        return precision
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "mixed_bfloat16"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capability = min(tf.config.experimental.get_device_details(gpu).get(
            "compute_capability", (0, 0)) for gpu in gpus)
        if capability >= (8, 0):
            return "mixed_bfloat16"
        return "mixed_float16" if capability >= (7, 0) else "float32"
    return "mixed_bfloat16" if cpu_has_native_bfloat16() else "float32"


def cpu_has_native_bfloat16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """Whether the CPU multiplies bfloat16 natively (the amx_bf16 or avx512_bf16 flag, read
    from Linux's `cpuinfo`; False where that file is missing)."""
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        if line.startswith("flags"):
            return bool({"amx_bf16", "avx512_bf16"} & set(line.partition(":")[2].split()))
    return False


# ----------------------------------------------------------------------------- run folder

def prepare_run_dir(config: ExperimentConfig, output_dir: str | os.PathLike) -> Path:
    """Creates the run folder, or checks that it holds this same run (to resume).

    Raises ConfigError, and writes nothing, if the folder holds another run's config.
    """
    output_dir = Path(output_dir)
    saved = output_dir / CONFIG_FILE
    if saved.exists():
        previous = ExperimentConfig.from_yaml(saved)
        if _comparable(previous) != _comparable(config):
            changed = sorted(_diff(_comparable(previous), _comparable(config)))
            raise ConfigError(f"{output_dir} holds another run's config (differs in "
                              f"{', '.join(changed)}); choose a new --output or delete it")
    output_dir.mkdir(parents=True, exist_ok=True)
    return output_dir


def _comparable(config: ExperimentConfig) -> dict:
    """The config without what training fills in (vocabulary sizes) or may extend (epochs)."""
    values = config.to_dict()
    for key in ("source_vocab_size", "target_vocab_size"):
        values["model"].pop(key)
    values["train"].pop("epochs")
    return values


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = set(a) | set(b)
    out = []
    for key in keys:
        name = f"{prefix}{key}"
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            out += _diff(a[key], b[key], f"{name}.")
        elif a.get(key) != b.get(key):
            out.append(name)
    return out


def prepare_tokenizers(config: ExperimentConfig, run_dir: Path) -> tuple[Tokenizer, Tokenizer]:
    """Loads the run's vocabularies, learning them from the training split the first time."""
    vocab_dir = Path(config.data.vocab_dir or run_dir / "vocab")
    if (vocab_dir / META_FILE).exists():
        return load_tokenizers(config.data, vocab_dir)
    pairs = data_lib.load_pairs(config.data, config.data.train_split)
    return build_tokenizers(config.data, pairs, vocab_dir)


def with_vocab_sizes(config: ExperimentConfig, source: Tokenizer,
                     target: Tokenizer) -> ExperimentConfig:
    model = dataclasses.replace(config.model, source_vocab_size=source.vocab_size,
                                target_vocab_size=target.vocab_size)
    return dataclasses.replace(config, model=model)


# ----------------------------------------------------------------------------- model

def build_model(config: ExperimentConfig) -> Transformer:
    """The compiled model of `config`: the paper's Adam and schedule, label-smoothed loss.

    Call inside `strategy.scope()` and under the run's dtype policy.
    """
    model = Transformer(config.model)
    model.build()
    model.compile(
        optimizer=create_optimizer(config.model, config.train),
        loss=MaskedLabelSmoothedCrossEntropy(label_smoothing=config.train.label_smoothing),
        metrics=[MaskedAccuracy(), TargetTokens()],
        jit_compile=config.train.jit_compile,
    )
    return model


def build_compiled_state(model: Transformer, batches: tf.data.Dataset) -> None:
    """Builds the compiled loss, metrics and optimizer on one real batch, before `fit`, so that
    `fit` has nothing left to build from its first distributed batch."""
    inputs, target_out = next(iter(batches.take(1)))
    logits = model(inputs)
    model.compute_loss(inputs, target_out, logits)
    model.compute_metrics(inputs, target_out, logits, sample_weight=None)
    model.reset_metrics()
    model.optimizer.build(model.trainable_variables)


def skip_symbolic_build(model: Transformer) -> None:
    """Stops Keras 3.15 from re-building a built model from a distributed batch in every
    `fit` and `evaluate` (so once per epoch for the validation data).

    Under any distribution strategy `_maybe_symbolic_build` opens an iterator over the data,
    takes one distributed batch, reduces it across replicas and abandons the iterator, whose
    pending reads are then cancelled ("Local rendezvous is aborting ... GetNextFromShard was
    cancelled"). Under MirroredStrategy on 2 CPU devices this hung a Multi30k run for good at
    the start of epoch 11's validation (every thread waiting on a futex); under
    MultiWorkerMirroredStrategy it fails outright ("Attempt to convert a value
    (PerReplica...)"). After `build_compiled_state` the model, loss, metrics and optimizer are
    built, so there is nothing to build: the step is skipped. This touches a private Keras
    method, hence isolated here; the 2-replica and multi-worker tests run with it (the hang was
    intermittent, so no test reproduces it).
    """
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def keep_validation_iterator(model: Transformer) -> None:
    """Makes `fit` read validation from one iterator for the whole run.

    Keras 3.15's `evaluate` resets its cached validation iterator at every call, dropping the
    distributed iterator of the previous evaluation; destroying it cancels its pending reads,
    and under MirroredStrategy on 2 CPU devices the trainer then sat idle for about 60 s at the
    start of most validations (py-spy: `EpochIterator.reset`, every thread asleep). `train`
    validates on a repeated stream with `validation_steps` = one pass, so the next evaluation
    can simply continue the same iterator: reset here forgets the step count and keeps it.
    This touches a private Keras attribute, hence isolated here and covered by a test.
    """
    evaluate = model.evaluate

    def evaluate_on_kept_iterator(*args, **kwargs):
        epoch_iterator = getattr(model, "_eval_epoch_iterator", None)
        if kwargs.get("_use_cached_eval_dataset") and epoch_iterator is not None:
            epoch_iterator.reset = functools.partial(_reset_keeping_iterator, epoch_iterator)
        return evaluate(*args, **kwargs)

    model.evaluate = evaluate_on_kept_iterator


def _reset_keeping_iterator(epoch_iterator) -> None:
    epoch_iterator._steps_seen = 0
    epoch_iterator._epoch_iterator = None


def apply_multi_worker_workarounds(model: Transformer) -> None:
    """Works around a Keras 3.15 bug of `fit` under MultiWorkerMirroredStrategy.

    The trainer averages each step's logs across workers with `strategy.reduce("MEAN", v,
    axis=0)`, which fails on scalars ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388): the steps return 1-element vectors instead,
    which that reduction turns back into scalars. This touches the trainer's reduction, hence
    isolated here and covered by the multi-worker test. (`skip_symbolic_build` is applied
    under every distribution strategy.)
    """
    train_step, test_step = model.train_step, model.test_step

    def as_vectors(logs):
        return {name: tf.reshape(value, [1]) for name, value in logs.items()}

    model.train_step = lambda data: as_vectors(train_step(data))
    model.test_step = lambda data: as_vectors(test_step(data))


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Metric):
    """Non-padding target tokens seen in the epoch (summed over replicas): the numerator of
    tokens per second."""

    def __init__(self, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.tokens = self.add_variable(shape=(), initializer="zeros", name="tokens")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.tokens.assign_add(tf.reduce_sum(tf.cast(tf.not_equal(y_true, PAD_ID), "float32")))

    def result(self):
        # A copy: returning the variable itself lets validation overwrite the training logs.
        return tf.identity(self.tokens.value)

    def reset_state(self):
        self.tokens.assign(0.0)


# ----------------------------------------------------------------------------- callbacks

class TokensPerSecond(keras.callbacks.Callback):
    """Adds `tokens_per_second` (target tokens of the training epoch / its wall time)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "target_tokens" in logs:
            logs["tokens_per_second"] = logs["target_tokens"] / (time.perf_counter() - self._start)


class ResumeLogger(keras.callbacks.Callback):
    """Logs where training starts: epoch and optimizer step (non-zero after a resume), and on
    how many replicas and in which precision (what `train.precision: auto` resolved to)."""

    def on_train_begin(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        epoch = getattr(self.model, "_initial_epoch", None) or 0
        message = (f"resuming at epoch {epoch + 1}, optimizer step {step}" if step
                   else "starting from scratch")
        message += (f" ({self.model.distribute_strategy.num_replicas_in_sync} replica(s), "
                    f"{self.model.dtype_policy.name})")
        logger.info(message)
        print(f"keras-transformer train: {message}", flush=True)


def default_callbacks(config: ExperimentConfig, run_dir: Path, validation_callback=None):
    """Callbacks in the order they must see each epoch's logs: validation BLEU first, so that
    checkpoints, early stopping and TensorBoard find `val_bleu`."""
    checkpoints = run_dir / CHECKPOINT_DIR
    checkpoints.mkdir(exist_ok=True)
    callbacks = [keras.callbacks.BackupAndRestore(str(run_dir / "backup")), ResumeLogger(),
                 TokensPerSecond(), keras.callbacks.TerminateOnNaN()]
    if validation_callback is not None:
        callbacks.append(validation_callback)
    callbacks += [
        keras.callbacks.ModelCheckpoint(str(checkpoints / CHECKPOINT_PATTERN),
                                        save_weights_only=True),
        keras.callbacks.ModelCheckpoint(str(run_dir / "last.weights.h5"), save_weights_only=True),
    ]
    if validation_callback is not None:
        callbacks.append(keras.callbacks.ModelCheckpoint(
            str(run_dir / "best.weights.h5"), save_weights_only=True, monitor="val_bleu",
            mode="max", save_best_only=True))
        if config.train.early_stopping_patience:
            callbacks.append(keras.callbacks.EarlyStopping(
                monitor="val_bleu", mode="max", patience=config.train.early_stopping_patience))
    callbacks.append(keras.callbacks.TensorBoard(str(run_dir / "logs"), update_freq="epoch"))
    return callbacks


# ----------------------------------------------------------------------------- train

def train(config: ExperimentConfig, output_dir: str | os.PathLike,
          verbose: str | int = "auto") -> keras.callbacks.History:
    """Trains `config` into `output_dir` with `model.fit`; resumes if the folder holds this run.

    Returns the Keras History. The resolved config is saved as `output_dir/config.yaml`.
    `verbose` is `model.fit`'s: 1 a progress bar, 2 one line per epoch.
    """
    run_dir = prepare_run_dir(config, output_dir)
    keras.utils.set_random_seed(config.train.seed)
    strategy = make_strategy(config.train.strategy)
    replicas = strategy.num_replicas_in_sync

    source_tokenizer, target_tokenizer = prepare_tokenizers(config, run_dir)
    config = with_vocab_sizes(config, source_tokenizer, target_tokenizer)
    config.to_yaml(run_dir / CONFIG_FILE)

    train_pairs = data_lib.load_pairs(config.data, config.data.train_split)
    train_batches = data_lib.make_batches(
        train_pairs, *training_tokenizers(config.data, source_tokenizer, target_tokenizer),
        config.data, training=True, num_replicas=replicas)
    if config.train.steps_per_epoch:
        train_batches = train_batches.repeat()
    validation_pairs = data_lib.load_pairs(config.data, config.data.validation_split)
    validation_batches = data_lib.make_batches(validation_pairs, source_tokenizer,
                                               target_tokenizer, config.data, training=False,
                                               num_replicas=replicas)
    # Validation reads a repeated stream, one pass per evaluation, so that Keras keeps a single
    # iterator for the run: a new distributed iterator at every evaluation sometimes sat idle
    # for about 60 s under MirroredStrategy on CPU (a third of the epochs of a Multi30k run).
    validation_steps = data_lib.batch_stats(validation_batches).batches
    if not validation_steps:
        raise ConfigError(
            f"data.validation_split={config.data.validation_split!r} gives no batches: every "
            f"pair is empty or longer than data.max_length={config.data.max_length}")

    precision = resolve_precision(config.train.precision, strategy)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        with strategy.scope():
            model = build_model(config)
            build_compiled_state(model, validation_batches)
            skip_symbolic_build(model)
            keep_validation_iterator(model)
            if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
                apply_multi_worker_workarounds(model)
        validation_callback = None
        if config.train.validation_bleu_sentences:
            from keras_transformer.evaluation import ValidationBleu

            validation_callback = ValidationBleu(
                validation_pairs.take(config.train.validation_bleu_sentences),
                source_tokenizer, target_tokenizer, config, run_dir / "logs" / "validation")
        return model.fit(
            train_batches,
            validation_data=validation_batches.repeat(),
            validation_steps=validation_steps,
            epochs=config.train.epochs,
            steps_per_epoch=config.train.steps_per_epoch,
            callbacks=default_callbacks(config, run_dir, validation_callback),
            verbose=verbose,
        )
    finally:
        keras.config.set_dtype_policy(previous_policy)


# ----------------------------------------------------------------------------- averaging

def load_run_config(run_dir: str | os.PathLike) -> ExperimentConfig:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a training run ({CONFIG_FILE} not found)")
    return ExperimentConfig.from_yaml(path)


def epoch_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The run's per-epoch weight files, oldest first."""
    return sorted((Path(run_dir) / CHECKPOINT_DIR).glob("epoch_*.weights.h5"))


def _epoch_of(path: Path) -> int:
    return int(path.name.split(".")[0].split("_")[1])  # epoch_007.weights.h5 -> 7


def average_checkpoints(run_dir: str | os.PathLike, last: int,
                        output: str | os.PathLike | None = None, *,
                        upper_bound: int | None = None) -> Path:
    """Writes the elementwise mean of the weights of the last `last` epochs (section 6.1: the
    paper averaged the last 5 or 20 checkpoints), or of the `last` epochs up to epoch
    `upper_bound` (fairseq's --checkpoint-upper-bound: the model as it stood at that epoch).
    Returns the written file's path."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    paths = epoch_checkpoints(run_dir)
    if upper_bound is not None:
        paths = [p for p in paths if _epoch_of(p) <= upper_bound]
    if last < 1 or len(paths) < last:
        bound = "" if upper_bound is None else f" up to epoch {upper_bound}"
        raise ConfigError(f"cannot average the last {last} checkpoints{bound}: "
                          f"{run_dir / CHECKPOINT_DIR} holds {len(paths)}")
    model = Transformer(config.model)
    model.build()
    total = None
    for path in paths[-last:]:
        model.load_weights(path)
        weights = model.get_weights()
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    model.set_weights([(t / last).astype(w.dtype) for t, w in zip(total, model.get_weights())])
    suffix = "" if upper_bound is None else f"_to{upper_bound}"
    output = Path(output or run_dir / f"average_last{last}{suffix}.weights.h5")
    model.save_weights(output)
    return output


def load_trained_model(run_dir: str | os.PathLike, weights: str = "best") -> Transformer:
    """The run's model (never compiled) with `best`, `last`, or a weight file's path."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    path = Path(weights) if weights not in ("best", "last") else run_dir / f"{weights}.weights.h5"
    if weights == "best" and not path.exists():
        path = run_dir / "last.weights.h5"
    if not path.exists():
        raise ConfigError(f"no weights at {path}")
    model = Transformer(config.model)
    model.build()
    model.load_weights(path)
    return model

