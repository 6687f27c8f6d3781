"""Ring members for the collective tests: actors that each own a NumPy buffer
and take part in the ring, optionally misbehaving in one of a few ways."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np
import pytest

from atomr import Actor, ActorRef, ActorSystem, Props
from atomr.train.comm.ring import RingMember, RingPing

RING_TIMEOUT_S = 5.0
"""The chunk timeout of the members (a healthy ring never waits that long)."""

FAULTS = ("fail_add", "fail_write", "stall", "absent")
"""How a member can misbehave: raise on `add_chunk` / `write_chunk`, block
in its first buffer change until the test ends, or answer every operation at
once without taking part (and drop every chunk)."""


class BufferActor(Actor):
    """A ring member over a NumPy buffer; `"get"` answers a copy of it.

    With `lend_views` it reads chunks as views of its buffer (as a CPU
    `ReplicaActor` does) and takes a random 0-2 ms before each change, so
    the members' steps interleave in many orders.
    """

    def __init__(
        self,
        data: np.ndarray,
        *,
        fault: str | None = None,
        lend_views: bool = False,
        seed: int = 0,
        timeout: float = RING_TIMEOUT_S,
        release: asyncio.Event | None = None,
    ) -> None:
        super().__init__()
        self.data = data
        self.fault = fault
        self.lend_views = lend_views
        self.rng = np.random.default_rng(seed)
        self.release = release
        self.member = RingMember(self, timeout=timeout)

    @property
    def ring_size(self) -> int:
        return int(self.data.size)

    async def read_chunk(self, lo: int, hi: int) -> np.ndarray:
        return self.data[lo:hi] if self.lend_views else self.data[lo:hi].copy()

    async def _before_change(self, kind: str) -> None:
        if self.fault == f"fail_{kind}":
            raise RuntimeError(f"injected {kind} failure")
        if self.fault == "stall" and self.release is not None:
            await self.release.wait()
        if self.lend_views:
            await asyncio.sleep(float(self.rng.uniform(0.0, 0.002)))

    async def add_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        await self._before_change("add")
        self.data[lo:hi] += data

    async def write_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        await self._before_change("write")
        self.data[lo:hi] = data

    def receive(self, message):
        if self.fault == "absent" and RingMember.handles(message):
            return True if isinstance(message, RingPing) else None
        if RingMember.handles(message):
            return self.member.receive(message, self.context)
        if message == "get":
            return self.data.copy()
        if message == "stop":
            self.context.stop(self.context.self_ref)
            return None
        raise TypeError(message)


@pytest.fixture
async def spawn_ring(
    actor_system: ActorSystem,
) -> AsyncIterator[Callable[..., list[ActorRef]]]:
    """`spawn_ring(arrays, faults={k: fault}, lend_views=False, timeout=...)`:
    one `BufferActor` per array (over a copy of it), in ring order. Members
    that stall are released when the test ends."""
    release = asyncio.Event()

    def spawn(
        arrays: Sequence[np.ndarray],
        faults: dict[int, str] | None = None,
        lend_views: bool = False,
        timeout: float = RING_TIMEOUT_S,
    ) -> list[ActorRef]:
        faults = faults or {}
        assert set(faults.values()) <= set(FAULTS), faults
        return [
            actor_system.spawn(
                Props(
                    BufferActor,
                    a.copy(),
                    fault=faults.get(k),
                    lend_views=lend_views,
                    seed=k,
                    timeout=timeout,
                    release=release,
                )
            )
            for k, a in enumerate(arrays)
        ]

    yield spawn
    release.set()
