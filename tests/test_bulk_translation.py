"""Translating a corpus (`bulk_translation`, `translate --source --output [--shard]`) and
sampling from the command line: output in input order, resume after a kill, shards, seeds.

Runs that split the corpus differently are compared at batch size 1: a sentence's logits may
differ in their last bits between batches, which can move a draw of the random model's nearly
flat distributions (`decoding.SamplingSearch`); the decoding tests show the per-sentence seeds
with exact logits."""

import gzip
import io
import json
import os
import sys

import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.decoding.bulk_translation import RESUME_SUFFIX, Shard, translate_file
from keras_transformer.config import ConfigError

LINES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Hallo",
         "Eine Frau liest ein Buch im Park, während Kinder neben ihr spielen.", "  ",
         "Ein Hund rennt.", "Leute", "Der Mann's Hut ist rot.", "Ein Mädchen klettert.",
         " ".join(["Wort"] * 300), "Kinder laufen über die Straße!", "Zwei Männer kochen."]


def run_cli(monkeypatch, capsys, argv, stdin: bytes = b""):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str, command="translate") -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"keras-transformer {command}: error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "captions.de"
    path.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sampled_stdout(random_run, corpus):
    """What `translate --sampling --seed 5 --batch-size 1` prints for the corpus, the reference
    of every file run below."""
    out = io.StringIO()
    sys_stdout, sys.stdout = sys.stdout, out
    try:
        assert cli.main(["translate", "--run", str(random_run), "--sampling", "--seed", "5",
                         "--quiet", "--batch-size", "1", "--source", str(corpus)]) == 0
    finally:
        sys.stdout = sys_stdout
    return out.getvalue().splitlines()


def sampling_argv(random_run, *extra, seed=5, batch_size=1):
    return ["translate", "--run", str(random_run), "--sampling", "--seed", str(seed), "--quiet",
            "--batch-size", str(batch_size), *extra]


def test_sampling_is_seeded_per_line(random_run, monkeypatch, capsys, sampled_stdout):
    """The same seed gives the same lines (batched too); another seed other lines; a line
    alone (seed 5 + its line number) gives what it gives in the corpus."""
    stdin = "".join(line + "\n" for line in LINES).encode()
    code, out, err = run_cli(monkeypatch, capsys, sampling_argv(random_run), stdin)
    assert code == 0, err
    assert out.splitlines() == sampled_stdout
    batched = [run_cli(monkeypatch, capsys, sampling_argv(random_run, batch_size=4), stdin)[1]
               for _ in range(2)]
    assert batched[0] == batched[1] and len(batched[0].splitlines()) == len(LINES)
    assert len(sampled_stdout) == len(LINES) and sampled_stdout[1] == sampled_stdout[5] == ""
    code, other, _ = run_cli(monkeypatch, capsys, sampling_argv(random_run, seed=6), stdin)
    assert code == 0 and other.splitlines() != sampled_stdout
    code, alone, _ = run_cli(monkeypatch, capsys, sampling_argv(random_run, seed=7),
                             (LINES[2] + "\n").encode())
    assert alone.splitlines() == [sampled_stdout[2]]


def test_sampling_top_k_one_is_greedy(random_run, monkeypatch, capsys):
    stdin = "".join(line + "\n" for line in LINES[:6]).encode()
    code, greedy, _ = run_cli(monkeypatch, capsys, ["translate", "--run", str(random_run),
                                                    "--greedy", "--quiet"], stdin)
    code, top_1, err = run_cli(monkeypatch, capsys, [
        "translate", "--run", str(random_run), "--sampling", "--sampling-topk", "1",
        "--sampling-temperature", "2", "--seed", "9", "--quiet"], stdin)
    assert code == 0, err
    assert top_1 == greedy


def test_a_file_is_translated_in_order_in_chunks(random_run, corpus, tmp_path, monkeypatch,
                                                 capsys, sampled_stdout):
    output = tmp_path / "out.en"
    code, out, err = run_cli(monkeypatch, capsys, sampling_argv(
        random_run, "--source", str(corpus), "--output", str(output)))
    assert code == 0, err
    assert out == "" and output.read_text(encoding="utf-8").splitlines() == sampled_stdout
    assert not (tmp_path / ("out.en" + RESUME_SUFFIX)).exists()
    # Run again: the finished output is not the job's to resume any more.
    code, _, err = run_cli(monkeypatch, capsys, sampling_argv(
        random_run, "--source", str(corpus), "--output", str(output)))
    assert code == 2
    assert "exists and is not an unfinished translation" in error_line(err)


def test_a_killed_job_resumes_at_its_first_untranslated_line(random_run, corpus, tmp_path,
                                                             sampled_stdout):
    """Chunks of 4 lines; the job dies in its third chunk, after half a line was written: the
    next run cuts the half line, translates only what is missing, and the file is whole."""
    from keras_transformer.decoding.translator import translator_from_run

    translator = translator_from_run(random_run)
    output = tmp_path / "out.en"
    settings = {"model": "tiny", "search": "sampling"}
    calls = []

    def dying(batch, seeds):
        calls.append(len(batch))
        if sum(calls) > 8:
            with open(output, "ab") as f:
                f.write(b"half a li")
            raise KeyboardInterrupt
        return translator.translate_sampling(batch, seeds)

    with pytest.raises(KeyboardInterrupt):
        translate_file(dying, corpus, output, settings=settings, seed=5, batch_size=1,
                       chunk_size=4)
    assert output.read_text(encoding="utf-8").splitlines()[:8] == sampled_stdout[:8]
    calls.clear()
    progress = []
    result = translate_file(lambda *inputs: translator.translate_sampling(*inputs), corpus,
                            output, settings=settings, seed=5, batch_size=1, chunk_size=4,
                            progress=lambda done, total: progress.append((done, total)))
    assert result == {"lines": len(LINES), "resumed_at": 8}
    assert output.read_text(encoding="utf-8").splitlines() == sampled_stdout
    assert progress[0] == (8, len(LINES)) and progress[-1] == (len(LINES), len(LINES))


def test_a_second_job_into_the_same_output_is_refused_naming_the_first(
        random_run, corpus, tmp_path, monkeypatch, capsys, sampled_stdout):
    """Two jobs writing one output at once both ended well, their lines interleaved: the
    second `translate --output`, started while the first translates its second chunk, is
    refused in one line naming the file and the first one's process; the first ends whole,
    its lock gone."""
    from keras_transformer.decoding.translator import translator_from_run

    translator = translator_from_run(random_run)
    output = tmp_path / "out.en"
    second = []

    def translate(batch, seeds):
        if int(seeds[0]) == 5 + 4 and not second:  # the first line of the second chunk
            second.append(run_cli(monkeypatch, capsys, sampling_argv(
                random_run, "--source", str(corpus), "--output", str(output))))
        return translator.translate_sampling(batch, seeds)

    translate_file(translate, corpus, output, settings={"model": "tiny"}, seed=5, batch_size=1,
                   chunk_size=4)
    [(code, out, err)] = second
    assert (code, out) == (2, "")
    assert error_line(err) == (
        f"keras-transformer translate: error: --output {output} is being written by another "
        f"translation job (process {os.getpid()}): wait for it to end, or choose another "
        "--output")
    assert output.read_text(encoding="utf-8").splitlines() == sampled_stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.en"]


def test_a_resumed_job_must_have_the_same_settings(random_run, corpus, tmp_path):
    output = tmp_path / "out.en"
    output.write_text("eins\n")
    resume = tmp_path / ("out.en" + RESUME_SUFFIX)
    record = {"source": str(corpus.resolve()), "source_lines": len(LINES), "shard": "0/1",
              "seed": 5, "settings": {"search": "beam"}}
    resume.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="was started with settings {'search': 'beam'}"):
        translate_file(lambda batch: None, corpus, output, settings={"search": "greedy"},
                       seed=5)
    with pytest.raises(ConfigError, match="was started with seed 5, not 6"):
        translate_file(lambda batch: None, corpus, output, settings={"search": "beam"}, seed=6)
    resume.write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        translate_file(lambda batch: None, corpus, output, settings={}, seed=5)
    assert output.read_text() == "eins\n"  # nothing lost


def test_shards_concatenate_to_the_whole_file(random_run, corpus, tmp_path, monkeypatch,
                                              capsys, sampled_stdout):
    parts = []
    for index in range(3):
        output = tmp_path / f"part{index}"
        code, _, err = run_cli(monkeypatch, capsys, sampling_argv(
            random_run, "--source", str(corpus), "--output", str(output), "--shard",
            f"{index}/3"))
        assert code == 0, err
        parts += output.read_text(encoding="utf-8").splitlines()
    assert parts == sampled_stdout
    assert [len(Shard(i, 3).lines(13)) for i in range(3)] == [4, 4, 5]


@pytest.mark.parametrize("argv, message", [
    (["--shard", "1/2"], "--shard is for --source FILE --output FILE"),
    (["--output", "x"], "--output is for --source FILE"),
    (["--source", "SOURCE", "--output", "x", "--shard", "2/2"], "--shard 2/2: needs 0 <= I < N"),
    (["--source", "SOURCE", "--output", "x", "--shard", "a"], "--shard 'a': expected I/N"),
    (["--source", "SOURCE", "--output", "SOURCE"], "is the --source file"),
    (["--source", "missing.de"], "missing.de: no such file"),
    (["--greedy", "--sampling-topk", "3"], "--sampling-topk is for --sampling"),
])
def test_translate_mistakes_are_one_line_errors(random_run, corpus, tmp_path, monkeypatch,
                                                capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = [str(corpus) if arg == "SOURCE" else arg for arg in argv]
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--run", str(random_run),
                                                   "--quiet", *argv])
    assert code == 2 and out == ""
    assert message in error_line(err)


def test_an_export_samples_with_its_own_settings(random_export, monkeypatch, capsys):
    stdin = "".join(line + "\n" for line in LINES[:4]).encode()
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                   "--sampling", "--quiet"], stdin)
    assert code == 0, err
    assert len(out.splitlines()) == 4
    code, _, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                 "--sampling", "--sampling-topk", "5"], stdin)
    assert code == 2
    assert error_line(err) == (
        f"keras-transformer translate: error: --sampling-topk 5: {random_export} was exported "
        "with sampling_topk 0; export again with --set decode.sampling_topk=5, or use --run")


def test_the_loop_guard_is_a_flag_of_a_run_and_fixed_in_a_savedmodel(random_run, random_export,
                                                                      monkeypatch, capsys):
    """--no-repeat-ngram-size and --repetition-penalty set a run's decode settings; a
    SavedModel's are fixed at export (CTranslate2 takes any: test_ctranslate2_export.py)."""
    stdin = "".join(line + "\n" for line in LINES[:3]).encode()
    code, out, err = run_cli(monkeypatch, capsys, [
        "translate", "--run", str(random_run), "--quiet", "--no-repeat-ngram-size", "2",
        "--repetition-penalty", "1.2"], stdin)
    assert code == 0, err
    assert len(out.splitlines()) == 3
    code, _, err = run_cli(monkeypatch, capsys, [
        "translate", "--model", str(random_export), "--quiet", "--no-repeat-ngram-size", "0",
        "--repetition-penalty", "1"], stdin)
    assert code == 0, err  # the export's own values
    code, _, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                 "--no-repeat-ngram-size", "3"], stdin)
    assert code == 2
    assert error_line(err) == (
        f"keras-transformer translate: error: --no-repeat-ngram-size 3: {random_export} was "
        "exported with no_repeat_ngram_size 0; export again with --set "
        "decode.no_repeat_ngram_size=3, or use --run")
    for value in ("0", "-1", "nan", "x"):
        with pytest.raises(SystemExit) as exit_:  # argparse's own refusal
            run_cli(monkeypatch, capsys, ["translate", "--run", str(random_run),
                                          "--repetition-penalty", value], stdin)
        assert exit_.value.code == 2
        assert "must be a finite number > 0 (1: off)" in capsys.readouterr().err


def test_the_progress_bar_counts_this_runs_rate_and_time_left():
    stream = io.StringIO()
    bar = cli._Progress(100, stream=stream, done=40, terminal=True)
    bar.start -= 2.0  # two seconds ago
    bar.show(60)
    text = stream.getvalue()
    assert text.startswith("\rtranslated 60/100 sentences (60%), ")
    rate = float(text.split(", ")[1].removesuffix("/s"))
    assert 9.0 < rate <= 10.0  # 20 sentences in two seconds (and a little more)
    assert text.endswith(", 0:00:04 left")


def test_progress_into_a_file_is_a_plain_line_at_each_tenth():
    stream = io.StringIO()  # not a terminal
    bar = cli._Progress(1000, stream=stream, done=150)
    for done in range(160, 1001, 10):
        bar.show(done)
    lines = stream.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in stream.getvalue()
    assert [line.split()[1] for line in lines[:-1]] == [
        f"{n}/1000" for n in (200, 300, 400, 500, 600, 700, 800, 900, 1000)]


def test_the_file_benchmark_takes_unique_captions_in_file_order(tmp_path):
    from helpers import load_benchmark

    bench = load_benchmark("translate_file")
    for index, lines in enumerate([["b", "a", "b"], ["", "c", "a"], ["d"], [], []], start=1):
        with gzip.open(tmp_path / f"train.{index}.de.gz", "wt", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
    assert bench.caption_lines(tmp_path, "de", 3) == ["b", "a", "c"]
    assert bench.caption_lines(tmp_path, "de", 10) == ["b", "a", "c", "d"]


def test_nbest_lists_in_moses_and_json_lines(random_export, random_run, monkeypatch, capsys):
    """`translate --nbest N`: N hypotheses per line, best first, the export's n-best; a line
    without words has the empty translation alone."""
    from keras_transformer.export.savedmodel import load_translator

    stdin = "".join(line + "\n" for line in LINES[:4]).encode()  # line 1 is empty
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                   "--nbest", "2"], stdin)
    assert code == 0, err
    rows = [line.split(" ||| ") for line in out.splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "1", "2", "2", "3", "3"]
    loaded = load_translator(random_export)
    nbest = loaded.translate_nbest(tf.constant(LINES[:4]))
    want = [(t.decode(), s) for t, s in zip(nbest["translations"].numpy()[0],
                                            nbest["scores"].numpy()[0])]
    assert [(row[1], float(row[2])) for row in rows[:2]] == [
        (text, pytest.approx(score, abs=1e-4)) for text, score in want]
    assert rows[2][1:] == ["", "0.0000"]
    code, out, _ = run_cli(monkeypatch, capsys, ["translate", "--run", str(random_run),
                                                 "--beam", "3", "--nbest", "3",
                                                 "--nbest-format", "jsonl"], stdin)
    entries = [json.loads(line) for line in out.splitlines()]
    assert [e["line"] for e in entries] == [0, 1, 2, 3]
    assert [len(e["hypotheses"]) for e in entries] == [3, 1, 3, 3]
    scores = [h["score"] for h in entries[0]["hypotheses"]]
    assert scores == sorted(scores, reverse=True)
    code, _, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                 "--nbest", "3"], stdin)
    assert code == 2 and "--nbest 3: the beam holds 2 hypotheses" in error_line(err)


def test_translate_with_a_prefix_file(random_run, random_export, tmp_path, monkeypatch, capsys):
    """`translate --prefix FILE`: each output line starts with its prefix line (from a run with
    greedy search, and from an export's translate_prefix signature); mismatched files are one
    line."""
    prefixes = ["A man", "", "Two", "Hal"]
    (tmp_path / "prefix").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    stdin = "".join(line + "\n" for line in LINES[:4]).encode()
    for argv in (["--run", str(random_run), "--greedy"], ["--model", str(random_export)]):
        code, out, err = run_cli(monkeypatch, capsys, ["translate", *argv, "--quiet",
                                                       "--prefix", str(tmp_path / "prefix")],
                                 stdin)
        assert code == 0, err
        lines = out.split("\n")[:-1]
        assert len(lines) == 4 and lines[1] == ""  # line 1 has no words: not decoded
        assert all(line.startswith(prefix) for line, prefix in zip(lines, prefixes))
    code, _, err = run_cli(monkeypatch, capsys, ["translate", "--run", str(random_run),
                                                 "--prefix", str(tmp_path / "prefix")],
                           stdin[:20])
    assert code == 2 and "has 4 lines, the input 1" in error_line(err)


@pytest.mark.parametrize("export", ["random_export", "random_ct2_export"])
def test_an_exports_beam_size_holds_for_nbest_and_prefix_too(export, tmp_path, request,
                                                             monkeypatch, capsys):
    """An export's beam size is fixed when it is made: `--beam 3` with an export of beam 2 is
    refused for --nbest and --prefix as for plain translation (--nbest 2 --beam 3 gave the
    export's beam-2 hypotheses without a word); its own beam size is accepted."""
    model = request.getfixturevalue(export)
    capsys.readouterr()  # what making the fixture printed
    (tmp_path / "prefix").write_text("A\nZwei\n", encoding="utf-8")
    stdin = "".join(line + "\n" for line in LINES[:2]).encode()
    refusal = (f"keras-transformer translate: error: --beam 3: {model} was exported with beam "
               "size 2; export again with --beam 3, or use --run")
    for mode in (["--nbest", "2"], ["--prefix", str(tmp_path / "prefix")], []):
        code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(model),
                                                       "--quiet", "--beam", "3", *mode], stdin)
        assert (code, out, err.strip()) == (2, "", refusal), mode
        code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(model),
                                                       "--quiet", "--beam", "2", *mode], stdin)
        assert code == 0 and out, err
    assert len(out.splitlines()) == 2


@pytest.fixture(scope="module")
def random_ct2_export(random_run, tmp_path_factory):
    """The random run exported for CTranslate2 (beam 2, as its SavedModel `random_export`)."""
    pytest.importorskip("ctranslate2")
    folder = tmp_path_factory.mktemp("ct2") / "model"
    assert cli.main(["export", "--run", str(random_run), "--format", "ctranslate2",
                     "--output", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def wordy_exports(sentencepiece_tokenizers, sentencepiece_vocab, tmp_path_factory):
    """(run, SavedModel, CTranslate2 export) of a random pre-norm model with sharp outputs,
    whose greedy translations have words (the random run's are empty)."""
    import shutil

    pytest.importorskip("ctranslate2")
    from helpers import seeded_tiny_model
    from keras_transformer.config import DecodeConfig, ExperimentConfig

    model = seeded_tiny_model(sentencepiece_tokenizers[0], seed=5, norm="pre",
                              output_scale=3.0, perturb_vectors=True)
    data_config, vocab_dir = sentencepiece_vocab
    root = tmp_path_factory.mktemp("wordy")
    run = root / "run"
    run.mkdir()
    ExperimentConfig(model=model.config, data=data_config,
                     decode=DecodeConfig(beam_size=2, max_extra_length=6)).to_yaml(
        run / "config.yaml")
    model.save_weights(run / "best.weights.h5")
    shutil.copytree(vocab_dir, run / "vocab")
    for fmt in ("savedmodel", "ctranslate2"):
        assert cli.main(["export", "--run", str(run), "--format", fmt,
                         "--output", str(root / fmt)]) == 0
    return run, root / "savedmodel" / "1", root / "ctranslate2"


def test_translate_with_alignments(wordy_exports, monkeypatch, capsys):
    """`translate --alignments`: 'translation ||| alignment' lines, one pair per target word
    with target words in order and source words in range, the same from a run, its SavedModel
    and its CTranslate2 export (greedy search); a line without words gives ' ||| '."""
    run, saved_model, ctranslate2 = wordy_exports
    sources = LINES[:4] + LINES[6:9]
    stdin = "".join(line + "\n" for line in sources).encode()
    outputs = []
    for argv in (["--run", str(run)], ["--model", str(saved_model)],
                 ["--model", str(ctranslate2)]):
        code, out, err = run_cli(monkeypatch, capsys, ["translate", *argv, "--greedy", "--quiet",
                                                       "--alignments"], stdin)
        assert code == 0, err
        outputs.append(out)
        rows = [line.split(" ||| ") for line in out.split("\n")[:-1]]
        assert len(rows) == len(sources) and rows[1] == ["", ""]
        for source, (translation, alignment) in zip(sources, rows):
            pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
            assert [j for _, j in pairs] == list(range(len(translation.split())))
            assert all(0 <= i < len(source.split()) for i, _ in pairs)
    assert outputs[0] == outputs[1] == outputs[2]
    assert sum(len(line.split(" ||| ")[1].split()) for line in outputs[0].splitlines()) > 10
    for extra in (["--nbest", "2"], ["--output", "out.txt", "--source", "in.txt"]):
        code, _, err = run_cli(monkeypatch, capsys, ["translate", "--run", str(run),
                                                     "--alignments", *extra], stdin)
        assert code == 2 and "--alignments writes to standard output" in error_line(err)


def test_nbest_lists_agree_between_the_savedmodel_and_ctranslate2(random_export,
                                                                  random_ct2_export,
                                                                  monkeypatch, capsys):
    """`translate --nbest 2` from the SavedModel and from the CTranslate2 export of one run:
    the same hypotheses in the same order, scores to float32 rounding (both stop a sentence
    once patience x beam hypotheses have finished, the export's beam_full rule)."""
    stdin = "".join(line + "\n" for line in LINES).encode()
    rows = []
    for model in (random_export, random_ct2_export):
        code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(model),
                                                       "--nbest", "2"], stdin)
        assert code == 0, err
        rows.append([line.split(" ||| ") for line in out.splitlines()])
    saved_model, ctranslate2 = rows
    assert len(saved_model) >= 2 * (len(LINES) - 2)
    assert [row[:2] for row in ctranslate2] == [row[:2] for row in saved_model]
    for ours, theirs in zip(saved_model, ctranslate2):
        assert float(theirs[2]) == pytest.approx(float(ours[2]), abs=2e-3)
