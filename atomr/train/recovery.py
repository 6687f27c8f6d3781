"""How the trainers recover from a failure, shared by all of them.

Three pieces, one per moment of a failure:

- `UpdateSnapshot`: before an optimizer update, a device-side copy of the
  parameters and the optimizer's buffers and step count; a failed update is
  undone with `restore` (the parameter server, the tensor-parallel shard).
- `worker_decider`: how a coordinator supervises the workers it spawned
  (restart them, except when their device is gone or out of memory).
- `resync`: after a failed step, bring the workers that were restarted (and
  came back with their constructor state) back to the last committed state:
  a coordinator sends each of them its re-sync messages (re-connect, set
  state), taken from a healthy peer (data parallel) or from the host copy it
  kept of the last committed step (`CommittedStates`: tensor and pipeline
  parallel, whose workers each hold a different part of the model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atomr.accel import OutOfMemory, Unrecoverable
from atomr.actor import ActorRef, ActorStoppedError, Directive
from atomr.train.errors import InvalidBatchError, NonFiniteError
from atomr.train.fanout import ask_all, ask_all_settled

__all__ = [
    "CommittedStates",
    "ResyncOutcome",
    "UpdateSnapshot",
    "from_a_worker",
    "resync",
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


def from_a_worker(error: BaseException) -> bool:
    """True when `error` is a worker's failure that may have cost it its state.

    `fanout.raise_first_failure` tags a worker's exception with
    `worker_index`; bad input (`InvalidBatchError`, `NonFiniteError`) is
    refused before anything changes and needs no re-sync.
    """
    return getattr(error, "worker_index", None) is not None and not isinstance(
        error, InvalidBatchError | NonFiniteError
    )


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


class CommittedStates:
    """A coordinator's host copy of each worker's state after the last committed step.

    `record` it after every step that every worker applied (and after
    connecting or loading a checkpoint); after a failed step the workers
    are put back with it (the failed step changed nothing on the others,
    so they all agree again).
    """

    def __init__(self) -> None:
        self.states: list[Any] | None = None

    async def record(self, refs: Sequence[ActorRef], message: Any, timeout: float | None) -> None:
        """Ask every worker for its state (`message`, e.g. `GetStageState()`) and keep it.

        Raises:
            Exception: a worker's failure (the previous record is kept).
        """
        self.states = await ask_all(refs, message, timeout, per_worker=False)

    def forget(self) -> None:
        """Drop the copy (the workers' state is no longer known to be committed)."""
        self.states = None
