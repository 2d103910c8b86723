"""The `keras-transformer` command line."""

import dataclasses
import io
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.training.runner import resolve_precision


def test_info_prints_versions_and_preset_parameters(capsys):
    assert cli.main(["info", "--preset", "base"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow 2.21" in out
    assert f"train.precision auto: {resolve_precision('auto')}" in out
    assert "preset base: 6 layers, d_model 512" in out and "63,082,496 parameters" in out


SUBCOMMANDS = ("info", "build-vocab", "data-stats", "train", "average", "export", "translate",
               "evaluate", "score", "filter", "tune-search")


def test_help_in_a_subprocess_lists_every_subcommand():
    result = subprocess.run([sys.executable, "-m", "keras_transformer.cli", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: keras-transformer")
    for command in SUBCOMMANDS:
        assert f"    {command} " in result.stdout, command  # one help line per subcommand


def test_console_script_is_installed_and_points_to_main():
    from importlib.metadata import entry_points

    scripts = entry_points(group="console_scripts", name="keras-transformer")
    assert len(scripts) == 1, "keras-transformer is not installed (pip install -e .)"
    assert next(iter(scripts)).load() is cli.main


def test_unknown_preset_is_a_one_line_error(capsys):
    assert cli.main(["info", "--preset", "base", "--preset", "huge"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing printed before the error
    assert err.strip().startswith("keras-transformer info: error: unknown model preset 'huge'")
    assert len(err.strip().splitlines()) == 1


def test_a_preset_too_large_for_memory_is_a_one_line_error(tmp_path, capsys):
    preset = tmp_path / "huge.yaml"
    preset.write_text("d_model: 100000000\ndff: 100000000\nnum_heads: 8\n")
    assert cli.main(["info", "--preset", str(preset)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"keras-transformer info: error: preset {preset}: too large to build in this "
                   "machine's memory (d_model 100000000, dff 100000000, 4 layers)")


def test_build_vocab_then_data_stats(tmp_path, multi30k_dir, capsys):
    """The two data subcommands on a small local corpus: vocabulary files, then a report."""
    import gzip

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, count in (("train", 400), ("val", 50), ("test_2016_flickr", 50)):
        for lang in ("de", "en"):
            source = multi30k_dir / f"{split}.{lang}.gz"
            with gzip.open(source, "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(count)]
            (corpus / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    config = tmp_path / "exp.yaml"
    config.write_text(f"data: {{dataset: files, data_dir: {corpus}, vocab_size: 600}}\n")
    vocab = tmp_path / "vocab"
    assert cli.main(["build-vocab", "--config", str(config), "--output", str(vocab)]) == 0
    assert (vocab / "sentencepiece.model").is_file() and (vocab / "tokenizer.json").is_file()
    assert "wrote sentencepiece vocabulary" in capsys.readouterr().out
    model_file = (vocab / "sentencepiece.model").read_bytes()
    assert cli.main(["build-vocab", "--config", str(config), "--output", str(vocab)]) == 2
    assert "already holds a vocabulary" in error_line(capsys, "build-vocab")
    assert (vocab / "sentencepiece.model").read_bytes() == model_file
    assert cli.main(["build-vocab", "--config", str(config), "--output", str(config)]) == 2
    assert f"--output {config} is a file, not a folder" in error_line(capsys, "build-vocab")

    assert cli.main(["data-stats", "--config", str(config), "--vocab", str(vocab)]) == 0
    report = capsys.readouterr().out
    assert "files de->en" in report and "400" in report and "padding" in report


def test_a_build_vocab_killed_while_it_writes_leaves_a_folder_the_next_one_removes(
        tmp_path, multi30k_dir, capsys):
    """kill -9 while `build-vocab` trains: its hidden `.partial-PID-vocab/` stays (no vocabulary
    appears), and the next build-vocab, which left it there before, removes it."""
    import signal
    import time

    config = tmp_path / "exp.yaml"
    config.write_text(f"data: {{dataset: files, data_dir: {multi30k_dir}, vocab_size: 600, "
                      "vocab_sample_sentences: 2000}\n")
    argv = ["build-vocab", "--config", str(config), "--output", str(tmp_path / "vocab")]
    process = subprocess.Popen([sys.executable, "-m", "keras_transformer.cli", *argv],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    partial, deadline = tmp_path / f".partial-{process.pid}-vocab", time.time() + 300
    while not partial.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert partial.is_dir(), "build-vocab ended (or never began writing) before the kill"
    assert sorted(p.name for p in tmp_path.iterdir()) == [partial.name, "exp.yaml"]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "vocab"]


# ----------------------------------------------------------------------------- translate, evaluate

def run_cli(monkeypatch, capsys, argv, stdin: bytes = b""):
    """cli.main(argv) with `stdin` as standard input: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def expected_translations(export_dir, lines, function="translate_beam"):
    from keras_transformer.export.savedmodel import load_translator
    from keras_transformer.decoding.texts import translate_texts

    loaded = load_translator(export_dir)
    return translate_texts(getattr(loaded, function), lines)


def test_translate_gives_one_line_per_input_line(random_export, monkeypatch, capsys):
    """Bytes that are not UTF-8 (Latin-1 here) become U+FFFD with a one-line warning naming the
    line, CRLF counts as one line end, empty lines and a last line without LF give a line
    each."""
    stdin = (b"Ein Mann f\xe4hrt Fahrrad.\r\n\r\n\nZwei Hunde spielen im Schnee.\r\n"
             b"  \t \nHallo \xff\xfe")
    lines = ["Ein Mann f\ufffdhrt Fahrrad.", "", "", "Zwei Hunde spielen im Schnee.", "  \t ",
             "Hallo \ufffd\ufffd"]
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                   "--quiet", "--batch-size", "4"], stdin)
    assert code == 0, err
    assert out.split("\n") == [*expected_translations(random_export, lines), ""]
    assert [out.split("\n")[i] for i in (1, 2, 4)] == ["", "", ""]
    assert err.splitlines() == [
        "keras-transformer translate: warning: <stdin>:1: not valid UTF-8 (invalid continuation "
        "byte at byte 10); replaced by U+FFFD",
        "keras-transformer translate: warning: <stdin>:6: not valid UTF-8 (invalid start byte "
        "at byte 6); replaced by U+FFFD"]

    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                   "--quiet", "--greedy"], b"\n" * 3)
    assert (code, out, err) == (0, "\n" * 3, "")


def test_a_translation_is_written_on_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_translate_lines",
                        lambda args, lines: ["a\nb", "c\r\nd\u2028e", ""][:len(lines)])
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", "unused"],
                             b"1\n2\n3\n")
    assert (code, out, err) == (0, "a b\nc  d e\n\n", "")


def test_many_invalid_lines_give_a_bounded_warning(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_translate_lines", lambda args, lines: lines)
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", "unused"],
                             b"\xe4\n" * (cli.MAX_WARNINGS + 5))
    assert code == 0 and out == "\ufffd\n" * (cli.MAX_WARNINGS + 5)
    assert len(err.splitlines()) == cli.MAX_WARNINGS + 1
    assert err.splitlines()[-1] == "keras-transformer translate: warning: 5 more lines of " \
                                   "<stdin> not valid UTF-8"


def test_a_byte_order_mark_is_not_part_of_the_first_line(monkeypatch, capsys):
    """A UTF-8 byte-order mark at the start of the input marks the encoding (Windows editors
    write one); U+FEFF further on is text, which the model's normalization removes."""
    monkeypatch.setattr(cli, "_translate_lines", lambda args, lines: lines)
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", "unused"],
                             b"\xef\xbb\xbfEin Hund.\r\n\xef\xbb\xbfZwei\n")
    assert (code, out, err) == (0, "Ein Hund.\n\ufeffZwei\n", "")


def test_evaluate_reads_bytes_and_refuses_empty_or_unaligned_files(random_export, tmp_path,
                                                                   monkeypatch, capsys):
    source, reference, output = tmp_path / "src.de", tmp_path / "ref.en", tmp_path / "hyp.en"
    source.write_bytes(b"Ein Mann f\xe4hrt Fahrrad.\r\n\r\nZwei Hunde spielen im Schnee.\r\n")
    reference.write_bytes(b"A man rides a bike.\r\n\r\nTwo dogs play in the snow.\r\n")
    model = ["--model", str(random_export), "--quiet"]
    code, out, err = run_cli(monkeypatch, capsys, ["evaluate", *model, "--source", str(source),
                                                   "--reference", str(reference),
                                                   "--output", str(output)])
    assert code == 0, err
    assert "bleu:" in out and "chrf:" in out
    assert err == (f"keras-transformer evaluate: warning: {source}:1: not valid UTF-8 (invalid "
                   "continuation byte at byte 10); replaced by U+FFFD\n")
    lines = ["Ein Mann f\ufffdhrt Fahrrad.", "", "Zwei Hunde spielen im Schnee."]
    assert output.read_text(encoding="utf-8").split("\n") == [
        *expected_translations(random_export, lines), ""]

    empty, short, clean = tmp_path / "empty", tmp_path / "short", tmp_path / "clean.de"
    empty.write_bytes(b"")
    short.write_bytes(b"A man rides a bike.\n")
    clean.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for source_file, reference_file, message in (
            (empty, reference, f"{empty}: empty file, no lines"),
            (clean, empty, f"{empty}: empty file, no lines"),
            (clean, short, f"{clean} has 3 lines but {short} has 1"),
            (tmp_path, reference, f"{tmp_path} is a folder, not a text file"),
            (tmp_path / "missing", reference, "missing: no such file")):
        code, out, err = run_cli(monkeypatch, capsys, ["evaluate", *model, "--source",
                                                       str(source_file), "--reference",
                                                       str(reference_file)])
        assert code == 2 and out == "", err
        assert err.startswith("keras-transformer evaluate: error: ") and message in err, err
        assert len(err.splitlines()) == 1, err


def test_model_errors_are_one_line(random_export, tmp_path, monkeypatch, capsys):
    """A beam the export cannot do names the one it can; a model path that is a file, a missing
    folder, or a folder whose saved_model.pb is damaged is a one-line error, exit 2."""
    code, _, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                 "--beam", "5"], b"Hallo\n")
    assert code == 2 and len(err.splitlines()) == 1
    assert "exported with beam size 2; export again with --beam 5" in err
    code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(random_export),
                                                   "--beam", "2", "--quiet"], b"Hallo\n")
    assert code == 0 and out == "\n".join(expected_translations(random_export, ["Hallo"])) + "\n"

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "saved_model.pb").write_bytes(b"not a protocol buffer")
    a_file = tmp_path / "model.pb"
    a_file.write_bytes(b"")
    for path, message in ((a_file, "is neither a SavedModel"), (tmp_path / "nowhere", "is "
                          "neither a SavedModel"), (damaged, str(damaged))):
        code, out, err = run_cli(monkeypatch, capsys, ["translate", "--model", str(path)],
                                 b"Hallo\n")
        assert code == 2 and out == "", err
        assert err.startswith("keras-transformer translate: error: ") and message in err, err
        assert len(err.splitlines()) == 1, err
def test_argument_mistakes_are_refused_before_any_work(random_export, random_run, tmp_path,
                                                      monkeypatch, capsys):
    """Values the parser or the command refuses, each in one line naming the argument; an
    evaluate --output that is an input file leaves that file as it was."""
    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("Hallo\n")
    reference.write_text("Hello\n")
    model = ["--model", str(random_export), "--quiet"]
    for argv, message in (
            (["translate", *model, "--beam", "0"], "argument --beam: 0 is not >= 1"),
            (["translate", *model, "--batch-size", "abc"],
             "argument --batch-size: 'abc' is not an integer"),
            (["export", "--run", str(random_run), "--output", str(tmp_path / "m"), "--alpha",
              "inf"], "argument --alpha: inf: every alpha must be a finite number >= 0"),
            (["tune-search", "--run", str(random_run), "--source", str(source), "--reference",
              str(reference), "--beam", "x"], "argument --beam: 'x' is not an integer"),
            # each sampling flag's message states the rule it enforces, whatever the value
            *[(["translate", *model, "--sampling", "--sampling-temperature", value],
               f"argument --sampling-temperature: {value}: must be a finite number > 0\n")
              for value in ("-1", "0", "nan", "inf")],
            *[(["translate", *model, "--sampling", "--sampling-topp", value],
               f"argument --sampling-topp: {value}: must be a number in (0, 1]\n")
              for value in ("-1", "0", "nan", "1.5")],
            (["translate", *model, "--sampling", "--sampling-topp", "0.5,1"],
             "argument --sampling-topp: '0.5,1' is not a number\n")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err, err

    evaluate = ["evaluate", *model, "--source", str(source), "--reference", str(reference)]
    for argv, message in (
            ([*evaluate, "--output", str(source)],
             f"--output {source} is the --source file: writing it would destroy the input"),
            ([*evaluate, "--output", str(tmp_path / "." / "ref.en")], "is the --reference file"),
            ([*evaluate, "--output", str(tmp_path)], f"--output {tmp_path} is a folder"),
            ([*evaluate, "--output", str(tmp_path / "no" / "hyp")], "--output"),
            (["translate", *model, "--weights", "last"],
             "--weights last: an export holds the weights it was made from"),
            (["translate", "--run", str(random_run), "--beam", "100000"],
             "decode.beam_size=100000 is larger than the target vocabulary (1000 tokens)"),
            (["tune-search", "--run", str(random_run), "--source", str(source), "--reference",
              str(reference), "--stopping", "exact", "--patience", "2"],
             "--patience is for the beam_full rule")):
        code, out, err = run_cli(monkeypatch, capsys, argv)
        assert code == 2 and out == "" and message in err, err
        assert len(err.splitlines()) == 1, err
    assert source.read_text() == "Hallo\n" and reference.read_text() == "Hello\n"


# ----------------------------------------------------------------------------- user mistakes

def error_line(capsys, command="train") -> str:
    """The one line a user mistake prints on stderr (asserting there is exactly one)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"keras-transformer {command}: error: "), lines[0]
    return lines[0]


@pytest.fixture
def fake_run(tiny_experiment, tmp_path):
    """A run folder as training leaves it, without the training: config.yaml (the tiny model
    over the session's 1,000-piece vocabulary), state.json and an untrained model's last
    weights, no best weights."""
    from keras_transformer.model import Transformer
    from keras_transformer.runs.folder import Run
    from keras_transformer.runs.weights import save_weights

    config = tiny_experiment()
    config = dataclasses.replace(config, model=dataclasses.replace(
        config.model, source_vocab_size=1000, target_vocab_size=1000))
    run = Run.create(config, tmp_path / "run")
    run.save_config(config)
    model = Transformer(config.model)
    model.build()
    save_weights(model, run.weights_file("last"))
    return run


@pytest.mark.parametrize("text, override, message", [
    ("", None, "exp.yaml is empty: an experiment file sets at least one of the sections"),
    ("model: 3\n", None, "exp.yaml: section 'model' must be a mapping of keys"),
    ("name: x\ntrain: {epochs: 2\n", None, "exp.yaml, line 3: invalid YAML ("),
    ("name: x\n", "train.epochs=[2", "override 'train.epochs=[2': the value is not valid YAML"),
    ("name: x\n", "train.learning_rate_scale=-1",
     "train.learning_rate_scale=-1.0 must be positive"),
    ("name: x\n", "train.adam_beta_2=1", r"train.adam_beta_2=1.0 must be in [0, 1)"),
    ("name: x\ntrain: {epochs: 2}\ntrain: {epochs: 3}\n", None,
     "exp.yaml, line 3: invalid YAML (key 'train' given twice)"),
    ("name: x\ntrain:\n  epochs: 2\n  epochs: 3\n", None,
     "exp.yaml, line 4: invalid YAML (key 'epochs' given twice)"),
    ("name: x\n", "train.strategy=tpu", "train.strategy=tpu: no TPU found"),  # after mkdir
])
def test_config_mistakes_are_one_line_errors(tmp_path, capsys, text, override, message):
    config = tmp_path / "exp.yaml"
    config.write_text(text)
    argv = ["train", "--config", str(config), "--output", str(tmp_path / "run")]
    assert cli.main(argv + (["--set", override] if override else [])) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_train_output_that_is_a_file_or_not_writable_is_refused_before_any_work(
        tmp_path, read_only_dir, capsys, monkeypatch):
    from keras_transformer.training import runner as training

    monkeypatch.setattr(training, "prepare_tokenizers", lambda *a: pytest.fail("work began"))
    config = tmp_path / "exp.yaml"
    config.write_text("name: x\n")
    (tmp_path / "file").write_text("not a folder")
    for output, message in [
            (tmp_path / "file", f"output folder {tmp_path / 'file'} is a file, not a folder"),
            (read_only_dir / "run", f"output folder {read_only_dir / 'run'}: cannot write in "
                                    f"{read_only_dir} (permission denied or a read-only file "
                                    "system)")]:
        assert cli.main(["train", "--config", str(config), "--output", str(output)]) == 2
        assert error_line(capsys).endswith(message)


def test_train_overwrite_flag_reaches_training(tmp_path, monkeypatch):
    from keras_transformer.training import runner as training

    calls = []
    monkeypatch.setattr(training, "train", lambda config, output, **kwargs: calls.append(kwargs))
    config = tmp_path / "exp.yaml"
    config.write_text("name: x\n")
    for flags in ([], ["--overwrite"]):
        assert cli.main(["train", "--config", str(config), "--output", str(tmp_path / "run"),
                         *flags]) == 0
    assert [call["overwrite"] for call in calls] == [False, True]


def test_negative_logical_cpus_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--config", "x.yaml", "--output", "y", "--logical-cpus", "-1"])
    assert exit_.value.code == 2
    assert "-1 is not >= 0" in capsys.readouterr().err


def test_export_into_a_read_only_folder_is_refused_before_the_model_loads(
        fake_run, read_only_dir, tmp_path, capsys, monkeypatch):
    from keras_transformer.export import savedmodel as export

    monkeypatch.setattr(export, "translator_from_run",
                        lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["export", "--run", str(fake_run.path), "--output",
                     str(read_only_dir / "model")]) == 2
    assert f"export folder {read_only_dir / 'model'}: cannot write in" in error_line(capsys,
                                                                                    "export")
    (tmp_path / "models" / "1").mkdir(parents=True)
    assert cli.main(["export", "--run", str(fake_run.path), "--output", str(tmp_path / "models"),
                     "--version", "1"]) == 2
    assert error_line(capsys, "export").endswith(
        f"{tmp_path / 'models' / '1'} already exists: choose another version")


@pytest.mark.parametrize("field, old, new", [("num_layers", 2, 3), ("d_model", 32, 256)])
def test_export_with_a_config_the_weights_were_not_trained_with_is_refused(
        fake_run, tmp_path, capsys, field, old, new):
    text = fake_run.config_path.read_text()
    fake_run.config_path.write_text(text.replace(f"  {field}: {old}\n", f"  {field}: {new}\n"))
    assert cli.main(["export", "--run", str(fake_run.path), "--weights", "last",
                     "--output", str(tmp_path / "models")]) == 2
    assert error_line(capsys, "export").endswith(
        f"{fake_run.weights_file('last')} was trained with model.{field}={old}, but "
        f"{fake_run.config_path} has model.{field}={new}")
    assert not (tmp_path / "models").exists()


def test_truncated_weight_files_are_named(fake_run, tmp_path, capsys):
    last = fake_run.weights_file("last")
    last.write_bytes(last.read_bytes()[:1000])
    assert cli.main(["export", "--run", str(fake_run.path), "--weights", "last",
                     "--output", str(tmp_path / "models")]) == 2
    assert f"error: {last} is damaged (Unable to synchronously open file" in error_line(
        capsys, "export")
    fake_run.checkpoint_dir.mkdir()
    shutil.copyfile(last, fake_run.checkpoint_file(1))
    assert cli.main(["average", "--run", str(fake_run.path), "--last", "1"]) == 2
    assert f"{fake_run.checkpoint_file(1)} is damaged (" in error_line(capsys, "average")
    assert cli.main(["average", "--run", str(fake_run.path), "--last", "1",
                     "--output", str(tmp_path / "mean.h5")]) == 2
    assert "mean.h5: a weights file's name ends in .weights.h5" in error_line(capsys, "average")


def test_missing_best_weights_are_said_on_stderr(fake_run, tmp_path):
    """"best" falls back to "last" with a warning the user sees (here before the damaged last
    file stops the export)."""
    last = fake_run.weights_file("last")
    last.write_bytes(last.read_bytes()[:1000])
    result = subprocess.run([sys.executable, "-m", "keras_transformer.cli", "export", "--run",
                             str(fake_run.path), "--output", str(tmp_path / "models")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    warning, error = result.stderr.strip().splitlines()[-2:]
    assert warning == (f"keras-transformer: {fake_run.path} has no best weights "
                       "(best.weights.h5); using the last epoch's")
    assert error.startswith(f"keras-transformer export: error: {last} is damaged")


def test_help_and_version_do_not_import_tensorflow():
    code = ("import sys\nfrom keras_transformer import cli\nfor argv in (['--version'], "
            "['--help'], ['train', '--help']):\n    try:\n        cli.main(argv)\n"
            "    except SystemExit:\n        pass\nprint('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert "keras-transformer 0.1.0" in done.stdout


def test_tensorflow_start_up_lines_only_with_verbose():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    command = [sys.executable, "-m", "keras_transformer.cli", "info", "--preset", "tiny"]
    quiet = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    assert quiet.stderr == "" and "preset tiny: 2 layers" in quiet.stdout
    verbose = subprocess.run([*command, "--verbose"], capture_output=True, text=True, env=env,
                             check=True)
    assert "preset tiny: 2 layers" in verbose.stdout
    assert verbose.stderr != ""  # TensorFlow's own start-up lines, as it prints them


def test_translate_writes_nothing_on_stderr_for_clean_input(random_export):
    """Not even SentencePiece's native INFO line (`normalizer.cc(51) LOG(INFO) ...`), which
    tf-text prints when it loads the model (tests/test_tokenizers.py: the filter)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    command = [sys.executable, "-m", "keras_transformer.cli", "translate", "--model",
               str(random_export), "--quiet"]
    quiet = subprocess.run(command, input="Hallo\n", capture_output=True, text=True, env=env,
                           timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert len(quiet.stdout.splitlines()) == 1


def test_every_command_refuses_weights_with_flipped_bytes(fake_run, tmp_path, monkeypatch,
                                                           capsys):
    """64 random bytes in the token embedding of `last` (the file still loads into Keras): every
    command that makes a model of it says which file and what to choose instead; nothing is
    exported or averaged."""
    from helpers import flip_weight_bytes

    last = fake_run.weights_file("last")
    fake_run.checkpoint_dir.mkdir()
    shutil.copyfile(last, fake_run.checkpoint_file(1))
    flip_weight_bytes(last)
    flip_weight_bytes(fake_run.checkpoint_file(1))
    source = tmp_path / "source.txt"
    source.write_text("Ein Hund.\n")
    run, weights = ["--run", str(fake_run.path)], ["--weights", "last"]
    texts = ["--source", str(source), "--reference", str(source)]
    damaged = f"{last} is damaged (its contents differ from the SHA-256 recorded when it was written)"
    commands = [["export", *run, *weights, "--output", str(tmp_path / "models")],
                ["translate", *run, *weights, "--quiet"],
                ["evaluate", *run, *weights, *texts, "--quiet"],
                ["tune-search", *run, *weights, *texts, "--beam", "1"]]
    try:
        import ctranslate2  # noqa: F401
        commands.append(["export", *run, *weights, "--format", "ctranslate2",
                         "--output", str(tmp_path / "ct2")])
    except ImportError:
        pass
    for argv in commands:
        code, _, err = run_cli(monkeypatch, capsys, argv, b"Ein Hund.\n")
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert f"error: {damaged}; choose other weights with --weights: best, last, or a " in err
    assert cli.main(["average", *run, "--last", "1"]) == 2
    assert error_line(capsys, "average").endswith(
        f"{fake_run.checkpoint_file(1)} is damaged (its contents differ from the SHA-256 "
        "recorded when it was written); no other checkpoint to average")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "source.txt"]
    assert not list(fake_run.path.glob("average_*"))


def test_the_no_best_weights_notice_is_said_once(fake_run, tmp_path, caplog, capsys):
    """It printed two to four times on export and translate (each lookup of the weights)."""
    import logging

    pytest.importorskip("ctranslate2")
    with caplog.at_level(logging.WARNING, logger="keras_transformer.runs.folder"):
        assert cli.main(["export", "--run", str(fake_run.path), "--format", "ctranslate2",
                         "--output", str(tmp_path / "ct2")]) == 0
    notices = [r for r in caplog.records if "has no best weights" in r.getMessage()]
    assert len(notices) == 1, [r.getMessage() for r in notices]


def test_score_prints_one_line_per_pair(random_export, random_run, tmp_path, monkeypatch, capsys):
    """`score`: log P, log P / lp and tokens per pair, tab-separated, the same from an export
    and from the run; the best translation of a source scores above another source's."""
    from keras_transformer.export.savedmodel import load_translator

    sources = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "", "Hallo"]
    loaded = load_translator(random_export)  # kept: a collected module's variables are gone
    best = [t.decode() for t in loaded.translate_greedy(tf.constant(sources))[
        "translation"].numpy()]
    targets = [best[0], best[0], "", best[3]]
    (tmp_path / "src").write_text("\n".join(sources) + "\n")
    (tmp_path / "tgt").write_text("\n".join(targets) + "\n")
    code, out, err = run_cli(monkeypatch, capsys, ["score", "--model", str(random_export),
                                                   "--source", str(tmp_path / "src"),
                                                   "--target", str(tmp_path / "tgt")])
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) == 4 and all(len(row) == 3 for row in rows)
    assert int(rows[2][2]) == 1  # the empty translation: END alone
    assert all(float(row[0]) < 0 for row in rows)
    code, out_run, err = run_cli(monkeypatch, capsys, [
        "score", "--run", str(random_run), "--source", str(tmp_path / "src"),
        "--target", str(tmp_path / "tgt"), "--batch-size", "1"])
    assert code == 0, err
    for ours, theirs in zip(rows, (line.split("\t") for line in out_run.splitlines())):
        assert float(ours[0]) == pytest.approx(float(theirs[0]), abs=2e-4)
    (tmp_path / "short").write_text("eins\n")
    code, _, err = run_cli(monkeypatch, capsys, ["score", "--model", str(random_export),
                                                 "--source", str(tmp_path / "src"),
                                                 "--target", str(tmp_path / "short")])
    assert code == 2 and "has 4 lines but" in err and len(err.strip().splitlines()) == 1
