"""``TestProbe``: an actor whose received messages a test can assert on."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from atomr.actor.actor import Actor
from atomr.actor.messages import Terminated
from atomr.actor.props import Props
from atomr.actor.ref import ActorRef
from atomr.actor.reply import Reply
from atomr.actor.system import ActorSystem

__all__ = ["TestProbe"]

T = TypeVar("T")

_MISSING: Any = object()


class _ProbeActor(Actor):
    def __init__(self, probe: TestProbe) -> None:
        super().__init__()
        self.probe = probe

    def receive(self, message: Any) -> Any:
        ctx = self.context
        reply = ctx.defer()
        self.probe._received(message, ctx.sender, reply)
        return None


class TestProbe:
    """A test actor: everything told or asked to ``probe.ref`` is queued for assertions.

    Asks to the probe are answered with ``probe.reply(value)``.

    Args:
        system: the system to spawn the probe in (needs a running loop).
        name: optional actor name.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, system: ActorSystem, name: str | None = None) -> None:
        self._queue: asyncio.Queue[tuple[Any, ActorRef | None, Reply]] = asyncio.Queue()
        self.last_sender: ActorRef | None = None
        self._last_reply: Reply | None = None
        self.ref: ActorRef = system.spawn(Props(_ProbeActor, self), name=name)

    def _received(self, message: Any, sender: ActorRef | None, reply: Reply) -> None:
        self._queue.put_nowait((message, sender, reply))

    async def _next(self, timeout: float, what: str) -> Any:
        try:
            message, sender, reply = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise AssertionError(f"timeout ({timeout} s) waiting for {what}") from None
        self.last_sender = sender
        self._last_reply = reply
        return message

    async def expect_msg(self, expected: Any = _MISSING, timeout: float = 3.0) -> Any:
        """Wait for the next message; if ``expected`` is given it must be equal.

        Returns:
            The message.
        Raises:
            AssertionError: on timeout or a different message.
        """
        what = "any message" if expected is _MISSING else repr(expected)
        message = await self._next(timeout, what)
        if expected is not _MISSING and message != expected:
            raise AssertionError(f"expected {expected!r}, got {message!r}")
        return message

    async def expect_msg_type(self, cls: type[T], timeout: float = 3.0) -> T:
        """Wait for the next message and check it is an instance of ``cls``.

        Raises:
            AssertionError: on timeout or a message of another type.
        """
        message = await self._next(timeout, cls.__name__)
        if not isinstance(message, cls):
            raise AssertionError(f"expected a {cls.__name__}, got {message!r}")
        return message

    async def expect_no_msg(self, duration: float = 0.1) -> None:
        """Check that no message arrives for ``duration`` seconds.

        Raises:
            AssertionError: if one arrives.
        """
        try:
            message, _, _ = await asyncio.wait_for(self._queue.get(), duration)
        except TimeoutError:
            return
        raise AssertionError(f"expected no message, got {message!r}")

    async def receive_n(self, n: int, timeout: float = 3.0) -> list[Any]:
        """Wait for the next ``n`` messages (``timeout`` for all of them together).

        Returns:
            The messages in arrival order.
        Raises:
            AssertionError: if fewer than ``n`` arrive in time.
            ValueError: if ``n`` < 0.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Any] = []
        for i in range(n):
            remaining = max(deadline - loop.time(), 0.0)
            out.append(await self._next(remaining, f"message {i + 1} of {n} (got {out!r})"))
        return out

    def watch(self, ref: ActorRef) -> ActorRef:
        """Get ``Terminated(ref)`` on this probe when ``ref`` stops. Returns ``ref``."""
        return self.ref._cell.context.watch(ref)

    async def expect_terminated(self, ref: ActorRef, timeout: float = 3.0) -> Terminated:
        """Wait for ``Terminated(ref)`` (call ``watch(ref)`` first).

        Raises:
            AssertionError: on timeout or another message.
        """
        message = await self.expect_msg_type(Terminated, timeout)
        if message.ref is not ref:
            raise AssertionError(f"expected Terminated({ref}), got {message!r}")
        return message

    def reply(self, value: Any) -> bool:
        """Answer the last received message's ask with ``value``.

        Returns:
            True if there was an ask to answer.
        """
        return self._last_reply.set_result(value) if self._last_reply is not None else False

    def __repr__(self) -> str:
        return f"<TestProbe {self.ref.path}>"
