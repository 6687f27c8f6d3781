"""Replacing a file atomically and durably, as `save_checkpoint` does.

The new content goes to a temporary file in the target's directory
(`.{name}.<8 mkstemp characters>.tmp`), which is fsynced, `os.replace`d over
the target, and the directory fsynced: a crash at any point leaves either
the previous file or the new one, never a mix. Temporary files a killed
write left behind are removed by the next write of the same name; one that a
write still under way holds (another thread's or process's, saving the same
file at the same time) is not: each write holds an exclusive `flock` on its
temporary file (and this process's writes list theirs) until it is renamed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
import threading
import time
from pathlib import Path

from atomr.train.core.errors import CheckpointError

__all__ = ["check_target", "probe_write", "write_atomically"]

_TEMP_TAIL = re.compile(r"[A-Za-z0-9_]{8}\.tmp")

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: an open file cannot be removed there
    fcntl = None  # type: ignore[assignment]

_writing: set[str] = set()
"""The temporary files of this process's writes under way (a lock on a
network file system may be per process: a thread's would not keep another's out)."""
_writing_lock = threading.Lock()


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
    fd, tmp_name = _own_temp(directory, target.name)
    try:
        with os.fdopen(fd, "wb") as fh:  # closes the descriptor whatever fails below
            os.fchmod(fd, mode)  # mkstemp's 0600 would replace the file's own mode
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            if fcntl is not None:  # renamed while locked: no other write removes it first
                os.replace(tmp_name, target)
        if fcntl is None:  # pragma: no cover - Windows renames no open file
            os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    finally:
        _unlist(tmp_name)
    _fsync_dir(directory)


def _own_temp(directory: Path, name: str) -> tuple[int, str]:
    """A new temporary file for a write of `name`, open and locked (listed in
    `_writing`, and `flock`ed where there is `fcntl`), so that no other
    write takes it for one a killed write left.

    Returns:
        Its descriptor and path.

    Raises:
        OSError: the file system refused.
    """
    while True:
        fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(name), suffix=".tmp", dir=directory)
        with _writing_lock:
            _writing.add(tmp_name)
        if fcntl is None:  # pragma: no cover
            return fd, tmp_name
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits while another write checks it
            if os.path.samestat(os.fstat(fd), os.lstat(tmp_name)):
                return fd, tmp_name
        except FileNotFoundError:
            pass  # another process's write removed it before it was locked: again
        except BaseException:
            os.close(fd)
            _unlist(tmp_name)
            raise
        os.close(fd)
        _unlist(tmp_name)


def _unlist(tmp_name: str) -> None:
    """`tmp_name` is no longer held by a write of this process (`_writing`)."""
    with _writing_lock:
        _writing.discard(tmp_name)


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
        NotADirectoryError: it exists, but is not a directory (a file).
        CheckpointError: `target` exists and is not a regular file.
    """
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        if directory.exists():  # a file where the folder should be: "does not exist" misleads
            raise NotADirectoryError(
                errno.ENOTDIR, "checkpoint directory is not a directory", os.fspath(directory)
            )
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


def probe_write(directory: Path) -> None:
    """Write, fsync and remove a one-byte temporary file in `directory`: a
    real write, so a folder without write permission, on a read-only or full
    file system, or failing with EIO shows up now, not at the first save.

    Raises:
        OSError: the file system refused (`errno` and `strerror` are its
            own; `filename` is `directory`).
    """
    probe = directory / f".atomr-probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, os.fspath(directory)) from None
    try:
        os.write(fd, b"\0")
        os.fsync(fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, os.fspath(directory)) from None
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def _remove_stale_temps(directory: Path, name: str) -> None:
    """Delete temp files a killed save of `name` left behind (our naming only).

    A name matches `.{name}.<8 mkstemp characters>.tmp` exactly and must be a
    regular file that no write under way holds (`_own_temp`); anything else
    in the directory is left alone.
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
                with _writing_lock:
                    if entry.path in _writing:
                        continue
                with contextlib.suppress(OSError):
                    _remove_if_abandoned(entry.path)


def _remove_if_abandoned(path: str) -> None:
    """Delete the temporary file `path` unless a write holds its lock.

    Raises:
        OSError: it could not be opened, locked or removed (it stays).
    """
    if fcntl is None:  # pragma: no cover - Windows: a file open for writing is not removed
        os.unlink(path)
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a write holds it
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            os.unlink(path)
    finally:
        os.close(fd)
