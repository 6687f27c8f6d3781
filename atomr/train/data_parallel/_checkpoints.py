"""`Checkpoints`: `SaveCheckpoint` and `LoadCheckpoint` of a data-parallel
trainer, in the checkpoint format every trainer shares.

Save writes replica 0's state (in a multi-process job, process 0 writes and
the others wait until the file is durable). Inside an accumulation window
it also writes the window, in the single-device `Trainer`'s format
(`core/accumulation.py`): the sum of every replica's accumulated
gradients, of every process; a load puts that sum on the job's first
replica and zeros on the others, so the window's last step applies what it
would have. Load is all or none: replica
0's state is copied to the host first; if any replica fails to load (a
`Failure`, a crash, an ask timeout), every replica is given that copy back
(a restarted one too), the trainer keeps its step count, and the asker gets
the replica's own exception.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import ActorStoppedError, AskTimeoutError, Failure
from atomr.train.comm._fanout import failed_indices
from atomr.train.comm.agreement import agreed
from atomr.train.core.accumulation import (
    PendingAccumulation,
    accumulation_extra,
    read_pending,
)
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_matches,
    check_optimizer_state,
    save_checkpoint,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.core.sharded_index import merge_shards
from atomr.train.data_parallel._replicas import ReplicaGroup
from atomr.train.data_parallel._step import StepRunner
from atomr.train.data_parallel.messages import (
    GetGradients,
    GetState,
    ReplicaState,
    SetGradients,
    SetState,
)
from atomr.train.data_parallel.options import DataParallelOptions

__all__ = ["Checkpoints"]

Path = str | os.PathLike[str]


class Checkpoints:
    """Saves and loads a data-parallel trainer's state.

    Args:
        config: the trainer's config (its optimizer checks a loaded state).
        options: the trainer's options (the process collective and rank).
        replicas: the replicas.
        runner: the step runner (its step count and accumulation window).
        host: the thread for file I/O.
    """

    def __init__(
        self,
        config: TrainerConfig,
        options: DataParallelOptions,
        replicas: ReplicaGroup,
        runner: StepRunner,
        host: SerialWorker,
    ) -> None:
        self.config = config
        self.options = options
        self.replicas = replicas
        self.runner = runner
        self.host = host

    async def save(self, path: Path) -> None:
        """Write replica 0's state to `path`; in a multi-process job only
        process 0 writes (the others' `path` is ignored), and every process
        returns once the file is durable or raises if it could not be.

        Raises:
            CheckpointError: process 0 failed to write (`agree_on_failure`).
            OSError: the file could not be written.
            CollectiveTimeoutError, RankFailedError: a process did not take part.
            Exception: a replica's own, when it could not give its
                accumulated gradients (nothing written; another process's
                failure to: CheckpointError).
        """
        pending = await self._pending() if self.runner.window.micro > 0 else None
        write = (lambda: self._write(path, pending)) if self.options.process_rank == 0 else None
        await agreed(self.options.process_collective, f"write the checkpoint {path}", write)

    async def _pending(self) -> PendingAccumulation:
        """The open window: every replica's accumulated gradient sums and the
        window's totals, summed over the processes (each takes part even
        when its replicas failed, and every process then fails).

        Raises:
            Exception: the first failing replica's own.
            CheckpointError: another process's replicas failed (nothing written).
        """
        window = self.runner.window
        n = self.replicas.n_params
        total = np.zeros(n + 3, dtype=np.float64)  # sums, loss sum, normaliser, failures
        error: Exception | None = None
        dtype = np.dtype(self.replicas.model.get("dtype", "float32"))
        try:
            for g in await self.replicas.gather(GetGradients()):
                total[:n] += np.asarray(g, dtype=np.float64)
            total[n : n + 2] = window.loss_sum, window.normaliser
        except Exception as exc:  # the other processes must hear of it
            error, total[n + 2] = exc, 1.0
        if self.options.process_collective is not None:
            total = np.asarray(await self.options.process_collective.all_reduce([total]))
        if error is not None:
            raise error
        if total[n + 2] > 0:
            raise CheckpointError(
                "another process's replicas could not give their accumulated gradients; "
                "nothing was saved"
            )
        sums = total[:n].astype(dtype)  # the totals too are every process's
        return PendingAccumulation(
            window.micro, sums, float(total[n]), float(total[n + 1]), window.samples
        )

    async def _write(self, path: Path, pending: PendingAccumulation | None) -> None:
        state: ReplicaState = await self.replicas.refs[0].ask(
            GetState(), timeout=self.replicas.timeout
        )
        ckpt = Checkpoint(
            model=state.model,
            weights=np.asarray(state.weights),
            step=self.runner.steps,
            optimizer=state.optimizer,
            extra={
                "trainer": "DataParallelTrainer",
                "policy": self.options.policy.value,
                **accumulation_extra(pending),
            },
        )
        await self.host.run(save_checkpoint, path, ckpt)

    async def _read(self, path: Path) -> tuple[Checkpoint, PendingAccumulation | None]:
        """The checkpoint at `path` and its open window, checked against the
        model, optimizer and accumulation.

        Raises:
            CheckpointError: the file or its contents do not fit.
            OSError: unreadable.
        """
        ckpt: Checkpoint = await self.host.run(merge_shards, path)
        n, dtype = self.replicas.n_params, self.replicas.spec().dtype
        check_model_matches(ckpt, self.replicas.model, n, dtype)
        check_optimizer_state(ckpt, self.config.optimizer, n, dtype)
        accumulation = self.config.accumulation_steps
        return ckpt, read_pending(ckpt, n, accumulation, dtype, "DataParallelTrainer")

    async def load(self, path: Path) -> Failure | None:
        """Check the checkpoint, then load it into every replica, all or none.

        In a multi-process job the processes first wait for each other (so
        none reads a file another is still writing), then each loads it.
        The trainer's open accumulation window is dropped either way; the
        checkpoint's own window, if it has one, is opened instead.

        Returns:
            None, or a `Failure` when replica 0 failed to give its state
            (then nothing was loaded).

        Raises:
            CheckpointError: the file or its contents do not fit (nothing changed).
            Exception: the first failing replica's own exception (`_unload`).
        """
        if self.options.process_collective is not None:
            await self.options.process_collective.barrier()
        ckpt, pending = await self._read(path)
        old: ReplicaState | None = None
        if self.replicas.lost is None:  # else there is no state worth keeping
            got = await self.replicas.ask_every(GetState(), self.replicas.refs[:1])
            if failed_indices(got):
                self.runner.window.reset()
                padded = got + [None] * (len(self.replicas.refs) - 1)
                return await self.replicas.repair(padded, "the checkpoint was not loaded")
            old = got[0]
        state = ReplicaState(ckpt.model, ckpt.weights, ckpt.optimizer, int(ckpt.step))
        results = await self.replicas.ask_every(SetState(state))
        self.runner.window.reset()
        if pending is not None and not failed_indices(results):
            results = await self._reopen(pending)
        if failed_indices(results):
            self.runner.window.reset()
            raise await self._unload(results, old)
        self.runner.steps = int(ckpt.step)
        self.replicas.lost = None
        return None

    async def _reopen(self, pending: PendingAccumulation) -> list[Any]:
        """Open the checkpoint's window: its gradient sums on the job's first
        replica, zeros on the others; its totals counted once (process 0's).

        Returns:
            Every replica's answer to its `SetGradients` (exceptions included).
        """
        first = self.options.process_rank == 0
        zeros = np.zeros_like(pending.grads)
        messages = [
            SetGradients(pending.grads if first and k == 0 else zeros)
            for k in range(len(self.replicas.refs))
        ]
        results = await self.replicas.ask_each(messages)
        self.runner.window.reopen(pending, totals=first)
        return results

    async def _unload(self, results: list[Any], old: ReplicaState | None) -> BaseException:
        """After a failed load: give every replica `old` (its state from before
        the load) back, the failed ones included (a restarted replica lost its
        state; a resumed one may have half loaded). A replica whose ask timed
        out may still load: its `SetState(old)` waits in its mailbox behind it.

        Returns:
            The first failing replica's exception, `worker_index` set and a
            note naming the replica and saying whether the replicas hold
            their old state again.
        """
        rank = failed_indices(results)[0]
        error: BaseException = results[rank]
        error.worker_index = rank  # type: ignore[attr-defined]
        if old is None:
            error.add_note(
                f"raised by replica {rank}; the checkpoint was not loaded and the replicas' "
                "state is still lost: send LoadCheckpoint to go on"
            )
            return error
        restored = await self.replicas.ask_every(SetState(old))
        gone = [i for i, r in enumerate(restored) if isinstance(r, ActorStoppedError)]
        bad = [
            i
            for i, r in enumerate(restored)
            if isinstance(r, BaseException)
            and not isinstance(r, ActorStoppedError | AskTimeoutError)
        ]
        if bad:
            self.replicas.lost = RuntimeError(
                f"replicas {bad} could not be given back their state after a failed load"
            )
            error.add_note(
                f"raised by replica {rank}; the checkpoint was not loaded, and giving the "
                f"replicas back their state failed on replicas {bad}: send LoadCheckpoint"
            )
        else:
            error.add_note(
                f"raised by replica {rank}; the checkpoint was not loaded: every replica "
                "holds its state from before the load again"
            )
        if gone:
            self.replicas.drop(gone)
        return error
