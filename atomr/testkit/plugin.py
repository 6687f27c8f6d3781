"""pytest plugin (entry point ``atomr``): the ``actor_system`` fixture.

It is loaded by every pytest run in an environment where atomr is installed,
so it must never break one: without pytest-asyncio (atomr's ``test`` extra)
the fixture is still defined, and a test that uses it fails with a message
saying what to install; every other test runs as usual.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from atomr.actor.system import ActorSystem

__all__ = ["actor_system"]

try:
    import pytest_asyncio
except ImportError:  # plain `pip install atomr` + pytest
    _HAVE_PYTEST_ASYNCIO = False
else:
    _HAVE_PYTEST_ASYNCIO = True


async def _fresh_system() -> AsyncIterator[ActorSystem]:
    """A fresh ``ActorSystem`` on the test's loop, terminated after the test."""
    system = ActorSystem("test")
    try:
        yield system
    finally:
        await system.terminate()


if _HAVE_PYTEST_ASYNCIO:
    actor_system = pytest_asyncio.fixture(_fresh_system, name="actor_system")
else:

    @pytest.fixture(name="actor_system")
    def actor_system() -> None:
        """Needs pytest-asyncio: fails the test that asks for it, saying so."""
        pytest.fail(
            "the actor_system fixture needs pytest-asyncio: pip install 'atomr[test]' "
            '(or pytest-asyncio), and set asyncio_mode = "auto" in the pytest config',
            pytrace=False,
        )
