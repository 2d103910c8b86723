"""How the cost of each data stage grows with the corpus, from Multi30k's 29k pairs to WMT14's 4.5M.

    python benchmarks/scale.py [--sizes 29000,290000,2900000,4500000] [--work-dir runs/scale]
                               [--config experiments/wmt14_en_de_base.yaml] [--set KEY=VALUE]
                               [--stages vocab,stats,input-off,input-on] [--first-batches 20]
                               [--train-steps 10 | --train-tokens-per-second N]
                               [--shard-size 290000] [--workers 1,2] [--json results.json]

For each size: a synthetic corpus of WMT14's shape (`benchmarks/make_corpus.py`; SYNTHETIC,
it measures cost, not quality), made once under --work-dir and reused, then each stage in its
own process, so that the peak resident memory of a stage (that process's ru_maxrss,
TensorFlow's own footprint included) is its own:

  vocab      `data.build_vocab` with the experiment's data section (WMT14's: one joint 37k
             SentencePiece vocabulary, learned from a uniform sample of at most
             data.vocab_sample_sentences sentences); every pair is read once.
  stats      `data.data_stats` (`keras-transformer data-stats`): every split tokenized,
             lengths, drops and batch shapes.
  input-off  one pass of `data.make_batches(training=True)` over the training split, as
  input-on   training reads it, with data.cache off / on: the real target tokens out of the
             batches per second, counted from the call to `load_pairs` (the file check, the
             shuffle buffer filling) to the end of batch --first-batches (first) and to the
             end of the pass (steady: each pass refills the shuffle buffer, which holds a whole
             29k-pair corpus, so the pass's average is the rate training is fed at). With the
             cache on, a second pass, read from the cache, gives the cached figure.

Once, on the smallest corpus, --train-steps steps of the experiment's model (`base`,
precision auto: bfloat16 where native; data.vocab_size embeddings, even where the synthetic
text gives the tokenizer fewer pieces) on its batches of --train-tokens-per-batch tokens: the
target tokens/s the input must feed, the model FLOPs per target token (`benchmarks/train.py`'s
count) and the MFU against the bfloat16 matmul peak measured in the same process.
--train-tokens-per-second N takes N instead of measuring.

With --shard-size N (a size made above or made now) and --workers 1,2: the input cost of one
worker of K for one pass of its part of the data, each worker alone on the machine, measured
in CPU seconds (user + system) and wall seconds: `line` is this package's multi-worker input
(`data.load_pairs(shard=...)`: every K-th pair, chosen before tokenization, batches of
tokens_per_batch / K), `data` is what tf.data's DATA auto-sharding costs (every worker runs the
whole pipeline, then keeps every K-th batch).

Prints markdown tables, each figure per size with its ratio to the smallest size's, then the
targets (reported, not asserted): time grows at most linearly with the pairs; with the cache
off, peak memory within 1.5x of the smallest size's; the steady input at least 10x the target
tokens/s the model trains at.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = "29000,290000,2900000,4500000"
STAGES = ("vocab", "stats", "input-off", "input-on")
TIME_LIMIT_OF_LINEAR = 1.1  # "at most linear": time ratio <= 1.1 x pairs ratio (timing noise)
MEMORY_TARGET = 1.5
INPUT_TARGET = 10.0


def load_sibling(name: str):
    """The module of `benchmarks/NAME.py` (benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peak_mb() -> float:
    """This process's peak resident memory so far, MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ----------------------------------------------------------------------------- stages (children)

def corpus_overrides(corpus, vocab=None) -> list[str]:
    """The config overrides that read a corpus of `make_corpus.py` (the `files` layout, splits
    train / validation / test) and, if given, the built vocabulary `vocab`."""
    return ["data.dataset=files", f"data.data_dir={corpus}", "data.train_split=train",
            "data.validation_split=validation", "data.test_split=test",
            *([f"data.vocab_dir={vocab}"] if vocab else [])]


def experiment(args, **data_values):
    """The experiment of --config on the corpus --corpus with the vocabulary --vocab, --set
    overrides applied, then `data_values`."""
    from keras_transformer.config import ExperimentConfig

    overrides = [*corpus_overrides(args.corpus, args.vocab), *(args.set or [])]
    config = ExperimentConfig.from_yaml(args.config, overrides)
    return dataclasses.replace(config, data=dataclasses.replace(config.data, **data_values))


def stage_vocab(args) -> dict:
    from keras_transformer.data.corpora import build_vocab

    config = experiment(args)
    start = time.perf_counter()
    source, _ = build_vocab(config.data, args.vocab)
    return {"seconds": time.perf_counter() - start, "vocab_size": source.vocab_size}


def stage_stats(args) -> dict:
    from keras_transformer.data.stats import data_stats

    config = experiment(args)
    start = time.perf_counter()
    stats = data_stats(config.data, args.vocab)
    train = stats["splits"]["train"]
    return {"seconds": time.perf_counter() - start, "kept": train["kept"],
            "dropped": sum(train["dropped"].values())}


def target_tokens_per_batch(batches):
    """Batches -> int64 scalars: the real (non-PAD) target tokens of each batch."""
    import tensorflow as tf

    return batches.map(lambda inputs, target_out: tf.math.count_nonzero(target_out))


def timed_pass(batches, start: float) -> tuple[list, list]:
    """Iterates once: (target tokens, seconds since `start`) of every batch."""
    tokens, times = [], []
    for count in batches.as_numpy_iterator():
        tokens.append(int(count))
        times.append(time.perf_counter() - start)
    return tokens, times


def rates(tokens: list, times: list, first_batches: int) -> dict:
    """From the target tokens of a pass's batches and the seconds at which each came (counted
    from the start): first, the tokens/s of the first `first_batches` batches; steady, the
    tokens/s of the whole pass (None for a pass without batches)."""
    if not tokens:
        return {"first": None, "steady": None, "pass_seconds": 0.0, "batches": 0, "tokens": 0}
    k = min(first_batches, len(tokens))
    return {"first": sum(tokens[:k]) / times[k - 1], "steady": sum(tokens) / times[-1],
            "pass_seconds": times[-1], "batches": len(tokens), "tokens": sum(tokens)}


def stage_input(args) -> dict:
    from keras_transformer.data.corpora import load_pairs
    from keras_transformer.data.streams import make_batches
    from keras_transformer.data.tokenizers import load_tokenizers

    cache = args.stage == "input-on"
    config = experiment(args, cache=cache)
    tokenizers = load_tokenizers(config.data, args.vocab)
    start = time.perf_counter()
    pairs = load_pairs(config.data, config.data.train_split)
    batches = target_tokens_per_batch(make_batches(pairs, *tokenizers, config.data,
                                                   training=True))
    result = rates(*timed_pass(batches, start), args.first_batches)
    if cache:
        result["cached"] = rates(*timed_pass(batches, time.perf_counter()), 1)["steady"]
    return result


def stage_shard(args) -> dict:
    """One pass of worker i of K's input (see the module docstring); CPU and wall seconds."""
    from keras_transformer.data.corpora import load_pairs
    from keras_transformer.data.streams import make_batches
    from keras_transformer.data.tokenizers import load_tokenizers

    index, count = (int(x) for x in args.shard.split("/"))
    config = experiment(args, cache=False)
    tokenizers = load_tokenizers(config.data, args.vocab)
    cpu, start = cpu_seconds(), time.perf_counter()
    if args.policy == "line":
        per_replica = dataclasses.replace(
            config.data, tokens_per_batch=config.data.tokens_per_batch // count)
        pairs = load_pairs(config.data, config.data.train_split, shard=(index, count))
        batches = make_batches(pairs, *tokenizers, per_replica, training=True)
    else:
        pairs = load_pairs(config.data, config.data.train_split)
        batches = make_batches(pairs, *tokenizers, config.data, training=True,
                               num_replicas=count).shard(count, index)
    tokens, _ = timed_pass(target_tokens_per_batch(batches), start)
    return {"wall_seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds() - cpu,
            "target_tokens": sum(tokens), "batches": len(tokens)}


def stage_train(args) -> dict:
    """Target tokens/s, FLOPs per target token and MFU of `train_on_batch` (see the module
    docstring); the bfloat16 and float32 matmul peaks measured here."""
    import keras
    import numpy as np

    from keras_transformer import data as data_lib
    from keras_transformer.training import runner as training
    from keras_transformer.runs.folder import with_vocab_sizes
    from keras_transformer.data.tokenizers import load_tokenizers

    train_benchmark = load_sibling("train")
    config = experiment(args, tokens_per_batch=args.train_tokens_per_batch, cache=False)
    # Seeded before the tokenizers load (benchmarks/train.py says why).
    keras.utils.set_random_seed(1)
    tokenizers = load_tokenizers(config.data, args.vocab)
    config = with_vocab_sizes(config, *tokenizers)
    # The model of data.vocab_size entries (37k for WMT14) even where the synthetic text gives
    # the tokenizer fewer pieces: the unused rows cost the FLOPs they cost in the real model.
    vocab_size = max(config.model.target_vocab_size, config.data.vocab_size)
    config = dataclasses.replace(config, model=dataclasses.replace(
        config.model, source_vocab_size=vocab_size, target_vocab_size=vocab_size))
    precision = training.resolve_precision(config.train.precision)
    keras.config.set_dtype_policy(precision)
    batches = [(tuple(x.numpy() for x in inputs), target.numpy()) for inputs, target in
               data_lib.make_batches(data_lib.load_pairs(config.data, config.data.train_split),
                                     *tokenizers, config.data, training=True)
               .take(args.train_warmup + args.train_steps)]
    if len(batches) < args.train_warmup + args.train_steps:
        raise SystemExit(f"the corpus gives only {len(batches)} batches; lower --train-steps")
    model = training.build_model(config)
    for inputs, target in batches[:args.train_warmup]:  # tracing
        model.train_on_batch(inputs, target)
    timed = batches[args.train_warmup:]
    start = time.perf_counter()
    for inputs, target in timed:
        model.train_on_batch(inputs, target)
    seconds = time.perf_counter() - start
    tokens = sum(int(np.count_nonzero(target)) for _, target in timed)
    flops = sum(train_benchmark.flops_per_batch(config.model, inputs[0], target)
                for inputs, target in timed)
    peaks = {dtype: train_benchmark.measure_matmul_peak(dtype)
             for dtype in ("float32", "bfloat16")}
    return {"preset_layers": config.model.num_layers, "d_model": config.model.d_model,
            "vocab_size": config.model.target_vocab_size, "precision": precision,
            "tokens_per_batch": config.data.tokens_per_batch, "steps": len(timed),
            "target_tokens_per_second": tokens / seconds, "step_seconds": seconds / len(timed),
            "flops_per_target_token": flops / tokens,
            "model_flops_per_second": flops / seconds, "peak_flops": peaks,
            "mfu": {dtype: flops / seconds / peak for dtype, peak in peaks.items()}}


STAGE_FUNCTIONS = {"vocab": stage_vocab, "stats": stage_stats, "input-off": stage_input,
                   "input-on": stage_input, "train": stage_train, "shard": stage_shard}


def child_main(args) -> None:
    result = STAGE_FUNCTIONS[args.stage](args)
    result.update(peak_mb=peak_mb(), cpu_seconds_total=cpu_seconds())
    print(json.dumps(result))


# ----------------------------------------------------------------------------- the driver

def run_stage(args, stage: str, corpus: Path, vocab: Path, *extra: str) -> dict:
    """Runs `stage` in a new process; its result (a dict, with its peak memory)."""
    command = [sys.executable, __file__, "--stage", stage, "--corpus", str(corpus),
               "--vocab", str(vocab), "--config", str(args.config),
               "--first-batches", str(args.first_batches), *extra]
    command += [f"--set={override}" for override in args.set or []]
    started = time.strftime("%H:%M:%S")
    output = subprocess.run(command, capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if output.returncode:
        sys.exit(f"scale.py: stage {stage} on {corpus} failed:\n{output.stderr[-3000:]}")
    # The clock times say what else ran meanwhile (figures are wall-clock times).
    return {**json.loads(output.stdout.strip().splitlines()[-1]), "started": started,
            "ended": time.strftime("%H:%M:%S")}


def ensure_corpus(args, size: int) -> Path:
    """The corpus of `size` pairs under --work-dir, made unless a complete one with the same
    parameters is there."""
    make_corpus = load_sibling("make_corpus")
    folder = Path(args.work_dir) / f"corpus_{size}"
    parameters = make_corpus.corpus_parameters(size, ("en", "de"), args.seed,
                                               make_corpus.MEDIAN_WORDS, make_corpus.SIGMA,
                                               args.eval_pairs)
    manifest = make_corpus.read_manifest(folder)
    if manifest and all(manifest.get(k) == v for k, v in parameters.items()):
        return folder
    start = time.perf_counter()
    make_corpus.write_corpus(folder, args.data_dir, **{k: v for k, v in parameters.items()})
    print(f"made the synthetic corpus {folder} ({size:,} pairs) in "
          f"{time.perf_counter() - start:,.0f} s", flush=True)
    return folder


# (key, label, format) of the rows of the table, in order.
ROWS = [
    ("pairs", "training pairs", "{:,.0f}"),
    ("vocab.seconds", "build-vocab, s", "{:,.1f}"),
    ("vocab.peak_mb", "build-vocab, peak MB", "{:,.0f}"),
    ("stats.seconds", "data-stats, s", "{:,.1f}"),
    ("stats.peak_mb", "data-stats, peak MB", "{:,.0f}"),
    ("input-off.first", "input, cache off: first, target tokens/s", "{:,.0f}"),
    ("input-off.steady", "input, cache off: steady (whole pass), target tokens/s", "{:,.0f}"),
    ("input-off.pass_seconds", "input, cache off: one pass, s", "{:,.1f}"),
    ("input-off.peak_mb", "input, cache off: peak MB", "{:,.0f}"),
    ("input-on.first", "input, cache on: first, target tokens/s", "{:,.0f}"),
    ("input-on.cached", "input, cache on: cached pass, target tokens/s", "{:,.0f}"),
    ("input-on.peak_mb", "input, cache on: peak MB", "{:,.0f}"),
]


def figure(results: dict, key: str):
    stage, _, name = key.partition(".")
    return results.get("pairs") if key == "pairs" else results.get(stage, {}).get(name)


def table(results: dict) -> list[str]:
    """Markdown lines: a row per figure, a column per size, each cell `value (ratio to the
    smallest size's)`."""
    sizes = sorted(results)
    lines = ["| figure | " + " | ".join(f"{size:,} pairs" for size in sizes) + " |",
             "| --- |" + " --- |" * len(sizes)]
    for key, label, fmt in ROWS:
        values = [figure(results[size], key) for size in sizes]
        if all(v is None for v in values):
            continue
        base = values[0]
        cells = []
        for value in values:
            if value is None:
                cells.append("-")
            elif base:
                cells.append(f"{fmt.format(value)} ({value / base:.2f}x)")
            else:
                cells.append(fmt.format(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def targets(results: dict, train_rate: float | None) -> list[str]:
    """The issue's targets, each figure and whether it is met (reported, not asserted)."""
    sizes = sorted(results)
    smallest = results[sizes[0]]
    lines = []
    for key, label in (("vocab.seconds", "build-vocab time"), ("stats.seconds", "data-stats time"),
                       ("input-off.pass_seconds", "input pass time, cache off")):
        if figure(smallest, key) is None or len(sizes) < 2:
            continue
        of_linear = [(figure(results[s], key) / figure(smallest, key))
                     / (results[s]["pairs"] / smallest["pairs"]) for s in sizes[1:]]
        met = all(x <= TIME_LIMIT_OF_LINEAR for x in of_linear)
        lines.append(f"- {label} grows at most linearly (time ratio / pairs ratio <= "
                     f"{TIME_LIMIT_OF_LINEAR:g} at every size): "
                     + ", ".join(f"{x:.2f}" for x in of_linear) + f": {'met' if met else 'NOT met'}")
    if figure(smallest, "input-off.peak_mb") and len(sizes) > 1:
        ratios = [figure(results[s], "input-off.peak_mb") / figure(smallest, "input-off.peak_mb")
                  for s in sizes[1:]]
        met = all(r <= MEMORY_TARGET for r in ratios)
        lines.append(f"- peak memory with the cache off within {MEMORY_TARGET:g}x of the "
                     f"{sizes[0]:,}-pair figure: " + ", ".join(f"{r:.2f}x" for r in ratios)
                     + f": {'met' if met else 'NOT met'}")
    if train_rate:
        for key, label in (("input-off.steady", "steady input, cache off"),
                           ("input-on.cached", "cached input")):
            values = [figure(results[s], key) for s in sizes]
            if all(v is None for v in values):
                continue
            multiples = [v / train_rate if v else None for v in values]
            met = all(m is not None and m >= INPUT_TARGET for m in multiples)
            lines.append(f"- {label} at least {INPUT_TARGET:g}x the {train_rate:,.0f} target "
                         f"tokens/s training consumes: "
                         + ", ".join("-" if m is None else f"{m:.1f}x" for m in multiples)
                         + f": {'met' if met else 'NOT met'}")
    return lines


def shard_table(rows: list) -> list[str]:
    """Markdown lines of the per-worker input cost (see the module docstring)."""
    lines = ["| workers | sharding | per worker: CPU s | wall s | target tokens | CPU s vs 1 worker |",
             "| --- | --- | --- | --- | --- | --- |"]
    one = next((r["cpu_seconds"] for r in rows if r["workers"] == 1), None)
    for r in rows:
        ratio = f"{r['cpu_seconds'] / one:.2f}x" if one else "-"
        lines.append(f"| {r['workers']} | {r['policy']} | {r['cpu_seconds']:,.1f} | "
                     f"{r['wall_seconds']:,.1f} | {r['target_tokens']:,} | {ratio} |")
    return lines


def machine() -> str:
    """The CPU (the model name of /proc/cpuinfo), its cores and the commit, for the record."""
    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip() or "unknown"
    return f"{name}, {os.cpu_count()} cores; commit {commit}"


def driver_main(args) -> None:
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    stages = args.stages.split(",")
    work = Path(args.work_dir)
    print(f"# benchmarks/scale.py on {machine()}", flush=True)
    print(f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}", flush=True)
    results = {}
    for size in sizes:
        corpus = ensure_corpus(args, size)
        vocab = work / f"vocab_{size}"
        results[size] = {"pairs": size}
        for stage in stages:
            results[size][stage] = run_stage(args, stage, corpus, vocab)
            print(f"{size:,} pairs, {stage}: {json.dumps(results[size][stage])}", flush=True)

    train = None
    train_rate = args.train_tokens_per_second
    if args.train_steps:
        train = run_stage(args, "train", ensure_corpus(args, sizes[0]), work / f"vocab_{sizes[0]}",
                          "--train-steps", str(args.train_steps),
                          "--train-warmup", str(args.train_warmup),
                          "--train-tokens-per-batch", str(args.train_tokens_per_batch))
        train_rate = train["target_tokens_per_second"]
        print(f"train: {json.dumps(train)}", flush=True)

    shards = []
    if args.shard_size:
        corpus = ensure_corpus(args, args.shard_size)
        vocab = work / f"vocab_{args.shard_size}"
        if not (vocab / "tokenizer.json").is_file():
            run_stage(args, "vocab", corpus, vocab)
        for workers in sorted({int(w) for w in args.workers.split(",")}):
            for policy in (("line",) if workers == 1 else ("line", "data")):
                measured = [run_stage(args, "shard", corpus, vocab, "--shard", f"{i}/{workers}",
                                      "--policy", policy) for i in range(workers)]
                row = {"workers": workers, "policy": policy if workers > 1 else "none",
                       "cpu_seconds": max(m["cpu_seconds"] for m in measured),
                       "wall_seconds": max(m["wall_seconds"] for m in measured),
                       "target_tokens": sum(m["target_tokens"] for m in measured) // workers,
                       "each": measured}
                shards.append(row)
                print(f"{workers} worker(s), {policy}: {json.dumps(measured)}", flush=True)

    print()
    for line in table(results):
        print(line)
    if train:
        print(f"\ntraining, {train['preset_layers']} layers, d_model {train['d_model']}, "
              f"vocabulary {train['vocab_size']:,}, {train['precision']}, "
              f"{train['tokens_per_batch']}-token batches, {train['steps']} steps: "
              f"{train['target_tokens_per_second']:,.0f} target tokens/s, "
              f"{train['step_seconds']:.2f} s/step, "
              f"{train['flops_per_target_token'] / 1e6:,.0f} MFLOP per target token, "
              f"MFU {100 * train['mfu']['bfloat16']:.0f}% of the measured bfloat16 peak "
              f"({train['peak_flops']['bfloat16'] / 1e12:.2f} TFLOP/s; float32 "
              f"{train['peak_flops']['float32'] / 1e12:.2f}), peak {train['peak_mb']:,.0f} MB")
    if shards:
        print(f"\ninput cost per worker, one pass of its part of {args.shard_size:,} pairs "
              f"(the largest of its workers; each worker alone on the machine):")
        for line in shard_table(shards):
            print(line)
    lines = targets(results, train_rate)
    if lines:
        print("\ntargets (reported, not asserted):")
        for line in lines:
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": machine(), "argv": sys.argv, "sizes": results, "train": train,
             "shards": shards}, indent=2) + "\n")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated pair counts")
    parser.add_argument("--work-dir", default=str(HERE.parent / "runs" / "scale"),
                        help="where the corpora and vocabularies are written")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_DATA"),
                        help="the Multi30k folder the corpora are made from")
    parser.add_argument("--config", default=str(HERE.parent / "experiments" /
                                                "wmt14_en_de_base.yaml"),
                        help="experiment whose model and data sections are used")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override a value of --config, e.g. data.vocab_size=8000")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--first-batches", type=int, default=20,
                        help="batches the 'first' throughput is measured over")
    parser.add_argument("--train-steps", type=int, default=10,
                        help="timed training steps on the smallest corpus (0: none)")
    parser.add_argument("--train-warmup", type=int, default=3, help="untimed steps (tracing)")
    parser.add_argument("--train-tokens-per-batch", type=int, default=4096)
    parser.add_argument("--train-tokens-per-second", type=float, default=0.0,
                        help="the target tokens/s training consumes, instead of --train-steps")
    parser.add_argument("--shard-size", type=int, default=290000,
                        help="corpus size for the per-worker input cost (0: skip)")
    parser.add_argument("--workers", default="1,2", help="worker counts for --shard-size")
    parser.add_argument("--eval-pairs", type=int, default=3000,
                        help="pairs of the synthetic validation and test splits")
    parser.add_argument("--seed", type=int, default=1, help="of the synthetic corpora")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--stage", choices=sorted(STAGE_FUNCTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", help=argparse.SUPPRESS)
    parser.add_argument("--shard", help=argparse.SUPPRESS)
    parser.add_argument("--policy", choices=("line", "data"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        return args
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes} and --workers {args.workers} must be "
                     "comma-separated integers")
    if min(sizes) < 1 or min(workers) < 1:
        parser.error("--sizes and --workers must be positive")
    unknown = [s for s in args.stages.split(",") if s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; known: {', '.join(STAGES)}")
    if args.train_steps and args.train_tokens_per_second:
        parser.error("give --train-steps or --train-tokens-per-second, not both")
    if args.train_steps < 0 or args.first_batches < 1 or args.shard_size < 0:
        parser.error("--train-steps and --shard-size must be >= 0, --first-batches >= 1")
    if not args.data_dir:
        parser.error("set --data-dir or KERAS_TRANSFORMER_DATA to the Multi30k folder")
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config}: no such file")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.stage:
        child_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    main()
