"""The ranks of `atomr train --distributed` agree on their options first.

Every rank runs its own copy of the command, with its own arguments (an
MPMD `mpiexec ... : ...` line can give each rank different ones). Ranks
that disagree on the model, the data, the optimizer, the schedule or the
strategy either train a model that matches no single run or wait for each
other in different collectives. So before anything is built each rank
digests the options that must match (`shared_options`: all of them but the
rank's own outputs and devices, and what it read from its own disk: the
`--resume` save and the data set), the ranks exchange the digests through the
job's `MpiCollective`, and every rank compares them (`disagreement`): a
mismatch is the same one-line error on every rank.

A rank that failed before the exchange (an option only it refused, a file
only it cannot read) still takes part in it (`agree`), with its error in
place of its digests, so that the other ranks stop at once with the same
line, naming it, instead of waiting for it until the start-up deadline.
A step that fails on one rank after the exchange and before training
(rank 0 opening its logs) is agreed on the same way (`none_failed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr.cli.errors import CliError
from atomr.cli.model_options import GPT_FLAGS, flag_of

if TYPE_CHECKING:
    from atomr.cli.run_config import RunConfig
    from atomr.cli.training_run import RunStart

__all__ = [
    "LOADED_DATA",
    "RESUMED_AT",
    "agree",
    "disagreement",
    "none_failed",
    "option_digests",
    "shared_options",
]

_PER_RANK = frozenset(
    {"distributed", "dist", "run_dir", "name", "plot", "history", "metrics", "tensorboard", "quiet"}
)
"""`RunConfig` fields a rank may set on its own: where rank 0 writes its
outputs (the other ranks write none) and how much it prints."""

RESUMED_AT = "--resume (its history file)"
"""The flag of where a resumed run starts, which the checkpoint's history
file gives where it has one (else the checkpoint's step)."""

LOADED_DATA = "--dataset (the data loaded)"
"""The flag of the data set each rank loaded (`RunStart.data`)."""

_WHY = {
    LOADED_DATA: "each rank loads --dataset itself (pydoc from its Python's documentation, "
    "digits from its scikit-learn, synthetic with its numpy): install the same versions "
    "on every host",
}
"""What to do about a flag that differs although every rank may have been
given the same options."""


def shared_options(run: RunConfig, start: RunStart) -> dict[str, Any]:
    """The options every rank of a job must be given alike, by flag.

    Everything in `run` but the rank's own outputs (`_PER_RANK`); `--devices`
    by its count (each rank picks its own devices, but the count sizes the
    batches), `--checkpoint` by whether it is given (each rank may spell the
    path its own way, but saving is collective), the GPT by each of its
    flags. `--resume` by the checkpoint read from it (`start.checkpoint`,
    the digest of the save: the same file, whatever each rank's path), and
    `RESUMED_AT` by the position the run resumes at (`start.position`):
    each rank reads its own disk, which may hold another save or history.
    `LOADED_DATA` by the data each rank loaded (`start.data`).
    """
    options: dict[str, Any] = {LOADED_DATA: start.data}
    for field in dataclasses.fields(run):
        name, value = field.name, getattr(run, field.name)
        if name in _PER_RANK:
            continue
        if name == "devices":
            value = len(value)
        elif name == "checkpoint":
            value = value is not None
        elif name == "resume":
            where = start.position
            options[RESUMED_AT] = None if value is None else (where.epoch, where.batch, where.step)
            value = start.checkpoint
        elif name == "gpt":  # every GPT flag, given or not: one digest per flag on every rank
            options.update(
                (flag_of(k), None if value is None else getattr(value, k)) for k in GPT_FLAGS
            )
            continue
        options[flag_of(name)] = value
    return dict(sorted(options.items()))


def option_digests(options: Mapping[str, Any]) -> np.ndarray:
    """One number per option: 52 bits of the SHA-256 of its flag and value,
    so that float64 (which the collective carries) holds it exactly."""
    digests = np.empty(len(options), dtype=np.float64)
    for i, (flag, value) in enumerate(options.items()):
        sha = hashlib.sha256(f"{flag}={value!r}".encode()).digest()
        digests[i] = int.from_bytes(sha[:8], "big") >> 12
    return digests


def disagreement(flags: Sequence[str], gathered: np.ndarray) -> str | None:
    """What differs between the ranks' options, or None when they agree.

    Args:
        flags: the options' flags, in the order of the digests.
        gathered: the digests of every rank, one row per rank (rank order).

    Returns:
        One line naming each rank that differs from rank 0 and the options
        it differs in (`LOADED_DATA` only where no option does: other
        options load other data), with what to do; None when every row
        equals rank 0's.

    Raises:
        ValueError: `gathered` is not one row of `len(flags)` digests per rank.
    """
    table = np.asarray(gathered)
    if table.ndim != 2 or table.shape[1] != len(flags):
        raise ValueError(f"expected one row of {len(flags)} digests per rank, got {table.shape}")
    differing, why = [], ["every rank of a job must be given the same training options"]
    for rank in range(1, table.shape[0]):
        which = [flags[int(i)] for i in np.flatnonzero(table[rank] != table[0])]
        if LOADED_DATA in which and len(which) > 1:  # other options load other data
            which.remove(LOADED_DATA)
        if which:
            differing.append(f"rank {rank} differs from rank 0 in {', '.join(which)}")
            why += [_WHY[f] for f in which if f in _WHY and _WHY[f] not in why]
    if not differing:
        return None
    return (
        "--distributed: the ranks were given different options: "
        + "; ".join(differing)
        + f" ({'; '.join(why)})"
    )


_MESSAGE_BYTES = 2000
"""A failed rank's error is cut to this many UTF-8 bytes for the exchange."""


async def agree(collective: Any, mine: Mapping[str, Any] | CliError) -> None:
    """Check that no rank failed before the exchange and that every rank was
    given the same `shared_options`.

    Collective: every rank calls it at the same point, once the job's
    collective is made and before anything else is. Each rank first sends
    its status (its error's exit status and length, or its digests' count),
    then every rank's error when one failed, else every rank's digests.

    Args:
        collective: the job's `MpiCollective` (rank, world size, `all_gather`).
        mine: this rank's `shared_options`, or the error it failed with.

    Raises:
        CliError: on every rank alike: a rank failed (one line naming each
            failed rank and its error; the exit status of the first), the
            ranks compare different options (another atomr on some host:
            exit status 2), or they disagree (exit status 2).
        CollectiveError: a rank never joined the exchange (timed out, dead).
    """
    flags: list[str] = []
    error, digests = None, np.empty(0)
    if isinstance(mine, CliError):
        error = mine
    else:
        flags, digests = list(mine), option_digests(mine)
    heads = await _statuses(collective, error, digests.size)
    if (heads[:, 2] != digests.size).any():
        counts = ", ".join(str(int(n)) for n in heads[:, 2])
        raise CliError(
            f"--distributed: the ranks compare different options ({counts} by rank): "
            "run the same atomr on every host"
        )
    line = disagreement(flags, await _gathered(collective, digests))
    if line is not None:
        raise CliError(line)


async def none_failed(collective: Any, error: CliError | None) -> None:
    """Check that no rank failed a step every rank takes after the exchange
    and before training (rank 0 opening its logs): one all-gather when none
    did. Collective, as `agree`.

    Raises:
        CliError: on every rank alike, as `agree`: a rank failed (one line
            naming each failed rank and its error; the exit status of the first).
        CollectiveError: a rank never joined (timed out, dead).
    """
    await _statuses(collective, error, 0)


async def _statuses(collective: Any, error: CliError | None, count: int) -> np.ndarray:
    """Every rank's status, one row per rank: its error's exit status and
    length (0 and 0: none) and the `count` of digests it sends next.

    Raises:
        CliError: some rank failed (`_failures`, once every failed rank's
            message was gathered).
    """
    code, message = 0, b""
    if error is not None:  # a status of 0 would read as no failure
        code, message = max(1, error.exit_code), str(error).encode()[:_MESSAGE_BYTES]
    heads = await _gathered(collective, np.array([code, len(message), count], float))
    if heads[:, 0].any():
        row = np.zeros(max(1, int(heads[:, 1].max())))
        row[: len(message)] = np.frombuffer(message, dtype=np.uint8)
        raise _failures(heads, await _gathered(collective, row))
    return heads


async def _gathered(collective: Any, row: np.ndarray) -> np.ndarray:
    """Every rank's `row` (of one length on every rank), one row per rank."""
    size = row.size
    table = np.zeros(collective.world_size * size, dtype=np.float64)
    table[collective.rank * size : (collective.rank + 1) * size] = row
    await collective.all_gather(table)
    return table.reshape(collective.world_size, size)


def _failures(heads: np.ndarray, texts: np.ndarray) -> CliError:
    """The error every rank raises when some failed before the exchange:
    each failed rank (status and length in `heads`, its error's bytes in
    `texts`) and its error, on one line; the first one's exit status."""
    failed = [int(r) for r in np.flatnonzero(heads[:, 0])]
    parts = []
    for rank in failed:
        raw = texts[rank, : int(heads[rank, 1])].astype(np.uint8).tobytes()
        error = " ".join(raw.decode(errors="replace").splitlines())
        parts.append(f"rank {rank} failed before training: {error}")
    return CliError("--distributed: " + "; ".join(parts), int(heads[failed[0], 0]))
