"""`ShardedClient`: pull and push a flat vector split across K servers by ranges.

Like MXNet's KVStore / ps-lite, the weight vector is cut into K contiguous
ranges, one per server actor; a client pulls every range and pushes every
range, so no single server carries all the traffic.

A sharded push must never be applied by some shards and refused by others.
The whole gradient is checked (length, finiteness in the servers' dtype:
`validation.cast_finite`) before anything is sent, and sent in that dtype;
then, in the asynchronous models, the first shard decides staleness and the
others apply what it accepted, counting the staleness it decided (a
follower's range may have seen up to workers - 1 other pushes interleaved
differently; the order of concurrent pushes is not global, as in ps-lite).
Every shard holds the push it applied (`PushGradient.hold`, `_hold.py`):
nothing else lands on it until this client, with every shard's answer,
confirms it (`ConfirmPush`, told to every shard) or rolls it back. A
follower that fails on its range (its device, its optimizer) has changed
nothing, but the shards before it applied theirs: the push is then rolled
back on every shard (`RollbackRound` naming the worker, `_round.roll_back`,
as the trainer rolls a synchronous round back) and `push` raises
`RoundFailedError`: with several workers too, every shard is as if the
push had never been sent. A client that gives a push up before every
shard answered (its first ask timed out, or it was cancelled: its worker
stopped) tells every shard to roll it back as it goes (`_give_up`), so
that no shard holds it for a client that is gone: the shards agree on
rolled back. A push across several shards is held for twice the ask
timeout at most, then rolled back by the shard itself (a client that could
run no code to give it up); a push to one shard is neither held nor
confirmed. The confirm is a tell: told to a live shard it arrives, after
the push (one mailbox, in order); a shard stopped or restarted meanwhile
lost its state and refuses to serve anyway (`WorkerStateLost`).
In synchronous mode every shard holds the push until its round is complete,
so all shards apply the same rounds; an abort (`abort`, for a batch without
a usable gradient) goes to every shard, so every shard drops the same round.
A round that failed on one shard is rolled back on the others by the trainer
(`RollbackRound`); weights pulled from shards at different versions (a
round applied on some only) are refused in synchronous mode (`check_versions`).
Every push and abort names its part's round (`round_id`), so that a shard
takes it once however often it is sent; a push across several shards must
(`check_round`): one that failed on a shard is rolled back on the others by
its round id, and without one it could not be.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.actor import ActorRef, AskTimeoutError
from atomr.actor.errors import bounded_repr
from atomr.train.comm._fanout import ask_all, ask_all_settled, failed_indices, name_failures
from atomr.train.core.errors import NonFiniteError
from atomr.train.core.model.inputs import model_dtype
from atomr.train.core.partition import split_bounds
from atomr.train.core.validation import cast_finite
from atomr.train.parameter_server._push_checks import check_round_id
from atomr.train.parameter_server._round import RoundFailedError, roll_back
from atomr.train.parameter_server.messages import (
    AbortPush,
    ConfirmPush,
    PullWeights,
    PushedWeights,
    PushGradient,
    RollbackRound,
)

__all__ = ["ShardedClient", "split_ranges"]


def split_ranges(n: int, k: int) -> list[tuple[int, int]]:
    """Cut `range(n)` into `k` contiguous near-equal ranges `(start, stop)`,
    one per server, none empty (`split_bounds`).

    Raises:
        ValueError: `k < 1` or `k > n`.
    """
    if k < 1 or k > n:
        raise ValueError(f"cannot split {n} values into {k} ranges (need 1 <= k <= n)")
    return split_bounds(n, k)


class ShardedClient:
    """Pulls and pushes a flat vector held by one server per range.

    Args:
        servers: one server `ActorRef` per range.
        ranges: `(start, stop)` per server, contiguous from 0.
        synchronous: the servers run the synchronous model (pushes go to
            every shard at once).
        timeout: ask timeout in seconds (None: wait forever); pulls and
            synchronous pushes wait for other workers.
        dtype: the servers' dtype (the model's), float32 or float64: a
            gradient is checked finite in it, and sent in it.

    Raises:
        ValueError: ranges and servers differ in number or do not tile
            `[0, n)`, or a dtype other than float32 or float64.
    """

    def __init__(
        self,
        servers: Sequence[ActorRef],
        ranges: Sequence[tuple[int, int]],
        synchronous: bool = False,
        timeout: float | None = 300.0,
        dtype: Any = np.float32,
    ) -> None:
        if len(servers) != len(ranges) or not servers:
            raise ValueError(f"{len(servers)} servers for {len(ranges)} ranges")
        start = 0
        for lo, hi in ranges:
            if lo != start or hi <= lo:
                raise ValueError(f"ranges must tile [0, n) contiguously, got {list(ranges)}")
            start = hi
        self.servers = list(servers)
        self.ranges = [(int(lo), int(hi)) for lo, hi in ranges]
        self.n = start
        self.synchronous = synchronous
        self.timeout = timeout
        self.dtype = model_dtype(dtype)

    async def pull(self, worker: int) -> tuple[np.ndarray, list[int]]:
        """Pull every range.

        Returns:
            `(weights, versions)`: the full vector (in the servers' dtype) and
            each server's version.

        Raises:
            Exception: a server's failure (after every pull settled).
        """
        replies = await ask_all(self.servers, PullWeights(worker), self.timeout, per_worker=False)
        if len(replies) == 1:
            weights, version = replies[0]
            return np.asarray(weights), [int(version)]
        weights = np.concatenate([np.asarray(w) for w, _ in replies])
        return weights, [int(v) for _, v in replies]

    def check_versions(self, versions: Sequence[int]) -> None:
        """Synchronous mode: refuse to compute from the shards' weights at
        `versions` (from `pull`) unless they are one version.

        Raises:
            RoundFailedError: they differ (a round was applied on some shards only).
        """
        if self.synchronous and len(set(versions)) > 1:
            raise RoundFailedError(
                f"the server shards are at versions {list(versions)}: a synchronous round "
                "was applied on some of them only; no gradient is computed from them"
            )

    def check_round(self, round_id: object) -> int | None:
        """The round a push of this client names, checked: an int >= 0, or
        None for a client of one server shard only. A push across several
        shards that fails on one is rolled back on the others by its round
        id (`RollbackRound`): without one it would stay half-applied.

        Raises:
            ValueError: not an int >= 0 (a bool is none), or None with
                several server shards.
        """
        checked = check_round_id(round_id)
        if checked is None and len(self.servers) > 1:
            raise ValueError(
                f"a push across {len(self.servers)} server shards needs a round_id (an int "
                ">= 0, e.g. TrainBatch.round_id): one that failed on a shard is rolled back "
                "on the others by it"
            )
        return checked

    async def push(
        self,
        worker: int,
        versions: Sequence[int],
        gradient: np.ndarray,
        weight: float = 1.0,
        round_id: int | None = None,
    ) -> list[int]:
        """Push a full gradient, range by range.

        Args:
            worker: the worker's id.
            versions: the versions returned by `pull`, one per server.
            gradient: the full gradient vector.
            weight: the batch's loss normaliser (see `PushGradient`).
            round_id: the part's round (`TrainBatch.round_id`) as
                `check_round` returned it (the worker checks it before it
                pulls): None only with one server shard.

        Returns:
            Each server's new version.

        Raises:
            ValueError: wrong gradient length or number of versions
                (nothing was sent).
            TypeError: the gradient is not of a float dtype (nothing was sent).
            NonFiniteError: the gradient is not finite in the servers' dtype:
                NaN, Inf, or values too large for it (nothing was sent).
            StaleGradientError: the first shard refused it (nothing applied).
            RoundFailedError: synchronous mode: a shard's update of the round
                failed (the trainer rolls it back on the others); the
                asynchronous models: a follower shard failed on its range (its
                error the `__cause__`) and the push was rolled back on every
                shard that applied it (the notes say so, or name a shard that
                could not undo it).
            AskTimeoutError: the first shard did not answer in time; the
                push is rolled back on every shard (`_give_up`), as it is
                when the client is cancelled before every shard answered.
            Exception: a server's failure.
        """
        pushed = await self._push(worker, versions, gradient, weight, False, round_id)
        return [int(r) for r in pushed]

    async def push_and_pull(
        self,
        worker: int,
        versions: Sequence[int],
        gradient: np.ndarray,
        weight: float = 1.0,
        round_id: int | None = None,
    ) -> tuple[np.ndarray, list[int]]:
        """`push`, each server answering with the weights the push left
        (`PushGradient.return_weights`): what a `pull` right after would give
        in synchronous mode, without asking for it.

        Returns:
            `(weights, versions)`, as `pull` returns them.

        Raises:
            As `push`.
        """
        replies: list[PushedWeights] = await self._push(
            worker, versions, gradient, weight, True, round_id
        )
        if len(replies) == 1:
            return replies[0].weights, [int(replies[0].version)]
        weights = np.concatenate([r.weights for r in replies])
        return weights, [int(r.version) for r in replies]

    async def _push(
        self,
        worker: int,
        versions: Sequence[int],
        gradient: np.ndarray,
        weight: float,
        return_weights: bool,
        round_id: int | None,
    ) -> list[Any]:
        grad = np.asarray(gradient)
        if grad.dtype.kind != "f":
            raise TypeError(f"gradient must be a float numpy array, got dtype {grad.dtype}")
        if grad.ndim != 1 or grad.shape[0] != self.n:
            raise ValueError(f"gradient has shape {grad.shape}, the servers hold {self.n} weights")
        if len(versions) != len(self.servers):
            raise ValueError(f"{len(versions)} versions for {len(self.servers)} servers")
        grad = cast_finite(grad, self.dtype, "gradients", NonFiniteError)  # as a server would
        if self.synchronous or round_id is None or len(self.servers) == 1:  # None: one shard
            msgs = self._messages(worker, versions, grad, weight, return_weights, round_id, None)
            return list(await ask_all(self.servers, msgs, self.timeout))
        hold = None if weight <= 0.0 else (math.inf if self.timeout is None else 2.0 * self.timeout)
        parts = functools.partial(
            self._messages, worker, versions, grad, weight, return_weights, round_id, hold
        )
        try:
            first = await self.servers[0].ask(parts(0, 1)[0], timeout=self.timeout)
        except (AskTimeoutError, asyncio.CancelledError):  # it may apply it yet: given up
            self._give_up(worker, round_id)
            raise
        version = first.version if return_weights else int(first)
        staleness = version - 1 - int(versions[0]) if weight > 0.0 else 0
        rest = parts(1, len(self.servers), staleness)
        if weight <= 0.0:  # a clock tick: nothing applied anywhere, nothing to undo
            return [first, *await ask_all(self.servers[1:], rest, self.timeout, first_index=1)]
        return await self._push_held(worker, round_id, first, rest)

    async def _push_held(
        self, worker: int, round_id: int, first: Any, rest: list[PushGradient]
    ) -> list[Any]:
        """The first shard applied the push and holds it (its reply `first`):
        push `rest` to the others, then confirm it on every shard, or roll
        it back on every shard if one failed (`_undo`), or was left without
        an answer (`_give_up`: the client cancelled).

        Returns:
            Every shard's reply.

        Raises:
            RoundFailedError: a follower failed on its range (`_undo`).
        """
        try:  # the holds end on every way out: confirmed, undone or given up
            replies = [first, *await ask_all_settled(self.servers[1:], rest, self.timeout)]
            failure = None
            if failed_indices(replies):  # a follower failed on its range: undone everywhere
                failure = await self._undo(worker, round_id, replies)
        except BaseException:
            self._give_up(worker, round_id)
            raise
        if failure is not None:
            raise failure
        for server in self.servers:  # kept by every shard: their holds end
            server.tell(ConfirmPush(worker, round_id))
        return replies

    def _give_up(self, worker: int, round_id: int) -> None:
        """The push of `worker`'s `round_id` was given up before every shard
        answered it: its first ask timed out (the shard may apply it yet),
        or the client was cancelled (its worker, or the trainer, stopped)
        while a shard may hold it. Tell every shard to roll it back
        (`RollbackRound`), so that none holds it until its deadline: one
        holding it undoes it and goes on at once, one it has not reached yet
        takes its round and never applies it. A tell, since a cancelled
        client can await nothing; each shard's mailbox keeps it behind the
        push. Every shard ends without the push: rolled back."""
        message = RollbackRound((round_id,), worker)
        for server in self.servers:
            with contextlib.suppress(Exception):  # a shard gone has nothing to undo
                server.tell(message)

    def _messages(
        self,
        worker: int,
        versions: Sequence[int],
        grad: np.ndarray,
        weight: float,
        return_weights: bool,
        round_id: int | None,
        hold: float | None,
        start: int = 0,
        stop: int | None = None,
        staleness: int | None = None,
    ) -> list[PushGradient]:
        """One `PushGradient` per server from `start` to `stop` (default:
        all), of its range of `grad`, with `staleness` arbitrated (if given)."""
        return [
            PushGradient(
                worker,
                int(versions[k]),
                grad[lo:hi],
                weight,
                staleness,
                return_weights,
                round_id,
                hold,
            )
            for k, (lo, hi) in enumerate(self.ranges[start:stop], start)
        ]

    async def _undo(self, worker: int, round_id: int, replies: list[Any]) -> RoundFailedError:
        """Shard 0 applied the asynchronous push but a follower failed on its
        range (`replies`, settled, in shard order): roll it back on every shard.

        Returns:
            The `RoundFailedError` for `push` to raise, caused by the first
            follower's failure, noting what was undone (`roll_back`).
        """
        name_failures(replies)
        index = failed_indices(replies)[0]
        cause = replies[index]
        error = RoundFailedError(
            f"server shard {index} failed on its range of worker {worker}'s push "
            f"({bounded_repr(cause)}), which the shards before it had applied"
        )
        error.__cause__ = cause
        await roll_back(
            self.servers, RollbackRound((round_id,), worker), self.timeout, error, "push"
        )
        return error

    async def abort(
        self, worker: int, versions: Sequence[int], reason: str, round_id: int | None = None
    ) -> list[int]:
        """Tell every server that this worker has no gradient for its batch
        (`AbortPush`): a synchronous round is dropped on every shard, otherwise
        the worker's clock ticks and nothing is applied.

        Args:
            worker: the worker's id.
            versions: the versions returned by `pull`, one per server.
            reason: why there is no gradient (it ends up in the round's error).
            round_id: the part's round (`TrainBatch.round_id`), or None.

        Returns:
            Each server's version (asynchronous and bounded models).

        Raises:
            ValueError: wrong number of versions (nothing was sent).
            NonFiniteError: synchronous mode: the round was dropped (always).
            Exception: a server's failure (after every shard answered).
        """
        if len(versions) != len(self.servers):
            raise ValueError(f"{len(versions)} versions for {len(self.servers)} servers")
        msgs = [AbortPush(worker, int(v), reason, round_id) for v in versions]
        return [int(v) for v in await ask_all(self.servers, msgs, self.timeout)]
