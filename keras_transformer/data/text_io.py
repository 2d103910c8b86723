"""Reading and writing line-aligned text files, plain or gzipped, with errors naming file and line.

The data pipeline reads training files strictly (`read_lines`: bytes that are not UTF-8 are a
`DataError`); the translation commands read what a user gives them leniently
(`read_user_lines`: bad bytes become U+FFFD with a warning naming the line), so that one bad
line never costs the others their translations.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import hashlib
import io
import os
import re
import shutil
import sys
import warnings
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping, Sequence

# What str.splitlines() ends a line at: written inside a line, each would make two of it for
# some reader.
_LINE_BREAKS = re.compile("[\n\v\f\r\x1c-\x1e\x85\u2028\u2029]")


class DataError(ValueError):
    """Bad input data; the message names the file (and line) and the offending value."""


# What reading a damaged gzip file raises (truncated, corrupt body, bad header).
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def first_line(message: object) -> str:
    """The first non-empty line of a message or an error's (library errors run on for pages);
    an error without a message gives its type's name."""
    line = next((line for line in str(message).splitlines() if line.strip()), "")
    return line or (type(message).__name__ if isinstance(message, BaseException) else "")


def _damaged(path, error: Exception) -> DataError:
    return DataError(f"{path}: damaged gzip file ({error})")


class InvalidUtf8Warning(UserWarning):
    """A line of user input held bytes that are not UTF-8; they were replaced by U+FFFD."""


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """Opens a plain or gzip file (detected by its magic bytes, not its name) for reading bytes."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yields the lines of a plain or gzip `path` without their line ending; DataError naming
    the file and line on bytes that are not UTF-8, or the file if it is a damaged gzip file."""
    with open_binary(Path(path)) as f:
        lines = enumerate(f, start=1)
        while True:
            try:
                number, raw = next(lines)
            except StopIteration:
                return
            except _GZIP_ERRORS as error:
                raise _damaged(path, error) from None
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}:{number}: not valid UTF-8 ({error.reason} at byte {error.start}): "
                    f"{raw[:80]!r}") from None


def decode_user_lines(stream: BinaryIO, name: str) -> list[str]:
    """The lines of a byte stream, each decoded on its own: line endings (LF or CRLF) removed,
    bytes that are not UTF-8 replaced by U+FFFD with an `InvalidUtf8Warning` naming `name` and
    the line, a byte-order mark at the start of the stream dropped (it marks the encoding, as
    Python's "utf-8-sig" reads it; a reference's first word would otherwise differ). Every input
    line gives exactly one output line, empty lines included."""
    lines = []
    for number, raw in enumerate(stream, start=1):
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            warnings.warn(f"{name}:{number}: not valid UTF-8 ({error.reason} at byte "
                          f"{error.start}); replaced by U+FFFD", InvalidUtf8Warning, stacklevel=2)
            lines.append(raw.decode("utf-8", errors="replace"))
    return lines


def read_user_lines(path: str | os.PathLike | None) -> list[str]:
    """`decode_user_lines` of a plain or gzip file, or of standard input when `path` is None or
    "-"; DataError if the file does not exist or is a damaged gzip file."""
    if path is None or str(path) == "-":
        return decode_user_lines(sys.stdin.buffer, "<stdin>")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    with open_binary(path) as f:
        try:
            return decode_user_lines(f, str(path))
        except _GZIP_ERRORS as error:
            raise _damaged(path, error) from None


def read_parallel_lines(paths: Mapping[str, str | os.PathLike]) -> Iterator[tuple[int, dict]]:
    """Reads line-aligned files together: yields (line_number, {key: line}) from 1.

    Raises DataError for a missing or empty file, bytes that are not UTF-8 (naming file and line),
    or files with different line counts (naming every file and its count).
    """
    paths = {key: Path(path) for key, path in paths.items()}
    for path in paths.values():
        if not path.is_file():
            raise DataError(f"{path}: file not found")
    readers = {key: read_lines(path) for key, path in paths.items()}
    number = 0
    while True:
        lines = {key: next(reader, None) for key, reader in readers.items()}
        if all(line is None for line in lines.values()):
            break
        if any(line is None for line in lines.values()):
            counts = {key: number + (line is not None) + sum(1 for _ in readers[key])
                      for key, line in lines.items()}
            listing = ", ".join(f"{paths[key]} has {count} lines" for key, count in counts.items())
            raise DataError(f"line-aligned files have different line counts: {listing}")
        number += 1
        yield number, lines
    if number == 0:
        raise DataError(f"{', '.join(map(str, paths.values()))}: empty file(s), no lines")


def one_line(text: str) -> str:
    """`text` with every line break in it (LF, CR, U+2028, ...: those of str.splitlines)
    replaced by a space, so that writing it and a newline writes exactly one line."""
    return _LINE_BREAKS.sub(" ", text)


def write_lines(path: str | os.PathLike, lines: Sequence[str]) -> None:
    """Writes exactly one line per item (`one_line`), UTF-8, whole or not at all: a regular
    file is written through a temporary file beside it (`partial_path`) and renamed, so that a
    full disk or an unwritable folder (an OSError naming `path`, `write_error`) leaves no
    partial file and `path` as it was; what killed writers left is removed first
    (`remove_dead_partials`). Anything else (`/dev/stdout`, a pipe) is written directly."""
    path = Path(path)
    if path.exists() and not path.is_file():
        with io.open(path, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(one_line(line) + "\n")
        return
    remove_dead_partials(path.parent)
    partial = partial_path(path)
    try:
        with io.open(partial, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(one_line(line) + "\n")
        os.replace(partial, path)
    except OSError as error:
        raise write_error(path, error) from None
    finally:
        partial.unlink(missing_ok=True)


# What every write that must be whole or absent goes through: a temporary sibling of the file
# or folder, renamed into place at the end.
PARTIAL_PREFIX = ".partial-"
_PARTIAL_NAME = re.compile(r"\.partial-(\d+)-.+")


def partial_path(path: str | os.PathLike) -> Path:
    """The temporary name beside `path` that writing it goes through: `.partial-PID-NAME`,
    hidden, with this process's id, so that two processes writing `path` never share one (the
    workers of a run, two exports) and `remove_dead_partials` can tell a killed writer's."""
    path = Path(path)
    return path.with_name(f"{PARTIAL_PREFIX}{os.getpid()}-{path.name}")


def remove_dead_partials(folder: str | os.PathLike) -> list[Path]:
    """Deletes the `.partial-PID-NAME` files and folders (`partial_path`) in `folder` whose
    process is no longer running on this machine: what a writer killed with -9 left. Those of
    a running process (another command writing there now) are kept. Returns what was
    deleted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.iterdir()):
        found = _PARTIAL_NAME.fullmatch(entry.name)
        if found is None or _running(int(found.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _running(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rename_new(partial: str | os.PathLike, target: str | os.PathLike, advice: str) -> None:
    """Renames the written folder `partial` to `target`, which did not exist when the writing
    began: FileExistsError naming `target`, with `advice`, if another process made it
    meanwhile (the rename fails with "Directory not empty")."""
    try:
        os.rename(partial, target)
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST) or Path(target).exists():
            raise FileExistsError(f"{target} already exists (another process wrote it while "
                                  f"this one did): {advice}") from None
        raise


def write_error(path: str | os.PathLike, error: BaseException) -> OSError:
    """The one-line OSError for a file or folder `path` that could not be written (a full disk,
    no permission: `error`, whose errno it keeps), saying that nothing of it was left."""
    code = errno_of(error)
    if getattr(error, "errno", None) and getattr(error, "strerror", None):
        why = first_line(error.strerror)
    else:  # h5py and TensorFlow put the errno in a message of several lines
        why = os.strerror(code) if code else first_line(error)
    failure = OSError(f"cannot write {path} ({why}); nothing was written, what was there "
                      "before is kept")
    failure.errno = code
    return failure


# What a file system refuses a write with. Libraries that are not Python's own say it in their
# own words: h5py "errno = 28, error message = '...'", TensorFlow "...; No space left on device".
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM,
                 errno.EROFS, errno.EIO)


def errno_of(error: BaseException) -> int | None:
    """The errno of a write the file system refused (one of `_WRITE_ERRNOS`), from an OSError
    or from the message of a library's error (h5py, TensorFlow); None for any other error."""
    if getattr(error, "errno", None):
        return error.errno if error.errno in _WRITE_ERRNOS else None
    text = str(error)
    found = re.search(r"errno = (\d+)", text)
    if found:
        return int(found.group(1)) if int(found.group(1)) in _WRITE_ERRNOS else None
    return next((code for code in _WRITE_ERRNOS if os.strerror(code) in text), None)


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, in hex (what `sha256sum` prints)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def changed_file(folder: str | os.PathLike, recorded: Mapping[str, str]) -> str | None:
    """The first name of `recorded` ({file name: SHA-256 in hex}) whose file in `folder` is
    missing or holds other bytes, or None if every one is as recorded."""
    for name, digest in recorded.items():
        path = Path(folder) / name
        if not path.is_file() or file_sha256(path) != digest:
            return name
    return None
