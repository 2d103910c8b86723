"""Translating a corpus file: sharded, resumable, in length-sorted batches, output in input order.

    translate_file(translate, "captions.de", "captions.en", shard=Shard(0, 4), seed=1)

Back-translation translates hundreds of thousands of lines at a time, so a job must survive a
kill and split across machines:

- The shard's lines are read in chunks of `chunk_size`; each chunk is translated in batches of
  similar length (`texts.translate_texts`) and appended to the output in input order, then
  flushed to disk. A killed job leaves whole chunks, plus at most one cut line, which the next
  run removes before it resumes at the first untranslated line.
- A record beside the output (`OUTPUT.resume.json`: source, shard, search settings) says that
  the output is unfinished, and which job it belongs to; it is removed when the shard is done. A
  run refuses an output it did not start, and one started with other settings.
- One job writes an output at a time: a second one is refused, naming the first one's process
  (`runs.process_lock` on a hidden `.OUTPUT.lock` beside it, deleted when the job ends).
- A full disk is one line naming the output, and leaves a job that resumes once there is room:
  the record is written whole before the output exists (or neither is left), and a chunk that
  meets the full disk leaves whole lines and at most one cut line, as a kill does.
- `Shard(i, n)` takes the i-th of n contiguous slices of the file, so that the outputs of
  shards 0 .. n-1, concatenated in order, are the translation of the whole file.
- With a `seed`, sentence k of the file (counting from 0, whatever the shard, chunk or batch)
  gets seed `seed + k`: a sampled translation does not depend on how the file was split.

Empty and over-long lines are translated as the export translates them ("" for a line without
words; sources truncated to the model's positions).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable

from keras_transformer.config import ConfigError
from keras_transformer.data.text_io import (DataError, errno_of, one_line, read_user_lines,
                                            write_error)
from keras_transformer.decoding.texts import translate_texts
from keras_transformer.decoding.translator import TranslateFn
from keras_transformer.runs.files import atomic_path, process_lock

CHUNK_SIZE = 16384  # lines sorted and written together (at most the loss of a kill)
RESUME_SUFFIX = ".resume.json"


@dataclasses.dataclass(frozen=True)
class Shard:
    """The `index`-th of `count` contiguous slices of a file's lines (`"I/N"` on the command
    line); slice sizes differ by at most one line."""

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise ConfigError(f"--shard {self.index}/{self.count}: needs 0 <= I < N")

    @classmethod
    def parse(cls, text: str) -> "Shard":
        index, _, count = text.partition("/")
        if not (index.isdigit() and count.isdigit()):
            raise ConfigError(f"--shard {text!r}: expected I/N, e.g. 0/4")
        return cls(int(index), int(count))

    def lines(self, total: int) -> range:
        """The line numbers of this shard in a file of `total` lines."""
        return range(self.index * total // self.count, (self.index + 1) * total // self.count)


def translate_file(translate: TranslateFn, source: str | os.PathLike, output: str | os.PathLike,
                   *, settings: dict, shard: Shard = Shard(), seed: int | None = None,
                   batch_size: int = 64, workers: int = 1, chunk_size: int = CHUNK_SIZE,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Translates the `shard` of the lines of `source` (plain or .gz) into `output`, resuming an
    unfinished `output` of the same job.

    Args:
        translate: a Translator signature function (string `[batch]`, and with `seed` also
            int64 `[batch]` seeds -> {"translation": ...}), as `translate_texts` calls it.
        settings: what makes the translation (model, search and its options), recorded in the
            resume file: a run with other settings is refused rather than mixed in.
        seed: the seed of line 0 of the file (line k gets `seed + k`); None: no seeds.
        progress: called as `progress(done, total)` with the shard's lines so far, resumed
            ones included, after each batch.

    Returns:
        a dict of "lines" (the shard's line count) and "resumed_at" (how many of them an
        earlier run had translated).
    """
    source, output = Path(source), Path(output)
    if source.is_dir():
        raise DataError(f"{source} is a folder, not a text file")
    if output.exists() and source.exists() and output.samefile(source):
        raise ConfigError(f"--output {output} is the --source file: writing it would destroy "
                          "the input")
    if output.is_dir():
        raise ConfigError(f"--output {output} is a folder, not a file")
    folder = output.resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"--output {output}: no folder {folder}")
    with process_lock(output.with_name(f".{output.name}.lock"), lambda holder: (
            f"--output {output} is being written by another translation job (process "
            f"{holder}): wait for it to end, or choose another --output"), remove=True):
        lines = read_user_lines(source)
        numbers = shard.lines(len(lines))
        record = {"source": str(source.resolve()), "source_lines": len(lines),
                  "shard": f"{shard.index}/{shard.count}", "seed": seed, "settings": settings}
        resumed_at = done = _resume(output, record, len(numbers))
        if progress is not None:
            progress(done, len(numbers))

        def batch_done(count):
            nonlocal done
            done += count
            if progress is not None:
                progress(done, len(numbers))

        for start in range(numbers.start + done, numbers.stop, chunk_size):
            chunk = range(start, min(start + chunk_size, numbers.stop))
            translations = translate_texts(
                translate, lines[chunk.start:chunk.stop], batch_size=batch_size,
                workers=workers, seeds=None if seed is None else [seed + n for n in chunk],
                progress=batch_done)
            _append(output, translations)
        Path(str(output) + RESUME_SUFFIX).unlink(missing_ok=True)
    return {"lines": len(numbers), "resumed_at": resumed_at}


def _resume(output: Path, record: dict, total: int) -> int:
    """How many lines of the shard `output` already holds (0 for a new output), after cutting
    a line that a kill left half-written; writes the resume record of a new job. ConfigError
    for an output this job did not start."""
    resume = Path(str(output) + RESUME_SUFFIX)
    if not output.exists():
        # The record first, whole (an output without one would be refused as not this job's),
        # then the output; a full disk leaves neither.
        try:
            with atomic_path(resume) as partial:
                partial.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            output.touch()
        except OSError as error:
            resume.unlink(missing_ok=True)
            if not errno_of(error):
                raise
            raise write_error(output, error) from None
        return 0
    if not resume.is_file():
        raise ConfigError(f"--output {output} exists and is not an unfinished translation (no "
                          f"{resume.name}): delete it, or choose another file")
    try:
        started = json.loads(resume.read_text(encoding="utf-8"))
    except ValueError:
        raise ConfigError(f"{resume}: damaged (not JSON); delete it and {output} to start "
                          "again") from None
    changed = [key for key in record if started.get(key) != record[key]]
    if changed:
        key = changed[0]
        raise ConfigError(f"--output {output} was started with {key} {started.get(key)!r}, "
                          f"not {record[key]!r}: finish it with the same settings, or delete it "
                          f"and {resume.name}")
    data = output.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) < len(data):  # a line cut by a kill
        with open(output, "r+b") as f:
            f.truncate(len(complete))
    done = complete.count(b"\n")
    if done > total:
        raise ConfigError(f"--output {output} holds {done} lines, more than the {total} of "
                          "its shard: delete it to start again")
    return done


def _append(output: Path, lines: list[str]) -> None:
    """Appends `lines` to `output`, one line each, and flushes them to disk. A full disk (or
    any refusal of the file system) is a one-line OSError naming `output` that says the job
    resumes: what was written stays, cut at its last whole line by the next run."""
    try:
        with open(output, "ab") as f:
            f.write("".join(one_line(line) + "\n" for line in lines).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except OSError as error:
        code = errno_of(error)
        if not code:
            raise
        failure = OSError(f"cannot write {output} ({os.strerror(code)}); the lines translated "
                          "so far are kept: make room, then run the same command again to "
                          "resume")
        failure.errno = code
        raise failure from None
