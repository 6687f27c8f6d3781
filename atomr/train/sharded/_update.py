"""Phase 2 of a sharded step (`ShardedUpdate`): the replicas' update of
their pieces, kept by every replica of every process or by none.

Every replica updates its piece out of place (`ApplyShard`); once the
processes of a job agree that none failed (`agree_on_failure`), every
replica commits (`CommitShard`), or else every replica of every process
rolls back (`RollbackShard`). Stages 1 and 2 then all-gather the new
parameters into every replica's working copy. Once agreed, the update is
kept: a commit that a replica does not confirm (or an all-gather or
hand-back that fails) is remembered, and completed before the trainer
serves its next request (`ShardedUpdate.complete`), but for a
`LoadCheckpoint`: loading gives every replica the checkpoint's state
instead, so it is the way out of a commit that is never confirmed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train.comm._fanout import (
    ask_all,
    ask_all_settled,
    failed_indices,
    first_failure,
    name_failures,
)
from atomr.train.comm.agreement import agree_on_failure
from atomr.train.core.errors import OtherProcessFailed
from atomr.train.sharded._exchange import ShardExchange
from atomr.train.sharded.messages import ApplyShard, CommitShard, RollbackShard, SetFullParams

__all__ = ["ShardedUpdate"]


class ShardedUpdate:
    """Phase 2 over a trainer's replicas (module docstring).

    Args:
        stage: the ZeRO stage.
        exchange: the collectives over the layout.
        refs: the local replicas, in order.
        timeout: each replica reply's deadline (None: forever).
    """

    def __init__(
        self, stage: int, exchange: ShardExchange, refs: list[ActorRef], timeout: float | None
    ) -> None:
        self.stage = stage
        self.exchange = exchange
        self.refs = refs
        self.timeout = timeout
        self._token = 0
        self._uncommitted: int | None = None  # an agreed update not committed everywhere yet
        self._unsent: list[tuple[ActorRef, np.ndarray]] = []  # working copies to hand back
        self._load_failed: Exception | None = None  # a load out of an unconfirmed commit

    async def apply(
        self, reduced_for: list[np.ndarray | None], scale: float, coefficient: float
    ) -> None:
        """Every replica of every process updates its piece and
        keeps it, or none does: the processes agree before any commits.

        Raises:
            Exception: the first failing local replica's own error, or, where
                only another process's replicas failed, an OtherProcessFailed saying
                so (every replica rolled back), or the process collective's error.
            Exception: after the agreement, as `_complete` (a note says the
                step was applied and is completed before the next request).
        """
        self._token += 1
        token = self._token
        msgs = [ApplyShard(r, scale, coefficient, token) for r in reduced_for]
        results = await ask_all_settled(self.refs, msgs, self.timeout)
        try:
            await agree_on_failure(
                self.exchange.processes, first_failure(results), "apply", others=_rolled_back
            )
        except BaseException:
            # every replica: one that timed out may still apply (its rollback waits
            # behind it), one that raised after applying was resumed with it pending
            undone = await ask_all_settled(
                self.refs, RollbackShard(token), self.timeout, per_worker=False
            )
            name_failures(undone)  # one restarted here is named by the WorkerStateLost
            raise
        self._uncommitted = token
        await self._complete(_APPLIED)

    async def complete(self, request: str) -> bool:
        """Before `request` is served, complete the last step if it was
        agreed but not completed (a replica did not confirm its commit, or
        the all-gather or hand-back after it failed): every replica keeps
        the update and (stages 1 and 2) holds the same working copy. In a
        job every process does this at its next request (a collective:
        they all agreed on the commit's outcome).

        Returns:
            True when a step was completed here (the trainer counts it).

        Raises:
            Exception: as `_commit`, or the collectives' or a replica's own
                error; a note says `request` was not served (the next
                request tries again).
            RuntimeError: a load out of an unconfirmed commit failed
                (`load_failed`), and no load has succeeded since.
        """
        if self._load_failed is not None:
            raise RuntimeError(
                f"{request} was not served: a LoadCheckpoint failed while the last step's "
                "commit was unconfirmed, so the replicas may hold parts of two states; "
                "only LoadCheckpoint is served until one succeeds"
            ) from self._load_failed
        if self._uncommitted is None and not self._unsent:
            return False
        await self._complete(_not_served(request))
        return True

    @property
    def unconfirmed(self) -> bool:
        """Whether a step was agreed but not committed by every replica:
        their pieces are not of one step, so there is no whole state to go
        back to (a load then keeps no old state to restore)."""
        return self._uncommitted is not None

    def forget(self) -> None:
        """Drop the step `complete` would complete (a checkpoint was
        loaded into every replica instead)."""
        self._uncommitted, self._unsent, self._load_failed = None, [], None

    def load_failed(self, error: Exception) -> None:
        """A load out of an unconfirmed commit failed with `error`: some
        replicas may hold the checkpoint's state and some not, so the step
        is dropped and `complete` refuses every request but a load (the
        trainer's `LoadCheckpoint` does not call it) until `forget`."""
        self._uncommitted, self._unsent, self._load_failed = None, [], error

    async def _complete(self, note: str) -> None:
        """Commit the agreed update everywhere, all-gather the stage 1 and 2
        working copies and hand them back; what did not finish is kept for
        `complete`. Only the hand-back, a local step, is left over
        after the collectives, so the processes' collectives stay paired.

        Raises:
            Exception: as `complete`, with `note`.
        """
        try:
            if self._uncommitted is not None:
                committed = await self._commit(self._uncommitted)
                if self.stage < 3:
                    await self.exchange.all_gather([h.buffer for h in committed])
                    self._unsent = [
                        (ref, h.buffer)
                        for ref, h in zip(self.refs, committed, strict=True)
                        if not h.shared
                    ]
                self._uncommitted = None
            if self._unsent:
                refs = [ref for ref, _ in self._unsent]
                copies = [SetFullParams(buffer) for _, buffer in self._unsent]
                await ask_all(refs, copies, self.timeout)
                self._unsent = []
        except Exception as exc:
            exc.add_note(note)
            raise

    async def _commit(self, token: int) -> list[Any]:
        """Every replica keeps update `token`, all of them for sure before
        anything goes on: a replica whose answer failed (late: its commit
        may still be running) is asked again, behind that commit in its
        mailbox, and answers its buffer again (`ShardedReplica`). The
        processes then agree that every replica committed, so none starts
        an all-gather another will not join.

        Returns:
            Every local replica's `Handed` (None at stage 3).

        Raises:
            Exception: a replica that did not confirm twice, its own error,
                or an OtherProcessFailed where only another process's did not.
        """
        results = await ask_all_settled(
            self.refs, CommitShard(token), self.timeout, per_worker=False
        )
        failed = failed_indices(results)
        name_failures(results)  # the retry replaces these; a restart is named by them
        again = await ask_all_settled(
            [self.refs[i] for i in failed], CommitShard(token), self.timeout, per_worker=False
        )
        for i, result in zip(failed, again, strict=True):
            results[i] = result
        error = first_failure(results)
        await agree_on_failure(self.exchange.processes, error, "commit", others=_unconfirmed)
        return results


def _rolled_back(who: str, what: str) -> Exception:
    """The error of a step whose update other processes (`who`) failed to `what`."""
    return OtherProcessFailed(
        f"a replica of {who} failed to {what} its update: every "
        "replica of every process rolled back (nothing applied)"
    )


_APPLIED = (
    "the step WAS applied (every replica of every process had its update ready), but "
    "not completed: the trainer completes it (the commit, its step count, the stage 1 "
    "and 2 working copies) before it serves its next request"
)


def _not_served(request: str) -> str:
    return (
        f"{request} was not served: the last step WAS applied but could not be completed "
        "(this error); the trainer tries again before its next request"
    )


def _unconfirmed(who: str, what: str) -> Exception:
    """The error of a step whose update other processes (`who`) could not `what` for sure."""
    return OtherProcessFailed(f"a replica of {who} did not {what} its update")
