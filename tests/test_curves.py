"""`benchmarks/curves.py`: the BLEU curve it reads from a run's TensorBoard logs (epochs, training
minutes across a resume, cumulative target tokens), its figure, and its one-line errors.

Event files are written in the layout and with the tags training writes (`logs/train`,
`logs/train_steps`, `logs/validation`; `epoch_bleu`, `epoch_target_tokens`): with explicit wall
times (Event protos in TFRecord framing) where minutes are asserted exactly, and with
`tf.summary`'s own writers to check that the format Keras writes is the one read.
"""

import struct

import numpy as np
import pytest
import tensorflow as tf

from helpers import load_benchmark

SCALARS = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"))


@pytest.fixture(scope="module")
def curves():
    return load_benchmark("curves")


def write_events(path, start, events):
    """An event file as TensorFlow's writer makes it: a file-version record at `start` (whole
    seconds, as TF writes it), then `events`: (wall time, step, {tag: value}) tensor scalars."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tf.compat.v1.Event(wall_time=float(start),
                                        file_version="brain.Event:2").SerializeToString())
        for wall_time, step, values in events:
            summary = tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag=tag, metadata=SCALARS,
                                           tensor=tf.make_tensor_proto(np.float32(value)))
                for tag, value in values.items()])
            writer.write(tf.compat.v1.Event(wall_time=wall_time, step=step,
                                            summary=summary).SerializeToString())


def session(run, start, pid, train=(), steps=(), validation=()):
    """One training process's event files, named as TensorFlow names them."""
    for index, (folder, events) in enumerate([("train", train), ("train_steps", steps),
                                              ("validation", validation)]):
        if events or folder == "train":
            write_events(run / "logs" / folder / f"events.out.tfevents.{int(start)}.vm.{pid}."
                         f"{index}.v2", start, events)


@pytest.fixture
def resumed_run(tmp_path):
    """Two sessions: the first validates epochs 1 and 2 (60 s each), logs a step 30 s into
    epoch 3 and is killed; after a 450 s gap the second resumes from epoch 1's checkpoint
    (epoch 2's, say, was damaged), trains epoch 2 again (90 s) and epoch 3 (60 s). Epochs of
    1, 2 (2.1 the second time) and 1.5 million target tokens."""
    run = tmp_path / "resumed"
    run.mkdir()
    (run / "config.yaml").write_text("name: resumed\n")
    t0 = 1_800_000_000.0
    session(run, t0, 11,
            train=[(t0 + 60, 0, {"epoch_target_tokens": 1_000_000, "epoch_loss": 5.0}),
                   (t0 + 120, 1, {"epoch_target_tokens": 2_000_000, "epoch_loss": 4.0})],
            steps=[(t0 + 30, 50, {"step_loss": 6.0}), (t0 + 150, 150, {"step_loss": 3.5})],
            validation=[(t0 + 60, 0, {"epoch_bleu": 2.5, "epoch_target_tokens": 77}),
                        (t0 + 120, 1, {"epoch_bleu": 7.0, "epoch_target_tokens": 77})])
    t1 = t0 + 600
    session(run, t1, 12,
            train=[(t1 + 90, 1, {"epoch_target_tokens": 2_100_000}),
                   (t1 + 150, 2, {"epoch_target_tokens": 1_500_000})],
            validation=[(t1 + 90, 1, {"epoch_bleu": 6.5}), (t1 + 150, 2, {"epoch_bleu": 12.0})])
    return run


def test_read_curve_sums_sessions_and_keeps_an_epochs_latest_values(curves, resumed_run):
    points = curves.read_curve(resumed_run)
    # Minutes: session 1 counts to its last event (150 s, the step of the killed epoch), the gap
    # to session 2 does not count; epoch 2's second try is its point (BLEU 6.5, 2.1M tokens).
    # Tokens: logs/train's, summed (not logs/validation's 77).
    assert points == [curves.Point(1, 1.0, 1e6, 2.5),
                      curves.Point(2, (150 + 90) / 60, 3.1e6, 6.5),
                      curves.Point(3, (150 + 150) / 60, 4.6e6, 12.0)]


def test_a_missing_epochs_tokens_leave_the_later_points_without(curves, tmp_path):
    run = tmp_path / "run"
    t0 = 1_800_000_000.0
    session(run, t0, 5, train=[(t0 + 60, 0, {"epoch_loss": 5.0}),
                               (t0 + 120, 1, {"epoch_target_tokens": 900})],
            validation=[(t0 + 60, 0, {"epoch_bleu": 1.0}), (t0 + 120, 1, {"epoch_bleu": 2.0})])
    assert [(p.minutes, p.tokens) for p in curves.read_curve(run)] == [(1.0, None), (2.0, None)]


def test_reads_what_tf_summary_writes(curves, tmp_path):
    """Keras's TensorBoard callback writes through `tf.summary` writers: tensor scalars, next to
    the text summaries `ValidationBleu` writes in logs/validation."""
    run = tmp_path / "keras_like"
    train = tf.summary.create_file_writer(str(run / "logs" / "train"))
    validation = tf.summary.create_file_writer(str(run / "logs" / "validation"))
    for epoch, (tokens, bleu) in enumerate([(300.0, 1.5), (250.0, 4.0), (310.0, 3.0)]):
        with train.as_default():
            tf.summary.scalar("epoch_target_tokens", tokens, step=epoch)
            tf.summary.scalar("epoch_loss", 5.0 - epoch, step=epoch)
        with validation.as_default():
            tf.summary.text("translations", "| a | b | c |", step=epoch)
            tf.summary.scalar("epoch_bleu", bleu, step=epoch)
        train.flush()
        validation.flush()
    train.close()
    validation.close()
    points = curves.read_curve(run)
    assert [(p.epoch, p.tokens) for p in points] == [(1, 300.0), (2, 550.0), (3, 860.0)]
    assert [p.bleu for p in points] == pytest.approx([1.5, 4.0, 3.0])
    minutes = [p.minutes for p in points]
    assert minutes == sorted(minutes) and 0.0 <= minutes[0] and minutes[-1] < 1.0


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_main_draws_the_figure_and_prints_the_table(curves, resumed_run, tmp_path, capsys):
    other = tmp_path / "other"
    t0 = 1_700_000_000.0
    session(other, t0, 7, train=[(t0 + 30, 0, {"epoch_target_tokens": 250_000})],
            validation=[(t0 + 30, 0, {"epoch_bleu": 9.0})])
    output = tmp_path / "figures" / "curves.png"
    output.parent.mkdir()
    assert curves.main([str(resumed_run), str(other), "--output", str(output),
                        "--labels", "old recipe, new", "--title", "Multi30k"]) == 0
    assert png_size(output) == (11 * 120, round(4.5 * 120))
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "epochs", "minutes"]
    # run, epochs, minutes, tokens (M), best BLEU, at epoch, at minute, at tokens (M)
    assert table[1].split() == ["old", "recipe", "3", "5.0", "4.60", "12.00", "3", "5.0",
                                "4.60"]
    assert table[2].split() == ["new", "1", "0.5", "0.25", "9.00", "1", "0.5", "0.25"]


@pytest.mark.parametrize("make, message", [
    (lambda root: root / "missing", "no such folder"),
    (lambda root: (root / "train.log").write_text("log") and root / "train.log",
     "is a file, not a run folder"),
    (lambda root: root, "is not a run folder"),
    (lambda root: (root / "logs" / "validation").mkdir(parents=True) or root,
     "has no validation BLEU events (epoch_bleu in logs/validation)"),
])
def test_main_refuses_a_folder_it_cannot_draw_in_one_line(curves, tmp_path, capsys, make,
                                                          message):
    root = tmp_path / "not_a_run"
    root.mkdir()
    folder = make(root)
    output = tmp_path / "curves.png"
    assert curves.main([str(folder), "--output", str(output)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("curves.py: error: ") and message in error
    assert error.count("\n") == 1 and "Traceback" not in error
    assert not output.exists()


def test_main_refuses_labels_that_do_not_match_the_runs(curves, resumed_run, tmp_path, capsys):
    assert curves.main([str(resumed_run), "--output", str(tmp_path / "c.png"),
                        "--labels", "a,b"]) == 2
    assert "--labels gives 2 labels for 1 run" in capsys.readouterr().err


def test_saved_series_draw_as_their_runs_did(curves, resumed_run, tmp_path, capsys):
    """--save-series writes each run's curve to LABEL.csv; the CSV files given as runs give the
    same points and the same table, with the file's name as the default label."""
    incomplete = tmp_path / "incomplete"
    t0 = 1_800_000_000.0
    session(incomplete, t0, 5, train=[(t0 + 60, 0, {"epoch_loss": 5.0})],
            validation=[(t0 + 60, 0, {"epoch_bleu": 1.0})])
    series = tmp_path / "series"
    series.mkdir()
    assert curves.main([str(resumed_run), str(incomplete), "--output", str(tmp_path / "a.png"),
                        "--labels", "old recipe/50,no tokens", "--save-series",
                        str(series)]) == 0
    first_table = capsys.readouterr().out.splitlines()[:3]
    saved = sorted(p.name for p in series.iterdir())
    assert saved == ["no_tokens.csv", "old_recipe_50.csv"]
    assert (series / "no_tokens.csv").read_text().splitlines() == [
        "epoch,minutes,target_tokens,bleu", "1,1.0,,1.0"]
    assert curves.read_series(series / "old_recipe_50.csv") == curves.read_curve(resumed_run)
    assert curves.read_series(series / "no_tokens.csv") == curves.read_curve(incomplete)

    assert curves.main([str(series / "old_recipe_50.csv"), str(series / "no_tokens.csv"),
                        "--output", str(tmp_path / "b.png"),
                        "--labels", "old recipe/50,no tokens"]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == first_table
    assert png_size(tmp_path / "b.png") == (11 * 120, round(4.5 * 120))
    assert curves.main([str(series / "no_tokens.csv"), "--output", str(tmp_path / "c.png")]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "no_tokens"


@pytest.mark.parametrize("text, message", [
    ("epoch,bleu\n1,2.0\n", ":1: not a saved curve: the header must be "
                            "epoch,minutes,target_tokens,bleu"),
    ("epoch,minutes,target_tokens,bleu\n1,0.5,100.0,3.0\n2,1.0,200.0\n",
     ":3: cannot read '2,1.0,200.0' (3 fields, not 4)"),
    ("epoch,minutes,target_tokens,bleu\n1,0.5,100.0,three\n", ":2: cannot read"),
    ("epoch,minutes,target_tokens,bleu\n", ": no validations after the header"),
])
def test_main_refuses_a_saved_series_it_cannot_read_naming_file_and_line(curves, tmp_path,
                                                                         capsys, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert curves.main([str(path), "--output", str(tmp_path / "c.png")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"curves.py: error: {path}") and message in error
    assert error.count("\n") == 1 and not (tmp_path / "c.png").exists()


def test_main_refuses_a_missing_series_folder(curves, resumed_run, tmp_path, capsys):
    assert curves.main([str(resumed_run), "--output", str(tmp_path / "c.png"),
                        "--save-series", str(tmp_path / "nowhere")]) == 2
    assert "--save-series" in capsys.readouterr().err and not (tmp_path / "c.png").exists()
