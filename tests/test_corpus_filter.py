"""Filtering a parallel corpus (`keras-transformer filter`): the rules, their counts, the files
written, and bad input as one-line errors."""

import gzip
import re

import pytest

from keras_transformer import cli
from keras_transformer.config import ConfigError
from keras_transformer.data.filtering import (FilterCounts, FilterRules, broken_rule,
                                             filter_pairs, longest_repeat)

PAIRS = [
    ("A man rides a bike .", "Ein Mann fährt Fahrrad ."),  # kept
    ("A dog", "Ein Hund springt über einen sehr hohen Zaun im Park"),  # ratio 5.5
    ("A slonnnnnnnned in pink", "Ein Mädchen in Rosa"),  # 8 n in a row
    ("", "Leer"),  # empty side
    ("Two kids play .", "Zwei Kinder spielen ."),  # kept, but a low score
]
SCORES = [-0.4, -0.5, -0.6, -0.7, -3.2]


def test_longest_repeat_counts_one_characters_run():
    assert longest_repeat("slonnnnnnnned") == 8
    assert longest_repeat("aabbb") == 3
    assert longest_repeat("") == 0


def test_each_pair_is_dropped_under_the_first_rule_it_breaks():
    rules = FilterRules(max_length_ratio=2.0, max_repeat=3, min_score=-1.0)
    assert [broken_rule(s, t, score, rules) for (s, t), score in zip(PAIRS, SCORES)] == [
        None, "length_ratio", "repeat", "empty", "score"]
    counts = FilterCounts()
    kept = list(filter_pairs(PAIRS, rules, SCORES, counts))
    assert kept == [PAIRS[0]]
    assert (counts.read, counts.kept) == (5, 1)
    assert counts.dropped == {"empty": 1, "length_ratio": 1, "repeat": 1, "score": 1}
    assert counts.line() == ("kept 1 of 5 pairs (dropped: empty 1, length ratio 1, repeat 1, "
                             "score 1)")
    # without rules only the empty pair goes
    assert list(filter_pairs(PAIRS, FilterRules())) == [p for p in PAIRS if p[0]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_length_ratio=0.5), "max_length_ratio=0.5 must be a finite number >= 1"),
    (dict(max_length_ratio=float("nan")), "max_length_ratio=nan must be a finite number >= 1"),
    (dict(max_length_ratio=float("inf")), "max_length_ratio=inf must be a finite number >= 1"),
    (dict(max_repeat=0), "max_repeat=0 must be >= 1"),
    (dict(min_score=float("nan")), "min_score=nan must be a finite number"),
    (dict(min_score=float("-inf")), "min_score=-inf must be a finite number"),
])
def test_impossible_rules_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        FilterRules(**kwargs)


@pytest.mark.parametrize("flag", ["--min-score", "--max-length-ratio"])
def test_a_rule_of_nan_is_refused_on_the_command_line_not_turned_off(corpus, tmp_path, capsys,
                                                                     flag):
    """`--min-score nan` kept every pair (no score compares below nan): refused in one line
    naming the rule, as `--max-length-ratio nan` is, and nothing is written."""
    source, target, scores = corpus
    out_source = tmp_path / "kept.en"
    assert cli.main(["filter", "--source", str(source), "--target", str(target),
                     "--output-source", str(out_source), "--output-target",
                     str(tmp_path / "kept.de"), "--scores", str(scores), "--min-score", "-1",
                     flag, "nan"]) == 2
    rule = flag[2:].replace("-", "_")
    assert capsys.readouterr().err.strip() == (
        f"keras-transformer filter: error: {rule}=nan must be a finite number"
        + (" >= 1" if rule == "max_length_ratio" else " (a log P / lp)"))
    assert not out_source.exists()


@pytest.fixture
def corpus(tmp_path):
    source, target, scores = (tmp_path / "bt.en.gz", tmp_path / "bt.de", tmp_path / "scores")
    with gzip.open(source, "wt", encoding="utf-8") as f:
        f.write("".join(s + "\n" for s, _ in PAIRS))
    target.write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
    scores.write_text("".join(f"{-5.0:.4f}\t{s:.4f}\t7\n" for s in SCORES), encoding="utf-8")
    return source, target, scores


def test_cli_writes_the_kept_pairs_line_aligned(corpus, tmp_path, capsys):
    source, target, scores = corpus
    out_source, out_target = tmp_path / "kept.en", tmp_path / "kept.de"
    assert cli.main(["filter", "--source", str(source), "--target", str(target),
                     "--output-source", str(out_source), "--output-target", str(out_target),
                     "--max-length-ratio", "2", "--max-repeat", "3", "--scores", str(scores),
                     "--min-score", "-1"]) == 0
    assert capsys.readouterr().out.startswith("kept 1 of 5 pairs (dropped: ")
    assert out_source.read_text(encoding="utf-8") == PAIRS[0][0] + "\n"
    assert out_target.read_text(encoding="utf-8") == PAIRS[0][1] + "\n"
    assert cli.main(["filter", "--source", str(source), "--target", str(target),
                     "--output-source", str(out_source), "--output-target", str(out_target),
                     "--max-repeat", "3"]) == 0
    assert out_source.read_text(encoding="utf-8").splitlines() == [
        PAIRS[0][0], PAIRS[1][0], PAIRS[4][0]]


@pytest.mark.parametrize("change, message", [
    (lambda c: c[2].write_text("-1.0\t-0.5\t3\n"), "scores has 1 lines but .*bt.en.gz has 5"),
    (lambda c: c[2].write_text("x\n" * 5), r"scores, line 1: 'x' is not a line of `keras-"),
    (lambda c: c[2].write_text("-1\t-0.5\t3\n" * 2 + "nan\tnan\t3\n" + "-1\t-0.5\t3\n" * 2),
     r"scores, line 3: the score \(log P / lp\) is nan, not a number$"),
    (lambda c: c[1].write_text("eins\n"), "bt.en.gz has 5 lines but .*bt.de has 1"),
])
def test_bad_input_is_a_one_line_error_and_writes_nothing(corpus, tmp_path, capsys, change,
                                                          message):
    change(corpus)
    source, target, scores = corpus
    out_source = tmp_path / "kept.en"
    assert cli.main(["filter", "--source", str(source), "--target", str(target),
                     "--output-source", str(out_source), "--output-target",
                     str(tmp_path / "kept.de"), "--scores", str(scores),
                     "--min-score", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not out_source.exists()


def test_min_score_needs_scores_and_outputs_must_differ(corpus, tmp_path, capsys):
    source, target, _ = corpus
    base = ["filter", "--source", str(source), "--target", str(target)]
    assert cli.main([*base, "--output-source", str(tmp_path / "a"), "--output-target",
                     str(tmp_path / "b"), "--min-score", "-1"]) == 2
    assert "--min-score and --scores go together" in capsys.readouterr().err
    assert cli.main([*base, "--output-source", str(tmp_path / "a"), "--output-target",
                     str(tmp_path / "a")]) == 2
    assert "are the same file" in capsys.readouterr().err
    assert cli.main([*base, "--output-source", str(target), "--output-target",
                     str(tmp_path / "b")]) == 2
    assert "is the --target file" in capsys.readouterr().err
