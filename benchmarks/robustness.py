"""How a model holds up on the text people type: capitals, typos, numbers, names and emoji.

    python benchmarks/robustness.py RUN_OR_EXPORT [--sets flickr,tatoeba] [--greedy]
        [--no-repeat-ngram-size N] [--repetition-penalty P] [--limit N] [--json FILE]

RUN_OR_EXPORT is a training run folder, a SavedModel version folder or a CTranslate2 export
(whatever `keras-transformer translate` takes). Each test set's sources are translated as they
are and after each transformation below, every one seeded, so that two models see the same
input:

    clean    the sources as they are
    upper    ALL CAPS (`str.upper`, as a caps-lock typist writes)
    title    Title Case: every word's first letter a capital
    typos    a typo in one word in six (at least one): letters swapped, dropped, doubled,
             replaced by a keyboard neighbour or inserted (`modifiers.typos`)
    number   a number put before a random word (``18 ein Mann ...``, ``... mit 3,5 Hunden``)
    name     a real person's name put before a random word (``José García``, ``Łukasz Nowak``);
             the training modifier (`modifiers.random_name`) only ever makes names up
    emoji    an emoji at the end of the sentence

For each it prints the lowercased sacreBLEU against the test set's references (the number, name
and emoji are not in the references, so those rows' BLEU measures what the rest of the sentence
kept), the difference from the clean input, the outputs per 1000 that are degenerate (a run of
one character 4 or more times, or one word 3 or more times in a row, that the source does not
have: ``TAAAAAAA``, ``the the the``), and for number, name and emoji the share of outputs that
contain the span exactly. Test sets: `flickr` (Multi30k test_2016_flickr, from
$KERAS_TRANSFORMER_DATA or --multi30k) and `tatoeba` (tatoeba-deu-eng's test split, from
--tatoeba, default the folder beside Multi30k's). The languages are the run's (an export's:
--source-lang/--target-lang, default de -> en). Name the CPU (`lscpu`) with the figures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_transformer.data import modifiers  # noqa: E402  (no TensorFlow: before the env is read)

CLASSES = ("clean", "upper", "title", "typos", "number", "name", "emoji")
SPAN_CLASSES = ("number", "name", "emoji")
# Names of real people's form, in Latin script with and without diacritics.
NAMES = ("Angela Müller", "José García", "Zoë Nakamura", "Łukasz Nowak", "Ngozi Okafor",
         "Björn Lindqvist", "Priya Raman", "Mehmet Yılmaz", "François Dubois", "Kwame Mensah",
         "Aiko Tanaka", "Dmitri Ivanov", "Sofia Rossi", "Tomás Novák", "Emma Schmidt",
         "Liam O'Brien", "Chloé Martin", "Jürgen Weiß", "Anna Kowalska", "Mateo Fernández",
         "Søren Kierkegaard", "Ines Ribeiro", "Hiroshi Sato", "Fatima Haddad", "Oliver Smith")
EMOJI = ("😊", "😂", "👍", "❤️", "🎉", "🙏", "😍", "🔥", "🌞", "🐶", "⚽", "🚲", "🍕", "😢", "✨")


def number(rng: random.Random) -> str:
    """A number as the benchmark writes one: 2 to 99, 100 to 2030, or a decimal with a comma."""
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(2, 99))
    if kind < 0.85:
        return str(rng.randint(100, 2030))
    return f"{rng.randint(1, 20)},{rng.randint(1, 9)}"


def transform(sources: list[str], kind: str, seed: int = 0) -> tuple[list[str], list]:
    """`sources` after transformation `kind` (one of `CLASSES`), and per source the span that
    the translation should contain (None for the classes without one)."""
    rng = random.Random(f"{kind}-{seed}")
    spans = [None] * len(sources)
    if kind == "clean":
        return list(sources), spans
    if kind == "upper":
        return [modifiers.upper_case(s) for s in sources], spans
    if kind == "title":
        return [modifiers.title_case(s) for s in sources], spans
    if kind == "typos":
        return [modifiers.typos(s, rng) for s in sources], spans
    changed = []
    for index, source in enumerate(sources):
        if kind == "emoji":
            spans[index] = rng.choice(EMOJI)
            changed.append(f"{source} {spans[index]}")
            continue
        spans[index] = number(rng) if kind == "number" else rng.choice(NAMES)
        words = source.split(" ")
        words.insert(rng.randint(0, len(words) - 1), spans[index])
        changed.append(" ".join(words))
    return changed, spans


_CHAR_RUN = re.compile(r"(.)\1{3,}")
_WORD_RUN = re.compile(r"\b(\w+)(?:\s+\1\b){2,}")


def runs(text: str) -> set[str]:
    """The loops of `text`: each character that runs 4 or more times, each word 3 or more."""
    lowered = text.lower()
    return ({m.group(1) for m in _CHAR_RUN.finditer(lowered)}
            | {m.group(1) for m in _WORD_RUN.finditer(lowered)})


def degenerate(source: str, output: str) -> bool:
    """Whether `output` loops where `source` does not (see `runs`)."""
    return bool(runs(output) - runs(source))


def kept(span: str, output: str) -> bool:
    """Whether the span is in the output as it is (an emoji's variation selector aside)."""
    return span.replace("\ufe0f", "") in output.replace("\ufe0f", "")


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def test_sets(args, source_lang: str, target_lang: str) -> dict:
    """{name: (sources, references)} of --sets."""
    multi30k = Path(args.multi30k or os.environ.get("KERAS_TRANSFORMER_DATA", ""))
    tatoeba = Path(args.tatoeba) if args.tatoeba else multi30k.parent / "tatoeba-deu-eng"
    files = {"flickr": (multi30k, "test_2016_flickr"), "tatoeba": (tatoeba, "test")}
    found = {}
    for name in args.sets.split(","):
        if name not in files:
            sys.exit(f"robustness.py: error: --sets {name}: not one of {', '.join(files)}")
        folder, split = files[name]
        paths = [folder / f"{split}.{lang}.gz" for lang in (source_lang, target_lang)]
        for path in paths:
            if not path.is_file():
                sys.exit(f"robustness.py: error: {path}: no such file (set --multi30k or "
                         "--tatoeba, or $KERAS_TRANSFORMER_DATA)")
        sources, references = (read_lines(path)[:args.limit] for path in paths)
        found[name] = (sources, references)
    return found


def score_class(sources, spans, outputs, references) -> dict:
    """The figures of one transformed set (see the module docstring)."""
    import sacrebleu

    bleu = sacrebleu.corpus_bleu(outputs, [references], lowercase=True).score
    row = {"bleu_lowercased": round(bleu, 2),
           "degenerate_per_1000": round(1000 * sum(map(degenerate, sources, outputs))
                                        / max(len(outputs), 1), 1),
           "sentences": len(outputs)}
    if spans[0] is not None:
        row["kept_percent"] = round(100 * sum(map(kept, spans, outputs)) / len(outputs), 1)
    return row


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a run folder, a SavedModel version folder or a "
                                      "CTranslate2 export")
    parser.add_argument("--sets", default="flickr,tatoeba")
    parser.add_argument("--classes", default=",".join(CLASSES))
    parser.add_argument("--multi30k", help="the Multi30k folder (default "
                                           "$KERAS_TRANSFORMER_DATA)")
    parser.add_argument("--tatoeba", help="the tatoeba-deu-eng folder (default: beside "
                                          "Multi30k's)")
    parser.add_argument("--source-lang", default=None)
    parser.add_argument("--target-lang", default=None)
    parser.add_argument("--greedy", action="store_true", help="greedy search (default: beam)")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--case-folding", action="store_true",
                        help="translate with case folding (a run's data.case_folding, or an "
                             "export made with it)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="first N sentences of a set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--outputs", help="write each class's translations to this folder")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from keras_transformer import cli
    from keras_transformer.decoding.texts import translate_texts

    model = Path(args.model)
    is_run = (model / "config.yaml").is_file()
    source_lang, target_lang = args.source_lang or "de", args.target_lang or "en"
    if is_run:
        from keras_transformer.runs.folder import Run

        data = Run(model).config.data
        source_lang = args.source_lang or data.source_lang
        target_lang = args.target_lang or data.target_lang
    command = ["translate", "--run" if is_run else "--model", str(model)]
    command += ["--greedy"] if args.greedy else []
    command += ["--case-folding"] if args.case_folding else []
    for flag, value in (("--no-repeat-ngram-size", args.no_repeat_ngram_size),
                        ("--repetition-penalty", args.repetition_penalty)):
        command += [] if value is None else [flag, str(value)]
    translate = cli._translate_function(cli.build_parser().parse_args(command))
    results = {"model": str(model), "search": "greedy" if args.greedy else "beam",
               "no_repeat_ngram_size": args.no_repeat_ngram_size,
               "repetition_penalty": args.repetition_penalty,
               "case_folding": args.case_folding, "sets": {}}
    print(f"{'set':8} {'input':7} {'BLEU(lc)':>8} {'vs clean':>8} {'degen/1000':>10} "
          f"{'kept %':>6}")
    for name, (sources, references) in test_sets(args, source_lang, target_lang).items():
        rows = results["sets"][name] = {}
        for kind in args.classes.split(","):
            inputs, spans = transform(sources, kind, args.seed)
            start = time.perf_counter()
            outputs = translate_texts(translate, inputs, batch_size=args.batch_size)
            row = rows[kind] = score_class(inputs, spans, outputs, references)
            row["seconds"] = round(time.perf_counter() - start, 1)
            if args.outputs:
                folder = Path(args.outputs)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{name}.{kind}.{target_lang}").write_text(
                    "".join(line + "\n" for line in outputs), encoding="utf-8")
            clean = rows.get("clean", {}).get("bleu_lowercased")
            delta = "" if clean is None else f"{row['bleu_lowercased'] - clean:+.2f}"
            print(f"{name:8} {kind:7} {row['bleu_lowercased']:8.2f} {delta:>8} "
                  f"{row['degenerate_per_1000']:10.1f} "
                  f"{row.get('kept_percent', ''):>6}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n",
                                   encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
