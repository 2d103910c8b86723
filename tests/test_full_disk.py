"""A full disk or an unwritable folder meets every command that writes (`train`'s checkpoints,
`export` in both formats, `average`, `evaluate --output`, `build-vocab`, `translate --output`)
with one line on stderr naming the file and exit code 2; nothing half-written is left behind,
and what was there before stays as it was, or (`train`, `translate --output`) the job resumes
where it stopped once there is room.

ENOSPC is injected where the write happens (a test cannot count on mounting a small file
system); where this machine lets the test mount a 1 MB tmpfs (root in a container that allows
it), the SavedModel export and `average` also meet a real full disk.
"""

import dataclasses
import errno
import os
import subprocess
from pathlib import Path

import keras
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.model import Transformer

NO_SPACE = "(No space left on device); nothing was written, what was there before is kept"


def no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def error_line(capsys, command: str) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"keras-transformer {command}: error: "), lines[0]
    return lines[0]


def partial_files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*") if "partial" in p.name)


def fail_saving_weights(monkeypatch, after: int = 0) -> None:
    """`Transformer.save_weights` writes a few bytes, then fails as a full disk does, from its
    `after + 1`-th call on."""
    calls = []
    save = Transformer.save_weights

    def save_weights(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) <= after:
            return save(self, path, *args, **kwargs)
        Path(path).write_bytes(b"\x89HDF\r\n")
        raise no_space()

    monkeypatch.setattr(Transformer, "save_weights", save_weights)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MB tmpfs mounted at a folder of `tmp_path`; skips where mounting is not allowed."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0 if os.geteuid() == 0 else False
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """Writes a file into `folder` until its file system is full; returns the file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        with pytest.raises(OSError, match="No space left on device"):
            while True:
                f.write(b"\0" * 4096)
    return filler


# ----------------------------------------------------------------------------- export

@pytest.mark.parametrize("error", ["tensorflow", "python"])
def test_savedmodel_export_onto_a_full_disk(random_run, tmp_path, monkeypatch, capsys, error):
    """TensorFlow says "No space left on device" in a ResourceExhaustedError (seen on a real
    6 MB tmpfs: a 28-line traceback and a 2.5 MB `.1.partial/` left behind)."""
    def save(module, path, signatures=None):
        Path(path, "variables").mkdir(parents=True)
        Path(path, "variables", "variables.data-00000-of-00001").write_bytes(b"\0" * 1000)
        if error == "tensorflow":
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{path}/saved_model.pb.tmp1234; No space left on device")
        raise no_space()

    monkeypatch.setattr(tf.saved_model, "save", save)
    models = tmp_path / "models"
    assert cli.main(["export", "--run", str(random_run), "--output", str(models)]) == 2
    assert error_line(capsys, "export").endswith(f"cannot write {models / '1'} {NO_SPACE}")
    assert list(models.iterdir()) == []


def test_ctranslate2_export_onto_a_full_disk(random_run, tmp_path, monkeypatch, capsys):
    pytest.importorskip("ctranslate2")
    from keras_transformer.export import ctranslate2 as ctranslate2_export

    def fail(*args, **kwargs):
        raise no_space()

    monkeypatch.setattr(ctranslate2_export, "file_sha256", fail)  # after model.bin is written
    output = tmp_path / "ct2"
    assert cli.main(["export", "--run", str(random_run), "--format", "ctranslate2",
                     "--output", str(output)]) == 2
    assert error_line(capsys, "export").endswith(f"cannot write {output} {NO_SPACE}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_savedmodel_export_onto_a_real_full_disk(random_run, small_filesystem, capsys):
    models = small_filesystem / "models"
    assert cli.main(["export", "--run", str(random_run), "--output", str(models)]) == 2
    line = error_line(capsys, "export")
    assert line.endswith(f"cannot write {models / '1'} {NO_SPACE}"), line
    assert list(models.iterdir()) == []


# ----------------------------------------------------------------------------- average

@pytest.fixture
def run_with_checkpoint(random_run, tmp_path):
    """A copy of `random_run` with its weights as epoch 1's checkpoint."""
    import shutil

    from keras_transformer.runs.folder import Run
    from keras_transformer.runs.weights import save_weights

    shutil.copytree(random_run, tmp_path / "run")
    run = Run(tmp_path / "run")
    run.checkpoint_dir.mkdir()
    save_weights(run.load_model("best"), run.checkpoint_file(1))
    return run


def test_average_onto_a_full_disk_keeps_the_previous_average(run_with_checkpoint, monkeypatch,
                                                             capsys):
    run = run_with_checkpoint
    assert cli.main(["average", "--run", str(run.path), "--last", "1"]) == 0
    average = run.path / "average_last1.weights.h5"
    before = average.read_bytes()
    capsys.readouterr()
    fail_saving_weights(monkeypatch)
    assert cli.main(["average", "--run", str(run.path), "--last", "1"]) == 2
    assert error_line(capsys, "average").endswith(f"cannot write {average} {NO_SPACE}")
    assert average.read_bytes() == before and partial_files(run.path) == []


def test_average_onto_a_real_full_disk(run_with_checkpoint, small_filesystem, capsys):
    """Refused before writing: h5py crashes the process (SIGSEGV) when HDF5 meets a full disk
    part-way through a file, as a 64 KB-free tmpfs shows if `runs.check_free_space` is
    skipped."""
    output = small_filesystem / "mean.weights.h5"
    (small_filesystem / "filler").write_bytes(b"\0" * ((1 << 20) - (64 << 10)))
    assert cli.main(["average", "--run", str(run_with_checkpoint.path), "--last", "1",
                     "--output", str(output)]) == 2
    assert f"cannot write {output} (No space left on device: " in error_line(capsys, "average")
    assert sorted(p.name for p in small_filesystem.iterdir()) == ["filler"]


# ----------------------------------------------------------------------------- evaluate

def test_evaluate_prints_its_scores_before_a_full_disk_refuses_the_output(
        random_export, tmp_path, monkeypatch, capsys):
    """The scores are printed; the hypotheses file is whole or absent (it was left empty)."""
    from keras_transformer.data import text_io

    source = tmp_path / "source.txt"
    source.write_text("Ein Hund.\nZwei Hunde.\n")
    argv = ["evaluate", "--model", str(random_export), "--source", str(source),
            "--reference", str(source), "--quiet"]
    output = tmp_path / "out.txt"
    output.write_text("the previous hypotheses\n")
    written = []

    def one_line(text):
        if written:
            raise no_space()
        written.append(text)
        return text

    monkeypatch.setattr(text_io, "one_line", one_line)
    assert cli.main([*argv, "--output", str(output)]) == 2
    captured = capsys.readouterr()
    assert "bleu: " in captured.out and "chrf: " in captured.out
    assert captured.err.strip() == (f"keras-transformer evaluate: error: cannot write {output} "
                                    f"{NO_SPACE}")
    assert output.read_text() == "the previous hypotheses\n" and partial_files(tmp_path) == []


def test_evaluate_output_in_an_unwritable_folder(random_export, tmp_path, capsys, read_only_dir):
    source = tmp_path / "source.txt"
    source.write_text("Ein Hund.\n")
    output = read_only_dir / "out.txt"
    assert cli.main(["evaluate", "--model", str(random_export), "--source", str(source),
                     "--reference", str(source), "--quiet", "--output", str(output)]) == 2
    captured = capsys.readouterr()
    assert "bleu: " in captured.out
    # Permission denied, or for root (whom modes do not stop) the immutable folder's EPERM
    assert captured.err.strip() in [f"keras-transformer evaluate: error: cannot write {output} "
                                    f"({why}); nothing was written, what was there before is kept"
                                    for why in ("Permission denied", "Operation not permitted")]
    assert list(read_only_dir.iterdir()) == []


# ----------------------------------------------------------------------------- translate --output

TRANSLATE_LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "",
                   "Eine Frau liest ein Buch im Park.", "Hallo", "Ein Hund rennt."]


@pytest.fixture
def translate_job(random_export, tmp_path, capsys):
    """(argv of `translate --source --output` into `folder`, the output, the translations the
    export prints for the same lines on stdout): `folder` is a folder of `tmp_path` by
    default."""
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in TRANSLATE_LINES), encoding="utf-8")
    # Sampling, whose draws have words (the random model's greedy translations are empty),
    # seeded by line; one sentence a batch: a resumed job's batches are not the whole file's.
    model = ["translate", "--model", str(random_export), "--sampling", "--seed", "5",
             "--quiet", "--batch-size", "1"]
    assert cli.main([*model, "--source", str(source)]) == 0
    expected = capsys.readouterr().out
    assert len(expected.splitlines()) == len(TRANSLATE_LINES) and expected.strip()

    def job(folder: Path):
        output = folder / "t.en"
        return [*model, "--source", str(source), "--output", str(output)], output

    return job, expected


def test_translate_output_onto_a_real_full_disk_leaves_nothing_and_runs_once_freed(
        translate_job, small_filesystem, capsys):
    """The probe: `t.en` and `t.en.resume.json` were left empty with an error naming no file,
    and the same command then refused the empty record as damaged."""
    job, expected = translate_job
    argv, output = job(small_filesystem)
    filler = fill(small_filesystem)
    assert cli.main(argv) == 2
    assert error_line(capsys, "translate").endswith(f"cannot write {output} {NO_SPACE}")
    assert sorted(p.name for p in small_filesystem.iterdir()) == ["filler"]
    filler.unlink()  # room made: the same command runs
    assert cli.main(argv) == 0
    assert output.read_text(encoding="utf-8") == expected
    assert sorted(p.name for p in small_filesystem.iterdir()) == ["t.en"]


def test_translate_output_that_fills_the_disk_part_way_resumes_once_there_is_room(
        translate_job, tmp_path, monkeypatch, capsys):
    """The disk fills part-way through a chunk (whole lines written, then a cut one): one
    line naming the output, the lines and the record kept; run again, the job resumes and the
    file is whole."""
    from keras_transformer.decoding import bulk_translation

    job, expected = translate_job
    argv, output = job(tmp_path)

    class HalfWritten:
        def __init__(self, path, mode):
            self.file = open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):  # the lines before the last with words, and its first byte
            last = max(i for i in range(len(data)) if data[i] != 10 and data[i - 1:i] in
                       (b"\n", b""))
            self.file.write(data[:last + 1])
            self.file.flush()
            raise no_space()

    monkeypatch.setattr(bulk_translation, "open", HalfWritten, raising=False)
    assert cli.main(argv) == 2
    assert error_line(capsys, "translate").endswith(
        f"cannot write {output} (No space left on device); the lines translated so far are "
        "kept: make room, then run the same command again to resume")
    *whole, cut = output.read_text(encoding="utf-8").split("\n")
    assert whole == expected.split("\n")[:len(whole)] and whole and cut  # a line cut
    assert (tmp_path / "t.en.resume.json").is_file()
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert output.read_text(encoding="utf-8") == expected
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith((".", "t.en."))]


# ----------------------------------------------------------------------------- build-vocab

@pytest.mark.parametrize("failure", ["full_disk", "vocab_size_5"])
def test_build_vocab_that_fails_leaves_no_folder(multi30k_dir, tmp_path, monkeypatch, capsys,
                                                 failure):
    from keras_transformer.data import tokenizers

    config = tmp_path / "exp.yaml"
    size = 5 if failure == "vocab_size_5" else 600
    config.write_text(f"data: {{dataset: files, data_dir: {multi30k_dir}, vocab_size: {size}, "
                      "vocab_sample_sentences: 2000}\n")
    if failure == "full_disk":
        def train(sentences, path, *args, **kwargs):
            Path(path).write_bytes(b"\0" * 100)
            raise no_space()

        monkeypatch.setattr(tokenizers, "train_sentencepiece", train)
    output = tmp_path / "new" / "vocab"
    assert cli.main(["build-vocab", "--config", str(config), "--output", str(output)]) == 2
    line = error_line(capsys, "build-vocab")
    if failure == "full_disk":
        assert line.endswith(f"cannot write {output} {NO_SPACE}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]


def test_build_vocab_onto_a_real_full_disk(multi30k_dir, tmp_path, small_filesystem, capsys):
    """SentencePiece's own writing met the full disk with a traceback ending "RuntimeError:
    INTERNAL: src/trainer_interface.cc(783) [output->WriteLine(...)]" (its .vocab copy), and
    cut the model file short without a word: one line naming the folder, nothing left."""
    config = tmp_path / "exp.yaml"
    config.write_text(f"data: {{dataset: files, data_dir: {multi30k_dir}, vocab_size: 600, "
                      "vocab_sample_sentences: 2000}\n")
    output = small_filesystem / "vocab"
    fill(small_filesystem)
    assert cli.main(["build-vocab", "--config", str(config), "--output", str(output)]) == 2
    assert error_line(capsys, "build-vocab").endswith(f"cannot write {output} {NO_SPACE}")
    assert sorted(p.name for p in small_filesystem.iterdir()) == ["filler"]


# ----------------------------------------------------------------------------- train

def test_a_checkpoint_or_log_onto_a_full_disk_stops_training_and_keeps_the_last_epoch(
        tiny_experiment, tmp_path, monkeypatch, capsys):
    """Epoch 2's checkpoint meets a full disk: one line, and the run stays as epoch 1 left it
    (state, last weights that verify), so that `train` resumes from there; then the resumed
    run's TensorBoard logs do."""
    from helpers import write_config

    from keras_transformer.runs.folder import Run
    from keras_transformer.runs.weights import verify_weights

    config = tiny_experiment(validation_bleu_sentences=0, strategy="one_device")
    path = write_config(dataclasses.replace(config, name="full"), tmp_path / "exp.yaml")
    run_dir = tmp_path / "run"
    fail_saving_weights(monkeypatch, after=1)
    assert cli.main(["train", "--config", str(path), "--output", str(run_dir),
                     "--progress", "0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == (f"keras-transformer train: error: cannot write "
                         f"{run_dir / 'checkpoints' / 'epoch_002.weights.h5'} {NO_SPACE}")
    run = Run(run_dir)
    assert run.state()["epoch"] == 1 and partial_files(run_dir) == []
    assert [p.name for p in run.epoch_checkpoints()] == ["epoch_001.weights.h5"]
    assert verify_weights(run.weights_file("last")) == verify_weights(run.checkpoint_file(1))

    # Resumed, its TensorBoard logs meet the full disk after epoch 2 is recorded (TensorFlow
    # says so in an OpError).
    monkeypatch.undo()

    def full_logs(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{run_dir}/logs/train/events.out.tfevents.1; No space left on device")

    monkeypatch.setattr(keras.callbacks.TensorBoard, "on_epoch_end", full_logs)
    assert cli.main(["train", "--config", str(path), "--output", str(run_dir),
                     "--progress", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"keras-transformer train: error: cannot write in {run_dir} (No space left on device); "
        "the run is as its last finished epoch left it: make room, then train again to resume")
    assert Run(run_dir).state()["epoch"] == 2 and partial_files(run_dir) == []
    assert verify_weights(run.weights_file("last")) == verify_weights(run.checkpoint_file(2))


# ----------------------------------------------------------------------------- the errors

@pytest.mark.parametrize("error, code", [
    (no_space(), errno.ENOSPC),
    (PermissionError(errno.EACCES, "Permission denied"), errno.EACCES),
    (OSError("Unable to synchronously create file (file write failed: time = ..., filename = "
             "'x', errno = 28, error message = 'No space left on device', buf = 0x1)"),
     errno.ENOSPC),
    (tf.errors.ResourceExhaustedError(None, None, "x/saved_model.pb.tmp; No space left on device"),
     errno.ENOSPC),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), None),
    (RuntimeError("a bug"), None)])
def test_only_the_file_systems_refusals_count_as_write_errors(error, code):
    from keras_transformer.data.text_io import errno_of, write_error

    assert errno_of(error) == code
    if code:
        message = str(write_error("out.txt", error))
        assert message == (f"cannot write out.txt ({os.strerror(code)}); nothing was written, "
                           "what was there before is kept")
