"""What `OperationDriver` (`_driver.py`) runs and how it waits on the loop:
one queued operation (`Operation`), the state of one the fast path began
(`Resume`), and the test bursts of a started MPI request (`Spinner`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from atomr.train.comm.mpi._order import Signature

__all__ = ["Operation", "Resume", "Signature", "Spinner", "new_future"]

_BURST_MIN_S = 100e-6  # `Spinner` tests in bursts between yields to the loop: this long
_BURST_MAX_S = 1e-3  # ... up to this long while the loop has nothing else to run
_IDLE_YIELD_S = 50e-6  # a yield back within this found nothing else to run

Resume = tuple[Any, float, Exception | None, bool]
"""An operation the fast path began: its request in flight, when it started,
its failure, and whether that request is the check's (the call not begun)."""


class Operation:
    """One collective, queued for the driver: its number, the non-blocking MPI
    call that starts it, and the local numpy work before and after."""

    __slots__ = ("after", "before", "future", "kind", "offload", "seq", "signature", "start")

    def __init__(
        self,
        seq: int,
        kind: str,
        signature: Signature,
        future: asyncio.Future[None],
        start: Callable[[], Any],
        before: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
        offload: bool = False,
    ) -> None:
        self.seq = seq
        self.kind = kind
        self.signature = signature
        self.future = future  # awaited by the caller; settled by the driver
        self.start = start  # starts the MPI call; returns its request (None: nothing to do)
        self.before = before
        self.after = after
        self.offload = offload  # before/after touch enough memory to run off the loop

    @property
    def name(self) -> str:
        return f"{self.kind} #{self.seq}"


class Spinner:
    """Tests started MPI requests from the loop, in bursts (see `spin`).

    Args:
        spin_s: how long `spin` tests a request before giving up.
    """

    def __init__(self, spin_s: float) -> None:
        self.spin_s = spin_s
        self._burst_s = _BURST_MIN_S

    async def spin(self, request: Any) -> bool:
        """Test `request` from the loop for up to `spin_s`; True when it completed.

        Tests run in bursts with a yield to the loop between them. Each yield
        stalls the collective on every rank for a moment, so the bursts adapt:
        a yield that found nothing else to run doubles the next burst (up to
        `_BURST_MAX_S`), one that ran other work shortens it to `_BURST_MIN_S`.
        The length carries over to the next operation.
        """
        clock = time.monotonic
        now = clock()
        end = now + self.spin_s
        burst = self._burst_s
        while True:
            stop = now + burst
            while True:
                if request.Test():
                    self._burst_s = burst
                    return True
                now = clock()
                if now >= stop:
                    break
            if now >= end:
                self._burst_s = burst
                return False
            await asyncio.sleep(0)
            then, now = now, clock()
            burst = min(2 * burst, _BURST_MAX_S) if now - then < _IDLE_YIELD_S else _BURST_MIN_S


def new_future() -> asyncio.Future[None]:
    """A future of the running loop."""
    return asyncio.get_running_loop().create_future()
