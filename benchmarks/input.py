"""Input pipeline throughput on Multi30k train, next to what a training step consumes.

    python benchmarks/input.py [--data-dir DIR] [--vocab-dir DIR] [--train-steps 20]
                               [--stall-seconds 30]

Prints pairs/s and tokens/s (real source + target tokens, no padding) of `make_batches` for the
first epoch (reading, tokenizing, filling the cache) and a cached epoch, then the target tokens/s
of `model.train_on_batch` for the `tutorial` preset on the same batches (batches taken from memory,
so the pipeline is not measured twice). The pipeline should be >= 10x faster than training.

Then, with tf.data autotuning off (as the package builds every pipeline,
`compat.without_autotuning`) and turned back on: the median tokens/s per side of 3 cached
epochs, and the seconds that deleting an iterator takes after an epoch read to its end at a
training-like pace (a pause after each batch, about --stall-seconds in all). On TensorFlow 2.21
the deletion waits for the autotuning thread; re-run this after a TensorFlow upgrade to see
whether the workaround is still needed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from keras_transformer.config import DATA_ENV, DataConfig, ExperimentConfig  # noqa: E402
from keras_transformer.data.corpora import build_vocab, load_pairs  # noqa: E402
from keras_transformer.data.streams import make_batches
from keras_transformer.data.tokenizers import load_tokenizers  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                        help=f"folder of the raw Multi30k files (default: ${DATA_ENV})")
    parser.add_argument("--vocab-dir", help="reuse/write the vocabulary here (default: a temp dir)")
    parser.add_argument("--tokenizer", default="sentencepiece", choices=("sentencepiece", "wordpiece"))
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--preset", default="tutorial", help="model preset for the training step")
    parser.add_argument("--train-steps", type=int, default=20,
                        help="timed training steps (0 skips the model)")
    parser.add_argument("--stall-seconds", type=float, default=30.0,
                        help="length of the paced epoch of the autotuning comparison (0 skips it)")
    return parser.parse_args()


def time_epoch(batches: tf.data.Dataset) -> dict:
    """Iterates one epoch; returns pairs, real tokens, batches and seconds."""
    pairs = tokens = count = 0
    start = time.perf_counter()
    for (source, _), target_out in batches:
        pairs += int(source.shape[0])
        tokens += int(tf.math.count_nonzero(source)) + int(tf.math.count_nonzero(target_out))
        count += 1
    return {"pairs": pairs, "tokens": tokens, "batches": count,
            "seconds": time.perf_counter() - start}


def paced_epoch_then_delete(batches: tf.data.Dataset, pause: float) -> tuple[float, float]:
    """Reads an epoch with `pause` seconds after each batch; returns (epoch seconds, seconds
    that deleting its exhausted iterator takes)."""
    iterator = iter(batches)
    start = time.perf_counter()
    for _ in iterator:
        time.sleep(pause)
    end = time.perf_counter()
    del iterator
    return end - start, time.perf_counter() - end


def compare_autotuning(batches: tf.data.Dataset, stall_seconds: float) -> None:
    """Prints the cached-epoch speed and the iterator-deletion wait with autotuning off and on."""
    autotuned = tf.data.Options()
    autotuned.autotune.enabled = True
    print(f"tf.data autotuning (tensorflow {tf.__version__}), paced epoch of about "
          f"{stall_seconds:.0f} s:")
    print(f"{'pipeline':<26} {'tokens/s per side (median)':>27} {'paced epoch s':>14} "
          f"{'del iterator s':>15}")
    for name, dataset in (("package (autotuning off)", batches),
                          ("autotuning on", batches.with_options(autotuned))):
        time_epoch(dataset)  # warm-up: fills the cache
        timed = [time_epoch(dataset) for _ in range(3)]
        rate = statistics.median(r["tokens"] / 2 / r["seconds"] for r in timed)
        epoch, delete = paced_epoch_then_delete(dataset, stall_seconds / timed[0]["batches"])
        print(f"{name:<26} {rate:>27,.0f} {epoch:>14.1f} {delete:>15.2f}", flush=True)


def time_training(config: ExperimentConfig, batches: list, steps: int) -> float:
    """Target tokens/s of `train_on_batch` over `steps` in-memory batches (after 3 warm-up steps)."""
    from keras_transformer.training import runner as training

    model = training.build_model(config)
    for x, y in batches[:3]:  # traces the train function for the first shapes
        model.train_on_batch(x, y)
    timed = batches[3:3 + steps]
    tokens = sum(int(tf.math.count_nonzero(y)) for _, y in timed)
    start = time.perf_counter()
    for x, y in timed:
        model.train_on_batch(x, y)
    return tokens / (time.perf_counter() - start)


def main():
    args = parse_args()
    if not args.data_dir:
        raise SystemExit(f"pass --data-dir or set ${DATA_ENV} to the Multi30k folder")
    data_config = DataConfig(dataset="files", data_dir=args.data_dir, tokenizer=args.tokenizer,
                             vocab_size=args.vocab_size, tokens_per_batch=args.tokens_per_batch)
    vocab_dir = args.vocab_dir or tempfile.mkdtemp(prefix="vocab_")
    try:
        source_tokenizer, target_tokenizer = load_tokenizers(data_config, vocab_dir)
    except ValueError:
        start = time.perf_counter()
        source_tokenizer, target_tokenizer = build_vocab(data_config, vocab_dir)
        print(f"built {args.tokenizer} vocabulary ({source_tokenizer.vocab_size} tokens) in "
              f"{time.perf_counter() - start:.1f} s -> {vocab_dir}")

    batches = make_batches(load_pairs(data_config, "train"), source_tokenizer, target_tokenizer,
                           data_config, training=True)
    for name in ("first epoch (read + tokenize + cache)", "cached epoch"):
        r = time_epoch(batches)
        print(f"input pipeline, {name}: {r['pairs']} pairs in {r['batches']} batches, "
              f"{r['seconds']:.2f} s: {r['pairs'] / r['seconds']:,.0f} pairs/s, "
              f"{r['tokens'] / r['seconds']:,.0f} tokens/s "
              f"({r['tokens'] / 2 / r['seconds']:,.0f} per side)")
    pipeline_target_rate = r["tokens"] / 2 / r["seconds"]

    if args.train_steps:
        config = ExperimentConfig.from_dict({"model": {"preset": args.preset},
                                             "data": vars(data_config)})
        from keras_transformer.runs.folder import with_vocab_sizes

        config = with_vocab_sizes(config, source_tokenizer, target_tokenizer)
        in_memory = list(batches.take(args.train_steps + 3))
        rate = time_training(config, in_memory, args.train_steps)
        print(f"training step, preset {args.preset!r}: {rate:,.0f} target tokens/s "
              f"({args.train_steps} steps); the cached pipeline delivers "
              f"{pipeline_target_rate / rate:,.0f}x that (goal >= 10x)")
    if args.stall_seconds:
        compare_autotuning(batches, args.stall_seconds)


if __name__ == "__main__":
    main()
