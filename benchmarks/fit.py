"""What a training run of an experiment costs on this machine, measured through the run itself.

    python benchmarks/fit.py --config experiments/wmt14_en_de_base.yaml --corpus DIR
                             [--vocab-dir DIR] [--steps 300] [--log-every 20]
                             [--set SECTION.KEY=VALUE ...] [--run-dir runs/fit/NAME] [--json FILE]

Trains --config on the local-files corpus --corpus (`{split}.{lang}.gz`, e.g. the SYNTHETIC
WMT14-shaped corpus of `benchmarks/make_corpus.py`, which measures cost, not quality) with
`keras-transformer train`'s own code (`training.train`: `model.fit` under the config's strategy,
its callbacks, checkpoints and validation loss) for one epoch of --steps optimizer steps, each of
`train.accumulate_steps` batches, validation BLEU off. --vocab-dir reuses a built vocabulary
(`keras-transformer build-vocab`, or `benchmarks/scale.py`'s); otherwise the run builds one.

Prints, for the run:

- the float32 and bfloat16 matmul peaks of this machine, measured in the same process before
  and after the run (`benchmarks/train.py`'s `measure_matmul_peak`); MFU divides by the larger;
- seconds per optimizer step and target tokens/s, read back from the run's own TensorBoard
  scalars (`logs/train_steps`, written every --log-every optimizer steps): the first window
  (tracing, the input pipeline filling) is left out, the median of the others is given;
- model FLOPs per target token (`benchmarks/train.py`'s count, padding excluded) over the first
  50 batches of the training stream, and the MFU against each measured peak;
- the peak resident memory of the process (ru_maxrss: the model, the optimizer state, the
  gradient accumulators, the activations and the input pipeline).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling benchmark scripts
from scale import corpus_overrides, load_sibling, machine  # noqa: E402

FLOP_SAMPLE_BATCHES = 50


def fit_config(args):
    """--config on --corpus, --set applied, trained for one epoch of --steps optimizer steps."""
    from keras_transformer.config import ExperimentConfig

    config = ExperimentConfig.from_yaml(
        args.config, [*corpus_overrides(args.corpus, args.vocab_dir), *(args.set or [])])
    train = dataclasses.replace(
        config.train, epochs=1, steps_per_epoch=args.steps,
        log_every_steps=args.log_every, validation_bleu_sentences=0)
    return dataclasses.replace(config, train=train)


def step_windows(log_dir: Path) -> list[dict]:
    """The `step_tokens_per_second` points of the run's TensorBoard folder, in step order:
    `{"step", "wall_time", "tokens_per_second"}`."""
    import tensorflow as tf

    points = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "step_tokens_per_second":
                    points[event.step] = {"step": event.step, "wall_time": event.wall_time,
                                          "tokens_per_second": float(
                                              tf.make_ndarray(value.tensor))}
    return [points[step] for step in sorted(points)]


def steady_rates(windows: list[dict]) -> dict:
    """Seconds per optimizer step and target tokens/s: medians over the windows after the
    first (which holds tracing and the input pipeline's start)."""
    if len(windows) < 3:
        raise SystemExit(f"fit.py: {len(windows)} TensorBoard points; raise --steps to at least "
                         "3 x --log-every")
    seconds = [(b["wall_time"] - a["wall_time"]) / (b["step"] - a["step"])
               for a, b in zip(windows, windows[1:])]
    return {"step_seconds": statistics.median(seconds),
            "target_tokens_per_second": statistics.median(
                w["tokens_per_second"] for w in windows[1:]),
            "windows": len(windows) - 1}


def flops_per_target_token(run, train_benchmark) -> float:
    """Model FLOPs of a training step per real target token (`benchmarks/train.py`'s count),
    over the first batches of the run's own training input (its tokenizers, buckets and batch
    size)."""
    from keras_transformer import data as data_lib

    config = run.config
    source, target = run.tokenizers()
    batches = data_lib.make_batches(data_lib.load_pairs(config.data, config.data.train_split),
                                    source, target, config.data, training=True)
    flops = tokens = 0.0
    for (source_ids, _), target_out in batches.take(FLOP_SAMPLE_BATCHES):
        target_out = target_out.numpy()
        flops += train_benchmark.flops_per_batch(config.model, source_ids.numpy(), target_out)
        tokens += float((target_out != 0).sum())
    return flops / tokens


def run_fit(args) -> dict:
    """Measures the peaks, trains, reads the run back; returns the figures."""
    from keras_transformer.training import runner as training
    from keras_transformer.runs.folder import Run

    train_benchmark = load_sibling("train")
    dtypes = ("float32", "bfloat16")
    # This machine's matmul speed drifts within the hour (experiments/log/2026-11-27.md): the
    # peak is the larger of a measurement before and one after the run, so that MFU errs low.
    def peak(dtype):
        return train_benchmark.measure_matmul_peak(dtype, repeats=args.peak_repeats)

    before = {dtype: peak(dtype) for dtype in dtypes}
    history = training.train(fit_config(args), args.run_dir, verbose=2, overwrite=True)
    measured = {dtype: [before[dtype], peak(dtype)] for dtype in dtypes}
    peaks = {dtype: max(values) for dtype, values in measured.items()}
    run = Run(args.run_dir)
    rates = steady_rates(step_windows(run.logs_dir / "train_steps"))
    flops = flops_per_target_token(run, train_benchmark)
    model = run.config.model
    achieved = rates["target_tokens_per_second"] * flops
    return {
        "machine": machine(), "argv": sys.argv, "config": args.config,
        "name": run.config.name, "layers": model.num_layers, "d_model": model.d_model,
        "vocab_size": model.target_vocab_size,
        "precision": training.resolve_precision(run.config.train.precision),
        "tokens_per_batch": run.config.data.tokens_per_batch,
        "accumulate_steps": run.config.train.accumulate_steps, "steps": args.steps,
        **rates,
        "flops_per_target_token": flops,
        "peak_flops": peaks, "peak_flops_before_after": measured,
        "mfu": {dtype: achieved / peak for dtype, peak in peaks.items()},
        "params": history.model.count_params(),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def report(result: dict) -> str:
    bfloat16_peaks = " and ".join(f"{peak / 1e12:.2f}"
                                  for peak in result["peak_flops_before_after"]["bfloat16"])
    return (f"{result['config']} ({result['name']}: {result['layers']} layers, d_model "
            f"{result['d_model']}, vocabulary {result['vocab_size']:,}, "
            f"{result['params'] / 1e6:.0f}M parameters), {result['precision']}, "
            f"{result['tokens_per_batch']}-token batches x {result['accumulate_steps']} per "
            f"optimizer step, {result['steps']} steps: {result['step_seconds']:.2f} s per step, "
            f"{result['target_tokens_per_second']:,.0f} target tokens/s (median of "
            f"{result['windows']} windows), {result['flops_per_target_token'] / 1e6:,.0f} MFLOP "
            f"per target token, MFU {100 * result['mfu']['bfloat16']:.0f}% of the measured "
            f"bfloat16 peak ({result['peak_flops']['bfloat16'] / 1e12:.2f} TFLOP/s, the larger "
            f"of {bfloat16_peaks} before and after the run; "
            f"{100 * result['mfu']['float32']:.0f}% of float32's "
            f"{result['peak_flops']['float32'] / 1e12:.2f}), peak {result['peak_mb']:,.0f} MB")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="an experiment YAML")
    parser.add_argument("--corpus", required=True, help="a local-files folder {split}.{lang}.gz")
    parser.add_argument("--vocab-dir", help="a built vocabulary to reuse")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--log-every", type=int, default=20,
                        help="optimizer steps per TensorBoard point (a timing window)")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="config overrides, after the corpus ones")
    parser.add_argument("--run-dir", default=str(HERE.parent / "runs" / "fit"),
                        help="the run folder (overwritten)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--peak-repeats", type=int, default=20,
                        help="2048 x 2048 matmuls timed per peak measurement (fewer: quicker, "
                             "less precise)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.log_every < 1 or args.peak_repeats < 1:
        parser.error("--steps, --log-every and --peak-repeats must be at least 1")
    if not Path(args.corpus).is_dir():
        parser.error(f"--corpus {args.corpus}: no such folder")
    return args


def main(argv=None) -> None:
    from keras_transformer.config import ConfigError

    args = parse_args(argv)
    print(f"# benchmarks/fit.py on {machine()}", flush=True)
    print(f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}", flush=True)
    try:
        result = run_fit(args)
    except ConfigError as error:
        raise SystemExit(f"fit.py: {error}") from None
    print(report(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
