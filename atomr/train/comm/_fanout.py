"""Fan-out / collect helpers shared by every trainer.

A coordinator asks all of its workers at once and waits until every reply has
settled before it decides anything: no reply is left in flight when a step is
abandoned, so a failed step can never race a later one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from atomr.accel.device_actor import OnDevice
from atomr.actor.ref import DEFAULT_ASK_TIMEOUT, ActorRef


async def ask_all(
    refs: Sequence[ActorRef],
    messages: Sequence[Any] | Any,
    timeout: float | None = DEFAULT_ASK_TIMEOUT,
    *,
    per_worker: bool = True,
    first_index: int = 0,
) -> list[Any]:
    """Ask every worker and return their replies in order.

    Args:
        refs: the workers.
        messages: one message per worker when ``per_worker`` is true (the
            default), else a single message sent to all.
        timeout: each ask's timeout in seconds (``None``: wait forever).
        per_worker: whether ``messages`` holds one message per worker.
        first_index: the index of ``refs[0]`` among all the workers, when
            ``refs`` are the rest of them (a failure names its worker by it).

    Returns:
        The replies, in the order of ``refs``.

    Raises:
        ValueError: the number of messages differs from the number of workers.
        BaseException: the first failed worker's own exception (so the
            asker sees its type), raised only after every ask has settled;
            see ``raise_first_failure``.
    """
    results = await ask_all_settled(refs, messages, timeout, per_worker=per_worker)
    raise_first_failure(results, first_index)
    return results


def raise_first_failure(results: list[Any], first_index: int = 0) -> None:
    """Re-raise the first exception found in ``results``, if any
    (``first_failure``).

    Raises:
        BaseException: that exception.
    """
    error = first_failure(results, first_index)
    if error is not None:
        raise error


def first_failure(results: Sequence[Any], first_index: int = 0) -> BaseException | None:
    """The first exception found in ``results``, or None.

    The exception keeps its own type; ``worker_index`` is set on it (and on
    every other exception there: `name_failures`) and a note names the
    worker, so the asker knows which one failed (``results[0]`` being worker
    ``first_index``'s).
    """
    name_failures(results, first_index)
    for index, result in enumerate(results, start=first_index):
        if isinstance(result, BaseException):
            result.add_note(f"raised by worker {index}")
            return result
    return None


async def ask_all_settled(
    refs: Sequence[ActorRef],
    messages: Sequence[Any] | Any,
    timeout: float | None = DEFAULT_ASK_TIMEOUT,
    *,
    per_worker: bool = True,
) -> list[Any]:
    """Ask every worker and return every outcome, exceptions included.

    Like ``ask_all`` but never raises a worker's failure: a coordinator that
    must repair the failed workers (roll back, re-sync) before answering
    needs to know *all* of them, not only the first.

    Args:
        refs: the workers.
        messages: one message per worker when ``per_worker`` is true (the
            default), else a single message sent to all.
        timeout: each ask's timeout in seconds (``None``: wait forever).
        per_worker: whether ``messages`` holds one message per worker.

    Returns:
        One entry per worker, in the order of ``refs``: its reply, or the
        exception its ask raised.

    Raises:
        ValueError: the number of messages differs from the number of workers.
    """
    if per_worker:
        messages = list(messages)
        if len(messages) != len(refs):
            raise ValueError(f"{len(messages)} messages for {len(refs)} workers")
    else:
        messages = [messages] * len(refs)
    if len(refs) == 1:  # awaited here: no task around it, no turn of the loop before it is sent
        try:
            return [await refs[0].ask(messages[0], timeout)]
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # this caller is cancelled
                raise
            return [exc]  # the reply was cancelled (its actor's loop ended), as `gather` returns it
        except Exception as exc:
            return [exc]
    asks = []
    for ref, message in zip(refs, messages, strict=True):
        asks.append(ref.ask(message, timeout))
    return list(await asyncio.gather(*asks, return_exceptions=True))


def name_failures(results: Sequence[Any], first_index: int = 0) -> None:
    """Set `worker_index` on every exception in settled replies (`results[0]`
    being worker `first_index`'s): a supervisor that recorded one of them (a
    `StateLossWatch` naming a restarted worker) learns whose it is, also
    where it is not the failure raised, or where a retry or an undo's
    round replaced or ignored it.
    """
    for index, result in enumerate(results, start=first_index):
        if isinstance(result, BaseException):
            result.worker_index = index  # type: ignore[attr-defined]


def failed_indices(results: Sequence[Any]) -> list[int]:
    """The positions of the exceptions in a list of settled replies.

    Args:
        results: from ``ask_all_settled``.

    Returns:
        The indices whose entry is an exception, in order.
    """
    failed = []
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            failed.append(i)
    return failed


def _nothing() -> None:
    """A device job that does nothing: answered once the jobs queued before it are done."""


async def fence(refs: Sequence[ActorRef], timeout: float | None) -> list[int]:
    """Wait until every device worker in `refs` is done with the work it was
    given before this call (a request whose ask timed out may still be
    running there): each is asked to run a job that does nothing, which its
    device thread reaches only after the jobs before it.

    Args:
        refs: `DeviceActor`s that answer `OnDevice`.
        timeout: how long each may take (`None`: wait forever).

    Returns:
        The positions of the workers that did not answer in time (still busy,
        or stopped); empty when every one is done.
    """
    return failed_indices(
        await ask_all_settled(refs, OnDevice(_nothing), timeout, per_worker=False)
    )


async def ask_all_or_abort(
    refs: Sequence[ActorRef],
    messages: Sequence[Any],
    on_failure: Callable[[], Awaitable[Any]],
    timeout: float | None = DEFAULT_ASK_TIMEOUT,
) -> list[Any]:
    """Ask every worker; at the first failure, let the others give up.

    For workers that wait on each other (pipeline stages): when one fails,
    the others would wait for its messages forever, so ``on_failure()`` is
    awaited at once (e.g. ask every worker to abort), then every ask is
    left to settle before the failure is raised.

    Args:
        refs: the workers.
        messages: one message per worker.
        on_failure: coroutine function run once, after the first failure.
        timeout: each ask's timeout in seconds (``None``: wait forever).

    Returns:
        The replies, in the order of ``refs``, when none failed.

    Raises:
        ValueError: the number of messages differs from the number of workers.
        BaseException: the earliest failure (lowest index among those that
            failed first), with its own type, after every ask has settled.
    """
    results, first = await _settle_or_abort(refs, messages, on_failure, timeout)
    if first is not None:
        raise_first_failure([r if i == first else None for i, r in enumerate(results)])
    return results


async def ask_all_settled_or_abort(
    refs: Sequence[ActorRef],
    messages: Sequence[Any],
    on_failure: Callable[[], Awaitable[Any]],
    timeout: float | None = DEFAULT_ASK_TIMEOUT,
) -> list[Any]:
    """`ask_all_settled`, but `on_failure()` is awaited as soon as one ask
    fails: for workers that meet each other mid-request (tensor-parallel
    shards), which wait for one that failed before it came.

    Args:
        refs: the workers.
        messages: one message per worker.
        on_failure: coroutine function run once, at the first failure.
        timeout: each ask's timeout in seconds (``None``: wait forever).

    Returns:
        One entry per worker, in the order of ``refs``: its reply, or the
        exception its ask raised.

    Raises:
        ValueError: the number of messages differs from the number of workers.
    """
    results, _ = await _settle_or_abort(refs, messages, on_failure, timeout)
    return results


async def _settle_or_abort(
    refs: Sequence[ActorRef],
    messages: Sequence[Any],
    on_failure: Callable[[], Awaitable[Any]],
    timeout: float | None,
) -> tuple[list[Any], int | None]:
    """Ask every worker, awaiting `on_failure()` at the first failure; every
    outcome once all settled, and the index of the one that failed first
    (lowest among those that failed at once; None when none failed).

    Raises:
        ValueError: the number of messages differs from the number of workers.
    """
    messages = list(messages)
    if len(messages) != len(refs):
        raise ValueError(f"{len(messages)} messages for {len(refs)} workers")
    tasks = [
        asyncio.ensure_future(ref.ask(message, timeout))
        for ref, message in zip(refs, messages, strict=True)
    ]
    try:
        pending: set[asyncio.Future[Any]] = set(tasks)
        first: int | None = None
        while pending and first is None:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [i for i, t in enumerate(tasks) if t.done() and t.exception() is not None]
            first = failed[0] if failed else None
        if first is not None:
            await on_failure()
        return list(await asyncio.gather(*tasks, return_exceptions=True)), first
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


async def set_learning_rate(
    optimizer: Any,
    dtype: Any,
    refs: Sequence[ActorRef],
    message: Any,
    timeout: float | None,
    repair: Callable[[list[Any]], Awaitable[Any]] | None = None,
) -> None:
    """A trainer's `SetLearningRate`, all or none: check the rate against its
    `OptimizerKind`, in the model's dtype, first (a bad one changes nothing
    anywhere), then set it on
    every worker (each answers the rate it replaces). If one fails, every
    worker is given the old rate back (a failed one too: it may have taken
    the new rate before failing, or take it late if its ask timed out).

    Args:
        optimizer: the trainer's `OptimizerKind` (checks the rate).
        dtype: the model's dtype (`OptimizerKind.check_dtype`).
        refs: the workers.
        message: the `SetLearningRate`.
        timeout: each ask's timeout in seconds (None: wait forever).
        repair: after a failure, awaited with every worker's outcome once the
            old rate is back (a trainer that restarts a crashed worker
            re-syncs it from a healthy one here), before the error is raised.

    Raises:
        ValueError, TypeError: a bad rate, or one out of range in `dtype`.
        BaseException: the first failing worker's own exception
            (`worker_index` set, a note saying whether every worker is back
            at the old rate or what to do if not), raised after the undo settled.
    """
    optimizer.with_lr(message.lr).check_dtype(dtype)
    results = await ask_all_settled(refs, message, timeout, per_worker=False)
    failed = failed_indices(results)
    if not failed:
        return
    name_failures(results)
    error: BaseException = results[failed[0]]
    note = await _give_back_rate(refs, results, type(message), timeout)
    error.add_note(f"worker {failed[0]} failed to take the learning rate {message.lr:g}; {note}")
    if repair is not None:
        await repair(results)
    raise error


async def _give_back_rate(
    refs: Sequence[ActorRef], results: list[Any], message_type: type, timeout: float | None
) -> str:
    """Give the old rate back to every worker (a failed one too: it may
    have taken the new rate before it failed, or take it late if its ask
    timed out): its own old rate where it answered one, else the first old
    rate known. Returns the note saying how that went."""
    olds = {i: float(r) for i, r in enumerate(results) if _is_rate(r)}
    if not olds:
        return _inconsistent(list(range(len(refs))), "no worker answered its old rate")
    known = next(iter(olds.values()))
    messages = [message_type(olds.get(i, known)) for i in range(len(refs))]
    unrestored = failed_indices(await ask_all_settled(refs, messages, timeout))
    if unrestored:
        return _inconsistent(unrestored, "giving the old rate back failed")
    return f"every worker was given back the learning rate {known:g}"


def _is_rate(reply: Any) -> bool:
    return isinstance(reply, int | float) and not isinstance(reply, bool)


def _inconsistent(workers: list[int], why: str) -> str:
    return (
        f"{why}: workers {workers} may hold another learning rate than the rest, the "
        "rate is inconsistent: send SetLearningRate again (or load a checkpoint)"
    )


async def load_all_or_none(
    refs: Sequence[ActorRef],
    messages: Sequence[Any],
    restore: Sequence[Any] | None,
    timeout: float | None,
    kind: str,
) -> None:
    """Give every worker its part of a checkpoint, all or none (the tensor-
    and pipeline-parallel and the parameter server's `LoadCheckpoint`): if
    one fails, every worker is asked its `restore` message, its state from
    before the load.

    Args:
        refs: the workers.
        messages: one loading message per worker.
        restore: one message per worker giving back its old state, or None
            when that state is lost anyway (a restarted worker).
        timeout: each ask's timeout in seconds (None: wait forever). A
            worker whose load timed out may still load later: its restore
            waits in its mailbox behind that load.
        kind: "shard", "stage" or "server shard", for the note.

    Raises:
        ValueError: a number of messages that differs from the number of workers.
        BaseException: the first failing worker's own exception (`worker_index`
            set, a note saying whether every worker got its old state back),
            raised after the restore settled.
    """
    results = await ask_all_settled(refs, messages, timeout)
    failed = failed_indices(results)
    if not failed:
        return
    name_failures(results)
    index = failed[0]
    error: BaseException = results[index]
    note = f"{kind} {index} failed to load the checkpoint"
    if restore is not None:
        unrestored = failed_indices(await ask_all_settled(refs, restore, timeout))
        if unrestored:
            note += (
                f", and giving the {kind}s back their old state failed on {kind}s "
                f"{unrestored}: the model is inconsistent, load a checkpoint"
            )
        else:
            note += f"; every {kind} was given back its state from before the load"
    error.add_note(note)
    raise error
