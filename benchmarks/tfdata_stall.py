"""The tf.data iterator-deletion stall that `compat.without_autotuning` avoids, on Multi30k train.

    python benchmarks/tfdata_stall.py [--data-dir DIR] [--vocab-dir DIR] [--pass-seconds 30]

For the training batches of `make_batches` as the package builds them (autotuning off) and with
tf.data autotuning turned back on, prints:
- input throughput: target tokens/s of a cached epoch read as fast as possible (one warm-up
  epoch that fills the cache, then the median of 3);
- the stall: one epoch read at a training-like pace (a pause after each batch, so the pass
  lasts about --pass-seconds) to its end, then the seconds `del iterator` takes.
On TensorFlow 2.21 the deletion waits for the autotuning thread's next wake-up; re-run this
after a TensorFlow upgrade to see whether `without_autotuning` is still needed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from keras_transformer.config import DATA_ENV, DataConfig  # noqa: E402
from keras_transformer.data import build_vocab, load_pairs, make_batches  # noqa: E402
from keras_transformer.tokenizers import load_tokenizers  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                        help=f"folder of the raw Multi30k files (default: ${DATA_ENV})")
    parser.add_argument("--vocab-dir", help="reuse/write the vocabulary here (default: a temp dir)")
    parser.add_argument("--pass-seconds", type=float, default=30.0,
                        help="how long the paced epoch lasts")
    parser.add_argument("--repeats", type=int, default=3, help="timed fast epochs per setting")
    return parser.parse_args()


def fast_epoch(batches: tf.data.Dataset) -> tuple[float, int]:
    """Seconds and target tokens of one epoch read as fast as possible."""
    tokens = 0
    start = time.perf_counter()
    for _, target_out in batches:
        tokens += int(tf.math.count_nonzero(target_out))
    return time.perf_counter() - start, tokens


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


def main():
    args = parse_args()
    if not args.data_dir:
        raise SystemExit(f"pass --data-dir or set ${DATA_ENV} to the Multi30k folder")
    data_config = DataConfig(dataset="multi30k", data_dir=args.data_dir, vocab_size=8000)
    vocab_dir = args.vocab_dir or tempfile.mkdtemp(prefix="vocab_")
    try:
        tokenizers = load_tokenizers(data_config, vocab_dir)
    except ValueError:
        tokenizers = build_vocab(data_config, vocab_dir)
    package = make_batches(load_pairs(data_config, "train"), *tokenizers, data_config,
                           training=True)
    autotuned = tf.data.Options()
    autotuned.autotune.enabled = True
    settings = {"package (autotuning off)": package,
                "autotuning on": package.with_options(autotuned)}

    print(f"tensorflow {tf.__version__}; Multi30k train, {data_config.tokens_per_batch} tokens "
          f"per batch, paced epoch of about {args.pass_seconds:.0f} s")
    print(f"{'pipeline':<26} {'target tok/s (median)':>22} {'paced epoch s':>14} "
          f"{'del iterator s':>15}")
    for name, batches in settings.items():
        fast_epoch(batches)  # warm-up: fills the cache
        timed = [fast_epoch(batches) for _ in range(args.repeats)]
        rate = statistics.median(tokens / seconds for seconds, tokens in timed)
        count = sum(1 for _ in batches)
        epoch, delete = paced_epoch_then_delete(batches, args.pass_seconds / count)
        print(f"{name:<26} {rate:>22,.0f} {epoch:>14.1f} {delete:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
