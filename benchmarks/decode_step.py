"""Where the time of a decoding step goes at batch 1: the SavedModel's greedy loop against
CTranslate2's, one sentence a call, one thread each, in one run.

    python benchmarks/decode_step.py --run runs/NAME [--weights best] [--limit 200] [--repeats 3]

Prints for each runtime the sentences/s when test sentences are translated one at a time, and
a least-squares line through each call's seconds against its generated tokens (the output's
subwords plus END): its intercept is what a call costs besides its steps (tokenizing,
encoding, detokenizing, the call itself), its slope what a step costs. For the SavedModel's
greedy search:
- the ops its loop body runs per step (counted in the traced search, nested conditionals'
  larger branch included);
- what one op costs this process's executor when it computes almost nothing: a
  `tf.while_loop` whose body is a chain of that many element-wise ops on a `[1, d_model]`
  tensor, timed per step as the decoding is;
- their product over the step's cost: the share of a step that is per-op work rather than
  arithmetic.
Each call's time is the median of `--repeats` timed passes after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--weights", default="best", help="best, last, or a weight file")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_DATA"),
                        help="raw Multi30k folder (default: $KERAS_TRANSFORMER_DATA)")
    parser.add_argument("--limit", type=int, default=200, help="first N test sentences")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("no data folder: pass --data-dir or set KERAS_TRANSFORMER_DATA")
    return args


def body_ops(graph_def, body: str) -> int:
    """The ops of function `body` of `graph_def`'s library, each conditional (`If`,
    `StatelessIf`) counted as its larger branch's ops, recursively."""
    functions = {function.signature.name: function for function in graph_def.library.function}

    def count(name: str) -> int:
        total = 0
        for node in functions[name].node_def:
            if node.op in ("If", "StatelessIf"):
                total += 1 + max(count(node.attr[branch].func.name)
                                 for branch in ("then_branch", "else_branch"))
            else:
                total += 1
        return total

    return count(body)


def loop_bodies(graph_def) -> list[str]:
    """The body function of every `While` op of `graph_def` (its graph, then its functions), in
    order."""
    nodes = [*graph_def.node, *(node for function in graph_def.library.function
                                for node in function.node_def)]
    return [node.attr["body"].func.name for node in nodes
            if node.op in ("While", "StatelessWhile")]


def per_op_seconds(ops: int, width: int, steps: int = 2000) -> float:
    """Seconds per op of a `tf.while_loop` of `steps` iterations whose body is a chain of `ops`
    element-wise ops (`tf.sin`) on a `[1, width]` float32 tensor: the executor's cost of an op
    that computes almost nothing."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def loop(x):
        def body(step, x):
            for _ in range(ops):
                x = tf.sin(x)
            return step + 1, x

        return tf.while_loop(lambda step, _: step < steps, body, (tf.constant(0), x))[1]

    x = tf.zeros([1, width])
    loop(x)  # trace and warm up
    start = time.perf_counter()
    loop(x).numpy()
    return (time.perf_counter() - start) / (steps * ops)


def per_call_seconds(calls: list, repeats: int) -> list[float]:
    """Each call's median seconds over `repeats` passes over all of them, after a warm-up pass."""
    for call in calls:
        call()
    seconds = [[] for _ in calls]
    for _ in range(repeats):
        for index, call in enumerate(calls):
            start = time.perf_counter()
            call()
            seconds[index].append(time.perf_counter() - start)
    return [statistics.median(row) for row in seconds]


def fit_line(tokens: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of seconds against tokens."""
    mean_x, mean_y = statistics.fmean(tokens), statistics.fmean(seconds)
    spread = sum((x - mean_x) ** 2 for x in tokens)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(tokens, seconds)) / spread
    return mean_y - slope * mean_x, slope


def main(argv=None) -> int:
    args = parse_args(argv)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from keras_transformer.config import ConfigError
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator
    from keras_transformer.export.savedmodel import export_translator, load_translator
    from keras_transformer.runs.folder import Run
    from keras_transformer.decoding.translator import translator_from_run

    try:
        translator = translator_from_run(args.run, weights=args.weights)
    except ConfigError as error:
        raise SystemExit(f"decode_step.py: {error}") from None
    from decode import read_sentences  # the sibling benchmark's, on sys.path as a script

    sentences = read_sentences(args.data_dir, Run(args.run).config.data.source_lang, args.limit)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                if line.startswith("Model name")), "unknown CPU")
    print(f"run {args.run} ({args.weights}); {len(sentences)} sentences one at a time; 1 core, "
          f"one thread; median of {args.repeats} passes; {cpu}", flush=True)

    concrete = translator._traced["greedy"].get_concrete_function(
        *_search_arguments(translator, sentences[0]))
    graph_def = concrete.graph.as_graph_def()
    bodies = loop_bodies(graph_def)
    ops = body_ops(graph_def, bodies[0])

    with tempfile.TemporaryDirectory(prefix="decode_step_") as root:
        saved = load_translator(export_translator(translator, Path(root) / "sm" / "1",
                                                  warmup_sentences=None))
        ct2 = CTranslate2Translator(export_ctranslate2(
            translator.model, translator.source_tokenizer, translator.target_tokenizer,
            translator.decode_config, Path(root) / "ct2",
            max_source_length=translator.max_source_length), inter_threads=1, intra_threads=1)
        batches = [tf.constant([sentence]) for sentence in sentences]
        outputs = [saved.translate_greedy(batch)["translation"].numpy()[0] for batch in batches]
        # subwords + END of each output
        tokens = [int(n) - 1 for n in translator.target_tokenizer.tokenize(
            tf.constant(outputs)).row_lengths().numpy()]
        rows = {
            "savedmodel": per_call_seconds(
                [lambda b=b: saved.translate_greedy(b) for b in batches], args.repeats),
            "ct2_float32": per_call_seconds(
                [lambda s=s: ct2.translate_greedy([s]) for s in sentences], args.repeats),
        }
    width = translator.model.config.d_model
    op_cost = statistics.median(per_op_seconds(ops, width) for _ in range(args.repeats))
    lines = {}
    for name, seconds in rows.items():
        lines[name] = fit_line(tokens, seconds)
        print(f"{name:<12} {len(sentences) / sum(seconds):8.1f} sentences/s; a call: "
              f"{1000 * lines[name][0]:6.3f} ms + {1000 * lines[name][1]:6.3f} ms per token")
    print(f"savedmodel / ct2_float32 speed: "
          f"{sum(rows['ct2_float32']) / sum(rows['savedmodel']):.2f}x; per call "
          f"{lines['ct2_float32'][0] / lines['savedmodel'][0]:.2f}x, per token "
          f"{lines['ct2_float32'][1] / lines['savedmodel'][1]:.2f}x")
    step = lines["savedmodel"][1]
    print(f"greedy loop body: {ops} ops per step; an op of nothing ([1, {width}]): "
          f"{1e6 * op_cost:.2f} us; {ops} of them: {1000 * ops * op_cost:.3f} ms, "
          f"{100 * ops * op_cost / step:.0f}% of the SavedModel's step")
    return 0


def _search_arguments(translator, sentence: str):
    """The arguments `Translator.search` passes to the traced greedy search for one
    sentence."""
    import tensorflow as tf

    source_ids = translator.source_ids(tf.constant([sentence]))
    caps = tf.constant([int(source_ids.shape[1]) + translator.decode_config.max_extra_length])
    prefix = tf.zeros([1, 0], tf.int32)
    return source_ids, caps, tf.reduce_max(caps), {"prefix_ids": prefix}


if __name__ == "__main__":
    sys.exit(main())
