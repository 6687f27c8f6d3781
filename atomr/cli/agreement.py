"""The ranks of `atomr train --distributed` agree on their options first.

Every rank runs its own copy of the command, with its own arguments (an
MPMD `mpiexec ... : ...` line can give each rank different ones). Ranks
that disagree on the model, the data, the optimizer, the schedule or the
strategy either train a model that matches no single run or wait for each
other in different collectives. So before anything is built each rank
digests the options that must match (`shared_options`: all of them but the
rank's own outputs and devices), the ranks exchange the digests with one
`all_gather` of the job's `MpiCollective`, and every rank compares them
(`disagreement`): a mismatch is the same one-line error on every rank.
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

__all__ = ["check_agreement", "disagreement", "option_digests", "shared_options"]

_PER_RANK = frozenset(
    {"distributed", "dist", "run_dir", "name", "plot", "history", "metrics", "tensorboard", "quiet"}
)
"""`RunConfig` fields a rank may set on its own: where rank 0 writes its
outputs (the other ranks write none) and how much it prints."""

_GIVEN_OR_NOT = frozenset({"checkpoint", "resume"})
"""Paths each rank may spell its own way (a machine's own disk), but that
every rank must give or leave out: saving and loading are collective."""


def shared_options(run: RunConfig) -> dict[str, Any]:
    """The options every rank of a job must be given alike, by flag.

    Everything in `run` but the rank's own outputs (`_PER_RANK`); `--devices`
    by its count (each rank picks its own devices, but the count sizes the
    batches), `--checkpoint` and `--resume` by whether they are given, the
    GPT by each of its flags.
    """
    options: dict[str, Any] = {}
    for field in dataclasses.fields(run):
        name, value = field.name, getattr(run, field.name)
        if name in _PER_RANK:
            continue
        if name == "devices":
            value = len(value)
        elif name in _GIVEN_OR_NOT:
            value = value is not None
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
        it differs in; None when every row equals rank 0's.

    Raises:
        ValueError: `gathered` is not one row of `len(flags)` digests per rank.
    """
    table = np.asarray(gathered)
    if table.ndim != 2 or table.shape[1] != len(flags):
        raise ValueError(f"expected one row of {len(flags)} digests per rank, got {table.shape}")
    differing = []
    for rank in range(1, table.shape[0]):
        which = [flags[int(i)] for i in np.flatnonzero(table[rank] != table[0])]
        if which:
            differing.append(f"rank {rank} differs from rank 0 in {', '.join(which)}")
    if not differing:
        return None
    return (
        "--distributed: the ranks were given different options: "
        + "; ".join(differing)
        + " (every rank of a job must be given the same training options)"
    )


async def check_agreement(collective: Any, run: RunConfig) -> None:
    """Check that every rank of the job was given the same `shared_options`.

    Collective: every rank calls it at the same point, once the job's
    collective is made and before anything else is.

    Args:
        collective: the job's `MpiCollective` (rank, world size, `all_gather`).
        run: this rank's options.

    Raises:
        CliError: the ranks disagree (exit status 2), on every rank alike.
        CollectiveError: a rank never joined the exchange (timed out, dead).
    """
    options = shared_options(run)
    mine = option_digests(options)
    size = mine.size
    table = np.zeros(collective.world_size * size, dtype=np.float64)
    table[collective.rank * size : (collective.rank + 1) * size] = mine
    await collective.all_gather(table)
    message = disagreement(list(options), table.reshape(collective.world_size, size))
    if message is not None:
        raise CliError(message)
