"""How the trainers recover from a failure, shared by all of them.

- `DoubleBuffer`: optimizer updates written out of place into a second set
  of buffers, then swapped in; `rollback` swaps the old set back, and a
  failed update changes nothing, with no copy either way (every trainer,
  and every worker that updates weights).
- `worker_decider` and `resync` (data parallel): a failed replica is
  restarted and re-synced from a healthy one (every replica holds the
  whole model).
- `state_keeping_decider` and `StateLossWatch` (tensor and pipeline
  parallel, sharded, the parameter server's shards: workers that each hold
  a different part of the model or of its optimizer state, so no peer can
  restore one): a worker is resumed after an ordinary exception
  (its updates are atomic, so its state is still valid and nothing needs
  re-syncing); only a poisoned device context costs a worker its state,
  and then the trainer refuses every request with `WorkerStateLost` until
  a checkpoint is loaded. No host copy of the state is kept.
- `ResumedCrashWatch` (data parallel's ring, the pipeline's pass): a worker
  resumed after raising on a *told* message lost that message, so an
  exchange waiting for its answer would wait for its timeout; the watch
  turns the supervisor's resume into a future the exchange can wait on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atomr.accel import ContextPoisoned, OutOfMemory, Unrecoverable
from atomr.actor import ActorRef, ActorStoppedError, Directive, Failure
from atomr.train.comm._fanout import ask_all_settled
from atomr.train.core.errors import WorkerStateLost
from atomr.train.core.messages import LoadCheckpoint

__all__ = [
    "DoubleBuffer",
    "ResumedCrashWatch",
    "ResyncOutcome",
    "StateLossWatch",
    "resync",
    "state_keeping_decider",
    "worker_decider",
]


class DoubleBuffer:
    """Atomic optimizer updates without a copy: two sets of buffers (the
    parameters and the optimizer's state), one current, one spare.

    `apply` runs the optimizer out of place (`Optimizer.step_into_unchecked`) from the
    current set into the spare one (the same memory traffic as an in-place
    step), synchronizes, then swaps: the new set becomes current (the owner's
    parameter attribute and the optimizer's buffers and step count point at
    it) and the old one is kept, untouched, until `commit` (it becomes the
    spare) or `rollback` (it becomes current again). A failure inside
    `apply` happens before the swap, so it changes nothing. Nothing is ever
    copied; views into the parameters must be taken afresh after a swap
    (`Mlp.weights` / `Mlp.bias` are).

    The spare buffers are allocated on the first `apply` and reused. Call
    every method on the device's worker thread.
    """

    def __init__(self) -> None:
        self._spare_params: Any = None
        self._spare: dict[str, Any] = {}
        # (owner, attribute, optimizer, old params, old buffers, old step count)
        self._old: tuple[Any, str, Any, Any, dict[str, Any], int] | None = None

    @property
    def pending(self) -> bool:
        """True between `apply` and `commit` / `rollback`."""
        return self._old is not None

    @property
    def previous(self) -> Any:
        """The parameters the pending step replaced (None when none is pending)."""
        return None if self._old is None else self._old[3]

    @property
    def nbytes(self) -> int:
        """Bytes of the second set (the spare, or the old set while pending)."""
        if self._old is not None:
            bufs = [self._old[3], *self._old[4].values()]
        else:
            bufs = [self._spare_params, *self._spare.values()]
        return sum(int(b.nbytes) for b in bufs if b is not None)

    def apply(
        self, backend: Any, owner: Any, attr: str, optimizer: Any, grads: Any, keep: bool = False
    ) -> None:
        """One optimizer step of `getattr(owner, attr)` by `grads`, kept pending (a
        pending step is committed first), or with `keep` kept at once (as `commit`).

        Args:
            backend: the device's backend.
            owner: holds the flat parameter vector as attribute `attr` (an
                `Mlp` and "params", a shard and "params", a server and "weights").
            attr: that attribute's name.
            optimizer: the parameters' `Optimizer`.
            grads: the flat gradient vector: `(n,)`, C-contiguous, in the
                optimizer's dtype on `backend`, as the parameters. Not checked
                here (`Optimizer.step_into_unchecked`): it is the worker's own
                buffer, or was checked where it came in.

        Raises:
            Whatever the step raises; then nothing has changed.
        """
        self.commit()
        params = getattr(owner, attr)
        out = self._spare_params
        if out is None or tuple(out.shape) != tuple(params.shape) or out.dtype != params.dtype:
            out = backend.empty(tuple(params.shape), dtype=params.dtype)
        self._spare_params = out  # kept for reuse should the step fail
        new = optimizer.step_into_unchecked(params, grads, out, self._spare)
        backend.synchronize()
        step, bufs = optimizer.step_count, optimizer.buffers()  # `new` is what adopt makes current
        self._old = None if keep else (owner, attr, optimizer, params, bufs, step)
        self._spare_params, self._spare = (params, _others(bufs, new)) if keep else (None, {})
        setattr(owner, attr, out)
        optimizer.adopt(new, step + 1)

    def commit(self) -> None:
        """Keep the pending step (if any): the old set becomes the spare."""
        old = self._old
        if old is None:
            return
        self._old = None
        _owner, _attr, optimizer, params, bufs, _step = old
        self._spare_params = params
        # a buffer the step did not replace (SGD without momentum) is still current
        self._spare = _others(bufs, optimizer.buffers())

    def rollback(self) -> None:
        """Undo the pending step: the old set becomes current again (the new
        one becomes the spare).

        Raises:
            ValueError: no step is pending.
        """
        old = self._old
        if old is None:
            raise ValueError("no pending update to roll back")
        self._old = None
        owner, attr, optimizer, params, bufs, step = old
        new_params, new_bufs = getattr(owner, attr), optimizer.buffers()
        setattr(owner, attr, params)
        optimizer.adopt(bufs, step)
        self._spare_params = new_params
        self._spare = _others(new_bufs, bufs)


def _others(buffers: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The buffers (by name) that exist and are none of `current`'s (by identity)."""
    found = {}
    for name, b in buffers.items():
        if b is not None:
            for c in current.values():
                if c is b:
                    break
            else:
                found[name] = b
    return found


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
        timeout: each ask's timeout in seconds (None: wait forever).

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
        updates are atomic (a failed apply changes nothing, see `DoubleBuffer`;
        forward and backward never touch the weights).
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
        kind: "shard", "stage", "replica" or "server shard" (for the error message).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._restarted: list[tuple[BaseException, int | None]] = []
        self._cause: tuple[BaseException, int | None] | None = None
        self._generation = 0

    def decide(self, error: BaseException, worker: int | None = None) -> Directive:
        """`state_keeping_decider`, recording the errors that restart a worker.

        Args:
            error: what the worker raised.
            worker: its index, when the supervisor knows it (None: the
                `worker_index` the trainer's fanout tags the error with).
        """
        directive = state_keeping_decider(error)
        if directive is Directive.RESTART:
            self._restarted.append((error, worker))
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
        if self._cause is None:
            return None
        cause, worker = self._cause
        if worker is None:  # fanout tags the exception a trainer's ask raised
            worker = getattr(cause, "worker_index", None)
        return WorkerStateLost(self.kind, worker, cause)

    async def serve(
        self,
        message: Any,
        handle: Callable[[Any], Awaitable[Any]],
        reload: Callable[[LoadCheckpoint], Awaitable[Any]],
    ) -> Any:
        """Answer a trainer's `message` with `handle(message)`, guarded by this watch.

        While a worker's state is lost, every message but `LoadCheckpoint` is
        answered with `WorkerStateLost`, and `LoadCheckpoint` goes to `reload`.
        An exception from `handle` or `reload` is answered with `Failure`:
        the exception itself when no worker restarted meanwhile (a worker that
        raised was resumed with its state intact), else `WorkerStateLost`. So
        is a request that succeeded although a worker restarted meanwhile (a
        parameter server's worker, sent its part again, trained it on a
        restarted server shard): its answer may come from the lost state.

        Returns:
            What `handle` / `reload` returned, or a `Failure`.
        """
        lost = self.lost()
        if lost is not None and not isinstance(message, LoadCheckpoint):
            return Failure(lost)
        generation = self._generation
        try:
            result = await (reload(message) if lost is not None else handle(message))
        except Exception as exc:
            if self._generation == generation:
                return Failure(exc)
            return Failure(self._lost_during(exc))
        if self._generation != generation:
            return Failure(self._lost_during(None))
        return result

    def _lost_during(self, error: Exception | None) -> WorkerStateLost:
        """The `WorkerStateLost` of a request during which a worker restarted,
        noting the request's own `error` (if any, and not the cause)."""
        lost = self.lost()
        assert lost is not None
        if error is not None and lost.__cause__ is not error:
            lost.add_note(f"the request failed with {type(error).__name__}: {error}")
        return lost

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


class ResumedCrashWatch:
    """Records a worker resumed (after raising) while an exchange runs.

    Such a worker may have raised on a told message (a ring chunk, a
    pipeline activation), which is then lost: the exchange would wait for an
    answer that never comes. Wrap the trainer's decider with `note`, and wait
    on the future `begin` returns alongside the exchange.
    """

    def __init__(self) -> None:
        self._crashed: asyncio.Future[BaseException] | None = None

    def begin(self) -> asyncio.Future[BaseException]:
        """Start watching; the future gets the first resumed worker's error."""
        self._crashed = asyncio.get_running_loop().create_future()
        return self._crashed

    def end(self) -> None:
        """Stop watching (the exchange is over)."""
        self._crashed = None

    def note(self, directive: Directive, error: BaseException) -> Directive:
        """Pass `directive` through; a resume while watching resolves the future."""
        crashed = self._crashed
        if directive is Directive.RESUME and crashed is not None and not crashed.done():
            crashed.set_result(error)
        return directive
