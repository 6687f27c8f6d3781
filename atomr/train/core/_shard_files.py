"""The shard files of a checkpoint saved one file per replica, found by
name beside its path: `<path>.gen-<N>.shard-<g>-of-<G>` (`<path>.shard-<g>-of-<G>`
for generation 0, from before generations existed), and the temp files a
killed write of one left (`.<shard file>.<8 characters>.tmp`).

Every file named like a shard of `<path>` belongs to it. A save at `<path>`
deletes the shard files it no longer names once its own files are in
place: a sharded save the older generations' (`write_index`), a full save
every generation (`save_checkpoint`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from pathlib import Path

__all__ = ["remove_shard_files", "shard_generations", "shard_path"]


def shard_path(path: str | os.PathLike[str], index: int, count: int, generation: int = 0) -> Path:
    """The file of shard `index` of `count`, of save `generation`, next to
    the index at `path` (generation 0: the name of indexes written before
    generations existed)."""
    if generation == 0:
        return Path(f"{path}.shard-{index}-of-{count}")
    return Path(f"{path}.gen-{generation}.shard-{index}-of-{count}")


def shard_generations(path: str | os.PathLike[str]) -> dict[int, list[Path]]:
    """The shard files beside `path` by generation, with the temp files a
    killed write of one left."""
    target = Path(path)
    shard = re.escape(target.name) + r"(?:\.gen-(\d+))?\.shard-\d+-of-\d+"
    pattern = re.compile(rf"(?:{shard}|\.{shard}\.[A-Za-z0-9_]{{8}}\.tmp)")
    name = glob.escape(target.name)
    candidates = [
        *target.parent.glob(name + "*.shard-*-of-*"),
        *target.parent.glob("." + name + "*.shard-*-of-*.tmp"),
    ]
    found: dict[int, list[Path]] = {}
    for candidate in candidates:
        match = pattern.fullmatch(candidate.name)
        if match is not None:
            generation = match.group(1) or match.group(2) or 0
            found.setdefault(int(generation), []).append(candidate)
    return found


def remove_shard_files(path: str | os.PathLike[str], keep: int | None = None) -> None:
    """Delete the shard files beside `path` of every generation but `keep`
    (None: all of them), once the file at `path` no longer names them.
    Never raises: the save is done, and a file left behind is harmless (a
    symlink or anything not a regular file is left alone)."""
    for generation, files in shard_generations(path).items():
        if generation != keep:
            for file in files:
                with contextlib.suppress(OSError):
                    if file.is_file() and not file.is_symlink():
                        file.unlink()
