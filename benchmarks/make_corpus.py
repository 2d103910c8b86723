"""A synthetic parallel corpus of WMT14's size and sentence lengths, made from Multi30k.

    python benchmarks/make_corpus.py --pairs 4500000 --output runs/scale/corpus_4500000 \
        [--data-dir MULTI30K] [--langs en,de] [--seed 1] [--median-words 20] [--sigma 0.65] \
        [--compound-rate 0.1] [--compound-lexicon 100000] [--eval-pairs 3000]

SYNTHETIC: it measures what vocabulary building, data statistics and the input pipeline cost as
the corpus grows (`benchmarks/scale.py`); it says nothing about translation quality. Its
vocabulary is Multi30k's and its sentences are Multi30k's sentences, recombined.

Writes, in the local-files layout that `data.dataset: files` reads (`data.split_files`), each
file gzipped, one sentence a line, the files of a split line-aligned:

    train.{lang}.gz        --pairs pairs, from Multi30k train
    validation.{lang}.gz   --eval-pairs pairs, from Multi30k val
    test.{lang}.gz         --eval-pairs pairs, from Multi30k test_2016_flickr
    corpus.json            the parameters and each split's length statistics, written last:
                           a folder that has it is complete

How a pair is made: a length L in words is drawn from a log-normal distribution (median
`--median-words`, shape `--sigma`); aligned Multi30k pairs are drawn at random (with
replacement) and appended, each side to its own line with one space between sentences, for as
long as the next one brings the word count of the first language of `--langs` closer to L (one
pair at least). Source and target therefore stay translations of each other, sentence by
sentence, in the same order; with 29,000 Multi30k pairs almost every line is a new combination,
not a copy. The default shape gives lines of about 25 words on average (WMT14 English-German's
order of magnitude), a 99th percentile near 90 words and, in 4.5M pairs, several hundred lines
of more than 200 words (corpus.json has the figures of each corpus). No line is shorter than
the shortest Multi30k sentence.

Multi30k's words alone give a joint SentencePiece vocabulary of about 21k pieces, where WMT14's
is 37k. So each language also gets a lexicon of `--compound-lexicon` made-up compounds, two
Multi30k training words of four or more letters joined, the second lowercased ("Hund" +
"Schnee" -> "Hundschnee", "street" + "Corner" -> "streetcorner"), and each word of a line is
replaced, with probability `--compound-rate`, by a compound drawn from a Zipf distribution
(exponent 1.3) over that lexicon: a few frequent, most rare, as real vocabularies go. Lines keep
their word counts; the two sides of a pair get their compounds independently (this corpus
measures cost, not translation). `--compound-rate 0` gives Multi30k's words only.

Deterministic: the same arguments write byte-identical files (gzip headers carry no time or
name). Memory holds the Multi30k pool and one chunk of lines, whatever --pairs is.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from keras_transformer.config import DATA_ENV
from keras_transformer.data.text_io import DataError, read_parallel_lines

# Multi30k split each synthetic split is made from.
SOURCE_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
MANIFEST = "corpus.json"
MEDIAN_WORDS, SIGMA = 20.0, 0.65  # the default length distribution (see the module docstring)
COMPOUND_RATE, COMPOUND_LEXICON = 0.1, 100_000  # the default compounds (module docstring)
_COMPOUND_ZIPF = 1.3
_COMPOUND_MIN_LETTERS = 4
_CHUNK = 8192  # pairs generated and written at a time
_COMPRESSLEVEL = 6
# Histogram range of the length statistics; longer lines are counted in the last bin.
_MAX_COUNTED_WORDS = 4096


class Pool:
    """The aligned Multi30k pairs a synthetic split is drawn from.

    Attributes:
        langs: the languages, in `--langs` order.
        sides: per language, a list of `size` sentences (whitespace-normalized).
        words: int64 [size], words of each pair's first-language sentence.
    """

    def __init__(self, data_dir: str | os.PathLike, split: str, langs: Sequence[str]):
        paths = {}
        for lang in langs:
            path = Path(data_dir) / f"{split}.{lang}.gz"
            paths[lang] = path if path.is_file() else Path(data_dir) / f"{split}.{lang}"
        self.langs = tuple(langs)
        self.sides = {lang: [] for lang in langs}
        for _, sentences in read_parallel_lines(paths):
            normalized = {lang: " ".join(sentences[lang].split()) for lang in langs}
            if all(normalized.values()):  # a pair with an empty side is left out
                for lang in langs:
                    self.sides[lang].append(normalized[lang])
        self.words = np.array([len(s.split()) for s in self.sides[langs[0]]], np.int64)
        if not len(self.words):
            raise DataError(f"{data_dir}: split {split!r} has no pair without an empty side")

    def __len__(self) -> int:
        return len(self.words)


def target_lengths(rng: np.random.Generator, count: int, median_words: float,
                   sigma: float) -> np.ndarray:
    """int64 [count]: words wanted per line, log-normal with the given median and shape, >= 1."""
    lengths = rng.lognormal(np.log(median_words), sigma, size=count)
    return np.maximum(np.rint(lengths), 1).astype(np.int64)


def synthetic_pairs(pool: Pool, count: int, rng: np.random.Generator, median_words: float,
                    sigma: float) -> Iterator[tuple[str, ...]]:
    """`count` synthetic pairs (one string per language of `pool.langs`), made as the module
    docstring says; generated a chunk at a time."""
    pool_words = pool.words.tolist()  # Python ints: the loop below runs once per drawn pair
    draws, used = [], 0
    for first in range(0, count, _CHUNK):
        size = min(_CHUNK, count - first)
        for length in target_lengths(rng, size, median_words, sigma).tolist():
            picked, words = [], 0
            while True:
                if used == len(draws):
                    draws, used = rng.integers(len(pool), size=4 * _CHUNK).tolist(), 0
                index = draws[used]
                # Append while that brings the count closer to the wanted length (the pair
                # that does not is the next line's first).
                if picked and 2 * words + pool_words[index] >= 2 * length:
                    break
                used += 1
                picked.append(index)
                words += pool_words[index]
            yield tuple(" ".join(pool.sides[lang][i] for i in picked) for lang in pool.langs)


def make_lexicon(sentences: Sequence[str], size: int, rng: np.random.Generator) -> list[str]:
    """`size` made-up compounds of the words of `sentences` (see the module docstring)."""
    words = sorted({word for sentence in sentences for word in sentence.split()
                    if word.isalpha() and len(word) >= _COMPOUND_MIN_LETTERS})
    if not words:
        raise DataError(f"no word of {_COMPOUND_MIN_LETTERS} or more letters to make compounds of")
    return [words[first] + words[second].lower()
            for first, second in rng.integers(len(words), size=(size, 2)).tolist()]


def with_compounds(pairs: Iterator[tuple[str, ...]], lexicons: Sequence[list[str]], rate: float,
                   rng: np.random.Generator) -> Iterator[tuple[str, ...]]:
    """`pairs` with each word replaced, with probability `rate`, by a compound of its side's
    lexicon (`lexicons` in the order of the pair's sides), Zipf-distributed over the lexicon."""
    for pair in pairs:
        yield tuple(_compounded(line, lexicon, rate, rng) for line, lexicon in zip(pair, lexicons))


def _compounded(line: str, lexicon: list[str], rate: float, rng: np.random.Generator) -> str:
    words = line.split(" ")
    replaced = np.flatnonzero(rng.random(len(words)) < rate).tolist()
    if not replaced:
        return line
    ranks = np.minimum(rng.zipf(_COMPOUND_ZIPF, size=len(replaced)) - 1, len(lexicon) - 1)
    for position, rank in zip(replaced, ranks.tolist()):
        words[position] = lexicon[rank]
    return " ".join(words)


class LengthStats:
    """Words per line of one language, counted as lines stream by (a histogram, no lines kept)."""

    def __init__(self):
        self.counts = np.zeros(_MAX_COUNTED_WORDS + 1, np.int64)

    def add(self, lines: Sequence[str]) -> None:
        words = np.minimum([len(line.split()) for line in lines], _MAX_COUNTED_WORDS)
        self.counts += np.bincount(words, minlength=len(self.counts))

    def summary(self) -> dict:
        """lines, mean, percentiles 50/90/99, max, and the lines longer than 100 and 200 words."""
        lines = int(self.counts.sum())
        lengths = np.arange(len(self.counts))
        cumulative = np.cumsum(self.counts)

        def percentile(p):
            return int(np.searchsorted(cumulative, p / 100 * lines))

        return {"lines": lines,
                "mean_words": float((self.counts * lengths).sum() / max(lines, 1)),
                "p50": percentile(50), "p90": percentile(90), "p99": percentile(99),
                "max": int(lengths[self.counts > 0].max()) if lines else 0,
                "over_100": int(self.counts[101:].sum()), "over_200": int(self.counts[201:].sum())}


def _gzip_writer(path: Path):
    """A byte-deterministic gzip file: no name and time 0 in its header."""
    return gzip.GzipFile(filename="", mode="wb", compresslevel=_COMPRESSLEVEL,
                         fileobj=open(path, "wb"), mtime=0)


def write_split(output: Path, split: str, pairs: Iterator[tuple[str, ...]],
                langs: Sequence[str]) -> dict:
    """Writes `{output}/{split}.{lang}.gz` for every language (under temporary names, renamed
    when complete); returns {lang: LengthStats.summary()}."""
    partial = {lang: output / f".partial-{split}.{lang}.gz" for lang in langs}
    files = {lang: _gzip_writer(path) for lang, path in partial.items()}
    stats = {lang: LengthStats() for lang in langs}
    try:
        chunk = []
        for pair in pairs:
            chunk.append(pair)
            if len(chunk) == _CHUNK:
                _write_chunk(files, stats, chunk, langs)
                chunk = []
        _write_chunk(files, stats, chunk, langs)
    finally:
        for f in files.values():
            fileobj = f.fileobj
            f.close()
            fileobj.close()
    for lang, path in partial.items():
        path.replace(output / f"{split}.{lang}.gz")
    return {lang: s.summary() for lang, s in stats.items()}


def _write_chunk(files, stats, chunk, langs):
    for column, lang in enumerate(langs):
        lines = [pair[column] for pair in chunk]
        files[lang].write("".join(line + "\n" for line in lines).encode("utf-8"))
        stats[lang].add(lines)


def corpus_parameters(pairs: int, langs: Sequence[str], seed: int, median_words: float,
                      sigma: float, eval_pairs: int, compound_rate: float = COMPOUND_RATE,
                      compound_lexicon: int = COMPOUND_LEXICON) -> dict:
    """What a corpus is made from (besides the Multi30k files): equal parameters, equal files."""
    return {"pairs": pairs, "langs": list(langs), "seed": seed, "median_words": median_words,
            "sigma": sigma, "eval_pairs": eval_pairs, "compound_rate": compound_rate,
            "compound_lexicon": compound_lexicon}


def read_manifest(output: str | os.PathLike) -> dict | None:
    """The corpus.json of a complete corpus folder, or None."""
    path = Path(output) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def write_corpus(output: str | os.PathLike, data_dir: str | os.PathLike, *, pairs: int,
                 langs: Sequence[str] = ("en", "de"), seed: int = 1,
                 median_words: float = MEDIAN_WORDS, sigma: float = SIGMA,
                 eval_pairs: int = 3000, compound_rate: float = COMPOUND_RATE,
                 compound_lexicon: int = COMPOUND_LEXICON) -> dict:
    """Writes the corpus (see the module docstring) to `output`; returns its manifest."""
    if pairs < 1 or eval_pairs < 1:
        raise ValueError(f"pairs={pairs} and eval_pairs={eval_pairs} must be positive")
    if not 0 <= compound_rate <= 1 or compound_lexicon < 1:
        raise ValueError(f"compound_rate={compound_rate} must be in [0, 1] and "
                         f"compound_lexicon={compound_lexicon} positive")
    if median_words <= 0 or sigma < 0:
        raise ValueError(f"median_words={median_words} must be positive and sigma={sigma} >= 0")
    if len(set(langs)) != len(langs) or len(langs) < 2:
        raise ValueError(f"langs={','.join(langs)}: give two or more different languages")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / MANIFEST).unlink(missing_ok=True)  # incomplete until rewritten
    parameters = corpus_parameters(pairs, langs, seed, median_words, sigma, eval_pairs,
                                   compound_rate, compound_lexicon)
    manifest = {**parameters, "synthetic": "Multi30k sentence pairs recombined; measures cost, "
                                           "not translation quality (benchmarks/make_corpus.py)",
                "splits": {}}
    # Independent random streams: per split for its lines (so the evaluation splits do not
    # depend on --pairs) and for its compounds (so the lines do not depend on the compounds),
    # and one for the lexicons, made of Multi30k train's words for every split.
    streams = np.random.SeedSequence(seed).spawn(2 * len(SOURCE_SPLITS) + 1)
    lexicons = []
    if compound_rate:
        train = Pool(data_dir, SOURCE_SPLITS["train"], langs)
        lexicon_rng = np.random.default_rng(streams[-1])
        lexicons = [make_lexicon(train.sides[lang], compound_lexicon, lexicon_rng)
                    for lang in langs]
    for index, (split, source_split) in enumerate(SOURCE_SPLITS.items()):
        pool = Pool(data_dir, source_split, langs)
        count = pairs if split == "train" else eval_pairs
        generated = synthetic_pairs(pool, count, np.random.default_rng(streams[index]),
                                    median_words, sigma)
        if compound_rate:
            generated = with_compounds(generated, lexicons, compound_rate, np.random.default_rng(
                streams[len(SOURCE_SPLITS) + index]))
        manifest["splits"][split] = {"from": f"multi30k {source_split} ({len(pool)} pairs)",
                                     "words": write_split(output, split, generated, langs)}
    (output / f".partial-{MANIFEST}").write_text(json.dumps(manifest, indent=2) + "\n")
    (output / f".partial-{MANIFEST}").replace(output / MANIFEST)
    return manifest


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, required=True, help="training pairs to write")
    parser.add_argument("--output", required=True, help="folder to write (created if missing)")
    parser.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                        help=f"the Multi30k folder (default: ${DATA_ENV})")
    parser.add_argument("--langs", default="en,de",
                        help="comma-separated languages; lengths are counted on the first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--median-words", type=float, default=MEDIAN_WORDS,
                        help="median of the log-normal line length drawn for each pair")
    parser.add_argument("--sigma", type=float, default=SIGMA,
                        help="shape of that log-normal: larger, a longer tail")
    parser.add_argument("--compound-rate", type=float, default=COMPOUND_RATE,
                        help="probability that a word is replaced by a made-up compound")
    parser.add_argument("--compound-lexicon", type=int, default=COMPOUND_LEXICON,
                        help="made-up compounds per language")
    parser.add_argument("--eval-pairs", type=int, default=3000,
                        help="pairs of the validation and test splits")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error(f"pass --data-dir or set ${DATA_ENV} to the Multi30k folder")
    if args.pairs < 1 or args.eval_pairs < 1:
        parser.error("--pairs and --eval-pairs must be positive")
    if not 0 <= args.compound_rate <= 1 or args.compound_lexicon < 1:
        parser.error("--compound-rate must be in [0, 1] and --compound-lexicon positive")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        manifest = write_corpus(args.output, args.data_dir, pairs=args.pairs,
                                langs=tuple(args.langs.split(",")), seed=args.seed,
                                median_words=args.median_words, sigma=args.sigma,
                                eval_pairs=args.eval_pairs, compound_rate=args.compound_rate,
                                compound_lexicon=args.compound_lexicon)
    except (DataError, ValueError, OSError) as error:
        sys.exit(f"make_corpus.py: error: {str(error).splitlines()[0]}")
    words = manifest["splits"]["train"]["words"][manifest["langs"][0]]
    print(f"wrote {args.pairs:,} training pairs to {args.output} (synthetic): "
          f"{manifest['langs'][0]} words per line mean {words['mean_words']:.1f}, "
          f"median {words['p50']}, 99th percentile {words['p99']}, max {words['max']}, "
          f"{words['over_200']:,} lines over 200 words")


if __name__ == "__main__":
    main()
