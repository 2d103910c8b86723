"""The `keras-transformer` command line: one subcommand per stage of the pipeline.

    keras-transformer --version
    keras-transformer info [--preset NAME]
    keras-transformer build-vocab --config experiments/NAME.yaml [--set k=v] --output DIR
    keras-transformer data-stats --config experiments/NAME.yaml [--set k=v] --vocab DIR
    keras-transformer train --config experiments/NAME.yaml [--set k=v ...] --output runs/NAME
    keras-transformer average --run runs/NAME --last N [--upper-bound EPOCH]
    keras-transformer export --run runs/NAME --output saved_models/NAME [--version N] [--beam K]
    keras-transformer export --run runs/NAME --format ctranslate2 [--quantization int8] --output DIR
    keras-transformer translate --model saved_models/NAME/1 [--beam K | --greedy] < in > out
    keras-transformer translate --model M --sampling [--sampling-topk K] [--seed S] \
        --source FILE --output FILE [--shard I/N]   (a corpus: resumable, sharded)
    keras-transformer evaluate --model saved_models/NAME/1 --source FILE --reference FILE
    keras-transformer score --model saved_models/NAME/1 --source FILE --target FILE > scores.tsv
    keras-transformer tune-search --run runs/NAME --source VAL --reference VAL --beam 4,5 --alpha 0.6,1

TensorFlow is imported only when a subcommand runs (so `--help` and `--version` answer at once),
and its start-up logging is silenced unless `--verbose` is given. A user's mistake (a missing
file, a bad config value, bad data) is one line on stderr and exit code 2; a traceback means a
bug, and `--verbose` shows the traceback of every error.

`translate` and `evaluate` read their input as bytes: bytes that are not UTF-8 become U+FFFD
(with a warning line naming the file and line), CR before LF is dropped, and every input line,
empty or not, gives exactly one output line.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import warnings

from keras_transformer import __version__
from keras_transformer.config import EXPORT_FORMATS, STOPPING_CHOICES, ConfigError
from keras_transformer.data.text_io import DataError, first_line, one_line

# Errors that are the user's to fix: printed as one line, exit code 2. OSError holds
# FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError and a SavedModel whose
# saved_model.pb does not parse.
USER_ERRORS = (ConfigError, DataError, OSError)
MAX_WARNINGS = 10  # invalid UTF-8 lines listed one by one on stderr, then counted


def _info(args) -> int:
    """Prints library versions, visible devices and the parameter counts of presets."""
    import keras
    import tensorflow as tf
    import tensorflow_text

    import keras_transformer
    from keras_transformer.config import ModelConfig, preset_names
    from keras_transformer.model import count_parameters
    from keras_transformer.training.runner import resolve_precision

    if args.model:
        return _model_info(args.model)
    names = args.preset or preset_names()
    presets = [ModelConfig.from_preset(name) for name in names]  # checked before any output
    print(f"keras-transformer {keras_transformer.__version__}")
    print(f"tensorflow {tf.__version__}, tensorflow-text {tensorflow_text.__version__}, "
          f"keras {keras.__version__}")
    for device in tf.config.list_physical_devices():
        print(f"device {device.device_type}: {device.name}")
    print(f"train.precision auto: {resolve_precision('auto')}")
    for name, config in zip(names, presets):
        try:
            parameters = count_parameters(config)
        except (MemoryError, tf.errors.ResourceExhaustedError):
            raise ConfigError(f"preset {name}: too large to build in this machine's memory "
                              f"(d_model {config.d_model}, dff {config.dff}, "
                              f"{config.num_layers} layers)") from None
        print(f"preset {name}: {config.num_layers} layers, d_model {config.d_model}, "
              f"dff {config.dff}, {config.num_heads} heads, share_embeddings "
              f"{config.share_embeddings}, vocab {config.source_vocab_size}/"
              f"{config.target_vocab_size}: {parameters:,} parameters")
    return 0


def _model_info(model_dir) -> int:
    import json

    from keras_transformer.export.savedmodel import read_provenance

    print(json.dumps(read_provenance(model_dir), indent=2))
    return 0


def _load_config(args):
    from keras_transformer.config import ExperimentConfig

    return ExperimentConfig.from_yaml(args.config, args.set or [])


def _build_vocab(args) -> int:
    from keras_transformer.data.corpora import build_vocab
    from keras_transformer.data.tokenizers import META_FILE
    from keras_transformer.runs.files import check_writable_folder

    config = _load_config(args)
    check_writable_folder(args.output, "--output")
    if os.path.exists(os.path.join(args.output, META_FILE)):
        raise ConfigError(f"--output {args.output} already holds a vocabulary (a run's weights "
                          "fit only their own): choose another folder, or delete it first")
    source, target = build_vocab(config.data, args.output)
    print(f"wrote {config.data.tokenizer} vocabulary to {args.output}: source "
          f"{source.vocab_size}, target {target.vocab_size} tokens")
    return 0


def _data_stats(args) -> int:
    from keras_transformer.data.stats import data_stats

    print(format_data_stats(data_stats(_load_config(args).data, args.vocab)))
    return 0


def partial_line(partial: int, batches: int, target_share: float, carried: bool) -> str:
    """What a pass's partial batches (each length bucket's last, smaller one) take."""
    training = ("training carries their pairs into the next pass instead "
                "(data.carry_remainders)" if carried else "training makes them too "
                "(data.carry_remainders is off)")
    return (f"{partial} of the {batches} batches are a length bucket's last, smaller batch "
            f"({partial / max(batches, 1):.1%} of the steps, {target_share:.1%} of the target "
            f"tokens); {training}")


def format_data_stats(stats: dict) -> str:
    """A human-readable report of `data_stats`."""
    lines = [f"{stats['dataset']} {stats['direction']}, {stats['tokenizer']} vocabulary "
             f"(source {stats['vocab_size']['source']}, target {stats['vocab_size']['target']})"]
    for split, entry in stats["splits"].items():
        dropped = ", ".join(f"{n} {reason}" for reason, n in entry["dropped"].items())
        lines.append(f"\n[{split}] {entry['pairs']} pairs: {entry['kept']} kept, dropped {dropped}")
        for side in ("source", "target"):
            pct = " ".join(f"p{p}={v}" for p, v in entry[f"{side}_length"].items())
            lines.append(f"  {side} tokens (with START/END): {pct}; "
                         f"unknown-token rate {entry[f'{side}_unk_rate']:.4%}")
        for key, title in (("batches", "bucketed batches"), ("fixed_64_batches", "64-pair batches")):
            if key in entry:
                b = entry[key]
                budget = f", budget {b['tokens_per_batch']}" if "tokens_per_batch" in b else ""
                lines.append(
                    f"  {title}: {b['batches']} batches in {b['shapes']} shapes, "
                    f"{b['mean_pairs_per_batch']:.1f} pairs, {b['mean_source_tokens']:.0f} source / "
                    f"{b['mean_target_tokens']:.0f} target tokens per batch (max padded "
                    f"{b['max_padded_tokens']}{budget}); padding {b['source_padding']:.1%} source, "
                    f"{b['target_padding']:.1%} target")
                if "partial_batches" in b:
                    lines.append("    " + partial_line(b["partial_batches"], b["batches"],
                                                     b["partial_target_share"],
                                                     stats["carry_remainders"]))
    for entry in stats.get("corpora", ()):
        dropped = ", ".join(f"{n} {reason}" for reason, n in entry["dropped"].items())
        tag = f", tag {entry['tag']}" if entry["tag"] else ""
        lines.append(f"\n[corpus {entry['name']}] weight {entry['weight']:g}{tag}: "
                     f"{entry['share']:.1%} of the training batches")
        lines.append(f"  {entry['pairs']} pairs: {entry['kept']} kept, dropped {dropped}; "
                     f"{entry['source_tokens']} source / {entry['target_tokens']} target tokens "
                     f"in {entry['batches']} batches")
        lines.append("  " + partial_line(entry["partial_batches"], entry["batches"],
                                         entry["partial_target_tokens"]
                                         / max(entry["target_tokens"], 1),
                                         stats["carry_remainders"]))
    return "\n".join(lines)


def _train(args) -> int:
    from keras_transformer.training import runner as training

    if args.logical_cpus:
        training.split_cpu(args.logical_cpus)
    config = _load_config(args)
    if args.init_from:
        config = dataclasses.replace(config, train=dataclasses.replace(
            config.train, init_from=args.init_from))
    progress = args.progress
    if progress is None:  # a bar's carriage returns and colours make no lines in a log file
        progress = 1 if sys.stdout.isatty() else 2
    history = training.train(config, args.output, verbose=progress, overwrite=args.overwrite)
    if history is None:  # finished before: train said so
        return 0
    print(f"keras-transformer train: finished {args.output}: {_final_figures(history.history)}")
    return 0


def _final_figures(history: dict) -> str:
    """The figures of a run's last epoch; when the time budget cut that epoch short (under
    half the target tokens of the one before), its training loss and accuracy are a few steps'
    and those of the last full epoch are given instead."""
    final = {key: round(values[-1], 4) for key, values in history.items()}
    tokens = history.get("target_tokens", [])
    if len(tokens) >= 2 and tokens[-1] < 0.5 * tokens[-2]:
        epoch = len(tokens) - 1  # the previous, full epoch (counted from 1 among these)
        for key, values in history.items():
            if not key.startswith("val_") and key not in ("training_minutes",):
                final[key] = round(values[-2], 4)
        return f"{final} (training figures of the last full epoch, {epoch} of these)"
    return str(final)


def _average(args) -> int:
    from keras_transformer.runs.folder import Run

    path = Run(args.run_dir).average(args.last, args.output, upper_bound=args.upper_bound)
    bound = "" if args.upper_bound is None else f" up to epoch {args.upper_bound}"
    print(f"wrote the average of the last {args.last} checkpoints{bound} to {path}")
    return 0


def _export(args) -> int:
    from keras_transformer.export.savedmodel import RequestBatching, export_run

    batching = None if args.batching is None else RequestBatching(num_batch_threads=args.batching)
    path = export_run(args.run_dir, args.output, version=args.version, weights=args.weights,
                      beam_size=args.beam, alpha=args.alpha,
                      format=args.format, quantization=args.quantization, batching=batching,
                      case_folding=True if args.case_folding else None)
    print(f"exported {args.run_dir} to {path}")
    return 0


SAMPLING_FLAGS = {"sampling_topk": "--sampling-topk", "sampling_topp": "--sampling-topp",
                  "sampling_temperature": "--sampling-temperature"}


def _search_name(args) -> str:
    return "greedy" if args.greedy else "sampling" if args.sampling else "beam"


def _sampling_settings(args) -> dict:
    """The --sampling-* values given: `{decode setting: value}`."""
    given = {key: getattr(args, key) for key in SAMPLING_FLAGS if getattr(args, key) is not None}
    if given and not args.sampling:
        raise ConfigError(f"{SAMPLING_FLAGS[next(iter(given))]} is for --sampling")
    return given


def _translate_function(args):
    """The `string [batch] -> {"translation": ...}` function chosen by --model/--run and
    --beam/--greedy/--sampling (with --sampling: `(string [batch], seeds int64 [batch]) -> ...`).
    An exported model's beam size and sampling settings are fixed at export: --beam and
    --sampling-* must match them (CTranslate2 exports take any)."""
    sampling = _sampling_settings(args)
    if args.workers > 1:
        _one_thread_per_op(args.workers)
    module = _translator_module(args, **sampling)
    if getattr(args, "prefix", None) is not None:  # translate's, not evaluate's
        return _prefix_function(args, module)
    if not args.run_dir:
        _check_exported_beam(args, module)
        if args.sampling and hasattr(module, "sample_ids"):  # CTranslate2: settings per call
            names = {"sampling_topk": "top_k", "sampling_topp": "top_p",
                     "sampling_temperature": "temperature"}
            options = {names[key]: value for key, value in sampling.items()}
            # CTranslate2 seeds a call, not a sentence: the batch's first seed.
            return lambda batch, seeds: module.translate_sampling(batch, int(seeds[0]),
                                                                  **options)
        if args.sampling:
            _check_exported_sampling(args.model, module, sampling)
    name = f"translate_{_search_name(args)}"
    # The closure keeps `module` alive: a tf.function bound to a collected module fails, and a
    # loaded SavedModel's variables are deleted with it.
    return lambda *inputs: getattr(module, name)(*inputs)


def _exported_beam_size(module) -> int:
    """The beam size an export (SavedModel or CTranslate2) was made with."""
    return int(module.translate_nbest(_strings(["."]))["scores"].shape[1])


def _check_exported_beam(args, module) -> None:
    """ConfigError if --beam differs from the beam size the export of --model was made with:
    its beam searches (translate_beam, translate_nbest, translate_prefix) have it fixed."""
    if args.run_dir or args.beam is None or args.greedy:
        return
    exported = _exported_beam_size(module)
    if args.beam != exported:
        raise ConfigError(f"--beam {args.beam}: {args.model} was exported with beam size "
                          f"{exported}; export again with --beam {args.beam}, or use --run")


def _prefix_function(args, module):
    """With --prefix: `(string [batch], prefixes string [batch]) -> {"translation", ...}`."""
    if args.sampling:
        raise ConfigError("--prefix is for beam or greedy search, not --sampling")
    if args.run_dir:
        search = _search_name(args)
        return lambda batch, prefixes: module.translate(batch, search, prefix=prefixes)
    _check_exported_beam(args, module)
    if hasattr(module, "sample_ids"):  # CTranslate2
        return lambda batch, prefixes: module.translate_prefix(batch, prefixes,
                                                               greedy=args.greedy)
    if args.greedy:
        raise ConfigError("--prefix with an exported SavedModel is its translate_prefix "
                          "signature, beam search: drop --greedy, or use --run")
    if not hasattr(module, "translate_prefix"):
        raise ConfigError(f"{args.model} was exported before translate_prefix existed; export "
                          "it again, or use --run")
    return lambda batch, prefixes: module.translate_prefix(batch, prefixes)


def _one_thread_per_op(workers: int) -> None:
    """With `workers` batches in flight, each op runs on one thread (`workers` at once), as
    `benchmarks/decode.py` measures the 2-core rows: the ops of two batches on two threads each
    oversubscribe the cores. A process whose TensorFlow runtime already runs keeps its
    settings."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(workers)
    except RuntimeError:  # set once per process, before the first op
        pass


def _check_exported_sampling(model_dir, module, sampling: dict) -> None:
    """ConfigError unless the SavedModel has `translate_sampling` with the --sampling-* values
    given (its settings are fixed at export, recorded in its provenance)."""
    from keras_transformer.export.savedmodel import read_provenance

    if not hasattr(module, "translate_sampling"):
        raise ConfigError(f"--sampling: {model_dir} was exported before sampling existed; "
                          "export it again, or use --run")
    exported = read_provenance(model_dir).get("search", {})
    for key, value in sampling.items():
        if exported.get(key) != value:
            raise ConfigError(f"{SAMPLING_FLAGS[key]} {value}: {model_dir} was exported with "
                              f"{key} {exported.get(key)}; export again with --set "
                              f"decode.{key}={value}, or use --run")


def _strings(lines):
    import tensorflow as tf

    return tf.constant(lines, tf.string)


class _Progress:
    """Progress on stderr: `translated 340/1000 sentences (34%), 120.5/s, 0:00:05 left`; the
    rate counts the sentences of this run (not those a resumed job had already translated).
    On a terminal one line redrawn in place; into a file or a pipe (`terminal` False) a plain
    line at each tenth of the work and at the end."""

    def __init__(self, total: int, stream=None, done: int = 0, terminal: bool | None = None):
        import time

        self.total, self.done, self.first, self.clock = total, done, done, time.perf_counter
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.start = self.clock()
        self.shown_tenth = 10 * done // max(total, 1)

    def __call__(self, count: int) -> None:
        self.show(self.done + count)

    def show(self, done: int) -> None:
        import datetime

        self.done = done
        rate = (done - self.first) / max(self.clock() - self.start, 1e-9)
        percent = 100 * done // max(self.total, 1)
        left = ("?" if rate <= 0 else
                str(datetime.timedelta(seconds=round((self.total - done) / rate))))
        line = f"translated {done}/{self.total} sentences ({percent}%), {rate:.1f}/s, {left} left"
        if self.terminal:
            end = "\n" if done >= self.total else ""
            print(f"\r{line}", end=end, file=self.stream, flush=True)
            return
        tenth = 10 * done // max(self.total, 1)
        if tenth > self.shown_tenth or done >= self.total:
            self.shown_tenth = tenth
            print(line, file=self.stream, flush=True)


def _translate_lines(args, lines):
    from keras_transformer.decoding.texts import translate_texts

    prefixes = None
    if getattr(args, "prefix", None) is not None:
        prefixes = _read_lines(args.prefix, args.command)
        if len(prefixes) != len(lines):
            raise ConfigError(f"--prefix {args.prefix} has {len(prefixes)} lines, the input "
                              f"{len(lines)}: one prefix a line (empty: none)")
    translate = _translate_function(args)
    progress = _Progress(len(lines)) if not args.quiet else None
    seeds = [args.seed + line for line in range(len(lines))] if args.sampling else None
    return translate_texts(translate, lines, batch_size=args.batch_size, progress=progress,
                           workers=args.workers, seeds=seeds, prefixes=prefixes)


def _read_lines(path, command: str) -> list[str]:
    """The lines of a plain or .gz file (see `_read_user_lines`); DataError if it has none."""
    if os.path.isdir(path):
        raise DataError(f"{path} is a folder, not a text file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    lines = _read_user_lines(path, command)
    if not lines:
        raise DataError(f"{path}: empty file, no lines")
    return lines


def _read_user_lines(path, command: str) -> list[str]:
    """`text_io.read_user_lines(path)` (None: standard input), its warnings about bytes that are
    not UTF-8 printed as one line each on stderr (`keras-transformer translate: warning:
    <stdin>:3: not valid UTF-8 ...`), at most MAX_WARNINGS, then their count."""
    from keras_transformer.data.text_io import InvalidUtf8Warning, read_user_lines

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InvalidUtf8Warning)
        lines = read_user_lines(path)
    invalid = [w for w in caught if issubclass(w.category, InvalidUtf8Warning)]
    for warning in invalid[:MAX_WARNINGS]:
        print(f"keras-transformer {command}: warning: {warning.message}", file=sys.stderr)
    if len(invalid) > MAX_WARNINGS:
        print(f"keras-transformer {command}: warning: {len(invalid) - MAX_WARNINGS} more lines "
              f"of {'<stdin>' if path is None else path} not valid UTF-8", file=sys.stderr)
    for warning in caught:
        if warning not in invalid:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
    return lines


def _write_lines(lines) -> None:
    """Writes each item as exactly one line (`text_io.one_line`) to stdout, in UTF-8 whatever
    the locale's encoding."""
    data = "".join(one_line(line) + "\n" for line in lines)
    sys.stdout.flush()
    if hasattr(sys.stdout, "buffer"):
        sys.stdout.buffer.write(data.encode("utf-8"))
        sys.stdout.buffer.flush()
    else:  # a text stream without bytes underneath (e.g. io.StringIO)
        sys.stdout.write(data)


def _read_aligned(source_path, reference_path, command: str) -> tuple[list[str], list[str]]:
    sources, references = _read_lines(source_path, command), _read_lines(reference_path, command)
    if len(sources) != len(references):
        raise ConfigError(f"{source_path} has {len(sources)} lines but {reference_path} has "
                          f"{len(references)}")
    return sources, references


def _translate(args) -> int:
    if args.shard is not None and args.output is None:
        raise ConfigError("--shard is for --source FILE --output FILE")
    for flag in ("prefix", "alignments"):
        if getattr(args, flag) and (args.output is not None or args.nbest is not None):
            raise ConfigError(f"--{flag} writes to standard output: not with --output or "
                              "--nbest")
    if args.nbest is not None:
        return _translate_nbest(args)
    if args.output is not None:
        return _translate_file(args)
    lines = _read_user_lines(args.source, args.command)
    translations = _translate_lines(args, lines)
    if args.alignments:
        alignments = _align_lines(args, lines, translations)
        translations = [f"{one_line(text)} ||| {alignment}"
                        for text, alignment in zip(translations, alignments)]
    _write_lines(translations)
    return 0


def _align_lines(args, sources, targets) -> list[str]:
    """The `align` signature of the translating module over (source, translation) pairs."""
    from keras_transformer.decoding.texts import align_texts

    module = _translator_module(args, **_sampling_settings(args))
    if not hasattr(module, "align"):
        raise ConfigError(f"--alignments: {args.model} was exported before alignments "
                          "existed; export it again, or use --run")
    return align_texts(lambda source, target: module.align(source, target), sources, targets,
                       batch_size=args.batch_size)


def _translate_nbest(args) -> int:
    """--nbest N: the N best hypotheses of beam search per source line, best first, as Moses
    writes them (`LINE ||| hypothesis ||| score`, lines counted from 0) or JSON lines
    (`{"line", "hypotheses": [{"translation", "score"}, ...]}`); scores are log P / lp. A
    source without words has the empty translation alone; fewer possible hypotheses than N
    give fewer lines."""
    import json

    import numpy as np

    from keras_transformer.decoding.strategies import NEG_INF

    if args.greedy or args.sampling:
        raise ConfigError("--nbest is beam search's n-best list: not with --greedy or --sampling")
    if args.output is not None or args.shard is not None:
        raise ConfigError("--nbest writes to standard output: not with --output or --shard")
    lines = _read_user_lines(args.source, args.command)
    module = _translator_module(args)
    _check_exported_beam(args, module)
    width = _exported_beam_size(module)
    if args.nbest > width:
        raise ConfigError(f"--nbest {args.nbest}: the beam holds {width} hypotheses; give "
                          f"--beam {args.nbest} (with --run), or export with --beam {args.nbest}")
    order = sorted(range(len(lines)), key=lambda i: len(lines[i].split()))
    found: list = [None] * len(lines)
    for start in range(0, len(order), args.batch_size):
        rows = order[start:start + args.batch_size]
        outputs = module.translate_nbest(_strings([lines[i] for i in rows]))
        texts, scores = np.asarray(outputs["translations"]), np.asarray(outputs["scores"])
        for row, row_texts, row_scores in zip(rows, texts, scores):
            found[row] = [(text.decode("utf-8"), float(score))
                          for text, score in zip(row_texts[:args.nbest], row_scores)
                          if score > NEG_INF / 2]
    if args.nbest_format == "jsonl":
        out = [json.dumps({"line": index, "hypotheses": [
            {"translation": text, "score": score} for text, score in hypotheses]},
            ensure_ascii=False) for index, hypotheses in enumerate(found)]
    else:
        out = [f"{index} ||| {one_line(text)} ||| {score:.4f}"
               for index, hypotheses in enumerate(found) for text, score in hypotheses]
    _write_lines(out)
    return 0


def _translator_module(args, **decode_settings):
    """The Translator of --run (with --beam and `decode_settings`, e.g. sampling_topk) or the
    loaded export of --model (CTranslate2: `--workers` threads); loaded once per command."""
    loaded = vars(args).setdefault("_modules", {})
    key = tuple(sorted(decode_settings.items()))
    if key not in loaded:
        loaded[key] = _load_translator_module(args, **decode_settings)
    return loaded[key]


GUARD_FLAGS = {"no_repeat_ngram_size": "--no-repeat-ngram-size",
               "repetition_penalty": "--repetition-penalty"}


def _load_translator_module(args, **decode_settings):
    guard = {key: getattr(args, key) for key in GUARD_FLAGS
             if getattr(args, key, None) is not None}
    case_folding = True if getattr(args, "case_folding", False) else None
    if args.run_dir:
        from keras_transformer.decoding.translator import translator_from_run

        return translator_from_run(args.run_dir, weights=args.weights or "best",
                                   beam_size=getattr(args, "beam", None), **decode_settings,
                                   case_folding=case_folding, **guard)
    from keras_transformer.export.savedmodel import load_any, read_provenance

    if args.weights is not None:
        raise ConfigError(f"--weights {args.weights}: an export holds the weights it was made "
                          "from; --weights is for --run")
    module = load_any(args.model, inter_threads=getattr(args, "workers", 1), **guard)
    if not hasattr(module, "sample_ids"):  # a SavedModel: the guard is fixed at export
        exported = read_provenance(args.model).get("search", {})
        defaults = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0}  # older exports
        for key, value in guard.items():
            if exported.get(key, defaults[key]) != value:
                raise ConfigError(
                    f"{GUARD_FLAGS[key]} {value}: {args.model} was exported with {key} "
                    f"{exported.get(key, defaults[key])}; export again with --set "
                    f"decode.{key}={value}, or use --run")
    exported_folding = getattr(module, "case_folding", None)  # CTranslate2: its setting
    if exported_folding is None:
        exported_folding = read_provenance(args.model).get("case_folding", "none") != "none"
    if case_folding and not exported_folding:
        raise ConfigError(f"--case-folding: {args.model} was exported without case folding; "
                          "export again with --case-folding, or use --run")
    return module


def _translate_file(args) -> int:
    """--source FILE --output FILE: `bulk_translation.translate_file`, resumable and sharded."""
    from keras_transformer.decoding.bulk_translation import Shard, translate_file

    if args.source is None:
        raise ConfigError("--output is for --source FILE (standard input is not resumable)")
    shard = Shard.parse(args.shard) if args.shard else Shard()
    settings = {"model": str(args.model or args.run_dir), "weights": args.weights,
                "search": _search_name(args), "beam": args.beam,
                **{key: getattr(args, key) for key in SAMPLING_FLAGS}}
    translate = _translate_function(args)
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = _Progress(total, done=done)
            if done:
                print(f"keras-transformer translate: {args.output} holds {done} lines; "
                      "resuming", file=sys.stderr)
        bar.show(done)

    result = translate_file(translate, args.source, args.output, settings=settings,
                            shard=shard, seed=args.seed if args.sampling else None,
                            batch_size=args.batch_size, workers=args.workers,
                            progress=None if args.quiet else progress)
    print(f"keras-transformer translate: wrote {result['lines']} lines to {args.output}",
          file=sys.stderr)
    return 0


def _evaluate(args) -> int:
    from keras_transformer.data.text_io import write_lines
    from keras_transformer.decoding.evaluation import score

    _check_output_file(args.output, {"--source": args.source, "--reference": args.reference})
    sources, references = _read_aligned(args.source, args.reference, args.command)
    hypotheses = _translate_lines(args, sources)
    scores = score(hypotheses, references)
    for metric in ("bleu", "bleu_lowercase", "chrf", "chrf_lowercase"):
        print(f"{metric}: {scores[metric]:.2f}  ({scores[metric + '_signature']})", flush=True)
    if args.output:  # after the scores, which a full disk then does not cost
        write_lines(args.output, hypotheses)
    return 0


def _score(args) -> int:
    """One line per pair: log P(target | source), log P / lp (as beam search ranks), and the
    target's tokens (END included), tab-separated."""
    from keras_transformer.data.text_io import write_lines
    from keras_transformer.decoding.texts import score_texts

    _check_output_file(args.output, {"--source": args.source, "--target": args.target})
    sources, targets = _read_aligned(args.source, args.target, args.command)
    module = _translator_module(args)
    if not hasattr(module, "score"):
        raise ConfigError(f"{args.model} was exported before scoring existed; export it "
                          "again, or use --run")
    results = score_texts(lambda source, target: module.score(source, target), sources,
                          targets, batch_size=args.batch_size)
    lines = [f"{log_p:.4f}\t{normalized:.4f}\t{tokens}" for log_p, normalized, tokens in results]
    if args.output:
        write_lines(args.output, lines)
    else:
        _write_lines(lines)
    return 0


def _filter(args) -> int:
    """Writes the pairs of --source/--target that pass the rules to --output-source and
    --output-target (line-aligned, plain text), and one line of counts."""
    from keras_transformer.data.filtering import (FilterCounts, FilterRules, filter_pairs,
                                                  parse_score_line)
    from keras_transformer.data.text_io import write_lines

    rules = FilterRules(max_length_ratio=args.max_length_ratio, max_repeat=args.max_repeat,
                        min_score=args.min_score)
    if (args.min_score is None) != (args.scores is None):
        raise ConfigError("--min-score and --scores go together: the scores are what "
                          "--min-score reads")
    inputs = {"--source": args.source, "--target": args.target,
              **({"--scores": args.scores} if args.scores else {})}
    for output in (args.output_source, args.output_target):
        _check_output_file(output, inputs)
    if os.path.abspath(args.output_source) == os.path.abspath(args.output_target):
        raise ConfigError("--output-source and --output-target are the same file")
    sources, targets = _read_aligned(args.source, args.target, args.command)
    scores = None
    if args.scores:
        lines = _read_lines(args.scores, args.command)
        if len(lines) != len(sources):
            raise ConfigError(f"{args.scores} has {len(lines)} lines but {args.source} has "
                              f"{len(sources)}")
        scores = [parse_score_line(line, number, args.scores)
                  for number, line in enumerate(lines, start=1)]
    counts = FilterCounts()
    kept = list(filter_pairs(zip(sources, targets), rules, scores, counts))
    write_lines(args.output_source, [source for source, _ in kept])
    write_lines(args.output_target, [target for _, target in kept])
    print(counts.line(), flush=True)
    return 0


def _tune_search(args) -> int:
    import json

    from keras_transformer.decoding.texts import tune_search
    from keras_transformer.decoding.translator import translator_from_run

    _check_output_file(args.output, {"--source": args.source, "--reference": args.reference})
    if args.patience is not None and args.stopping == ["exact"]:
        raise ConfigError("--patience is for the beam_full rule; --stopping exact has none")
    sources, references = _read_aligned(args.source, args.reference, args.command)
    translator = translator_from_run(args.run_dir, weights=args.weights)
    tuned = tune_search(translator, sources, references, args.beam, args.alpha,
                        batch_size=args.batch_size, workers=args.workers,
                        stoppings=args.stopping, patiences=args.patience)
    for row in tuned["results"]:
        print(f"beam {row['beam_size']} alpha {row['alpha']:g} stopping {_rule(row)}: "
              f"BLEU {row['bleu']:.2f} chrF {row['chrf']:.2f}", flush=True)
    best = tuned["best"]
    patience = "" if best["patience"] is None else f" --patience {best['patience']:g}"
    print(f"best: --beam {best['beam_size']} --alpha {best['alpha']:g} --stopping "
          f"{best['stopping']}{patience} (BLEU {best['bleu']:.2f}, {tuned['bleu_signature']})")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(tuned, f, indent=1)
    return 0


def _check_output_file(output, inputs: dict) -> None:
    """ConfigError, before any work, if `output` (None: no output) is an input file or cannot
    be a file."""
    if output is None:
        return
    for flag, path in inputs.items():
        if os.path.exists(path) and os.path.exists(output) and os.path.samefile(path, output):
            raise ConfigError(f"--output {output} is the {flag} file: writing it would "
                              "destroy the input")
    if os.path.isdir(output):
        raise ConfigError(f"--output {output} is a folder, not a file")
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise ConfigError(f"--output {output}: no folder {folder}")


def _rule(row: dict) -> str:
    return row["stopping"] + ("" if row["patience"] is None else f" patience {row['patience']:g}")


def _positive_ints(text: str) -> list[int]:
    return [_positive_int(part) for part in text.split(",")]


def _stopping_rules(text: str) -> list[str]:
    rules = [part.strip() for part in text.split(",")]
    for rule in rules:
        if rule not in STOPPING_CHOICES:
            raise argparse.ArgumentTypeError(f"{rule!r} is not a stopping rule: use "
                                             f"{' or '.join(STOPPING_CHOICES)}")
    return rules


def _numbers(text: str, minimum: float, name: str) -> list[float]:
    """A comma-separated list of numbers, each at least `minimum` (`name` for the error)."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")
    if not all(value >= minimum and math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(f"{text}: every {name} must be a finite number >= "
                                         f"{minimum:g}")
    return values


def _alphas(text: str) -> list[float]:
    return _numbers(text, 0, "alpha")


def _alpha(text: str) -> float:
    if "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: one alpha, not a list")
    return _alphas(text)[0]


def _patiences(text: str) -> list[float]:
    return _numbers(text, 1, "patience")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _probability(text: str) -> float:
    """--sampling-topp: decode.sampling_topp's rule, in (0, 1] (nan is not)."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a number in (0, 1]")
    return value


def _temperature(text: str) -> float:
    """--sampling-temperature: decode.sampling_temperature's rule, a finite number > 0."""
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number > 0")
    return value


def _repetition_penalty(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number > 0 (1: off)")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is not >= {minimum}")
    return value


def _add_translator_arguments(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="an export: a SavedModel version folder (e.g. "
                        "saved_models/NAME/1) or a CTranslate2 model folder")
    source.add_argument("--run", dest="run_dir",
                        help="training run folder (uses the Keras model directly)")
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--beam", type=_positive_int, metavar="K",
                        help="beam size (default: the run's decode.beam_size, or the export's)")
    search.add_argument("--greedy", action="store_true", help="greedy search")
    search.add_argument("--sampling", action="store_true",
                        help="random sampling (back-translation): the run's or export's "
                             "decode.sampling_* settings, or those below")
    parser.add_argument("--sampling-topk", dest="sampling_topk", type=_non_negative_int,
                        metavar="K", help="with --sampling: draw from the K most probable "
                                          "tokens (0: all)")
    parser.add_argument("--sampling-topp", dest="sampling_topp", type=_probability,
                        metavar="P", help="with --sampling: then from the smallest set of "
                                          "them whose probability reaches P (nucleus)")
    parser.add_argument("--sampling-temperature", dest="sampling_temperature",
                        type=_temperature, metavar="T",
                        help="with --sampling: divide the logits by T")
    parser.add_argument("--seed", type=_non_negative_int, default=0,
                        help="with --sampling: line k of the input is sampled with seed "
                             "SEED + k (default 0), whatever the batching or shard")
    parser.add_argument("--no-repeat-ngram-size", dest="no_repeat_ngram_size",
                        type=_non_negative_int, metavar="N",
                        help="no n-gram of N tokens twice in an output (0: off; default: the "
                             "run's or export's decode.no_repeat_ngram_size)")
    parser.add_argument("--repetition-penalty", dest="repetition_penalty",
                        type=_repetition_penalty, metavar="P",
                        help="divide the logits of tokens already in the output by P (1: off;"
                             " default: the run's or export's decode.repetition_penalty)")
    parser.add_argument("--case-folding", action="store_true",
                        help="translate a source in capitals or title case lowercased and put "
                             "the translation back into that case (default: the run's "
                             "data.case_folding, or the export's)")
    parser.add_argument("--weights",
                        help="with --run: best, last, or a weight file (default: best)")
    parser.add_argument("--batch-size", type=_positive_int, default=64,
                        help="sentences per batch")
    parser.add_argument("--workers", type=_positive_int, default=1,
                        help="batches translated at once (concurrent requests); default 1")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_config_arguments(parser):
    parser.add_argument("--config", required=True, help="experiment YAML file")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable), e.g. train.epochs=3")


# One function a subcommand: `commands.add_parser` gives it the options every subcommand takes.

def _add_info(commands) -> None:
    info = commands.add_parser("info", help="versions, devices and preset parameter counts; "
                               "with --model, what an export was made from")
    info.add_argument("--preset", action="append",
                      help="preset name (repeatable; default: all presets)")
    info.add_argument("--model", help="an export folder: print its provenance record")
    info.set_defaults(run=_info)


def _add_build_vocab(commands) -> None:
    vocab = commands.add_parser("build-vocab", help="learn and write the vocabulary files")
    _add_config_arguments(vocab)
    vocab.add_argument("--output", required=True, help="vocabulary folder to write")
    vocab.set_defaults(run=_build_vocab)


def _add_data_stats(commands) -> None:
    stats = commands.add_parser("data-stats", help="pair counts, lengths, batches, padding")
    _add_config_arguments(stats)
    stats.add_argument("--vocab", help="vocabulary folder (default: data.vocab_dir)")
    stats.set_defaults(run=_data_stats)


def _add_train(commands) -> None:
    train = commands.add_parser("train", help="train a model with model.fit")
    _add_config_arguments(train)
    train.add_argument("--output", required=True,
                       help="run folder: resumes the run it holds after a kill, extends it to a "
                            "larger train.epochs, or says it is finished")
    train.add_argument("--overwrite", action="store_true",
                       help="delete the run that --output holds (another config, or a finished "
                            "run) and train anew")
    train.add_argument("--init-from", metavar="RUN|WEIGHTS",
                       help="fine-tune: start from this run's best weights (or this weight "
                            "file), with a fresh optimizer and schedule (train.init_from)")
    train.add_argument("--logical-cpus", type=_non_negative_int, default=0, metavar="N",
                       help="split the CPU into N logical devices (distribution without GPUs)")
    train.add_argument("--progress", type=int, default=None, choices=(0, 1, 2),
                       help="1 a progress bar, 2 one plain line per epoch, 0 none (default: "
                            "1 on a terminal, 2 into a file or a pipe)")
    train.set_defaults(run=_train)


def _add_average(commands) -> None:
    average = commands.add_parser("average", help="average the last N epoch checkpoints")
    average.add_argument("--run", dest="run_dir", required=True, help="run folder")
    average.add_argument("--last", type=int, default=5, help="how many checkpoints")
    average.add_argument("--upper-bound", type=int, metavar="EPOCH",
                         help="average the last N checkpoints up to this epoch (default: all)")
    average.add_argument("--output", help="weights file (default: RUN/average_lastN.weights.h5)")
    average.set_defaults(run=_average)


def _add_export(commands) -> None:
    export = commands.add_parser("export", help="export a run as a SavedModel for TF Serving")
    # dest run_dir: `run` holds the subcommand's function (set_defaults below).
    export.add_argument("--run", dest="run_dir", required=True, help="training run folder")
    export.add_argument("--output", required=True,
                        help="model folder; the export goes to OUTPUT/VERSION/")
    export.add_argument("--version", type=int, help="version number (default: the next one)")
    export.add_argument("--beam", type=_positive_int, help="beam size of serving_default "
                        "(default: the run's decode.beam_size)")
    export.add_argument("--alpha", type=_alpha, help="length penalty (default: decode.alpha)")
    export.add_argument("--weights", default="best", help="best, last, or a weight file")
    export.add_argument("--case-folding", action="store_true",
                        help="fold the case of sources in capitals or title case and recase "
                             "their translations (default: the run's data.case_folding)")
    export.add_argument("--format", choices=EXPORT_FORMATS, default=EXPORT_FORMATS[0],
                        help="savedmodel (TF Serving; OUTPUT/VERSION/) or ctranslate2 (a "
                             "CTranslate2 model folder at OUTPUT; needs the ctranslate2 extra)")
    export.add_argument("--quantization", default="float32",
                        help="with --format ctranslate2: float32, int8, bfloat16, ...")
    export.add_argument("--batching", type=_positive_int, metavar="THREADS",
                        help="decode concurrent calls together (in-graph request batching), "
                             "THREADS batches at once: the serving machine's cores")
    export.set_defaults(run=_export)


def _add_translate(commands) -> None:
    translate = commands.add_parser(
        "translate", help="translate stdin (or --source) to stdout (or --output), line by line")
    _add_translator_arguments(translate)
    translate.add_argument("--source", help="input file (plain or .gz; default: stdin)")
    translate.add_argument("--output", help="output file, written in chunks as they finish: "
                           "a killed job run again resumes at its first untranslated line")
    translate.add_argument("--shard", metavar="I/N", help="with --output: translate the I-th "
                           "of N contiguous slices of --source (0 <= I < N)")
    translate.add_argument("--prefix", metavar="FILE",
                           help="one target prefix a line of the input: each translation starts "
                                "with it (interactive completion; an empty line forces nothing)")
    translate.add_argument("--nbest", type=_positive_int, metavar="N",
                           help="write beam search's N best hypotheses per line with their "
                                "scores (N <= the beam size)")
    translate.add_argument("--nbest-format", choices=("moses", "jsonl"), default="moses",
                           help="with --nbest: 'LINE ||| hypothesis ||| score' lines (Moses, "
                                "default) or one JSON object per source line")
    translate.add_argument("--alignments", action="store_true",
                           help="write 'translation ||| alignment' lines: each target word with "
                                "the source word it attends to most, Pharaoh 'i-j' pairs from 0 "
                                "(decode.alignment_layer's cross-attention; approximate)")
    translate.set_defaults(run=_translate)


def _add_evaluate(commands) -> None:
    evaluate = commands.add_parser("evaluate", help="sacreBLEU and chrF of a model on files")
    _add_translator_arguments(evaluate)
    evaluate.add_argument("--source", required=True, help="source text file, one sentence a line")
    evaluate.add_argument("--reference", required=True, help="reference file, line-aligned")
    evaluate.add_argument("--output", help="write the hypotheses to this file")
    evaluate.set_defaults(run=_evaluate)


def _add_score(commands) -> None:
    score = commands.add_parser(
        "score", help="log-probability of given translations, per line: log P, log P / lp, "
                      "tokens (to filter a corpus or rerank candidates)")
    model = score.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="an export: a SavedModel version folder or a "
                       "CTranslate2 model folder")
    model.add_argument("--run", dest="run_dir", help="training run folder")
    score.add_argument("--weights", help="with --run: best, last, or a weight file")
    score.add_argument("--source", required=True, help="source file, one sentence a line")
    score.add_argument("--target", required=True, help="translations to score, line-aligned")
    score.add_argument("--output", help="write the scores here (default: stdout)")
    score.add_argument("--batch-size", type=_positive_int, default=64,
                       help="pairs per batch (default: 64)")
    score.set_defaults(run=_score)


def _add_filter(commands) -> None:
    corpus_filter = commands.add_parser(
        "filter", help="keep the pairs of a parallel corpus that pass length, repetition and "
                       "score rules (synthetic back-translations above all)")
    corpus_filter.add_argument("--source", required=True, help="source file, one sentence a line")
    corpus_filter.add_argument("--target", required=True, help="target file, line-aligned")
    corpus_filter.add_argument("--output-source", required=True, help="the kept sources")
    corpus_filter.add_argument("--output-target", required=True, help="the kept targets")
    corpus_filter.add_argument("--max-length-ratio", type=float, metavar="R",
                               help="drop pairs whose longer side has more than R times the "
                                    "words of the shorter")
    corpus_filter.add_argument("--max-repeat", type=_positive_int, metavar="N",
                               help="drop pairs with a character repeated more than N times in "
                                    "a row")
    corpus_filter.add_argument("--scores", help="`keras-transformer score` of the pairs, "
                               "line-aligned (for --min-score)")
    corpus_filter.add_argument("--min-score", type=float, metavar="S",
                               help="drop pairs whose log P / lp (--scores' second column) is "
                                    "below S")
    corpus_filter.set_defaults(run=_filter)


def _add_tune_search(commands) -> None:
    tune = commands.add_parser(
        "tune-search", help="BLEU of every beam size and alpha on held-out (validation) files")
    tune.add_argument("--run", dest="run_dir", required=True, help="training run folder")
    tune.add_argument("--weights", default="best", help="best, last, or a weight file")
    tune.add_argument("--source", required=True, help="validation source file")
    tune.add_argument("--reference", required=True, help="validation reference file")
    tune.add_argument("--beam", type=_positive_ints, default=[4], metavar="K[,K...]",
                      help="beam sizes to try (default: 4)")
    tune.add_argument("--alpha", type=_alphas, default=[0.6], metavar="A[,A...]",
                      help="length penalties to try (default: 0.6)")
    tune.add_argument("--stopping", type=_stopping_rules, default=None, metavar="RULE[,RULE...]",
                      help="beam stopping rules to try: exact, beam_full (default: the run's "
                           "decode.stopping)")
    tune.add_argument("--patience", type=_patiences, default=None, metavar="P[,P...]",
                      help="with beam_full: stop after P x beam finished hypotheses; values "
                           "to try (default: the run's decode.patience)")
    tune.add_argument("--batch-size", type=_positive_int, default=64,
                      help="sentences per batch (default: 64)")
    tune.add_argument("--workers", type=_positive_int, default=1,
                      help="batches translated at once (default: 1)")
    tune.add_argument("--output", help="write the results and the best setting as JSON")
    tune.set_defaults(run=_tune_search)


def build_parser() -> argparse.ArgumentParser:
    verbose = dict(action="store_true",
                   help="show TensorFlow's start-up logging, and tracebacks of errors")
    # Before or after the subcommand; SUPPRESS keeps a subcommand's default from overriding a
    # --verbose given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", default=argparse.SUPPRESS, **verbose)
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train, export and serve the Transformer of 'Attention Is All You Need'.")
    parser.add_argument("-v", "--verbose", default=False, **verbose)
    parser.add_argument("--version", action="version", version=f"keras-transformer {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)

    class Commands:  # every subcommand takes --verbose too
        @staticmethod
        def add_parser(name, **kwargs):
            return subparsers.add_parser(name, parents=[common], **kwargs)

    commands = Commands()
    for add in (_add_info, _add_build_vocab, _add_data_stats, _add_train, _add_average,
                _add_export, _add_translate, _add_evaluate, _add_score, _add_filter,
                _add_tune_search):  # one function a subcommand, in the order of --help
        add(commands)
    return parser


def quiet_tensorflow() -> None:
    """Imports TensorFlow, tf-text and Keras and initializes the devices with the process's
    standard error closed, then silences absl's and TensorFlow's Python loggers and the
    libraries' Python warnings. TensorFlow 2.21 writes its start-up lines (oneDNN, CUDA
    drivers, cuInit) before absl's logging is initialized, which TF_CPP_MIN_LOG_LEVEL does not
    reach. An import that fails still raises, after standard error is restored."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # errors too: a real one raises in Python
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import keras  # noqa: F401
        import tensorflow as tf
        import tensorflow_text  # noqa: F401

        tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(keras|tensorflow)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.verbose:
        quiet_tensorflow()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="keras-transformer: %(message)s")
    try:
        return args.run(args)
    except USER_ERRORS as error:
        if args.verbose:
            raise
        print(f"keras-transformer {args.command}: error: {first_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
