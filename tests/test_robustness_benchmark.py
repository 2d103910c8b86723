"""`benchmarks/robustness.py`: its transformations, what it counts as a loop or a kept span,
and one run over a run folder that writes its figures."""

import json
import random

import pytest

from keras_transformer.data import modifiers
from helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("robustness")


SOURCES = ["Ein Mann mit einem orangefarbenen Hut.", "Zwei Hunde spielen im Schnee.",
           "Eine Frau liest."]


def test_each_transformation_changes_what_it_names_and_is_seeded(bench):
    assert bench.transform(SOURCES, "clean") == (SOURCES, [None] * 3)
    assert bench.transform(SOURCES, "upper")[0][0] == "EIN MANN MIT EINEM ORANGEFARBENEN HUT."
    assert bench.transform(SOURCES, "title")[0][1] == "Zwei Hunde Spielen Im Schnee."
    typos, _ = bench.transform(SOURCES, "typos")
    for before, after in zip(SOURCES, typos):
        changed = [a != b for a, b in zip(before.split(" "), after.split(" "))]
        assert len(before.split(" ")) == len(after.split(" ")) and 1 <= sum(changed) <= 2
    for kind in ("number", "name", "emoji"):
        inputs, spans = bench.transform(SOURCES, kind, seed=3)
        assert (inputs, spans) == bench.transform(SOURCES, kind, seed=3)
        assert inputs != bench.transform(SOURCES, kind, seed=4)[0]
        for source, changed, span in zip(SOURCES, inputs, spans):
            assert span in changed and changed.replace(span, "").split() == source.split()
    assert bench.transform(SOURCES, "emoji")[0][0].endswith(bench.transform(SOURCES, "emoji")[1][0])
    # the benchmark's names are real ones, never the made-up names training inserts
    made_up = {modifiers.random_name(random.Random(i)) for i in range(2000)}
    assert not made_up & set(bench.NAMES)


@pytest.mark.parametrize("source, output, expected", [
    ("EIN MANN MIT HUT", 'T This is giant "TAAAAAAAAAAAAA', True),
    ("Ein Mann.", "A man.", False),
    ("Ein Mann.", "A man man man.", True),
    ("Ein Mann man man man.", "A man man man.", False),  # the source has the same loop
    ("Es kostet 1000 Euro.", "It costs 1000 euros.", False),
    ("Es kostet 10 Euro.", "It costs 10000 euros.", True),
    ("Ein Mann.", "Ah the the.", False),  # twice is not a loop
])
def test_degenerate_is_a_loop_the_source_does_not_have(bench, source, output, expected):
    assert bench.degenerate(source, output) is expected


def test_a_span_is_kept_only_as_it_is(bench):
    assert bench.kept("18", "18 men are walking.")
    assert not bench.kept("18", "Eighteen men are walking.")
    assert bench.kept("José García", "José García is a man.")
    assert not bench.kept("José García", "Jose Garcia is a man.")
    assert bench.kept("❤️", "I love it ❤")  # the variation selector aside


def test_a_run_prints_and_writes_every_class(bench, random_run, short_multi30k_dir, tmp_path,
                                             capsys):
    path = tmp_path / "figures.json"
    assert bench.main([str(random_run), "--sets", "flickr", "--multi30k",
                       str(short_multi30k_dir), "--limit", "6", "--greedy",
                       "--classes", "clean,upper,number", "--no-repeat-ngram-size", "2",
                       "--json", str(path)]) == 0
    figures = json.loads(path.read_text(encoding="utf-8"))
    rows = figures["sets"]["flickr"]
    assert list(rows) == ["clean", "upper", "number"]
    assert all(row["sentences"] == 6 for row in rows.values())
    assert "kept_percent" in rows["number"] and "kept_percent" not in rows["clean"]
    assert figures["no_repeat_ngram_size"] == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["set", "input", "BLEU(lc)", "vs", "clean", "degen/1000",
                                "kept", "%"]
    assert [line.split()[:2] for line in lines[1:]] == [["flickr", "clean"],
                                                         ["flickr", "upper"],
                                                         ["flickr", "number"]]
