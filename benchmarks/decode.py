"""Translation speed of the exported SavedModel against CTranslate2 on the same weights, in one run.

    python benchmarks/decode.py --run runs/NAME [--weights best] [--limit 1000] [--alphas 1.4,0.6]
    python benchmarks/decode.py --run runs/NAME --searches score   # scoring given translations

The run is exported once per variant into a temporary folder: the SavedModel as
`keras-transformer export` writes it by default (one export per alpha, since an export fixes
its length penalty), and CTranslate2 models in
float32 and int8 (`keras-transformer export --format ctranslate2`). Every row then runs in a
process of its own over the same sentences (Multi30k test_2016_flickr, the run's source
language) in the same batches (sorted by length, `--batch-size`):

    1 core   the process pinned to one CPU: one batch at a time, one thread per op
             (CTranslate2: inter_threads 1, intra_threads 1)
    2 cores  two CPUs: two batches in flight from two client threads, one thread per op each
             (CTranslate2: inter_threads 2, intra_threads 1, the same two client threads)

Each row makes one untimed warm-up pass and 3 timed passes (`--repeats`) and reports the median:
sentences/s, target tokens/s (the output's subwords plus END, counted with the run's
tokenizer), and the ratio to CTranslate2 float32 with the same search, alpha and cores. The
rows compared with each other (same search, alpha and cores) take turns: their processes are
loaded and warmed up one after the other, then each round times one pass of every row, one
process running at a time, the first row of a round moving on by one each round. The speed of
these machines drifts within minutes (experiments/log/2026-11-27.md); taking turns spreads that
drift over every row alike, and each round gives a ratio of passes run seconds apart, whose
range over the rounds the table shows. Greedy outputs of the SavedModel and of CTranslate2 float32 are
compared sentence by sentence.

The "score" search times scoring instead of translating: log P of each (test sentence, its
reference translation) pair, by the SavedModel's `score` signature and by CTranslate2's
`score_batch` (`CTranslate2Translator.score`), in the same batches (`texts.score_texts`);
its tokens/s counts the references' target tokens, and its outputs are compared to within
1e-3.

CTranslate2 chooses its kernels by CPU (instruction set, float32 and int8 GEMM libraries); the
header prints what it chose, and `CT2_FORCE_CPU_ISA` / `CT2_USE_MKL` set in the environment
change it for the CTranslate2 rows (e.g. `CT2_FORCE_CPU_ISA=AVX512 python benchmarks/decode.py ...`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

VARIANTS = ("savedmodel", "ct2_float32", "ct2_int8")
SEARCHES = ("greedy", "beam", "score")
CORES = (1, 2)
REFERENCE = "ct2_float32"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--weights", default="best", help="best, last, or a weight file")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_DATA"),
                        help="raw Multi30k folder (default: $KERAS_TRANSFORMER_DATA)")
    parser.add_argument("--limit", type=int, default=1000, help="first N test sentences")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alphas", default=None,
                        help="comma-separated length penalties for the beam rows (default: the "
                             "run's decode.alpha and 0.6)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--searches", default="greedy,beam",
                        help=f"comma-separated subset of {','.join(SEARCHES)}")
    parser.add_argument("--cores", default="1,2")
    parser.add_argument("--stopping", choices=("exact", "beam_full"), default=None,
                        help="the SavedModel's beam stopping rule (default: the run's "
                             "decode.stopping)")
    parser.add_argument("--patience", type=float, default=None,
                        help="the SavedModel's beam_full patience (default: the run's "
                             "decode.patience)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per row")
    parser.add_argument("--output", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    args.variants = _choices(parser, "--variants", args.variants, VARIANTS)
    args.searches = _choices(parser, "--searches", args.searches, SEARCHES)
    args.cores = [int(c) for c in _choices(parser, "--cores", args.cores, ("1", "2"))]
    if not args.data_dir:
        parser.error("no data folder: pass --data-dir or set KERAS_TRANSFORMER_DATA")
    return args


def _choices(parser, flag, text, allowed):
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        parser.error(f"{flag}: unknown {unknown}; choose from {','.join(allowed)}")
    return values


def read_sentences(data_dir, lang: str, limit: int) -> list[str]:
    from keras_transformer.data.text_io import read_lines

    path = Path(data_dir) / f"test_2016_flickr.{lang}.gz"
    if not path.is_file():
        sys.exit(f"decode.py: {path} not found (raw Multi30k files expected in {data_dir})")
    return list(read_lines(path))[:limit]


# ----------------------------------------------------------------------------- one row

# Lines of the row processes' protocol on their stdout start with this; anything else a library
# prints there is ignored.
_REPLY = "@row "


def row_server(spec: dict) -> None:
    """One row's process: loads the model, makes the warm-up pass, says it is ready, then on
    each "pass" line of stdin makes a timed pass and replies with its seconds, and on "outputs"
    replies with the translations of the last pass."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < spec["cores"]:
        raise SystemExit(f"decode.py: {spec['cores']} cores asked, {len(cpus)} available")
    os.sched_setaffinity(0, cpus[:spec["cores"]])
    translate = load_row_model(spec)
    from keras_transformer.decoding.texts import score_texts, translate_texts

    def one_pass():
        start = time.perf_counter()
        if spec["search"] == "score":
            outputs = [log_p for log_p, _, _ in score_texts(
                translate, spec["sentences"], spec["references"],
                batch_size=spec["batch_size"], workers=spec["cores"])]
        else:
            outputs = translate_texts(translate, spec["sentences"],
                                      batch_size=spec["batch_size"], workers=spec["cores"])
        return outputs, time.perf_counter() - start

    outputs, _ = one_pass()  # warm-up: tracing, loading, first allocations
    print(_REPLY + "ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "pass":
            outputs, seconds = one_pass()
            print(_REPLY + json.dumps(seconds), flush=True)
        elif line.strip() == "outputs":
            print(_REPLY + json.dumps(outputs), flush=True)


class RowProcess:
    """A row's process (`row_server`), started, loaded and warmed up when this returns."""

    def __init__(self, spec: dict):
        self.name = f"{spec['variant']} {spec['search']}"
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(spec, f)
        self._spec_path = f.name
        self._stderr = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--row", f.name], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self._reply()  # "ready"

    def timed_pass(self) -> float:
        return float(self._ask("pass"))

    def finish(self) -> list[str]:
        """The outputs of the last pass; the process ends."""
        outputs = json.loads(self._ask("outputs"))
        self._process.stdin.close()
        self._process.wait()
        self._stderr.close()
        os.unlink(self._spec_path)
        return outputs

    def _ask(self, command: str) -> str:
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._reply()

    def _reply(self) -> str:
        for line in self._process.stdout:
            if line.startswith(_REPLY):
                return line[len(_REPLY):].strip()
        self._process.wait()
        self._stderr.seek(0)
        raise SystemExit(f"decode.py: row {self.name} failed:\n{self._stderr.read()[-3000:]}")


def run_group(specs: list[dict], repeats: int, start=RowProcess) -> list[dict]:
    """The rows of `specs` taking turns: each process is started (`start(spec)`: loaded and
    warmed up) after the one before, then `repeats` rounds time one pass of every row, the
    first row of round r being row r (mod the number of rows). Returns each row's
    `{"seconds": [per round], "outputs": [...]}`."""
    processes = [start(spec) for spec in specs]
    seconds = [[] for _ in specs]
    for round_index in range(repeats):
        for offset in range(len(specs)):
            row = (round_index + offset) % len(specs)
            seconds[row].append(processes[row].timed_pass())
    return [{"seconds": row_seconds, "outputs": process.finish()}
            for process, row_seconds in zip(processes, seconds)]


def load_row_model(spec: dict):
    """The row's translate function, string [batch] -> {"translation": ...} (score: (source,
    target) string [batch] -> {"score", ...}), with one thread per op and `cores` batches in
    flight."""
    if spec["variant"].startswith("ct2"):
        from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator

        translator = CTranslate2Translator(spec["path"], inter_threads=spec["cores"],
                                           intra_threads=1, max_batch_size=0)
        return {"greedy": translator.translate_greedy, "beam": translator.translate_beam,
                "score": translator.score}[spec["search"]]
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(spec["cores"])
    from keras_transformer.export.savedmodel import load_translator

    loaded = load_translator(spec["path"])
    if spec["search"] == "score":
        return lambda source, target: loaded.signatures["score"](source=source, target=target)
    signature = loaded.signatures["translate_greedy" if spec["search"] == "greedy"
                                  else "serving_default"]
    return lambda batch: signature(source=batch)


def count_target_tokens(tokenizer, outputs) -> int:
    """Subwords of the outputs plus one END each (`tokenize` adds START and END)."""
    import tensorflow as tf

    if not outputs:
        return 0
    return int(tf.reduce_sum(tokenizer.tokenize(tf.constant(outputs)).row_lengths())) - len(
        outputs)


# ----------------------------------------------------------------------------- exports

def export_variants(args, translator, root: Path, alphas: list[float]) -> dict:
    """{(variant, alpha): path} of every export the rows need, made in this process from the
    run's `translator` (an export fixes its length penalty, so one export per alpha)."""
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.savedmodel import export_translator
    from keras_transformer.decoding.translator import Translator

    paths = {}
    for alpha in alphas:
        decode_config = _with_alpha(translator.decode_config, alpha, args.stopping,
                                    args.patience)
        for variant in args.variants:
            path = root / f"{variant}_{alpha}"
            if variant.startswith("savedmodel"):
                module = Translator(translator.model, translator.source_tokenizer,
                                    translator.target_tokenizer, decode_config,
                                    max_source_length=translator.max_source_length)
                paths[variant, alpha] = export_translator(module, path / "1",
                                                          warmup_sentences=None)
            else:
                paths[variant, alpha] = export_ctranslate2(
                    translator.model, translator.source_tokenizer, translator.target_tokenizer,
                    decode_config, path, quantization=variant.split("_")[1],
                    max_source_length=translator.max_source_length)
    return paths


# CTranslate2 picks its CPU kernels itself, by vendor: MKL on Intel CPUs only (its
# src/cpu/backend.cc), and the AVX2 code path on the AMD EPYC of RESULTS although it has AVX-512.
# These variables override its choice; the rows' processes inherit them.
CT2_SETTINGS = ("CT2_FORCE_CPU_ISA", "CT2_USE_MKL")
_CT2_CHOICES = {"Selected ISA": "ISA", "SGEMM backend": "float32 GEMM",
                "GEMM_S8 backend": "int8 GEMM"}


def ctranslate2_cpu_choices(model_dir) -> dict:
    """What CTranslate2 chooses on this CPU, read from its own log (`CT2_VERBOSE=1`) while a
    subprocess loads `model_dir`: `{"ISA": "AVX2", "float32 GEMM": "DNNL (packed: false)",
    "int8 GEMM": ..., "CT2_USE_MKL": "unset", ...}`."""
    code = "import sys, ctranslate2; ctranslate2.Translator(sys.argv[1], device='cpu')"
    log = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True,
                         text=True, env=dict(os.environ, CT2_VERBOSE="1")).stderr
    return {**parse_ctranslate2_log(log),
            **{name: os.environ.get(name, "unset") for name in CT2_SETTINGS}}


def parse_ctranslate2_log(log: str) -> dict:
    """The ISA and GEMM backends in CTranslate2's `CT2_VERBOSE` log; a SystemExit naming the
    log's end if it has none (the model did not load)."""
    choices = {}
    for line in log.splitlines():
        for key, name in _CT2_CHOICES.items():
            if f"- {key}: " in line:
                choices[name] = line.split(f"- {key}: ", 1)[1].strip()
    if len(choices) != len(_CT2_CHOICES):
        raise SystemExit(f"decode.py: CTranslate2 did not report its CPU choices:\n{log[-2000:]}")
    return choices


def _rule(args, decode) -> str:
    """The SavedModel rows' stopping rule, e.g. "beam_full, patience 2"."""
    stopping = args.stopping or decode.stopping
    patience = decode.patience if args.patience is None else args.patience
    return stopping + (f", patience {patience:g}" if stopping == "beam_full" else "")


def _with_alpha(decode_config, alpha, stopping=None, patience=None):
    import dataclasses

    return dataclasses.replace(
        decode_config, alpha=alpha, stopping=stopping or decode_config.stopping,
        patience=decode_config.patience if patience is None else patience)


# ----------------------------------------------------------------------------- the table

def rows(args, paths: dict, alphas: list[float]):
    """Every (variant, search, alpha, cores) row, CTranslate2 float32 first in each group."""
    order = sorted(args.variants, key=lambda v: v != REFERENCE)
    for search in args.searches:
        for alpha in (alphas if search == "beam" else [None]):
            for cores in args.cores:
                for variant in order:
                    yield {"variant": variant, "search": search, "alpha": alpha,
                           "cores": cores, "path": str(paths[variant, alpha or alphas[0]])}


def _group_key(spec: dict) -> tuple:
    """The rows compared with each other, which take turns (`run_group`)."""
    return spec["search"], spec["alpha"], spec["cores"]


def print_table(results: list[dict]) -> None:
    header = (f"{'model':<16}{'search':<12}{'cores':>6}{'sentences/s':>13}{'tokens/s':>11}"
              f"{'vs ct2 fp32':>13}{'per round':>13}")
    print(header)
    print("-" * len(header))
    for row in results:
        search = row["search"] if row["alpha"] is None else (
            f"beam{row['beam']} a{row['alpha']:g}")
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}x"
        rounds = row.get("round_ratios")
        spread = (f"{min(rounds):.2f}-{max(rounds):.2f}x"
                  if rounds and row["variant"] != REFERENCE else "-")
        print(f"{row['variant']:<16}{search:<12}{row['cores']:>6}"
              f"{row['sentences_per_second']:>13.1f}{row['tokens_per_second']:>11.0f}"
              f"{ratio:>13}{spread:>13}", flush=True)


def add_ratios(results: list[dict]) -> None:
    """Each row's sentences/s over CTranslate2 float32's with the same search, alpha, cores.
    Rows with the per-round `seconds` of `run_group` also get `round_ratios`: the ratio of
    each round's passes (the reference's seconds over the row's)."""
    reference = {_group_key(r): r for r in results if r["variant"] == REFERENCE}
    for row in results:
        base = reference.get(_group_key(row))
        row["ratio"] = (row["sentences_per_second"] / base["sentences_per_second"] if base
                        else None)
        if base and "seconds" in row and len(row["seconds"]) == len(base["seconds"]):
            row["round_ratios"] = [b / s for b, s in zip(base["seconds"], row["seconds"])]


def compare_outputs(results: list[dict]) -> list[str]:
    """Lines saying how many greedy / beam outputs of each model equal CTranslate2 float32's."""
    lines = []
    reference = {(r["search"], r["alpha"]): r["outputs"] for r in results
                 if r["variant"] == REFERENCE and r["cores"] == min(r2["cores"] for r2 in results)}
    seen = set()
    for row in results:
        key = (row["variant"], row["search"], row["alpha"])
        want = reference.get((row["search"], row["alpha"]))
        if row["variant"] == REFERENCE or key in seen or want is None:
            continue
        seen.add(key)
        if row["search"] == "score":  # log P, float32 on both sides
            same = sum(abs(a - b) <= 1e-3 * max(1.0, abs(b))
                       for a, b in zip(row["outputs"], want))
            kind = "scores within 1e-3 of"
        else:
            same = sum(a == b for a, b in zip(row["outputs"], want))
            kind = "outputs identical to"
        search = row["search"] if row["alpha"] is None else f"beam a{row['alpha']:g}"
        lines.append(f"{row['variant']} {search}: {same}/{len(want)} {kind} {REFERENCE}")
    return lines


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--row":
        row_server(json.loads(Path(sys.argv[2]).read_text()))
        return 0
    args = parse_args(argv)
    from keras_transformer.config import ConfigError
    from keras_transformer.runs.folder import Run
    from keras_transformer.decoding.translator import translator_from_run

    try:
        translator = translator_from_run(args.run, weights=args.weights, beam_size=args.beam)
    except ConfigError as error:
        raise SystemExit(f"decode.py: {error}") from None
    config = Run(args.run).config
    alphas = ([float(a) for a in args.alphas.split(",")] if args.alphas
              else sorted({config.decode.alpha, 0.6}, reverse=True))
    sentences = read_sentences(args.data_dir, config.data.source_lang, args.limit)
    references = (read_sentences(args.data_dir, config.data.target_lang, args.limit)
                  if "score" in args.searches else None)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                if line.startswith("Model name")), "unknown CPU")
    print(f"run {args.run} ({args.weights} weights); {len(sentences)} sentences of "
          f"test_2016_flickr.{config.data.source_lang}; batch {args.batch_size}; beam "
          f"{args.beam}; alphas {alphas}; stopping {_rule(args, config.decode)}; median of "
          f"{args.repeats} rounds after a warm-up, the rows of a group taking turns; "
          f"{cpu}; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="decode_bench_") as root:
        paths = export_variants(args, translator, Path(root), alphas)
        ct2_path = next((path for (variant, _), path in paths.items()
                         if variant.startswith("ct2")), None)
        ct2_cpu = ctranslate2_cpu_choices(ct2_path) if ct2_path else None
        if ct2_cpu:
            print("CTranslate2 on this CPU: " + ", ".join(
                f"{name} {value}" for name, value in ct2_cpu.items()), flush=True)
        results = []
        for _, group in itertools.groupby(rows(args, paths, alphas), key=_group_key):
            specs = [dict(spec, sentences=sentences, batch_size=args.batch_size,
                          references=references) for spec in group]
            for spec, result in zip(specs, run_group(specs, args.repeats)):
                seconds = statistics.median(result["seconds"])
                scored = references if spec["search"] == "score" else result["outputs"]
                tokens = count_target_tokens(translator.target_tokenizer, scored)
                result.update(sentences_per_second=len(sentences) / seconds,
                              tokens_per_second=tokens / seconds)
                results.append({**{k: spec[k] for k in ("variant", "search", "alpha", "cores")},
                                "beam": args.beam, **result})
                if spec["variant"].startswith("ct2"):
                    results[-1]["ctranslate2_cpu"] = ct2_cpu
                print(f"  {spec['variant']} {spec['search']} alpha {spec['alpha']} cores "
                      f"{spec['cores']}: {result['sentences_per_second']:.1f} sentences/s",
                      file=sys.stderr, flush=True)
    add_ratios(results)
    print_table(results)
    for line in compare_outputs(results):
        print(line)
    if args.output:
        Path(args.output).write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "outputs"} for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
