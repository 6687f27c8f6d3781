"""Exact time for the speed tests of CADENCE and ASYNC: replicas whose batches
take a set time on a `ManualClock` (`DataParallelOptions(clock=...)`), fed
one batch at a time and slower than they compute, so that the trainer waits
on its feed, not on its replicas."""

from __future__ import annotations

from typing import Any

from atomr.actor import ActorRef
from atomr.testkit import ManualClock, await_condition
from atomr.train import Step
from atomr.train.core import StepStats
from atomr.train.data_parallel import ReplicaActor
from atomr.train.data_parallel.messages import ComputeGradients


class FeedClock(ManualClock):
    """The test's time, read by the trainer (`clock=FeedClock().time`).

    Attributes:
        reads: how often it was read.
        read_at_done: `reads` when a replica last finished a batch.
        batches: the replica index of each batch computed, in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.read_at_done = 0
        self.batches: list[int] = []

    def time(self) -> float:
        self.reads += 1
        return super().time()


def timed_replica(clock: FeedClock, seconds: tuple[float, ...]) -> type[ReplicaActor]:
    """A replica class whose replica `i` takes `seconds[i]` on `clock` per
    batch: it moves the clock on by that once it has computed the batch (on
    the event loop, before it answers)."""

    class TimedReplica(ReplicaActor):
        async def receive(self, message: Any) -> Any:
            result = await super().receive(message)
            if isinstance(message, ComputeGradients):
                clock.advance(seconds[self.index])
                clock.read_at_done = clock.reads
                clock.batches.append(self.index)
            return result

    return TimedReplica


async def feed(dp: ActorRef, batch: tuple[Any, Any], clock: FeedClock, gap: float) -> StepStats:
    """Step `batch`, wait until its replica has computed it and the trainer
    has read the clock since (it timed the result), then let `gap` seconds
    pass before the next batch comes.

    Returns:
        The `Step`'s reply.

    Raises:
        AssertionError: the batch was not timed within 10 s.
    """
    done = len(clock.batches) + 1
    stats: StepStats = await dp.ask(Step(*batch))
    await await_condition(
        lambda: len(clock.batches) == done and clock.reads > clock.read_at_done,
        timeout=10.0,
        interval=0.001,
        message="the trainer timed the batch's result",
    )
    clock.advance(gap)
    return stats
