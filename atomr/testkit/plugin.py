"""pytest plugin (entry point ``atomr``): the ``actor_system`` fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from atomr.actor.system import ActorSystem

__all__ = ["actor_system"]


@pytest_asyncio.fixture
async def actor_system() -> AsyncIterator[ActorSystem]:
    """A fresh ``ActorSystem`` on the test's loop, terminated after the test."""
    system = ActorSystem("test")
    try:
        yield system
    finally:
        await system.terminate()
