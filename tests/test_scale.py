"""The scale benchmarks: `benchmarks/make_corpus.py` (a synthetic corpus of WMT14's shape made
from Multi30k) and `benchmarks/scale.py` (the cost of each data stage as the corpus grows)."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.config import REPO_ROOT
from keras_transformer.data.corpora import check_parallel_files, split_files
from keras_transformer.runs.folder import Run
from helpers import load_benchmark


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


def test_compounds_replace_words_at_the_rate_and_keep_the_lines_and_their_lengths(
        corpus, multi30k_dir, tmp_path):
    """Made-up compounds widen the vocabulary towards WMT's: about `compound_rate` of the words
    become compounds of two Multi30k words; everything else is the corpus without them."""
    for name, rate in (("plain", 0.0), ("compounds", 0.1), ("again", 0.1)):
        corpus.write_corpus(tmp_path / name, multi30k_dir, pairs=2000, eval_pairs=20, seed=4,
                            compound_rate=rate)
    assert (tmp_path / "compounds" / "train.de.gz").read_bytes() == (
        tmp_path / "again" / "train.de.gz").read_bytes()
    assert corpus.read_manifest(tmp_path / "compounds")["compound_rate"] == 0.1
    multi30k_words = {word for lang in ("en", "de") for line in read_gz(
        multi30k_dir / f"train.{lang}.gz") for word in line.split()}
    for lang in ("en", "de"):
        plain = read_gz(tmp_path / "plain" / f"train.{lang}.gz")
        compounded = read_gz(tmp_path / "compounds" / f"train.{lang}.gz")
        assert {w for line in plain for w in line.split()} <= multi30k_words
        changed = total = 0
        for before, after in zip(plain, compounded, strict=True):
            before, after = before.split(), after.split()
            assert len(before) == len(after)
            total += len(after)
            for old, new in zip(before, after):
                if old != new:
                    changed += 1
                    assert new not in multi30k_words and len(new) >= 8 and new.isalpha()
        assert 0.08 < changed / total < 0.12, (lang, changed / total)


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
    (["--pairs", "10", "--compound-rate", "1.5"], "--compound-rate must be in [0, 1]"),
])
def test_make_corpus_bad_input_is_one_line_error(multi30k_dir, tmp_path, arguments, message):
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "make_corpus.py"),
               "--output", str(tmp_path / "c"), "--data-dir", str(multi30k_dir), *arguments]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]  # after argparse's usage, if any
    assert error.startswith("make_corpus.py: error: ") and message in error, result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def scale():
    return load_benchmark("scale")


def test_rates_of_a_pass(scale):
    tokens, times = [100, 300, 600], [1.0, 2.0, 4.0]  # seconds since the start
    assert scale.rates(tokens, times, 2) == {"first": 200.0, "steady": 250.0, "pass_seconds": 4.0,
                                             "batches": 3, "tokens": 1000}
    assert scale.rates(tokens, times, 10)["first"] == 250.0  # a pass shorter than the first
    assert scale.rates([], [], 2)["steady"] is None


def sizes(vocab_seconds, stats_seconds, pass_seconds, off_peak, steady):
    return {size: {"pairs": size, "vocab": {"seconds": v}, "stats": {"seconds": s},
                   "input-off": {"pass_seconds": p, "peak_mb": m, "steady": r}}
            for size, v, s, p, m, r in zip((1000, 10000), vocab_seconds, stats_seconds,
                                           pass_seconds, off_peak, steady)}


def test_table_gives_ratios_to_the_smallest_size(scale):
    lines = scale.table(sizes((2.0, 10.0), (1.0, 10.0), (1.0, 9.0), (800, 1000), (5e4, 6e4)))
    assert lines[0] == "| figure | 1,000 pairs | 10,000 pairs |"
    assert "| training pairs | 1,000 (1.00x) | 10,000 (10.00x) |" in lines
    assert "| build-vocab, s | 2.0 (1.00x) | 10.0 (5.00x) |" in lines
    assert "| input, cache off: peak MB | 800 (1.00x) | 1,000 (1.25x) |" in lines
    assert not any("cache on" in line for line in lines)  # not measured: no row


def test_targets_are_judged_against_linear_time_memory_and_training(scale):
    met = scale.targets(sizes((2.0, 10.0), (1.0, 10.0), (1.0, 9.0), (800, 1000), (5e4, 6e4)), 1000)
    assert met[0].endswith("0.50: met") and met[1].endswith("1.00: met")
    assert met[2].endswith("0.90: met") and met[3].endswith("1.25x: met")
    assert met[4].endswith("50.0x, 60.0x: met")
    missed = scale.targets(sizes((2.0, 30.0), (1, 1), (1, 1), (800, 1300), (5e4, 9e3)), 1000)
    assert missed[0].endswith("1.50: NOT met")
    assert missed[3].endswith("1.62x: NOT met") and missed[4].endswith("9.0x: NOT met")


def test_scale_runs_each_stage_and_prints_the_table_with_ratios(multi30k_dir, tmp_path):
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "scale.py"), "--sizes", "200,400",
               "--work-dir", str(tmp_path), "--data-dir", str(multi30k_dir),
               "--stages", "vocab,input-off", "--set", "data.vocab_size=400",
               "--set", "data.tokens_per_batch=2048", "--first-batches", "2", "--eval-pairs", "20",
               "--train-steps", "0", "--train-tokens-per-second", "100", "--shard-size", "0",
               "--json", str(tmp_path / "figures.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "| figure | 200 pairs | 400 pairs |" in out
    assert "| training pairs | 200 (1.00x) | 400 (2.00x) |" in out
    for row in ("build-vocab, s", "build-vocab, peak MB", "input, cache off: first, target tokens/s",
                "input, cache off: peak MB"):
        line = next(l for l in out.splitlines() if l.startswith(f"| {row} |"))
        assert line.count("x)") == 2 and "(1.00x)" in line, line
    assert "data-stats" not in out  # a stage not asked for
    assert "- peak memory with the cache off within 1.5x of the 200-pair figure: " in out
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["sizes"]["400"]["input-off"]["tokens"] > figures["sizes"]["200"]["input-off"]["tokens"]
    assert figures["sizes"]["200"]["vocab"]["peak_mb"] > 100  # a process's own peak, in MB


# ----------------------------------------------------------------------------- fit.py

@pytest.fixture(scope="module")
def fit():
    return load_benchmark("fit")


def test_steady_rates_leave_out_the_first_window(fit):
    windows = [{"step": 2, "wall_time": 100.0, "tokens_per_second": 50.0},  # tracing
               {"step": 4, "wall_time": 104.0, "tokens_per_second": 1000.0},
               {"step": 6, "wall_time": 110.0, "tokens_per_second": 700.0},
               {"step": 8, "wall_time": 114.0, "tokens_per_second": 1100.0}]
    rates = fit.steady_rates(windows)
    assert rates == {"step_seconds": 2.0, "target_tokens_per_second": 1000.0, "windows": 3}
    with pytest.raises(SystemExit, match="2 TensorBoard points; raise --steps"):
        fit.steady_rates(windows[:2])


def test_fit_trains_the_experiment_on_a_corpus_and_reads_its_run_back(multi30k_dir, tmp_path):
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "make_corpus.py"),
                    "--output", str(corpus), "--data-dir", str(multi30k_dir), "--pairs", "300",
                    "--eval-pairs", "20"], check=True, capture_output=True)
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "fit.py"),
               "--config", str(REPO_ROOT / "experiments" / "wmt14_en_de_big.yaml"),
               "--corpus", str(corpus), "--steps", "3", "--log-every", "1",
               "--set", "model.preset=tiny", "--set", "data.vocab_size=500",
               "--set", "data.max_pair_length=128", "--set", "data.tokens_per_batch=512",
               "--set", "train.accumulate_steps=2", "--peak-repeats", "2",
               "--run-dir", str(tmp_path / "run"), "--json", str(tmp_path / "fit.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "fit.json").read_text())
    assert (figures["steps"], figures["accumulate_steps"], figures["windows"]) == (3, 2, 2)
    assert 325 < figures["vocab_size"] <= 500 and figures["layers"] == 2
    assert figures["step_seconds"] > 0 and figures["target_tokens_per_second"] > 0
    assert figures["mfu"]["bfloat16"] == pytest.approx(
        figures["target_tokens_per_second"] * figures["flops_per_target_token"]
        / figures["peak_flops"]["bfloat16"])
    for dtype in ("float32", "bfloat16"):  # the larger of the two measurements: MFU errs low
        before, after = figures["peak_flops_before_after"][dtype]
        assert figures["peak_flops"][dtype] == max(before, after) > 0
    assert figures["peak_mb"] > 100
    assert figures["params"] == Run(tmp_path / "run").load_model("last").count_params()
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert (state["epoch"], state["optimizer_step"]) == (1, 3)  # a real run folder
    assert "wmt14_en_de_big.yaml (wmt14_en_de_big: 2 layers" in result.stdout


@pytest.mark.parametrize("option", ["--steps", "--log-every", "--peak-repeats"])
def test_fit_counts_must_be_positive(fit, tmp_path, capsys, option):
    with pytest.raises(SystemExit) as raised:
        fit.parse_args(["--config", "x.yaml", "--corpus", str(tmp_path), option, "0"])
    assert raised.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "--steps, --log-every and --peak-repeats must be at least 1")


def test_fit_bad_input_is_one_line_error(tmp_path):
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "fit.py"), "--config",
               str(REPO_ROOT / "experiments" / "wmt14_en_de_base.yaml"), "--corpus",
               str(tmp_path / "missing")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(f"--corpus {tmp_path / 'missing'}: no such folder")
