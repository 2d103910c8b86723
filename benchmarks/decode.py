"""Translation speed on Multi30k test_2016_flickr: the tf.text tutorial's decoding vs cached
batched greedy and beam search, eager Translator and exported SavedModel, with and without XLA.

    python benchmarks/decode.py --run runs/NAME [--limit 1000] [--intra-op 1]
    python benchmarks/decode.py --model saved_models/NAME/1       # SavedModel figures only

Methods (sentences/s and target tokens/s, ratio to the tutorial's method):
    tutorial         no cache, one sentence at a time, the whole prefix re-run every step, argmax,
                     inside tf.function (the tf.text tutorial's Translator, with our caps)
    greedy[_xla]     Translator.translate_greedy, batches of --batch-size sentences of similar
                     length (cached decoder), optionally compiled with XLA
    beam[_xla]       Translator.translate_beam with --beam (alpha from the run's config)
    saved_greedy     the exported SavedModel's translate_greedy (the run is exported to a temp
    saved_beam       folder unless --model is given) and serving_default (beam)
    saved_*_xla      the same, exported with jit_compile (`keras-transformer export --xla`)

Target tokens are the output's subwords plus END. Every timed pass follows an untimed warm-up
pass over the same sentences (tracing; XLA compiles once per bucketed shape), except the
tutorial's, which is warmed up on 3 sentences. The tutorial and cached greedy outputs must be
identical (same model, same argmax, same length caps).

Measured 2026-11-23 on 2 CPU cores (idle, batch 64), the 50-epoch Multi30k de-en model of
experiments/RESULTS.md, 1000 sentences, through the SavedModel, sentences/s (greedy / beam 4):
defaults 438 / 129; --workers 2 --intra-op 1 (two batches in flight, one thread per op) 862 /
189, and 861 / 200 with --batch-size 32. Figures and their commands are in experiments/RESULTS.md.
Beam cost grows with the output buffer under XLA, whose caches have the fixed length source + 50
(without XLA they grow one position per step).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

METHODS = ("tutorial", "greedy", "greedy_xla", "beam", "beam_xla", "saved_greedy", "saved_beam",
           "saved_greedy_xla", "saved_beam_xla")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="training run folder")
    source.add_argument("--model", help="exported SavedModel version folder (saved_* only)")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_DATA"),
                        help="raw Multi30k folder (default: $KERAS_TRANSFORMER_DATA)")
    parser.add_argument("--source-lang", help="default: the run's data.source_lang (de)")
    parser.add_argument("--limit", type=int, default=1000, help="first N test sentences")
    parser.add_argument("--tutorial-limit", type=int, default=None,
                        help="time the tutorial's method on the first N only (default: all)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1,
                        help="batches in flight at once (as concurrent server requests)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--intra-op", type=int, default=0,
                        help="tf.config.threading intra-op threads (0: TensorFlow's default)")
    parser.add_argument("--inter-op", type=int, default=0, help="inter-op threads (0: default)")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    if args.model:  # an export is XLA-compiled or not: its name says nothing, time it once
        args.methods = [m for m in ("saved_greedy", "saved_beam") if m in args.methods]
    return args


def read_sentences(data_dir, lang: str, limit: int) -> list[str]:
    if not data_dir:
        sys.exit("decode.py: no data folder: pass --data-dir or set KERAS_TRANSFORMER_DATA")
    path = Path(data_dir) / f"test_2016_flickr.{lang}.gz"
    if not path.is_file():
        sys.exit(f"decode.py: {path} not found (raw Multi30k files expected in {data_dir})")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def tutorial_function(translator):
    """The tf.text tutorial's `Translator.__call__`, with the same truncation and length caps as
    ours: one sentence (a scalar string), a Python loop that autograph turns into a
    `tf.while_loop`, the whole model re-run on the growing prefix each step."""
    import tensorflow as tf

    from keras_transformer.tokenizers import END_ID, START_ID

    model = translator.model

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def translate(sentence):
        source_ids, length_caps, _ = translator._encode_inputs(sentence[tf.newaxis])
        output = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
        output = output.write(0, START_ID)
        for i in tf.range(length_caps[0]):
            prefix = output.stack()[tf.newaxis]  # [1, i + 1]
            logits = model((source_ids, prefix), training=False)[:, -1]  # [1, vocab]
            next_id = tf.argmax(logits, axis=-1, output_type=tf.int32)[0]
            output = output.write(i + 1, next_id)
            if next_id == END_ID:
                break
        ids = output.stack()[tf.newaxis, 1:]  # [1, len]
        return translator.target_tokenizer.detokenize(ids)[0]

    return translate


def time_batched(translate, sentences, batch_size, workers=1, warm_up=True):
    """-> (outputs in input order, seconds of the timed pass)."""
    from keras_transformer.translator import translate_texts

    if warm_up:
        translate_texts(translate, sentences, batch_size=batch_size, workers=workers)
    start = time.perf_counter()
    outputs = translate_texts(translate, sentences, batch_size=batch_size, workers=workers)
    return outputs, time.perf_counter() - start


def time_tutorial(translate, sentences):
    import tensorflow as tf

    for sentence in sentences[:3]:
        translate(tf.constant(sentence))
    start = time.perf_counter()
    outputs = [translate(tf.constant(s)).numpy().decode("utf-8") for s in sentences]
    return outputs, time.perf_counter() - start


def count_target_tokens(tokenizer, outputs) -> int:
    """Subwords of the outputs plus one END each (tokenize adds START and END)."""
    import tensorflow as tf

    if not outputs:
        return 0
    return int(tf.reduce_sum(tokenizer.tokenize(tf.constant(outputs)).row_lengths()) - len(
        outputs))


def configure_threads(args):
    import tensorflow as tf

    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    return (tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads())


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    threads = configure_threads(args)
    import tensorflow_text  # noqa: F401

    from keras_transformer.export import export_translator, load_translator
    from keras_transformer.translator import Translator

    translator = target_tokenizer = None
    source_lang = args.source_lang or "de"
    if args.run:
        from keras_transformer.runs import Run
        from keras_transformer.translator import translator_from_run

        config = Run(args.run).config
        source_lang = args.source_lang or config.data.source_lang
        translator = translator_from_run(args.run, beam_size=args.beam)
        target_tokenizer = translator.target_tokenizer
    sentences = read_sentences(args.data_dir, source_lang, args.limit)
    print(f"model: {args.run or args.model}; {len(sentences)} sentences of test_2016_flickr."
          f"{source_lang}; batch {args.batch_size}; workers {args.workers}; beam {args.beam}; "
          f"intra-op threads "
          f"{threads[0] or 'default'}, inter-op {threads[1] or 'default'}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    if translator is not None:
        c = translator.model.config
        print(f"model size: {c.num_layers} layers, d_model {c.d_model}, dff {c.dff}, "
              f"{c.num_heads} heads, vocab {c.target_vocab_size}; alpha "
              f"{translator.decode_config.alpha}", flush=True)

    results = {}  # method -> (outputs, seconds, sentences)
    for method in args.methods:
        if method == "tutorial":
            subset = sentences[:args.tutorial_limit] if args.tutorial_limit else sentences
            outputs, seconds = time_tutorial(tutorial_function(translator), subset)
            results[method] = (outputs, seconds, len(subset))
        elif method in ("greedy", "greedy_xla", "beam", "beam_xla"):
            xla = method.endswith("_xla")
            module = translator if not xla else Translator(
                translator.model, translator.source_tokenizer, translator.target_tokenizer,
                translator.decode_config, jit_compile=True)
            function = module.translate_greedy if method.startswith("greedy") else (
                module.translate_beam)
            outputs, seconds = time_batched(function, sentences, args.batch_size, args.workers)
            results[method] = (outputs, seconds, len(sentences))
        else:
            outputs, seconds = time_saved_model(args, translator, sentences, method,
                                                export_translator, load_translator)
            results[method] = (outputs, seconds, len(sentences))
        print(f"  {method}: {results[method][2] / results[method][1]:.1f} sentences/s",
              file=sys.stderr, flush=True)

    if target_tokenizer is None:
        target_tokenizer = _tokenizer_of_saved_model(args.model)
    print_table(results, target_tokenizer)
    check_identical(results)
    return 0


def time_saved_model(args, translator, sentences, method, export_translator, load_translator):
    """Exports (once per XLA setting) the run's translator and times the loaded signature."""
    xla = method.endswith("_xla")
    if args.model:
        path = args.model
    else:
        exports = time_saved_model.__dict__.setdefault("exports", {})
        if xla not in exports:
            from keras_transformer.translator import Translator

            module = translator if not xla else Translator(
                translator.model, translator.source_tokenizer, translator.target_tokenizer,
                translator.decode_config, jit_compile=True)
            exports[xla] = Path(tempfile.mkdtemp(prefix="decode_bench_")) / "1"
            export_translator(module, exports[xla], warmup_sentences=None)
        path = exports[xla]
    loaded = load_translator(path)
    name = "translate_greedy" if method.startswith("saved_greedy") else "serving_default"
    signature = loaded.signatures[name]
    outputs, seconds = time_batched(lambda batch: signature(source=batch), sentences,
                                    args.batch_size, args.workers)
    return outputs, seconds


def _tokenizer_of_saved_model(path):
    """Counts target tokens with the exported model's own tokenizer."""
    from keras_transformer.export import load_translator

    loaded = load_translator(path)
    return loaded.target_tokenizer


def print_table(results, tokenizer):
    base = results.get("tutorial")
    base_rate = base[2] / base[1] if base else None
    header = (f"{'method':<18}{'sentences/s':>12}{'tokens/s':>11}{'seconds':>9}"
              f"{'x tutorial':>12}")
    print(header)
    print("-" * len(header))
    for method, (outputs, seconds, count) in results.items():
        rate = count / seconds
        tokens = count_target_tokens(tokenizer, outputs) / seconds
        versus = f"{rate / base_rate:.1f}" if base_rate else "-"
        print(f"{method:<18}{rate:>12.1f}{tokens:>11.0f}{seconds:>9.2f}{versus:>12}")


def check_identical(results):
    """The tutorial's method and cached greedy must give the same strings."""
    if "tutorial" not in results:
        return
    tutorial = results["tutorial"][0]
    for method in ("greedy", "greedy_xla", "saved_greedy", "saved_greedy_xla"):
        if method in results:
            other = results[method][0][:len(tutorial)]
            differ = [i for i, (a, b) in enumerate(zip(tutorial, other)) if a != b]
            status = "identical" if not differ else f"{len(differ)} differ (first: {differ[:5]})"
            print(f"tutorial vs {method}: {len(tutorial)} outputs {status}")


if __name__ == "__main__":
    sys.exit(main())
