"""Translating a corpus file costs nothing beyond decoding: `translate --source --output` against
the same decoding loop on the same sentences held in memory, in one run.

    python benchmarks/translate_file.py --run runs/demo [--limit 20000] [--beam-limit 4000]

The run is exported once per variant into a temporary folder (the SavedModel with beam 4, and
CTranslate2 float32 and int8), and the first `--limit` unique German captions of Multi30k Task 2
(`multi30k-captions/train.*.de.gz`) are written to a plain file. For every variant and search
(greedy, beam 4 on the first `--beam-limit`, sampling), two processes run one after the other:

    decode  the model loaded, the sentences in memory, `texts.translate_texts` (sorted by
            length, `--batch-size`, `--workers` batches in flight): what `benchmarks/decode.py`
            times, without its warm-up pass
    file    `keras-transformer translate --model M --source FILE --output OUT --workers W`:
            reading, chunks of length-sorted batches, the output written and flushed chunk by
            chunk, the progress bar

Both rates count from the model being loaded to the last sentence translated (tracing
included, on both sides), and the table gives file / decode. Every process uses `--workers`
threads (one thread per op, as `translate` sets them). Name the CPU (`lscpu`) with the figures.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

VARIANTS = ("savedmodel", "ct2_float32", "ct2_int8")
SEARCHES = ("greedy", "beam", "sampling")
SEARCH_FLAGS = {"greedy": ["--greedy"], "beam": ["--beam", "4"], "sampling": ["--sampling"]}

# The decode row: the CLI's function for the search, over sentences in memory.
_DECODE = r"""
import sys, time
from keras_transformer import cli
from keras_transformer.decoding.texts import translate_texts
model, source, search, workers, batch_size = sys.argv[1:6]
args = cli.build_parser().parse_args(
    ["translate", "--model", model, "--workers", workers] + sys.argv[6:])
translate = cli._translate_function(args)
lines = open(source, encoding="utf-8").read().splitlines()
start = time.perf_counter()
translate_texts(translate, lines, batch_size=int(batch_size), workers=int(workers),
                seeds=list(range(len(lines))) if search == "sampling" else None)
print("RATE", len(lines) / (time.perf_counter() - start))
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--captions", default=None,
                        help="folder of the Task 2 captions (default: multi30k-captions beside "
                             "$KERAS_TRANSFORMER_DATA)")
    parser.add_argument("--lang", default=None, help="caption language (default: the run's "
                                                      "source language)")
    parser.add_argument("--limit", type=int, default=20000, help="sentences for greedy, sampling")
    parser.add_argument("--beam-limit", type=int, default=4000, help="sentences for beam 4")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--searches", default=",".join(SEARCHES))
    return parser.parse_args(argv)


def caption_lines(folder: Path, lang: str, limit: int) -> list[str]:
    """The first `limit` unique non-empty captions of train.1..5.LANG.gz, in file order."""
    seen = {}
    for index in range(1, 6):
        with gzip.open(folder / f"train.{index}.{lang}.gz", "rt", encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and line not in seen:
                    seen[line] = None
                    if len(seen) == limit:
                        return list(seen)
    return list(seen)


def export(run: str, variant: str, folder: Path) -> Path:
    command = [sys.executable, "-m", "keras_transformer.cli", "export", "--run", run,
               "--beam", "4"]
    if variant == "savedmodel":
        subprocess.run(command + ["--output", str(folder / "sm"), "--version", "1"], check=True)
        return folder / "sm" / "1"
    quantization = variant.removeprefix("ct2_")
    subprocess.run(command + ["--format", "ctranslate2", "--quantization", quantization,
                              "--output", str(folder / variant)], check=True)
    return folder / variant


def decode_rate(model: Path, source: Path, search: str, args) -> float:
    result = subprocess.run(
        [sys.executable, "-c", _DECODE, str(model), str(source), search, str(args.workers),
         str(args.batch_size), *SEARCH_FLAGS[search]], capture_output=True, text=True,
        check=True)
    return float(result.stdout.split("RATE", 1)[1])


def file_rate(model: Path, source: Path, search: str, args, output: Path) -> float:
    output.unlink(missing_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--model", str(model),
         "--source", str(source), "--output", str(output), "--workers", str(args.workers),
         "--batch-size", str(args.batch_size), *SEARCH_FLAGS[search]],
        capture_output=True, text=True, check=True)
    return float(re.findall(r"([\d.]+)/s", result.stderr)[-1])


def cpu_name() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(argv=None) -> int:
    args = parse_args(argv)
    from keras_transformer.runs.folder import Run

    config = Run(args.run).config
    lang = args.lang or config.data.source_lang
    data = os.environ.get("KERAS_TRANSFORMER_DATA", "../shared/data/multi30k")
    captions = Path(args.captions or Path(data).parent / "multi30k-captions")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sources = {}
        for search in args.searches.split(","):
            limit = args.beam_limit if search == "beam" else args.limit
            path = folder / f"captions_{limit}.{lang}"
            if not path.exists():
                path.write_text("".join(line + "\n" for line in caption_lines(
                    captions, lang, limit)), encoding="utf-8")
            sources[search] = path
        print(f"# {cpu_name()}, {os.cpu_count()} CPUs; {args.run}; captions {lang}; batch "
              f"{args.batch_size}, {args.workers} workers", flush=True)
        print("| variant | search | sentences | decode (sentences/s) | file (sentences/s) | "
              "file / decode |")
        print("| --- | --- | --- | --- | --- | --- |", flush=True)
        for variant in args.variants.split(","):
            model = export(args.run, variant, folder)
            for search in args.searches.split(","):
                source = sources[search]
                count = len(source.read_text(encoding="utf-8").splitlines())
                decode = decode_rate(model, source, search, args)
                written = file_rate(model, source, search, args, folder / "out.txt")
                print(f"| {variant} | {search} | {count} | {decode:.1f} | {written:.1f} | "
                      f"{written / decode:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
