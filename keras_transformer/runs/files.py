"""Writing a run's files safely: one process at a time (`process_lock`, `training_lock`),
through a temporary name (`atomic_path`), with a one-line error naming the file when the disk is
full or the folder unwritable (`write_errors`, `check_free_space`, `check_writable_folder`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from keras_transformer.config import ConfigError
from keras_transformer.data.text_io import errno_of, partial_path, write_error

logger = logging.getLogger(__name__)

LOCK_FILE = ".train.lock"  # held by the training that writes in the folder (`training_lock`)


@contextlib.contextmanager
def training_lock(path: str | os.PathLike):
    """Holds an exclusive lock on the run folder `path` (an existing folder) while a training
    writes in it: `process_lock` on `path/.train.lock`.

    A second training in the folder is refused (ConfigError) in one line naming the first
    one's process. The kernel releases the lock when that process ends, by kill -9 too, so a
    killed run resumes at once. Workers of one multi-worker run (TF_CONFIG) may share a folder:
    each locks a file of its own.
    """
    path = Path(path)
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    except (ValueError, AttributeError):
        task = {}
    name = f".train-{task.get('type')}-{task.get('index')}.lock" if task else LOCK_FILE
    with process_lock(path / name, lambda holder: (
            f"{path} is in use by another training (process {holder}): wait for it to end, "
            "or choose another --output")):
        yield


@contextlib.contextmanager
def process_lock(lock_file: str | os.PathLike, busy: Callable[[str], str], *,
                 wait: bool = False, remove: bool = False):
    """Holds an exclusive lock on `lock_file` (created if need be) while the block runs: the
    kernel's `flock`, which it releases when the process ends, by kill -9 too, so that nothing
    is left to clean up. The file holds the holder's process id, for the others to name.

    If another holds it (a process, or another open of the file in this one): ConfigError
    `busy(its process id)`, at once; or with `wait`, `busy(its process id)` logged as a warning,
    and the lock waited for. With `remove`, the holder deletes the file as it lets go (one who
    then locks the deleted file notices, and locks the new one). A lock file that cannot be
    created is a one-line OSError naming it; one whose process id cannot be written (a full
    disk) still locks.

    What `training_lock` (the run folder), `bulk_translation.translate_file` (an output file)
    and `export.export_run` (a model folder's versions) hold.
    """
    lock_file = Path(lock_file)
    fd = _lock_descriptor(lock_file, busy, wait)
    try:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError:  # a full disk: the others name the holder "unknown"
            pass
        yield
    finally:
        if remove:
            lock_file.unlink(missing_ok=True)
        os.close(fd)


def _lock_descriptor(lock_file: Path, busy: Callable[[str], str], wait: bool) -> int:
    """An open descriptor of `lock_file` whose `flock` this process holds (`process_lock`)."""
    while True:
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise write_error(lock_file, error) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                if not wait:
                    raise ConfigError(busy(holder)) from None
                logger.warning("%s", busy(holder))
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:  # still the file at `lock_file`, not one its holder deleted meanwhile
                locked = os.path.samestat(os.fstat(fd), os.stat(lock_file))
            except FileNotFoundError:
                locked = False
        except BaseException:
            os.close(fd)
            raise
        if locked:
            return fd
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary name beside `path` to write to; renames it to `path` when the block
    ends without an error (after syncing it to disk), deletes it otherwise. The name keeps
    `path`'s suffix (Keras wants `.weights.h5`) and holds the process id (workers of one run
    may write the same file): `text_io.partial_path`."""
    path = Path(path)
    partial = partial_path(path)
    try:
        yield partial
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def copy_file(source: Path, target: Path) -> None:
    """Copies `source` to `target` through a temporary file (`atomic_path`); a full disk is
    a one-line OSError (`write_errors`) that leaves `target` as it was."""
    check_free_space(target, source.stat().st_size)
    with write_errors(target), atomic_path(target) as partial:
        shutil.copyfile(source, partial)


def check_writable_folder(path: str | os.PathLike, what: str = "output folder") -> None:
    """ConfigError unless `path` is a folder, or can be made one, that this process may write in
    (checked without writing anything)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} is a file, not a folder")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path}: cannot write in {existing} (permission denied or a "
                          "read-only file system)")


def check_weights_output(path: Path) -> None:
    """ConfigError unless `path` names a `.weights.h5` file that can be written."""
    if not path.name.endswith(".weights.h5"):
        raise ConfigError(f"{path}: a weights file's name ends in .weights.h5")
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a weights file")
    check_writable_folder(path.parent, f"the folder of {path}:")


@contextlib.contextmanager
def write_errors(path: str | os.PathLike):
    """Turns what writing `path` raises when the disk is full or the folder unwritable
    (OSError; h5py's RuntimeError, whose message holds the errno) into a one-line OSError that
    names the file and says that nothing was written."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        if errno_of(error) is None:  # not the file system's refusal: a bug, with its traceback
            raise
        _quiet_h5py_cleanup()
        raise write_error(path, error) from None


def _quiet_h5py_cleanup() -> None:
    """After a failed write h5py says so again, as a traceback on stderr, whenever it frees the
    file's objects (Python calls that an unraisable exception): the one-line error has said it."""
    previous = sys.unraisablehook
    if getattr(previous, "keras_transformer_h5py", False):
        return

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, RuntimeError)
                and "h5py" in repr(unraisable.object)):
            previous(unraisable)

    hook.keras_transformer_h5py = True
    sys.unraisablehook = hook


def check_free_space(path: str | os.PathLike, size: int) -> None:
    """OSError (ENOSPC) unless the file system of `path`'s folder has `size` bytes free."""
    folder = Path(path).parent
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < size:
        raise write_error(path, OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: "
                                        f"{size / 1e6:.1f} MB needed, {free / 1e6:.1f} MB free"))


