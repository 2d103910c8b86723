"""Validation BLEU against training minutes and against target tokens, for several runs on one
figure: time to quality, which a curve shows better than a table.

    python benchmarks/curves.py RUN [RUN ...] --output experiments/curves.png
                                [--labels a,b,...] [--title TEXT] [--save-series DIR]

Each RUN is a run folder that `keras-transformer train` wrote (runs/NAME), or a curve saved
before with `--save-series` (a `.csv` file). The script reads a folder's TensorBoard logs only
(nothing is loaded or decoded, and a run still training can be drawn), and draws two panels side
by side: BLEU against training minutes, BLEU against target tokens (millions), one line per run
with a marker per epoch. It prints a table: per run the epochs, minutes and target tokens of its
last validation, and its best BLEU with when it came.

`--save-series DIR` also writes each run's curve to `DIR/LABEL.csv` (`epoch,minutes,
target_tokens,bleu`, a line per validation; an unknown token count is empty). Run folders stay on
the machine that trained them; the CSV files are small enough to commit beside the figure
(`experiments/curves/`), so that a later figure can draw runs of other machines and sessions.

What it reads, as `keras_transformer.training.callbacks.default_callbacks` writes it:

- BLEU: tag `epoch_bleu` in `logs/validation`, step = epoch - 1. `ValidationBleu` puts
  `val_bleu` (greedy decoding of `train.validation_bleu_sentences` sentences) in the epoch logs,
  and Keras's TensorBoard callback writes the `val_` logs there without the prefix. (Not
  `evaluation_*_vs_iterations`, which are Keras's loss and accuracy at the optimizer step.)
- Target tokens: tag `epoch_target_tokens` in `logs/train`, the non-padding target tokens the
  epoch trained on (`losses.TargetTokens`, summed over replicas, reset every epoch). A point's
  tokens are the sum over the epochs up to and including its own. (`logs/validation` holds an
  `epoch_target_tokens` too: the validation set's, the same every epoch.)
- Wall times: the events' own, of every event file under `logs/`.

Training minutes are the wall time the user waited for training, from the moment `model.fit`
starts, whatever it spent it on (tracing, steps, the validation loss and BLEU decoding at the end
of each epoch), until the point's `epoch_bleu` event:

- A training session (one `keras-transformer train` process that reached `fit`) starts at the
  first event of the `logs/train` event file it opens: Keras's TensorBoard callback opens it in
  `on_train_begin`, so the file's first record (its version, whole seconds) is when `fit` began.
  Not the first `logs/train_steps` event: that comes only after `train.log_every_steps` steps
  (on the demo, 135 s of the first epoch's 296).
- A session ends at its last event in any folder under `logs/` before the next session starts.
- A resumed or extended run is the sum of its sessions' spans: the time between sessions (the
  process down, and the next one's start-up before `fit`: data, vocabulary, restoring the
  checkpoint) is not counted; the work a killed session did is, up to its last event (work after
  it, at most `log_every_steps` steps of a partial epoch, leaves no trace in the logs).
- An epoch logged twice (trained again after a resume from an earlier checkpoint) counts once
  for BLEU and tokens, with its latest values; the time of the first attempt stays in the
  minutes, since the user waited for it.

Data preparation before the first `fit` (downloads, tokenizer training) is not training time.
"""

from __future__ import annotations

import argparse
import bisect
import struct
import sys
from pathlib import Path
from typing import Iterator, NamedTuple

LOGS = "logs"  # `Run.logs_dir`
TRAIN, VALIDATION = "train", "validation"
BLEU_TAG = "epoch_bleu"  # in logs/validation
TOKENS_TAG = "epoch_target_tokens"  # in logs/train
EVENT_FILES = "events.out.tfevents.*"

SERIES_HEADER = ("epoch", "minutes", "target_tokens", "bleu")  # --save-series's CSV columns

FIGURE_INCHES = (11.0, 4.5)
DPI = 120  # 1320 x 540 pixels


class Point(NamedTuple):
    """One validation of a run."""

    epoch: int  # 1-based
    minutes: float  # training minutes when its BLEU was logged (see the module docstring)
    tokens: float | None  # target tokens trained on up to the end of the epoch; None if unknown
    bleu: float


class CurveError(Exception):
    """A folder the script cannot draw: the message is one line for the user."""


def read_events(path: Path) -> Iterator:
    """The `Event` protos of a TensorBoard event file (TFRecord framing: length, its CRC, data,
    its CRC), without TensorFlow. Stops at a truncated last record, as a run still writing or a
    killed one leaves it."""
    from tensorboard.compat.proto import event_pb2

    with open(path, "rb") as file:
        while True:
            header = file.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = file.read(length)
            if len(data) < length or len(file.read(4)) < 4:
                return
            yield event_pb2.Event.FromString(data)


def scalar_values(event) -> Iterator[tuple[str, float]]:
    """(tag, value) of the scalars of an event: tensor summaries (`tf.summary.scalar`, which
    Keras's TensorBoard callback uses) or the older `simple_value`."""
    from tensorboard.util import tensor_util

    for value in event.summary.value:
        if value.HasField("tensor"):
            if value.metadata.plugin_data.plugin_name not in ("scalars", ""):
                continue  # text, images
            array = tensor_util.make_ndarray(value.tensor)
            if array.size == 1 and array.dtype.kind in "fiu":
                yield value.tag, float(array.reshape(()))
        elif value.HasField("simple_value"):
            yield value.tag, float(value.simple_value)


class _LogFile(NamedTuple):
    folder: str  # train, validation, train_steps, ...
    wall_times: list[float]  # of every event, file version included
    scalars: list[tuple[float, int, str, float]]  # wall time, step, tag, value


def _read_log_file(path: Path) -> _LogFile:
    wall_times, scalars = [], []
    for event in read_events(path):
        wall_times.append(event.wall_time)
        if event.HasField("summary"):
            scalars.extend((event.wall_time, event.step, tag, value)
                           for tag, value in scalar_values(event))
    return _LogFile(path.parent.name, wall_times, scalars)


def training_sessions(files: list[_LogFile]) -> list[tuple[float, float]]:
    """(start, end) wall times of the training sessions: one per `logs/train` event file, from
    its first event to the last event of any log file before the next session's start."""
    starts = sorted(f.wall_times[0] for f in files if f.folder == TRAIN and f.wall_times)
    ends = list(starts)
    for wall_time in (t for f in files for t in f.wall_times):
        session = bisect.bisect_right(starts, wall_time) - 1
        if session >= 0:
            ends[session] = max(ends[session], wall_time)
    return list(zip(starts, ends))


def training_start(run_dir: str | Path) -> float | None:
    """The wall time of the run's minute 0 (its first training session's start, as
    `read_curve` counts minutes), or None without a training log."""
    files = [_read_log_file(path) for path in sorted((Path(run_dir) / LOGS).glob(
        f"{TRAIN}/{EVENT_FILES}"))]
    sessions = training_sessions(files)
    return sessions[0][0] if sessions else None


def training_minutes(sessions: list[tuple[float, float]], wall_time: float) -> float:
    """Minutes of training up to `wall_time`: the spans of the sessions before its own, and its
    own session's time so far."""
    starts = [start for start, _ in sessions]
    session = max(bisect.bisect_right(starts, wall_time) - 1, 0)
    before = sum(end - start for start, end in sessions[:session])
    return (before + max(wall_time - sessions[session][0], 0.0)) / 60.0


def _latest(scalars, tag: str) -> dict[int, tuple[float, float]]:
    """step -> (wall time, value) of a tag, the latest write of a step winning."""
    latest: dict[int, tuple[float, float]] = {}
    for wall_time, step, name, value in sorted(scalars):
        if name == tag:
            latest[step] = (wall_time, value)
    return latest


def read_curve(run_dir: str | Path) -> list[Point]:
    """The validations of a run, by epoch: (epoch, minutes, tokens, bleu), as the module
    docstring defines them. Raises CurveError for a folder that is not a run, or has no
    validation BLEU or no training log."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CurveError(f"{run_dir} is a file, not a run folder" if run_dir.exists()
                         else f"{run_dir}: no such folder")
    logs = run_dir / LOGS
    if not logs.is_dir():
        raise CurveError(f"{run_dir} is not a run folder: it has no {LOGS}/ (a folder "
                         f"`keras-transformer train` wrote, runs/NAME)")
    files = [_read_log_file(path) for path in sorted(logs.glob(f"*/{EVENT_FILES}"))]
    bleu = _latest([s for f in files if f.folder == VALIDATION for s in f.scalars], BLEU_TAG)
    if not bleu:
        raise CurveError(f"{run_dir} has no validation BLEU events ({BLEU_TAG} in "
                         f"{LOGS}/{VALIDATION}): no epoch has finished, or "
                         f"train.validation_bleu_sentences is 0")
    sessions = training_sessions(files)
    if not sessions:
        raise CurveError(f"{run_dir} has validation BLEU but no training log "
                         f"({LOGS}/{TRAIN}) to time it by")
    tokens = _latest([s for f in files if f.folder == TRAIN for s in f.scalars], TOKENS_TAG)
    points = []
    for step in sorted(bleu):
        wall_time, value = bleu[step]
        epochs = range(step + 1)
        total = (sum(tokens[e][1] for e in epochs) if all(e in tokens for e in epochs)
                 else None)
        points.append(Point(step + 1, training_minutes(sessions, wall_time), total, value))
    return points


def read_series(path: str | Path) -> list[Point]:
    """A curve that `write_series` saved. Raises CurveError naming the file and line of a row
    it cannot read."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CurveError(f"cannot read {path}: {error}") from None
    if not lines or tuple(lines[0].split(",")) != SERIES_HEADER:
        raise CurveError(f"{path}:1: not a saved curve: the header must be "
                         f"{','.join(SERIES_HEADER)}")
    points = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split(",")
        try:
            if len(fields) != len(SERIES_HEADER):
                raise ValueError(f"{len(fields)} fields, not {len(SERIES_HEADER)}")
            epoch, minutes, tokens, bleu = fields
            points.append(Point(int(epoch), float(minutes), float(tokens) if tokens else None,
                                float(bleu)))
        except ValueError as error:
            raise CurveError(f"{path}:{number}: cannot read {line!r} ({error})") from None
    if not points:
        raise CurveError(f"{path}: no validations after the header")
    return points


def write_series(points: list[Point], path: Path) -> None:
    """Writes a curve as `read_series` reads it; minutes and tokens exactly as read (repr)."""
    rows = [",".join(SERIES_HEADER)]
    rows += [f"{p.epoch},{p.minutes!r},{'' if p.tokens is None else repr(p.tokens)},{p.bleu!r}"
             for p in points]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def read_run_or_series(run: str | Path) -> list[Point]:
    """`read_series` for a `.csv` file, `read_curve` for a run folder."""
    return read_series(run) if Path(run).suffix == ".csv" else read_curve(run)


def series_file_name(label: str) -> str:
    """`LABEL.csv`, the label's characters other than letters, digits, '.' and '-' as '_'."""
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in label) + ".csv"


# ----------------------------------------------------------------------------- output

def summary_rows(curves: dict[str, list[Point]]) -> list[list[str]]:
    """The table: a header, then per run its epochs, minutes and tokens at its last validation
    and its best BLEU with the epoch, minutes and tokens it came at."""
    def millions(tokens):
        return "-" if tokens is None else f"{tokens / 1e6:.2f}"

    rows = [["run", "epochs", "minutes", "tokens (M)", "best BLEU", "at epoch", "at minute",
             "at tokens (M)"]]
    for label, points in curves.items():
        last, best = points[-1], max(points, key=lambda p: p.bleu)
        rows.append([label, str(last.epoch), f"{last.minutes:.1f}", millions(last.tokens),
                     f"{best.bleu:.2f}", str(best.epoch), f"{best.minutes:.1f}",
                     millions(best.tokens)])
    return rows


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                     for row in rows)


def draw(curves: dict[str, list[Point]], output: Path, title: str | None = None) -> None:
    """Writes the two-panel figure to `output` (its format from the extension, PNG by default)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    by_minutes, by_tokens = figure.subplots(1, 2, sharey=True)
    for index, (label, points) in enumerate(curves.items()):
        style = dict(color=f"C{index % 10}", marker="o", markersize=4, linewidth=1.5,
                     label=label)
        by_minutes.plot([p.minutes for p in points], [p.bleu for p in points], **style)
        known = [p for p in points if p.tokens is not None]
        if known:
            by_tokens.plot([p.tokens / 1e6 for p in known], [p.bleu for p in known], **style)
    by_minutes.set_xlabel("training minutes (wall clock from the start of fit)")
    by_tokens.set_xlabel("target tokens trained on (millions)")
    by_minutes.set_ylabel("validation BLEU (greedy)")
    by_tokens.tick_params(labelleft=True)
    for axes in (by_minutes, by_tokens):
        axes.grid(True, alpha=0.3)
        axes.set_xlim(left=0)
        axes.set_ylim(bottom=0)
    by_minutes.legend(loc="lower right")
    if title:
        figure.suptitle(title)
    figure.savefig(output)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="curves.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run folders (runs/NAME) or curves saved by --save-series (.csv)")
    parser.add_argument("--output", required=True,
                        help="the figure to write, e.g. experiments/curves.png")
    parser.add_argument("--labels", help="comma-separated legend labels, one per RUN "
                        "(default: the folders' names)")
    parser.add_argument("--title", help="a title above the panels")
    parser.add_argument("--save-series", metavar="DIR",
                        help="also write each run's curve to DIR/LABEL.csv")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        labels = ([label.strip() for label in args.labels.split(",")] if args.labels
                  else [Path(run).resolve().stem if Path(run).suffix == ".csv"
                        else Path(run).resolve().name for run in args.runs])
        if len(labels) != len(args.runs):
            raise CurveError(f"--labels gives {len(labels)} labels for {len(args.runs)} "
                             f"run{'s' if len(args.runs) != 1 else ''}")
        if len(set(labels)) != len(labels):
            raise CurveError(f"two runs have the same label ({', '.join(labels)}): "
                             f"name them with --labels")
        output = Path(args.output)
        if not output.parent.is_dir():
            raise CurveError(f"--output {output}: the folder {output.parent} does not exist")
        series_dir = Path(args.save_series) if args.save_series else None
        if series_dir is not None and not series_dir.is_dir():
            raise CurveError(f"--save-series {series_dir}: no such folder")
        curves = {label: read_run_or_series(run) for label, run in zip(labels, args.runs)}
        for label, points in curves.items():
            if any(p.tokens is None for p in points):
                print(f"curves.py: {label}: some epochs have no {TOKENS_TAG} in {LOGS}/{TRAIN}; "
                      f"their points are left out of the tokens panel", file=sys.stderr)
        print(format_table(summary_rows(curves)))
        try:
            draw(curves, output, args.title)
        except (OSError, ValueError) as error:  # a folder not writable, an unknown extension
            raise CurveError(f"cannot write {output}: {error}") from None
        if series_dir is not None:
            for label, points in curves.items():
                write_series(points, series_dir / series_file_name(label))
    except CurveError as error:
        print(f"curves.py: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
