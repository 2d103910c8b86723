"""The `keras-transformer` command line."""

import subprocess
import sys

from keras_transformer import cli


def test_info_prints_versions_and_preset_parameters(capsys):
    assert cli.main(["info", "--preset", "base"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow 2.21" in out
    assert "preset base: 6 layers, d_model 512" in out and "63,082,496 parameters" in out


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "keras_transformer.cli", "info", "--preset",
                             "tiny"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "preset tiny: 2 layers" in result.stdout


def test_unknown_preset_is_a_one_line_error(capsys):
    assert cli.main(["info", "--preset", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keras-transformer info: error: unknown model preset 'huge'")
    assert len(err.splitlines()) == 1
