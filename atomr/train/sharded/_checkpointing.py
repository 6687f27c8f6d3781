"""`ShardedCheckpoints`: how a `ShardedDataParallelTrainer` saves and loads.

The full weights and optimizer state are assembled from every replica's
piece, across the processes of a job (`ShardExchange.assemble`); a save
writes the full format (or, with `ShardedOptions.shard_checkpoints`, one
file per replica and an index: `checkpoints`), and a load gives every
replica its part. Both are all or none across the processes: they agree
after each phase (`agree_on_failure`), and a failed load gives every
replica its old state back.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import ActorRef
from atomr.train.comm.agreement import agree_on_failure, agreed
from atomr.train.comm.collective import Collective
from atomr.train.core.accumulation import check_resumable_window
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_matches,
    check_optimizer_state,
    save_checkpoint,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.sharded._exchange import ShardExchange
from atomr.train.sharded.checkpoints import (
    assemble_state,
    merge_shards,
    next_generation,
    split_state,
    write_index,
    write_shards,
)
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import GetShardState, SetShardState
from atomr.train.sharded.options import ShardedOptions

__all__ = ["ShardedCheckpoints"]

TRAINER = "ShardedDataParallelTrainer"
"""The trainer a checkpoint's `extra["trainer"]` names."""


class ShardedCheckpoints:
    """Saves and loads a sharded trainer's state (module docstring).

    Args:
        config: the trainer's config (its optimizer checks a loaded state).
        options: the stage, the job and `shard_checkpoints`.
        layout: the owned positions.
        model_config, dtype: the model's config and float dtype.
        exchange: assembles the pieces across the processes.
        host: the thread for file I/O.
        refs: the local replicas.
        ask: every local replica's answer to one message each, in order.
    """

    def __init__(
        self,
        config: TrainerConfig,
        options: ShardedOptions,
        layout: ShardLayout,
        model_config: dict[str, Any],
        dtype: Any,
        exchange: ShardExchange,
        host: SerialWorker,
        refs: list[ActorRef],
        ask: Callable[[list[Any]], Awaitable[list[Any]]],
    ) -> None:
        self.config, self.options, self.layout = config, options, layout
        self.model_config, self.dtype = model_config, dtype
        self.exchange, self.host, self.refs, self.ask = exchange, host, refs, ask

    async def states(self) -> list[Any]:
        """Every local replica's state (its piece, optimizer state, steps)."""
        return await self.ask([GetShardState()] * len(self.refs))

    async def full_state(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The full weights and optimizer state, assembled from every piece."""
        weights, optimizer = assemble_state(self.layout, await self.states(), self.dtype)
        weights = await self.exchange.assemble(weights)
        for key, value in optimizer.items():
            if isinstance(value, np.ndarray):
                optimizer[key] = await self.exchange.assemble(value)
        return weights, optimizer

    async def save(self, path: Path, steps: int) -> None:
        """Write the checkpoint at `path` (`ShardedOptions.shard_checkpoints`:
        one file per replica and an index), every process agreeing.

        Raises:
            Exception: this process's error, or a `CheckpointError` saying
                another process failed (nothing of this save is kept).
        """
        extra = {"trainer": TRAINER, "stage": self.options.stage}
        if self.options.shard_checkpoints:
            await self._save_shards(path, extra)
            return
        weights, optimizer = await self.full_state()

        async def write() -> None:
            ckpt = Checkpoint(self.model_config, weights, steps, optimizer, extra)
            await self.host.run(save_checkpoint, path, ckpt)

        rank_0 = self.options.process_rank == 0
        await agreed(
            self.options.process_collective, "write the checkpoint", write if rank_0 else None
        )

    async def _save_shards(self, path: Path, extra: dict[str, Any]) -> None:
        """One file per replica, of a new generation, then (process 0) the
        index, once every process has written (`checkpoints` module
        docstring). Every phase ends with the processes agreeing that all
        of them succeeded, so a failure anywhere fails the save everywhere."""
        error: Exception | None = None
        states: list[Any] = []
        generation = 0
        try:
            states = await self.states()
            if self.options.process_rank == 0:
                generation = await self.host.run(next_generation, path)
        except Exception as exc:
            error = exc
        config, processes = self.model_config, self.options.process_collective
        # process 0's generation and save id, so every file is of one save
        generation = int(await agree_on_failure(processes, error, "prepare the save", generation))
        save_id = await shared_save_id(processes, self.options.process_rank)

        async def shards() -> None:
            await self.host.run(
                write_shards, path, self.layout, states, config, generation, save_id
            )

        async def index() -> None:
            steps = states[0].steps
            await self.host.run(
                write_index, path, self.layout, steps, config, extra, generation, save_id
            )

        await agreed(processes, "write its shard files", shards)
        await agreed(
            processes, "write the index", index if self.options.process_rank == 0 else None
        )

    async def _read(self, path: Path) -> Checkpoint:
        ckpt: Checkpoint = await self.host.run(merge_shards, path)
        check_model_matches(ckpt, self.model_config, self.layout.n_params, self.dtype)
        check_optimizer_state(ckpt, self.config.optimizer, self.layout.n_params, self.dtype)
        check_resumable_window(ckpt, self.config.accumulation_steps, TRAINER)
        return ckpt

    async def load(self, path: Path, keep_old: bool) -> int:
        """Check the checkpoint, then give every replica of every process its
        part, all or none: the processes agree after reading and after
        loading, and a failure anywhere gives every replica its old state
        back (`keep_old`: its state is whole, not lost with a replica).

        Returns:
            The checkpoint's step.

        Raises:
            CheckpointError: the checkpoint does not fit (nothing changed);
                or another process failed to load it (nothing changed here).
            Exception: a replica's own error (every replica's state restored).
        """
        processes = self.options.process_collective

        async def read() -> tuple[Checkpoint, list[Any] | None]:
            return await self._read(path), (await self.states() if keep_old else None)

        read_back = await agreed(processes, "read the checkpoint", read, others=_not_loaded)
        assert read_back is not None  # agreed raises when the read failed
        ckpt, old = read_back
        try:
            await agreed(
                processes,
                "load the checkpoint",
                lambda: self._install(ckpt.weights, ckpt.optimizer, int(ckpt.step)),
                others=_not_loaded,
            )
        except Exception:
            if old is not None:
                await self._restore(old)
            raise
        return int(ckpt.step)

    async def from_process_zero(self, weights: np.ndarray) -> None:
        """Every process starts from process 0's `weights` (this process's
        initial ones on process 0): a broadcast every process joins; the
        other processes' replicas take their parts, with a fresh optimizer.

        Raises:
            Exception: the process collective's error, or the first failing
                replica's own.
        """
        processes = self.options.process_collective
        assert processes is not None  # only a job's trainer starts so
        weights = np.ascontiguousarray(weights, dtype=self.dtype)
        await processes.broadcast([weights], 0)
        if self.options.process_rank != 0:
            await self._install(weights, {}, 0)

    async def _install(self, weights: Any, optimizer: dict[str, Any], steps: int) -> None:
        """Give every local replica its part of the full state.

        Raises:
            Exception: the first failing replica's own error.
        """
        weights = np.asarray(weights, dtype=self.dtype)
        full = weights if self.options.stage < 3 else None
        parts = split_state(self.layout, weights, optimizer, steps)
        await self.ask([SetShardState(p, full) for p in parts])

    async def _restore(self, old: list[Any]) -> None:
        """Give every local replica its state `old` back (stages 1 and 2: the
        working copy too, from every process's pieces: a collective).

        Raises:
            Exception: the first failing replica's own error, or the
                process collective's.
        """
        back = None
        if self.options.stage < 3:
            back = await self.exchange.assemble(assemble_state(self.layout, old, self.dtype)[0])
        await self.ask([SetShardState(s, back) for s in old])


def _not_loaded(who: str, what: str) -> Exception:
    """The error of a load that other processes (`who`) failed to `what`."""
    return CheckpointError(
        f"{who} failed to {what}; no process loaded it (every replica keeps its state)"
    )


async def shared_save_id(processes: Collective | None, rank: int) -> str:
    """A new sharded save's id: 16 random bytes chosen by process rank 0,
    copied to every process (`broadcast`), in hex.

    Raises:
        Exception: the collective's error (as `Collective.broadcast`).
    """
    token = np.zeros(16, np.uint8)
    if rank == 0:
        token[:] = np.frombuffer(secrets.token_bytes(16), np.uint8)
    if processes is not None:
        await processes.broadcast([token], root=0)
    return token.tobytes().hex()
