"""The `keras-transformer` command line."""

import subprocess
import sys

from keras_transformer import cli
from keras_transformer.training import resolve_precision


def test_info_prints_versions_and_preset_parameters(capsys):
    assert cli.main(["info", "--preset", "base"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow 2.21" in out
    assert f"train.precision auto: {resolve_precision('auto')}" in out
    assert "preset base: 6 layers, d_model 512" in out and "63,082,496 parameters" in out


SUBCOMMANDS = ("info", "build-vocab", "data-stats", "train", "average", "export", "translate",
               "evaluate", "tune-search")


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
    assert cli.main(["info", "--preset", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keras-transformer info: error: unknown model preset 'huge'")
    assert len(err.splitlines()) == 1


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

    assert cli.main(["data-stats", "--config", str(config), "--vocab", str(vocab)]) == 0
    report = capsys.readouterr().out
    assert "files de->en" in report and "400" in report and "padding" in report
