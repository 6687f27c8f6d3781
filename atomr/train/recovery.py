"""How the trainers recover from a failure, shared by all of them.

- `UpdateSnapshot`: before an optimizer update, a device-side copy of the
  parameters and the optimizer's buffers and step count; a failed update is
  undone with `restore` (the parameter server, the tensor-parallel shard,
  the pipeline stage, the data-parallel replica).
- `worker_decider` and `resync` (data parallel): a failed replica is
  restarted and re-synced from a healthy one (every replica holds the
  whole model).
- `state_keeping_decider` and `StateLossWatch` (tensor and pipeline
  parallel, whose workers each hold a different part of the model, so no
  peer can restore one): a worker is resumed after an ordinary exception
  (its updates are atomic, so its state is still valid and nothing needs
  re-syncing); only a poisoned device context costs a worker its state,
  and then the trainer refuses every request with `WorkerStateLost` until
  a checkpoint is loaded. No host copy of the state is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atomr.accel import ContextPoisoned, OutOfMemory, Unrecoverable
from atomr.actor import ActorRef, ActorStoppedError, Directive
from atomr.train.errors import WorkerStateLost
from atomr.train.fanout import ask_all_settled

__all__ = [
    "ResyncOutcome",
    "StateLossWatch",
    "UpdateSnapshot",
    "resync",
    "state_keeping_decider",
    "worker_decider",
]


class UpdateSnapshot:
    """A device-side copy of a flat parameter vector and its optimizer state,
    taken before an update and restored if the update fails half-way.

    The copy buffers are allocated once and reused. Call `take` and
    `restore` on the device's worker thread.
    """

    def __init__(self) -> None:
        self._params: Any = None
        self._buffers: dict[str, Any] = {}
        self._state: tuple[int, dict[str, Any]] | None = None

    @property
    def taken(self) -> bool:
        """True between `take` and `restore` / `discard`."""
        return self._state is not None

    @property
    def nbytes(self) -> int:
        """Bytes held by the copy buffers (kept between updates for reuse)."""
        bufs = [self._params, *self._buffers.values()]
        return sum(int(b.nbytes) for b in bufs if b is not None)

    def take(self, backend: Any, params: Any, optimizer: Any) -> None:
        """Copy `params` and `optimizer`'s buffers and step count."""
        if self._params is None or tuple(self._params.shape) != tuple(params.shape):
            self._params = backend.empty(tuple(params.shape), dtype=params.dtype)
            self._buffers = {}
        backend.copy(params, self._params)
        bufs: dict[str, Any] = {}
        for name, buf in optimizer.buffers().items():
            if buf is None:
                bufs[name] = None
                continue
            dst = self._buffers.get(name)
            if dst is None:
                dst = self._buffers[name] = backend.empty(tuple(buf.shape), dtype=buf.dtype)
            backend.copy(buf, dst)
            bufs[name] = dst
        self._state = (optimizer.step_count, bufs)

    def restore(self, backend: Any, params: Any, optimizer: Any) -> None:
        """Write the copy back into `params` and `optimizer` (a buffer that
        did not exist at `take` is dropped again), then forget it.

        Raises:
            ValueError: no snapshot was taken.
        """
        state = self._state
        if state is None:
            raise ValueError("no snapshot to restore")
        step, bufs = state
        backend.copy(self._params, params)
        optimizer.step_count = step
        current = optimizer.buffers()
        for name, snap in bufs.items():
            if snap is None:
                optimizer.set_buffer(name, None)
            else:
                backend.copy(snap, current[name])
        backend.synchronize()
        self._state = None

    def discard(self) -> None:
        """Forget the copy (the update is committed; its buffers are kept for reuse)."""
        self._state = None


def worker_decider(error: BaseException) -> Directive:
    """How a trainer supervises the workers (replicas, shards, stages) it spawned.

    Args:
        error: what the worker raised.

    Returns:
        STOP for `Unrecoverable` (the device is gone), RESUME for
        `OutOfMemory` (the worker keeps its state), RESTART for anything
        else (the trainer then re-syncs the restarted worker, see `resync`).
    """
    if isinstance(error, Unrecoverable):
        return Directive.STOP
    if isinstance(error, OutOfMemory):
        return Directive.RESUME
    return Directive.RESTART


@dataclass
class ResyncOutcome:
    """What `resync` found.

    Attributes:
        gone: the workers that have stopped (`ActorStoppedError`).
        bad: the others that refused a re-sync message (their state is unknown).
    """

    gone: list[int] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every worker was re-synced."""
        return not self.gone and not self.bad


async def resync(
    refs: Sequence[ActorRef],
    indices: Sequence[int],
    messages: Callable[[int], Sequence[Any]],
    timeout: float | None,
) -> ResyncOutcome:
    """Send each worker `refs[i]`, `i` in `indices`, its re-sync messages, in order.

    The workers are re-synced at once; each one's messages are asked one
    after the other (a message is sent only when the one before it succeeded).
    A restarted worker takes these messages only after its restart (its
    mailbox survives the restart), so this may be called as soon as the
    failure is known.

    Args:
        refs: every worker.
        indices: the ones to re-sync.
        messages: `messages(i)` gives worker `i`'s messages (e.g. its
            connect message, then its state).
        timeout: each ask's timeout in seconds (None: the ask default).

    Returns:
        The `ResyncOutcome`.
    """
    outcome = ResyncOutcome()
    for step in range(max((len(messages(i)) for i in indices), default=0)):
        live = [i for i in indices if i not in outcome.gone and i not in outcome.bad]
        live = [i for i in live if step < len(messages(i))]
        if not live:
            break
        results = await ask_all_settled(
            [refs[i] for i in live], [messages(i)[step] for i in live], timeout
        )
        for i, result in zip(live, results, strict=True):
            if isinstance(result, ActorStoppedError):
                outcome.gone.append(i)
            elif isinstance(result, BaseException):
                outcome.bad.append(i)
    return outcome


def state_keeping_decider(error: BaseException) -> Directive:
    """How the tensor- and pipeline-parallel trainers supervise their workers.

    Args:
        error: what the worker raised.

    Returns:
        STOP for `Unrecoverable` (the device is gone), RESTART for
        `ContextPoisoned` (the device context, and the state in it, is gone:
        the worker needs a fresh one), RESUME for anything else: the worker
        keeps its instance and its state, which is still valid because its
        updates are atomic (a failed apply restores its `UpdateSnapshot`
        before raising; forward and backward never touch the weights).
    """
    if isinstance(error, Unrecoverable):
        return Directive.STOP
    if isinstance(error, ContextPoisoned):
        return Directive.RESTART
    return Directive.RESUME


class StateLossWatch:
    """A trainer's record of the workers that lost their state.

    Use `decide` as the trainer's supervision decider (it is
    `state_keeping_decider`, and records every RESTART). The runtime calls
    the decider before the worker's asker can see its exception, so after
    any failed ask `lost()` already knows whether a worker was restarted.

    Args:
        kind: "shard" or "stage" (for the error message).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._restarted: list[BaseException] = []
        self._cause: BaseException | None = None
        self._generation = 0

    def decide(self, error: BaseException) -> Directive:
        """`state_keeping_decider`, recording the errors that restart a worker."""
        directive = state_keeping_decider(error)
        if directive is Directive.RESTART:
            self._restarted.append(error)
            self._generation += 1
        return directive

    @property
    def generation(self) -> int:
        """Counts the restarts seen; compare before and after a reload."""
        return self._generation

    def lost(self) -> WorkerStateLost | None:
        """A fresh `WorkerStateLost` if a worker lost its state and no
        checkpoint was loaded since, else None."""
        if self._restarted:
            self._cause = self._restarted[0]
            self._restarted.clear()
        cause = self._cause
        if cause is None:
            return None
        # fanout tags the exception a trainer's ask raised with `worker_index`
        return WorkerStateLost(self.kind, getattr(cause, "worker_index", None), cause)

    def clear(self, generation: int) -> bool:
        """Forget the loss after a checkpoint was loaded into every worker,
        unless a worker restarted again since `generation` was read.

        Returns:
            True when the loss was forgotten.
        """
        if self._generation != generation:
            return False
        self._restarted.clear()
        self._cause = None
        return True
