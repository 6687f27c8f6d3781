"""`History`: what a training run measured, as JSON.

The history file (`history.json`) holds the run's options, one record per
finished epoch and a summary; a resumed run appends to the history stored
next to its checkpoint, so the curves cover the whole training.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from atomr._arguments import int_at_least, real_number
from atomr._repr import bounded_repr
from atomr.train.core._atomic_write import write_atomically
from atomr.train.core._checkpoint_validation import open_regular_file
from atomr.train.core.errors import CheckpointError
from atomr.train.fit import EpochRecord
from atomr.train.metrics import json_value

__all__ = ["History", "history_path_for"]

FORMAT = "atomr-history/1"
MAX_BYTES = 64 * 2**20
"""The largest history file read (a record per epoch: a few hundred bytes each)."""


def history_path_for(checkpoint: Path) -> Path:
    """Where the history written next to `checkpoint` lives (`--resume` reads it)."""
    return checkpoint.with_name(checkpoint.name + ".history.json")


def _record(raw: Any) -> EpochRecord:
    """An `EpochRecord` from its JSON form (null back to NaN), checked.

    Raises:
        TypeError: not an object, a field missing or unknown, `epoch` or
            `step` not an integer, another field not a real number.
        ValueError: `epoch` below 1 or `step` below 0.
    """
    if not isinstance(raw, dict):
        raise TypeError(f"an epoch record must be an object, got {bounded_repr(raw)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("epoch", "step"):
            values[key] = int_at_least(f"an epoch record's {key}", value, int(key == "epoch"))
        else:
            values[key] = math.nan if value is None else real_number(str(key), value)
    return EpochRecord(**values)


@dataclass
class History:
    """Options, per-epoch records and status of one training run.

    Attributes:
        config: the run's options (`RunConfig.to_json()`).
        epochs: one `EpochRecord` per finished epoch, in order (including
            the epochs of the run this one resumed).
        status: "running", "finished", "interrupted" or "failed".
        wall_seconds: wall time of this process's run.
        resumed_from: the checkpoint this run continued from, if any.
        position: where training stands (next epoch and batch, steps done,
            data options): written next to checkpoints so `--resume` continues
            at the same batch.
        run_id: which run this is: new for a fresh run, the checkpoint's
            run's when `--resume` continues it (None in a file from before
            ids were kept): only that run may write into a folder holding
            its outputs.
    """

    config: dict[str, Any]
    epochs: list[EpochRecord] = field(default_factory=list)
    status: str = "running"
    wall_seconds: float = 0.0
    resumed_from: str | None = None
    position: dict[str, Any] | None = None
    run_id: str | None = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def last(self) -> EpochRecord | None:
        """The latest epoch's record, or None before the first epoch ends."""
        return self.epochs[-1] if self.epochs else None

    def to_json(self) -> dict[str, Any]:
        """The history as a JSON-ready dict (NaN and infinities become null)."""
        return {
            "format": FORMAT,
            "status": self.status,
            "config": self.config,
            "resumed_from": self.resumed_from,
            "wall_seconds": round(self.wall_seconds, 3),
            "position": self.position,
            "run_id": self.run_id,
            "epochs": [{k: json_value(v) for k, v in asdict(rec).items()} for rec in self.epochs],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the history as JSON to `path` (parent folders are created),
        atomically: a temp file beside it replaces it, so a kill mid-write
        leaves the old file or the new one, never a torn one.

        Returns:
            The path written.

        Raises:
            OSError: the file cannot be written (its `filename` is `path`,
                not the temp file).
            CheckpointError: `path` exists and is not a regular file.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), indent=2) + "\n"
        try:
            write_atomically(target, text.encode("utf-8"))
        except OSError as exc:
            exc.filename, exc.filename2 = str(target), None
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> History:
        """Read a history file written by `save`.

        Only a regular file of at most `MAX_BYTES` is read (symlinks
        followed): a FIFO is refused without blocking, a larger file unread.

        Raises:
            FileNotFoundError: there is no file at `path` (OSError: it
                cannot be read).
            ValueError: it is not an atomr history: not a regular file,
                larger than `MAX_BYTES`, or not this format.
        """
        try:
            data = json.loads(_read_bounded(path))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("unknown format")
            records = [_record(raw) for raw in data["epochs"]]
            wall = real_number("wall_seconds", data["wall_seconds"])
            if not 0 <= wall < math.inf:
                raise ValueError(f"wall_seconds must be finite and >= 0, got {wall}")
            return cls(
                config=dict(data["config"]),
                epochs=records,
                status=str(data["status"]),
                wall_seconds=wall,
                resumed_from=data.get("resumed_from"),
                position=data.get("position"),
                run_id=run_id if isinstance(run_id := data.get("run_id"), str) else None,
            )
        except (KeyError, TypeError, ValueError, RecursionError) as exc:  # JSON nested too deep
            raise ValueError(f"{path}: not an atomr history file ({exc})") from None


def _read_bounded(path: str | os.PathLike[str]) -> str:
    """The text of the regular file at `path` (`open_regular_file`: a FIFO
    is not waited on), of at most `MAX_BYTES`.

    Raises:
        OSError: it cannot be opened or read.
        ValueError: not a regular file, larger than `MAX_BYTES`, or not UTF-8.
    """
    try:
        with open_regular_file(os.fspath(path)) as file:
            size = os.fstat(file.fileno()).st_size
            raw = file.read(MAX_BYTES + 1) if size <= MAX_BYTES else b""
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    if size > MAX_BYTES or len(raw) > MAX_BYTES:
        raise ValueError(f"{max(size, len(raw))} bytes, more than a history file's {MAX_BYTES}")
    return raw.decode("utf-8")
