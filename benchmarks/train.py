"""Training throughput: the tutorial's recipe against this package's best, on the same model.

    python benchmarks/train.py [--preset tutorial] [--steps 60] [--quality-tokens 0]
                               [--quality-seconds 0] [--seeds 1]

Each configuration runs in its own process (so peak memory and thread settings are its own):
`model.fit` over batches taken from Multi30k German-English, timing every step after a warmup
that absorbs tracing. Prints, per configuration: steady-state target tokens/s, source+target
tokens/s, sentences/s, padding fraction, peak memory, and model FLOPs utilization against
float32 and bfloat16 matmul peaks measured in the same run, with the target tokens/s that 100%
of each peak would give (no configuration of this model goes faster on this machine); then the
ratio of every other configuration to the reference.

With --quality-tokens N, each configuration also trains a fresh model until N target tokens and
prints its validation loss, to show that the faster recipe learns as much per token. Both follow
one learning-rate schedule measured in target tokens: the reference's warmup of 4000 steps of
64-sentence batches, so a configuration whose batches hold k times more target tokens warms up
for 4000 / k steps. Under the inverse-square-root schedule that gives it sqrt(k) times the
reference's rate at every token count (the square-root scaling of the rate with the batch);
--rate-scaling linear multiplies its rate by a further sqrt(k), k times the reference's (the
linear scaling rule of Goyal et al., 2017, as Ott et al., 2018 used for large-batch NMT);
--rate-scaling none divides it by sqrt(k): the reference's rate at every token count.
With --quality-seconds S instead, each trains a fresh model for S seconds of wall-clock time
(`train_on_batch` from its live input pipeline, tracing included) under the same schedules, and
the validation losses are compared at equal time: how far each recipe gets on this machine in
the same time, which is what a user pays for.
With --profile-steps N, each configuration then runs N more steps under the TensorFlow profiler
and prints where a step's time goes: the kernel time of each op type, summed over the
inter-op threads, per step, in groups (matmuls, casts, dropout's random masks, element-wise
ops, reductions, the XLA-compiled loss, Adam, the input pipeline), against the two cores'
capacity (wall time x 2); what no kernel holds is the executor's own overhead and idle time.
With --seeds 1,2,3 every configuration runs once per seed (initial weights and batch order), and
the comparison is made seed by seed, then averaged, so that a gap can be told from seed noise.

Configurations:
  reference  the tf.text tutorial's recipe: 64-sentence batches padded to their longest member,
             float32, no length bucketing
  best       token-budget length buckets, precision "auto": mixed_bfloat16 where the machine
             multiplies bfloat16 natively (AMX, AVX512-BF16), float32 where it is only emulated;
             the fastest configuration
  matched    best with batches of about the reference's target tokens (1728-token budget,
             16-token length steps): about as many updates per token as the reference. On the
             `tutorial` preset larger batches lose 15-19% in validation loss at equal tokens;
             these were within 2% of the reference after 1.5M target tokens, 5% behind after
             the tutorial's 9.1M (3% in float32), and 10% ahead after 25 minutes of training
             on 2 AVX2 cores, best 3% (experiments/RESULTS.md, experiments/log/2026-11-25.md)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

REFERENCE_WARMUP_STEPS = 4000  # the tutorial's (and the paper's) warmup

# --profile-steps: op types by group, first match wins; "other" takes the rest.
OP_GROUPS = (
    ("matmul", ("MatMul", "Einsum", "BatchMatMul", "Conv")),
    ("cast", ("Cast",)),
    ("dropout masks", ("StatelessRandom", "RandomUniform", "GreaterEqual", "SelectV2", "Select")),
    ("reduction", ("Sum", "Mean", "Max", "Min", "BiasAddGrad", "Prod", "ArgMax")),
    ("XLA (the loss)", ("_XlaRun", "XlaLaunch", "_XlaCompile", "(XLA executable)")),
    ("Adam", ("ApplyAdam",)),
    ("input pipeline", ("IteratorGetNext", "OptionalGetValue", "OptionalHasValue",
                        "(tf.data threads)")),
    ("element-wise", ("Mul", "Add", "Sub", "Div", "Square", "Sqrt", "Rsqrt", "Relu", "Neg",
                      "Maximum", "Minimum", "Softmax", "Exp", "Log", "Tanh", "Erf", "BiasAdd",
                      "Pow", "Less", "Greater", "Equal", "LogicalAnd", "Transpose", "Tile",
                      "Pad", "Fill", "ZerosLike", "OnesLike", "Gather", "Scatter", "Slice",
                      "Concat", "Pack")),
)
INPUT_PIPELINE = "(tf.data threads)"
XLA_EXECUTABLE_EVENT, XLA_EXECUTABLE = "CpuExecutable::ExecuteAsyncOnStream", "(XLA executable)"
# Op types that only call other ops (their time is their callees'), or hold no kernel.
CONTAINER_OPS = ("PartitionedCall", "StatefulPartitionedCall", "While", "If", "StatelessIf",
                 "StatelessWhile", "_Recv", "_Send", "NoOp", "Identity", "ReadVariableOp",
                 "AssignVariableOp", "Const", "_Arg", "_Retval")

CONFIGS = {
    "reference": dict(batching="fixed64", precision="float32", tokens_per_batch=4096),
    "bucketed_float32": dict(batching="bucketed", precision="float32", tokens_per_batch=4096),
    "best": dict(batching="bucketed", precision="auto", tokens_per_batch=4096),
    "matched": dict(batching="bucketed", precision="auto", tokens_per_batch=1728, bucket_step=16),
}


# What a configuration (or --set) may name: what `worker` reads.
SETTINGS = ("batching", "precision", "tokens_per_batch", "bucket_step", "jit_compile",
            "intra_op_threads", "inter_op_threads", "distinct", "rdrop_alpha")


def with_overrides(spec: dict, overrides: list) -> dict:
    """`spec` with `--set KEY=VALUE` overrides applied (numbers and true/false parsed as JSON).
    Raises ValueError on an override that is not KEY=VALUE or names no setting, which would
    otherwise be ignored and mislabel the run."""
    spec = dict(spec)
    for override in overrides:
        key, separator, value = override.partition("=")
        if not separator or key not in SETTINGS:
            raise ValueError(f"--set {override!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(SETTINGS)}")
        parsed = value[:1].isdigit() or value in ("true", "false")
        spec[key] = json.loads(value) if parsed else value
    return spec


def measure_matmul_peak(dtype: str, size: int = 2048, repeats: int = 20) -> float:
    """Dense matmul throughput in FLOP/s for `dtype` on this machine."""
    import tensorflow as tf

    a = tf.random.normal([size, size], dtype=tf.float32)
    a = tf.cast(a, dtype)

    @tf.function
    def run(x):
        for _ in range(repeats):
            x = tf.matmul(x, a) * tf.cast(1e-3, dtype)
        return x

    run(a).numpy()
    start = time.perf_counter()
    run(a).numpy()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def flops_per_batch(model_config, source, target) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward) on the real tokens.

    Matmuls: 2 FLOPs per weight per token; attention: 4 * d_model FLOPs per (query, key) pair
    and layer (scores and weighted sum); padding excluded.
    """
    import numpy as np

    d, ff, n, vocab = (model_config.d_model, model_config.dff, model_config.num_layers,
                       model_config.target_vocab_size)
    src_len = (source != 0).sum(axis=1).astype(np.float64)
    tgt_len = (target != 0).sum(axis=1).astype(np.float64)
    encoder = n * (2 * (4 * d * d + 2 * d * ff) * src_len.sum() + 4 * d * (src_len**2).sum())
    decoder = n * (2 * (8 * d * d + 2 * d * ff) * tgt_len.sum()
                   + 4 * d * (tgt_len**2).sum() + 4 * d * (src_len * tgt_len).sum())
    projection = 2 * d * vocab * tgt_len.sum()
    return 3 * (encoder + decoder + projection)


def worker(args) -> dict:
    """Runs one configuration; returns its figures."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer import data as data_lib
    from keras_transformer.runs import folder as runs
    from keras_transformer.training import runner as training
    from keras_transformer.config import ExperimentConfig

    spec = with_overrides(CONFIGS[args.config], args.set or [])
    if spec.get("intra_op_threads"):
        tf.config.threading.set_intra_op_parallelism_threads(spec["intra_op_threads"])
    if spec.get("inter_op_threads"):
        tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op_threads"])
    config = ExperimentConfig.from_dict({
        "name": f"bench_{args.config}",
        "model": {"preset": args.preset, "share_embeddings": "all"},
        "data": {"dataset": "files", "data_dir": args.data_dir, "source_lang": "de",
                 "target_lang": "en", "vocab_size": 8000, "max_pair_length": 128,
                 "tokens_per_batch": spec["tokens_per_batch"], "vocab_dir": args.vocab_dir,
                 "bucket_step": spec.get("bucket_step", 8)},
        "train": {"precision": spec["precision"], "warmup_steps": REFERENCE_WARMUP_STEPS,
                  "jit_compile": spec.get("jit_compile", False),
                  "rdrop_alpha": spec.get("rdrop_alpha", 0.0)},
    })
    # Seeded before the tokenizers load: tf.random.set_seed clears the eager kernel cache and
    # with it loaded SentencePiece models (seeding later broke --quality-tokens).
    keras.utils.set_random_seed(args.seed)
    source_tokenizer, target_tokenizer = data_lib.load_tokenizers(config.data, args.vocab_dir)
    config = runs.with_vocab_sizes(config, source_tokenizer, target_tokenizer)
    pairs = data_lib.load_pairs(config.data, "train")
    if spec["batching"] == "fixed64":
        dataset = data_lib.fixed_size_batches(pairs.shuffle(30000, seed=args.seed),
                                              source_tokenizer, target_tokenizer, config.data,
                                              batch_size=64)
    else:
        dataset = data_lib.make_batches(pairs, source_tokenizer, target_tokenizer, config.data,
                                        training=True)
    precision = training.resolve_precision(config.train.precision)
    keras.config.set_dtype_policy(precision)
    model = training.build_model(config)

    result = {"config": args.config, **spec, "precision": precision, "seed": args.seed}
    steps = args.warmup + args.steps
    # distinct=N cycles the first N batches: with jit_compile, a warmup of at least N steps
    # then compiles every shape the timed steps use (XLA compiles once per shape).
    distinct = spec.get("distinct") or steps
    batches = [(tuple(x.numpy() for x in inputs), y.numpy())
               for inputs, y in dataset.repeat().take(distinct)]
    batches = [batches[i % distinct] for i in range(steps)]
    timed = batches[args.warmup:]
    source = [b[0][0] for b in timed]
    target = [b[1] for b in timed]
    real_source = sum(int((s != 0).sum()) for s in source)
    real_target = sum(int((t != 0).sum()) for t in target)
    result["padding_fraction"] = 1 - (real_source + real_target) / sum(
        s.size + t.size for s, t in zip(source, target))
    flops = sum(flops_per_batch(config.model, s, t) for s, t in zip(source, target))

    spec_out = (
        (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)),
        tf.TensorSpec([None, None], tf.int32))
    feed = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec_out)
    times = []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: times.append(time.perf_counter()))
    model.fit(feed, epochs=1, steps_per_epoch=steps, callbacks=[callback], verbose=0)
    elapsed = times[-1] - times[args.warmup - 1]
    if args.profile_steps:
        result["profile"] = profile_steps(
            model, feed.repeat().skip(args.warmup), args.profile_steps)
    result.update(
        target_tokens_per_second=real_target / elapsed,
        tokens_per_second=(real_source + real_target) / elapsed,
        sentences_per_second=sum(len(t) for t in target) / elapsed,
        step_ms=1000 * elapsed / args.steps,
        model_flops_per_second=flops / elapsed,
        peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    if args.quality_tokens or args.quality_seconds:
        reference = data_lib.fixed_size_batches(pairs, source_tokenizer, target_tokenizer,
                                                config.data, batch_size=64)
        warmup, scale = token_matched_schedule(
            REFERENCE_WARMUP_STEPS, data_lib.batch_stats(reference),
            data_lib.batch_stats(dataset), args.rate_scaling)
        result.update(quality_tokens=args.quality_tokens,
                      quality_seconds=args.quality_seconds, rate_scaling=args.rate_scaling,
                      quality_warmup_steps=warmup, quality_rate_scale=scale)
        result.update(quality(args, config, dataset, source_tokenizer, target_tokenizer,
                              warmup, scale))
    return result


def op_group(op_type: str) -> str:
    """The `OP_GROUPS` name of `op_type` (oneDNN's `_Mkl` and fused prefixes ignored)."""
    name = op_type
    for prefix in ("_MklNative", "_Mkl", "_Fused", "Fused", "Resource"):
        name = name.removeprefix(prefix)
    for group, markers in OP_GROUPS:
        # A marker is a whole word of the CamelCase name: "Max" is not "Maximum"'s.
        if any(re.search(re.escape(marker) + "(?![a-z])", name) for marker in markers):
            return group
    return "other"


def op_times(xplane_path, counts: dict | None = None) -> dict:
    """Op type -> kernel time in seconds, summed over the host's threads, from one profile
    (`*.xplane.pb`). An op event is named "op_name:OpType"; its time excludes the ops nested
    in it on its thread, and `CONTAINER_OPS` are left out. The ops of tf.data's own threads
    (the input pipeline's functions) count as one type, `INPUT_PIPELINE`, and the runs of
    XLA-compiled functions (the fused loss) as `XLA_EXECUTABLE`. With `counts`, also adds each
    type's number of events to it; `counts["(span)"]` is the time from the first event's start
    to the last one's end, in seconds."""
    from pathlib import Path

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(xplane_path).read_bytes())
    totals, first, last = {}, None, None
    counts = {} if counts is None else counts
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        op_type = {}
        for key, metadata in plane.event_metadata.items():
            name, separator, kind = metadata.name.rpartition(":")
            if separator and name and kind.isidentifier() and "::" not in metadata.name:
                op_type[key] = kind
            elif metadata.name == XLA_EXECUTABLE_EVENT:
                op_type[key] = XLA_EXECUTABLE
        for line in plane.lines:
            input_pipeline = line.name.startswith("tf_data")
            events = sorted((event.offset_ps, event.offset_ps + event.duration_ps,
                             INPUT_PIPELINE if input_pipeline else op_type[event.metadata_id])
                            for event in line.events if event.metadata_id in op_type)
            if events:
                origin = line.timestamp_ns * 1000
                first = min(first or math.inf, origin + events[0][0])
                last = max(last or 0, origin + max(end for _, end, _ in events))
            for _, _, kind in events:
                counts[kind] = counts.get(kind, 0) + 1
            open_events = []  # [end, type, nested time] of the enclosing op events
            for start, end, kind in events:
                while open_events and open_events[-1][0] <= start:
                    _close(open_events, totals)
                open_events.append([end, kind, 0, end - start])
            while open_events:
                _close(open_events, totals)
    counts["(span)"] = (last - first) / 1e12 if first is not None else 0.0
    return {kind: ps / 1e12 for kind, ps in totals.items() if kind not in CONTAINER_OPS}


def _close(open_events: list, totals: dict) -> None:
    end, kind, nested, duration = open_events.pop()
    totals[kind] = totals.get(kind, 0) + duration - nested
    if open_events:
        open_events[-1][2] += duration


def profile_steps(model, feed, steps: int) -> dict:
    """`steps` steps of `model.fit` on `feed` under the TensorFlow profiler: their wall time,
    and kernel time per op type (`op_times`), both per step in milliseconds."""
    import shutil
    import tempfile
    from pathlib import Path

    import tensorflow as tf

    log_dir = tempfile.mkdtemp(prefix="train-profile-")
    try:
        tf.profiler.experimental.start(log_dir)
        start = time.perf_counter()
        model.fit(feed, epochs=1, steps_per_epoch=steps, verbose=0)
        wall = time.perf_counter() - start
        tf.profiler.experimental.stop()
        (xplane,) = Path(log_dir).rglob("*.xplane.pb")
        times = op_times(xplane)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return {"steps": steps, "wall_ms": 1000 * wall / steps,
            "op_ms": {kind: 1000 * seconds / steps for kind, seconds in times.items()}}


def profile_lines(profile: dict, cores: int = 2, top: int = 12) -> list:
    """What a step's time goes to: kernel time by group and by op type, per step, as shares of
    the cores' capacity (wall time x `cores`)."""
    capacity = profile["wall_ms"] * cores
    groups = {}
    for kind, ms in profile["op_ms"].items():
        groups[op_group(kind)] = groups.get(op_group(kind), 0) + ms
    busy = sum(groups.values())
    groups["no kernel (executor overhead, idle)"] = capacity - busy

    def share(ms):
        return f"{ms:7.1f} ms {100 * ms / capacity:5.1f}%"

    lines = [f"profile of {profile['steps']} steps: {profile['wall_ms']:.1f} ms a step, "
             f"{capacity:.1f} ms of {cores} cores' capacity"]
    lines += [f"  {group:36} {share(ms)}"
              for group, ms in sorted(groups.items(), key=lambda item: -item[1])]
    lines.append("  top op types:")
    for kind, ms in sorted(profile["op_ms"].items(), key=lambda item: -item[1])[:top]:
        lines.append(f"    {kind:34} {share(ms)}  ({op_group(kind)})")
    return lines


def token_matched_schedule(reference_warmup: int, reference_stats, stats,
                           rate_scaling: str = "sqrt") -> tuple:
    """(warmup steps, learning_rate_scale) for batches holding k times the reference's target
    tokens (`BatchStats` of one pass over each batching): the warmup spans as many target tokens
    as `reference_warmup` steps of the reference's batches, which makes the rate sqrt(k) times
    the reference's at every token count; "linear" scales it by a further sqrt(k) (k times the
    reference's) and "none" by 1 / sqrt(k) (the reference's)."""
    k = (stats.target_tokens / stats.batches) / (
        reference_stats.target_tokens / reference_stats.batches)
    warmup = max(1, round(reference_warmup / k))
    return warmup, {"sqrt": 1.0, "linear": k**0.5, "none": k**-0.5}[rate_scaling]


def budget_spent(target_tokens: int, seconds: float, max_tokens: int, max_seconds: float) -> bool:
    """Whether training has reached `max_tokens` target tokens or run `max_seconds` (either
    limit 0: none)."""
    return bool(max_tokens and target_tokens >= max_tokens
                or max_seconds and seconds >= max_seconds)


def quality(args, config, dataset, source_tokenizer, target_tokenizer, warmup_steps,
            rate_scale) -> dict:
    """Validation loss of a fresh model trained on `--quality-tokens` target tokens or for
    `--quality-seconds` (`quality_target_tokens` and `quality_train_seconds` say how far it got):
    `validation_loss`, the mean over every real target token of the validation split
    (`Transformer.test_step`), the same measure whatever the configuration's batching; and
    `sentence_weighted_validation_loss`, Keras's default before that `test_step` (each batch's
    mean over its tokens, weighted by its number of sentences), which depends on the batching
    and which the comparisons in experiments/log/ before commit 7aa226c used."""
    import dataclasses

    import numpy as np

    from keras_transformer import data as data_lib
    from keras_transformer.training import runner as training

    config = dataclasses.replace(config, train=dataclasses.replace(
        config.train, warmup_steps=warmup_steps, learning_rate_scale=rate_scale))
    model = training.build_model(config)
    seen = 0
    start = time.perf_counter()
    for inputs, target_out in dataset.repeat():
        model.train_on_batch(inputs, target_out)
        seen += int(np.count_nonzero(target_out.numpy()))
        if budget_spent(seen, time.perf_counter() - start, args.quality_tokens,
                        args.quality_seconds):
            break
    train_seconds = time.perf_counter() - start
    validation = data_lib.make_batches(data_lib.load_pairs(config.data, "validation"),
                                       source_tokenizer, target_tokenizer, config.data,
                                       training=False)
    weighted = sentences = 0.0
    for inputs, target_out in validation:
        loss = model.compute_loss(inputs, target_out, model(inputs, training=False))
        weighted += float(loss) * len(target_out)
        sentences += len(target_out)
    return {"validation_loss": float(model.evaluate(validation, verbose=0,
                                                    return_dict=True)["loss"]),
            "sentence_weighted_validation_loss": weighted / sentences,
            "quality_target_tokens": seen, "quality_train_seconds": train_seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tutorial")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_DATA"))
    parser.add_argument("--steps", type=int, default=60, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps (tracing)")
    parser.add_argument("--quality-tokens", type=int, default=0,
                        help="also train each configuration on this many target tokens and "
                             "compare validation losses (0: skip)")
    parser.add_argument("--quality-seconds", type=float, default=0,
                        help="also train each configuration for this many seconds and compare "
                             "validation losses at equal time (0: skip)")
    parser.add_argument("--rate-scaling", choices=("sqrt", "linear", "none"), default="sqrt",
                        help="how --quality-tokens/--quality-seconds scale the learning rate "
                             "with the batch's target tokens: sqrt(k) (the schedule's own), k "
                             "times, or not at all (the reference's rate at every token count)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="then profile this many steps and print where their time goes "
                             "(0: skip)")
    parser.add_argument("--seeds", default="1",
                        help="comma-separated random seeds; every configuration runs once per "
                             "seed and each is compared with the reference seed by seed")
    parser.add_argument("--configs", default="reference,best,matched",
                        help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a setting of every configuration run, e.g. "
                             "tokens_per_batch=8192, intra_op_threads=1, jit_compile=true, "
                             "bucket_step=16, rdrop_alpha=5 (R-Drop's step), distinct=20 "
                             "(cycle the first 20 batches)")
    parser.add_argument("--config", help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--vocab-dir", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.data_dir:
        parser.error("set --data-dir or KERAS_TRANSFORMER_DATA to the Multi30k folder")
    if args.quality_tokens and args.quality_seconds:
        parser.error("--quality-tokens and --quality-seconds: give one budget, not both")
    unknown = [name for name in args.configs.split(",") if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    try:
        with_overrides({}, args.set or [])
    except ValueError as error:
        parser.error(str(error))

    if args.config:
        print(json.dumps(worker(args)))
        return

    with tempfile.TemporaryDirectory() as vocab_dir:
        build_vocabulary(args.data_dir, vocab_dir)
        peaks = measure_peaks()
        print(f"matmul peak: float32 {peaks['float32'] / 1e12:.2f} TFLOP/s, "
              f"bfloat16 {peaks['bfloat16'] / 1e12:.2f} TFLOP/s")
        results = {}
        for seed in [int(seed) for seed in args.seeds.split(",")]:
            for name in args.configs.split(","):
                command = [sys.executable, __file__, "--config", name, "--vocab-dir", vocab_dir,
                           "--data-dir", args.data_dir, "--preset", args.preset,
                           "--steps", str(args.steps), "--warmup", str(args.warmup),
                           "--quality-tokens", str(args.quality_tokens),
                           "--quality-seconds", str(args.quality_seconds),
                           "--rate-scaling", args.rate_scaling, "--seed", str(seed),
                           "--profile-steps", str(args.profile_steps)]
                command += [f"--set={override}" for override in args.set or []]
                output = subprocess.run(command, capture_output=True, text=True,
                                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
                if output.returncode:
                    sys.exit(f"configuration {name} (seed {seed}) failed:\n"
                             f"{output.stderr[-3000:]}")
                result = json.loads(output.stdout.strip().splitlines()[-1])
                results.setdefault(name, []).append(result)
                report(result, peaks)
                if "profile" in result:
                    print("\n".join(profile_lines(result["profile"])))
    for name in results:
        if name != "reference" and "reference" in results:
            for line in compare(results["reference"], results[name], name):
                print(line)


def compare(reference: list, other: list, name: str = "best") -> list:
    """Summary lines for the `name` / reference comparison, from one result of each per seed
    (paired by seed): the ratio of mean target tokens/s and, with validation losses, the
    relative gap of each seed, their mean and their range."""
    def mean(values):
        return sum(values) / len(values)

    pairs = [(r, b) for r in reference for b in other if r["seed"] == b["seed"]]
    if not pairs:
        raise ValueError(f"reference and {name} share no seed: nothing to compare")
    speed = (mean([b["target_tokens_per_second"] for _, b in pairs])
             / mean([r["target_tokens_per_second"] for r, _ in pairs]))
    lines = [f"{name} / reference: {speed:.2f}x target tokens/s"]
    if "validation_loss" in pairs[0][0]:
        r, b = pairs[0]
        equal_time = bool(r.get("quality_seconds"))

        def reached(result):  # at equal time, how far each got
            return f" ({result['quality_target_tokens']:,} tokens)" if equal_time else ""

        def gaps_per_seed(key):
            gaps = [(b[key] - r[key]) / r[key] for r, b in pairs]
            return gaps, ", ".join(
                f"seed {r['seed']}: reference {r[key]:.4f}{reached(r)}, {name} {b[key]:.4f}"
                f"{reached(b)} ({100 * gap:+.2f}%)" for (r, b), gap in zip(pairs, gaps))

        gaps, per_seed = gaps_per_seed("validation_loss")
        budget = (f"{r['quality_seconds']:g} s of training" if equal_time
                  else f"{r['quality_tokens']:,} target tokens")
        lines.append(f"validation loss after {budget} (warmup "
                     f"{r['quality_warmup_steps']} / {b['quality_warmup_steps']} steps, "
                     f"{r['rate_scaling']} rate scaling): {per_seed}")
        if "sentence_weighted_validation_loss" in r:
            lines.append("the same weighted by sentences (Keras's default, depends on the "
                         f"batching): {gaps_per_seed('sentence_weighted_validation_loss')[1]}")
        if len(gaps) > 1:
            lines.append(f"{name} - reference over {len(gaps)} seeds: "
                         f"mean {100 * mean(gaps):+.2f}%, "
                         f"from {100 * min(gaps):+.2f}% to {100 * max(gaps):+.2f}%")
    return lines


def build_vocabulary(data_dir: str, vocab_dir: str) -> None:
    from keras_transformer.config import DataConfig
    from keras_transformer.data.corpora import build_vocab

    build_vocab(DataConfig(dataset="files", data_dir=data_dir, source_lang="de",
                           target_lang="en", vocab_size=8000, max_pair_length=128), vocab_dir)


def measure_peaks() -> dict:
    return {dtype: measure_matmul_peak(dtype) for dtype in ("float32", "bfloat16")}


def ceilings(result: dict, peaks: dict) -> dict:
    """Target tokens/s this configuration's batches would reach at 100% of each measured
    matmul peak: its model FLOPs per real target token against the peak. What a target in
    tokens/s asks of the machine: a figure above the ceiling cannot be reached by any
    implementation of this model on it, only by fewer FLOPs per token."""
    flops_per_target_token = (result["model_flops_per_second"]
                              / result["target_tokens_per_second"])
    return {dtype: peak / flops_per_target_token for dtype, peak in peaks.items()}


def report(result: dict, peaks: dict) -> None:
    mfu32 = result["model_flops_per_second"] / peaks["float32"]
    mfu16 = result["model_flops_per_second"] / peaks["bfloat16"]
    ceiling = ceilings(result, peaks)
    extras = "".join(f", {k}={result[k]}" for k in ("intra_op_threads", "inter_op_threads",
                                                     "jit_compile", "bucket_step", "distinct",
                                                     "rdrop_alpha")
                     if k in result)
    line = (f"{result['config']:>9}: {result['batching']}, {result['precision']}, "
            + ("64 sentences/batch" if result["batching"] == "fixed64"
               else f"{result['tokens_per_batch']} tokens/batch") + f"{extras}: "
            f"{result['target_tokens_per_second']:,.0f} target tokens/s, "
            f"{result['tokens_per_second']:,.0f} source+target tokens/s, "
            f"{result['sentences_per_second']:,.1f} sentences/s, "
            f"{result['step_ms']:.0f} ms/step, padding {100 * result['padding_fraction']:.1f}%, "
            f"peak memory {result['peak_memory_mb']:,.0f} MB, "
            f"MFU {100 * mfu32:.0f}% of float32 / {100 * mfu16:.0f}% of bfloat16 peak "
            f"(at 100%: {ceiling['float32']:,.0f} / {ceiling['bfloat16']:,.0f} target tokens/s)")
    if "validation_loss" in result:
        line += (f", validation loss {result['validation_loss']:.4f} (weighted by sentences: "
                 f"{result['sentence_weighted_validation_loss']:.4f}) after "
                 f"{result['quality_target_tokens']:,} target tokens in "
                 f"{result['quality_train_seconds']:,.0f} s, "
                 f"{result['quality_warmup_steps']}-step warmup, rate scale "
                 f"{result['quality_rate_scale']:.2f}")
    print(line, flush=True)


if __name__ == "__main__":
    main()
