"""The training runner: strategy, precision, data, callbacks and `model.fit` from one config.

    history = keras_transformer.train(ExperimentConfig.from_yaml("experiments/NAME.yaml"),
                                      "runs/NAME")

The run folder it writes, and resumes from, is described in `keras_transformer.runs.folder`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import compat
from keras_transformer.config import ConfigError, ExperimentConfig
from keras_transformer.data import corpora, streams
from keras_transformer.data.text_io import errno_of
from keras_transformer.data.tokenizers import META_FILE, training_tokenizers
from keras_transformer.model import Transformer
from keras_transformer.runs.files import LOCK_FILE, check_writable_folder, training_lock
from keras_transformer.runs.folder import Run, prepare_tokenizers, with_vocab_sizes
from keras_transformer.training import fine_tuning
from keras_transformer.training.callbacks import EpochLogger, ValidationBleu, default_callbacks
from keras_transformer.training.losses import (MaskedAccuracy, MaskedLabelSmoothedCrossEntropy,
                                               TargetTokens)
from keras_transformer.training.schedules import (TransformerSchedule, create_optimizer,
                                                  create_schedule)

logger = logging.getLogger(__name__)


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
    cluster = _tf_config().get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def _tf_config() -> dict:
    """The TF_CONFIG environment variable ({} if unset), checked for what tf.distribute reads:
    `cluster` maps job names to lists of "host:port", `task` names one of them by type and
    index. ConfigError naming the field otherwise."""
    def bad(why):
        return ConfigError(f"TF_CONFIG: {why} (see README, 'Training beyond one machine')")

    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError as error:
        raise bad(f"not JSON ({error})") from None
    if not isinstance(config, dict):
        raise bad(f"a JSON {type(config).__name__}, not an object")
    cluster, task = config.get("cluster", {}), config.get("task")
    if not isinstance(cluster, dict) or not all(
            isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)
            for hosts in cluster.values()):
        raise bad(f'"cluster" must map job names to lists of "host:port", got {cluster!r}')
    if cluster and task is not None:
        if not isinstance(task, dict) or task.get("type") not in cluster:
            raise bad(f'"task" must name a job of the cluster ({sorted(cluster)}) as '
                      f'"type", got {task!r}')
        index = task.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or not (
                0 <= index < len(cluster[task["type"]])):
            raise bad(f'"task" index {index!r} is not one of the {len(cluster[task["type"]])} '
                      f'{task["type"]} addresses')
    return config


def make_strategy(name: str) -> tf.distribute.Strategy:
    """The distribution strategy named by `train.strategy`.

    auto: MultiWorkerMirroredStrategy when TF_CONFIG names several workers, else
    MirroredStrategy over the local GPUs, or over the logical CPU devices without GPUs.
    The strategies' per-device input runs without tf.data autotuning
    (`compat.device_datasets_without_autotuning`).
    """
    compat.device_datasets_without_autotuning()
    workers = _cluster_workers()
    if name == "auto":
        name = "multi_worker" if workers > 1 else "mirrored"
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        except ValueError as error:  # no TPU named or found
            raise ConfigError(f"train.strategy=tpu: no TPU found ({error})") from None
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


def worker_shard(strategy: tf.distribute.Strategy) -> tuple[int, int]:
    """(index, count) of this worker among the workers of a MultiWorkerMirroredStrategy: the
    chief first, then the workers in TF_CONFIG order (tf.distribute's input pipeline ids);
    (0, 1) for any other strategy."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    chiefs = len(cluster.get("chief", []))
    count = chiefs + len(cluster.get("worker", []))
    if count <= 1:
        return 0, 1
    return (0 if resolver.task_type == "chief" else resolver.task_id + chiefs), count


def check_shared_vocabulary(config: ExperimentConfig, workers: int) -> None:
    """With several workers, ConfigError unless `data.vocab_dir` holds a vocabulary: each
    worker would otherwise learn its own, in its own run folder, from the whole training split."""
    vocab = config.data.vocab_dir
    if workers > 1 and not (vocab and (Path(vocab) / META_FILE).is_file()):
        raise ConfigError(
            f"{workers} workers must share one vocabulary: build it once with `keras-transformer "
            f"build-vocab` and set data.vocab_dir to it (data.vocab_dir={vocab!r} holds none)")


# ----------------------------------------------------------------------------- precision

def resolve_precision(precision: str, strategy: tf.distribute.Strategy | None = None) -> str:
    """The Keras dtype policy for `train.precision`; "auto" picks one for this machine.

    auto: mixed_bfloat16 where matmuls run natively in bfloat16 (TPUs, GPUs of compute
    capability 8.0 and up, CPUs with AMX-BF16 or AVX512-BF16), mixed_float16 on GPUs of compute
    capability 7.x, float32 elsewhere. On a CPU without native bfloat16 the emulated mixed
    policy is slower, not faster (experiments/RESULTS.md, "Training speed").
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


# ----------------------------------------------------------------------------- model

def build_model(config: ExperimentConfig,
                schedule: TransformerSchedule | None = None) -> Transformer:
    """The compiled model of `config`: the paper's Adam on `schedule` (default:
    `schedules.create_schedule`'s), label-smoothed loss (and R-Drop's term if
    `train.rdrop_alpha`).

    Call inside `strategy.scope()` and under the run's dtype policy.
    """
    model = Transformer(config.model)
    model.compile(  # builds the model and the optimizer
        optimizer=create_optimizer(config.model, config.train, schedule),
        loss=MaskedLabelSmoothedCrossEntropy(label_smoothing=config.train.label_smoothing),
        metrics=[MaskedAccuracy(), TargetTokens()],
        jit_compile=config.train.jit_compile,
        rdrop_alpha=config.train.rdrop_alpha,
    )
    return model


def build_compiled_state(model: Transformer, batches: tf.data.Dataset) -> None:
    """Builds the compiled loss and metrics on one real batch, before `fit`, so that `fit` has
    nothing left to build from its first distributed batch (`Transformer.compile` built the
    model and the optimizer)."""
    inputs, target_out = next(iter(batches.take(1)))
    logits = model(inputs)
    model.compute_loss(inputs, target_out, logits)
    model.compute_metrics(inputs, target_out, logits, sample_weight=None)
    model.reset_metrics()


# ----------------------------------------------------------------------------- training input

class TrainingInput:
    """The training batches that `fit` reads, from any epoch on, and the steps of an epoch.

    One worker (MirroredStrategy, OneDeviceStrategy, TPUStrategy): one `data.TrainingStream` of
    global batches (`data.tokens_per_batch` padded tokens, a multiple of the replicas in
    pairs), which the strategy splits between the replicas.

    Several workers (MultiWorkerMirroredStrategy): each worker reads only its shard of the
    training pairs (`data.load_pairs(shard=(worker, workers))`: every workers-th pair, chosen
    before tokenization) into its own stream of per-replica batches of
    tokens_per_batch / replicas padded tokens, given to `fit` through
    `distribute_datasets_from_function`, which shards nothing more; its replicas take
    consecutive batches. A global step is then one batch per replica, each from its own
    length bucket (the loss is still the mean over the step's real target tokens,
    `losses.MaskedLabelSmoothedCrossEntropy`).

    With `train.accumulate_steps` = N > 1, each of those batches is a group of N batches of
    one shape (`data.group_batches`) and a step is one optimizer update over the whole group
    (`Transformer.train_step`): steps, epochs and the learning-rate schedule count updates.

    An epoch is `train.steps_per_epoch` steps, or about one pass over the data: with several
    workers, whose shards give different numbers of batches, the mean over the workers of
    their pass in steps (agreed with an all-reduce: every worker must take the same number of
    steps; a worker whose pass is shorter goes on into its next pass). Either way a run resumed
    at epoch E reads what the uninterrupted run read there: each stream restarts at its element
    E * steps * (elements per step).
    """

    def __init__(self, config: ExperimentConfig, strategy: tf.distribute.Strategy,
                 source_tokenizer, target_tokenizer):
        self.config, self.strategy = config, strategy
        self.per_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        self.worker, self.workers = worker_shard(strategy)
        replicas = strategy.num_replicas_in_sync
        data_config, stream_replicas = config.data, replicas
        if self.per_worker:
            streams.bucket_batch_sizes(config.data, replicas)  # fails early, naming the replicas
            data_config = dataclasses.replace(
                config.data, tokens_per_batch=config.data.tokens_per_batch // replicas)
            stream_replicas = 1
        self.batches_per_step = replicas // self.workers if self.per_worker else 1
        self.stream = streams.training_stream(
            data_config, source_tokenizer, target_tokenizer, seed=config.train.seed,
            shard=(self.worker, self.workers), num_replicas=stream_replicas,
            accumulate_steps=config.train.accumulate_steps)

    def epoch_steps(self) -> int:
        """`train.steps_per_epoch`, or about one pass (see the class docstring); with several
        workers, says which shard this worker reads."""
        steps = self.config.train.steps_per_epoch
        passes = ""
        if not steps:
            local = self.stream.pass_length() / self.batches_per_step
            mean = local
            if self.per_worker:
                per_replica = self.strategy.run(lambda: tf.constant(local, tf.float32))
                mean = float(self.strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica,
                                                  axis=None))
            steps = max(1, int(mean))
            passes = f": {local:g} steps per pass here, {steps} per epoch"
        if self.workers > 1:
            message = (f"worker {self.worker} of {self.workers} reads training pairs "
                       f"{self.worker}, {self.worker + self.workers}, "
                       f"{self.worker + 2 * self.workers}, ... (sharded before tokenization)"
                       f"{passes}")
            logger.info(message)
            print(f"keras-transformer train: {message}", flush=True)
        return steps

    def batches(self, initial_epoch: int, steps: int):
        """What `fit` reads when it starts at `initial_epoch` with `steps` steps an epoch: a
        dataset, or with several workers a distributed dataset, of the run's remaining steps.

        Not endless: an iterator destroyed with an element in production waits for it, and
        `fit`'s iterators are destroyed when it returns or later, whenever the garbage
        collector finds them."""
        start = initial_epoch * steps * self.batches_per_step
        count = (self.config.train.epochs - initial_epoch) * steps * self.batches_per_step
        if not self.per_worker:
            return self.stream.batches(start).take(count)

        def dataset_fn(context: tf.distribute.InputContext):
            if (context.input_pipeline_id, context.num_input_pipelines) != (self.worker,
                                                                           self.workers):
                raise ConfigError(
                    f"tf.distribute calls this worker input pipeline {context.input_pipeline_id}"
                    f" of {context.num_input_pipelines}, but TF_CONFIG makes it worker "
                    f"{self.worker} of {self.workers}")
            return self.stream.batches(start).take(count)

        return self.strategy.distribute_datasets_from_function(dataset_fn)


# ----------------------------------------------------------------------------- train

def train(config: ExperimentConfig, output_dir: str | os.PathLike,
          verbose: str | int = "auto", *,
          overwrite: bool = False) -> keras.callbacks.History | None:
    """Trains `config` into `output_dir` with `model.fit`, resuming or extending the run the
    folder holds.

    Returns the Keras History of the epochs trained now, or None, having written nothing, when
    the run is finished (`train.epochs` done, or stopped early). A killed run, or a finished one
    given a larger `train.epochs`, continues from its newest epoch checkpoint that loads
    (weights, optimizer state, dropout's seeds) at the batch of the training stream where that
    epoch ended (`data.TrainingStream`), as if it had never stopped. A folder holding another
    run is refused unless `overwrite`, which deletes that run's files first. The resolved config
    is saved as `output_dir/config.yaml`. `verbose`: 1 `model.fit`'s progress bar, 2 one
    plain line per epoch (`callbacks.EpochLogger`), 0 none.
    """
    corpora.check_data_folder(config.data)  # before the run folder is made
    if config.data.max_pair_length > config.model.max_positions:
        raise ConfigError(f"data.max_pair_length={config.data.max_pair_length} is longer than "
                          f"model.max_positions={config.model.max_positions}: the position "
                          "table would not cover the longest pairs; lower the one or raise "
                          "the other")
    created = not os.path.exists(output_dir)
    if not created and not overwrite and _said_finished(config, output_dir):
        return None  # before the lock, which would write its file
    check_writable_folder(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    try:
        # Before Run.create, whose --overwrite would delete what a running training writes.
        with training_lock(output_dir):
            return _train(config, output_dir, verbose, overwrite)
    finally:
        # A failed start leaves no folder that holds nothing but the lock.
        if created and {p.name for p in Path(output_dir).iterdir()} <= {LOCK_FILE}:
            shutil.rmtree(output_dir, ignore_errors=True)


def _said_finished(config: ExperimentConfig, output_dir: str | os.PathLike) -> bool:
    """Whether the run in `output_dir` (checked to be this config's) needs no more training
    with `config`; says why if so."""
    finished = Run.create(config, output_dir).finished(config)
    if finished:
        logger.info(finished)
        print(f"keras-transformer train: {finished}", flush=True)
    return finished is not None


def _train(config: ExperimentConfig, output_dir: str | os.PathLike, verbose: str | int,
           overwrite: bool) -> keras.callbacks.History | None:
    """`train` in a folder it has locked."""
    run = Run.create(config, output_dir, overwrite=overwrite)
    if _said_finished(config, output_dir):
        return None
    keras.utils.set_random_seed(config.train.seed)
    strategy = make_strategy(config.train.strategy)
    if (config.train.budget_minutes is not None
            and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)):
        raise ConfigError(f"train.budget_minutes={config.train.budget_minutes:g} follows "
                          "one machine's clock, and the workers' clocks differ: train "
                          "several workers for a number of train.epochs instead")
    replicas = strategy.num_replicas_in_sync
    check_shared_vocabulary(config, worker_shard(strategy)[1])
    if config.train.init_from:
        fine_tuning.check_parent(config)  # before anything is written
        fine_tuning.adopt_parent_vocabulary(config, run.path)
    source_tokenizer, target_tokenizer = prepare_tokenizers(config, run)
    config = with_vocab_sizes(config, source_tokenizer, target_tokenizer)
    run.save_config(config)
    run.remove_partial_files()

    training_input = TrainingInput(config, strategy, *training_tokenizers(
        config.data, source_tokenizer, target_tokenizer))
    validation_pairs = corpora.load_pairs(config.data, config.data.validation_split)
    validation_batches = streams.make_batches(validation_pairs, source_tokenizer,
                                               target_tokenizer, config.data, training=False,
                                               num_replicas=replicas)
    validation_steps = streams.batch_stats(validation_batches).batches
    if not validation_steps:
        raise ConfigError(
            f"data.validation_split={config.data.validation_split!r} gives no batches: every "
            f"pair is empty or longer than data.max_pair_length={config.data.max_pair_length}")
    # `fit` validates on a repeated stream, `validation_steps` (one pass) at each evaluation:
    # Keras then never reaches the end of a dataset of unknown length, where it warns that the
    # input "ran out of data"; declaring the length instead makes it start a second iterator
    # at the end of every evaluation. The stream ends with the last evaluation, for the reason
    # `TrainingInput.batches` gives.

    # Preparing the data the first time (a fresh cache, a new vocabulary) draws from Python's
    # `random`, from which Keras seeds the layers' initializers and dropout: seeded again here,
    # the same seed gives the same weights whether or not the data was prepared before.
    # (Not tf.random.set_seed, which would destroy the loaded SentencePiece resources.)
    random.seed(config.train.seed)
    np.random.seed(config.train.seed)
    precision = resolve_precision(config.train.precision, strategy)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        with strategy.scope():
            schedule = create_schedule(config.model, config.train)
            model = build_model(config, schedule)
            build_compiled_state(model, validation_batches)
            compat.skip_symbolic_build(model)
            if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
                compat.apply_multi_worker_workarounds(model)
            initial_epoch = run.restore(model)
            if config.train.init_from and not initial_epoch:
                record = fine_tuning.initialize_from(model, config.train.init_from,
                                                     (source_tokenizer, target_tokenizer))
                fine_tuning.write_record(run.path, record)
                print(f"keras-transformer train: weights initialized from "
                      f"{record['weights_file']} (vocabulary: {record['vocabulary']})",
                      flush=True)
        steps = training_input.epoch_steps()
        validation_callback = None
        if config.train.validation_bleu_sentences:
            validation_callback = ValidationBleu(
                validation_pairs.take(config.train.validation_bleu_sentences),
                source_tokenizer, target_tokenizer, config, run.logs_dir / "validation")
        callbacks = default_callbacks(config, run, validation_callback, initial_epoch,
                                      schedule.budget_spent)
        if verbose == 2:  # plain lines that say what the run does (`EpochLogger`)
            callbacks.append(EpochLogger(config.train.epochs, steps,
                                         config.train.budget_minutes))
            verbose = 0
        return model.fit(
            training_input.batches(initial_epoch, steps),
            validation_data=validation_batches.repeat(config.train.epochs - initial_epoch),
            validation_steps=validation_steps,
            initial_epoch=initial_epoch,
            epochs=config.train.epochs,
            steps_per_epoch=steps,
            shuffle=False,  # the stream shuffles; Keras would only warn that it cannot
            callbacks=callbacks,
            verbose=verbose,
        )
    except (OSError, tf.errors.OpError) as error:
        # A full disk or an unwritable folder, met by a checkpoint (save_weights says which
        # file) or by the TensorBoard logs (TensorFlow says so in an OpError): one line.
        if isinstance(error, OSError) and str(error).startswith("cannot write "):
            raise
        if not errno_of(error):
            raise
        why = getattr(error, "strerror", None) or os.strerror(errno_of(error))
        raise OSError(f"cannot write in {run.path} ({why}); the run is as its last finished "
                      "epoch left it: make room, then train again to resume") from None
    finally:
        keras.config.set_dtype_policy(previous_policy)
