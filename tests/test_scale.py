"""The scale benchmarks: `benchmarks/make_corpus.py` (a synthetic corpus of WMT14's shape made
from Multi30k) and `benchmarks/scale.py` (the cost of each data stage as the corpus grows)."""

import gzip
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.config import REPO_ROOT
from keras_transformer.data import check_parallel_files, split_files


def load_benchmark(name: str):
    """The module of `benchmarks/NAME.py`, which is a script, not a package module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus():
    return load_benchmark("make_corpus")


def read_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_corpus_splits_are_aligned_gzip_files_of_wmt_like_lengths(corpus, multi30k_dir, tmp_path):
    manifest = corpus.write_corpus(tmp_path / "c", multi30k_dir, pairs=3000, eval_pairs=200,
                                   seed=3)
    for split, count in (("train", 3000), ("validation", 200), ("test", 200)):
        paths = split_files(tmp_path / "c", split, ("en", "de"))  # what data.dataset files reads
        check = check_parallel_files(paths)
        assert (check.lines, check.empty_count) == (count, 0), split
    stats = manifest["splits"]["train"]["words"]["en"]
    words = [len(line.split()) for line in read_gz(tmp_path / "c" / "train.en.gz")]
    assert stats["lines"] == len(words) == 3000
    assert stats["mean_words"] == pytest.approx(np.mean(words))
    assert stats["max"] == max(words) and stats["p50"] == int(np.median(words))
    assert 22 <= stats["mean_words"] <= 28, stats
    assert stats["p99"] >= 70 and stats["over_100"] > 0, stats
    assert manifest["splits"]["validation"]["from"].startswith("multi30k val")
    assert corpus.read_manifest(tmp_path / "c") == manifest


def test_corpus_is_deterministic_for_a_seed(corpus, multi30k_dir, tmp_path):
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        corpus.write_corpus(tmp_path / name, multi30k_dir, pairs=500, eval_pairs=20, seed=seed)
    for file in ("train.en.gz", "train.de.gz", "validation.de.gz", "test.en.gz"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    assert read_gz(tmp_path / "a" / "train.en.gz") != read_gz(tmp_path / "c" / "train.en.gz")


def test_pairs_are_aligned_sentences_joined_in_the_same_order(corpus, small_pairs, tmp_path):
    for lang, column in (("de", 0), ("en", 1)):
        with gzip.open(tmp_path / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(pair[column] + "\n" for pair in small_pairs))
    pool = corpus.Pool(tmp_path, "train", ("en", "de"))
    translation = {en: de for de, en in small_pairs}
    pairs = list(corpus.synthetic_pairs(pool, 200, np.random.default_rng(0), 25.0, 0.5))
    assert len(pairs) == 200 and max(len(en.split()) for en, _ in pairs) > 30
    for en, de in pairs:
        sentences = []
        while en:  # the English line, cut back into the pool's sentences
            sentence = next(s for s in translation if en.startswith(s))
            sentences.append(sentence)
            en = en[len(sentence):].lstrip(" ")
        assert de == " ".join(translation[s] for s in sentences)


def test_the_length_tail_reaches_beyond_200_words(corpus, multi30k_dir):
    lengths = corpus.target_lengths(np.random.default_rng(0), 1_000_000, 20.0, 0.65)
    assert 24 <= lengths.mean() <= 26 and (lengths > 200).sum() > 100
    pool = corpus.Pool(multi30k_dir, "val", ("en", "de"))
    long_lines = corpus.synthetic_pairs(pool, 20, np.random.default_rng(0), 250.0, 0.0)
    assert all(len(en.split()) >= 240 for en, _ in long_lines)


@pytest.mark.parametrize("arguments, message", [
    (["--pairs", "0"], "--pairs and --eval-pairs must be positive"),
    (["--pairs", "10", "--data-dir", "/nonexistent"], "file not found"),
    (["--pairs", "10", "--langs", "en,en"], "give two or more different languages"),
])
def test_make_corpus_bad_input_is_one_line_error(multi30k_dir, tmp_path, arguments, message):
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "make_corpus.py"),
               "--output", str(tmp_path / "c"), "--data-dir", str(multi30k_dir), *arguments]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]  # after argparse's usage, if any
    assert error.startswith("make_corpus.py: error: ") and message in error, result.stderr
    assert "Traceback" not in result.stderr
