"""Replacing a file atomically and durably, as `save_checkpoint` does.

The new content goes to a temporary file in the target's directory
(`.{name}.<8 mkstemp characters>.tmp`), which is fsynced, `os.replace`d over
the target, and the directory fsynced: a crash at any point leaves either
the previous file or the new one, never a mix. Temporary files a killed
write left behind are removed by the next write of the same name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from pathlib import Path

from atomr.train.core.errors import CheckpointError

__all__ = ["check_target", "write_atomically"]

_TEMP_TAIL = re.compile(r"[A-Za-z0-9_]{8}\.tmp")


def write_atomically(target: Path, data: bytes) -> None:
    """Replace `target` with `data`, atomically and durably.

    Raises:
        FileNotFoundError: the directory of `target` does not exist (its
            `filename` is that directory).
        CheckpointError: `target` exists and is not a regular file (a symlink,
            device, FIFO or directory is never replaced).
        OSError: the file system refused (the previous file, if any, is left
            intact and no temporary file remains).
    """
    directory = check_target(target)
    _remove_stale_temps(directory, target.name)
    mode = _mode_for(target)
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)  # mkstemp's 0600 would replace the file's own mode
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _mode_for(target: Path) -> int:
    """The permissions the written file gets: those of the file it replaces,
    or those of a new file under the process's umask (as `open` would)."""
    with contextlib.suppress(FileNotFoundError):
        return stat.S_IMODE(target.lstat().st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it (Linux's /proc; else the
    usual 022). `os.umask` would have to set it to read it, racing other threads."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _temp_prefix(name: str) -> str:
    return f".{name}."


def check_target(target: Path) -> Path:
    """What `write_atomically` refuses about `target` itself, checked before
    anything is written; returns its directory.

    Raises:
        FileNotFoundError: the directory of `target` does not exist.
        CheckpointError: `target` exists and is not a regular file.
    """
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise FileNotFoundError(
            errno.ENOENT, "checkpoint directory does not exist", os.fspath(directory)
        )
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return directory
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"{target}: exists and is not a regular file (refusing to replace it)"
        )
    return directory


def _remove_stale_temps(directory: Path, name: str) -> None:
    """Delete temp files a killed save of `name` left behind (our naming only).

    A name matches `.{name}.<8 mkstemp characters>.tmp` exactly and must be a
    regular file; anything else in the directory is left alone.
    """
    prefix = _temp_prefix(name)
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            rest = entry.name[len(prefix) :]
            if (
                entry.name.startswith(prefix)
                and _TEMP_TAIL.fullmatch(rest)
                and entry.is_file(follow_symlinks=False)
            ):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
