"""``TestProbe``: an actor whose received messages a test can assert on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from atomr._arguments import int_at_least
from atomr.actor.actor import Actor
from atomr.actor.errors import bounded_repr
from atomr.actor.messages import Terminated
from atomr.actor.props import Props
from atomr.actor.ref import ActorRef
from atomr.actor.reply import Reply
from atomr.actor.supervision import Directive, OneForOneStrategy, SupervisorStrategy
from atomr.actor.system import ActorSystem
from atomr.actor.timers import check_delay
from atomr.testkit._matching import (
    Unfiltered,
    check_class,
    check_predicate,
    not_awaitable,
    same,
)

__all__ = ["ChildFailed", "TestProbe"]

T = TypeVar("T")

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """What a probe receives when a child it supervises fails.

    Attributes:
        child: the failed child.
        error: what its handler raised.
        directive: the strategy's directive (a restart past ``max_restarts``
            still stops the child).
    """

    child: ActorRef
    error: BaseException
    directive: Directive


class _ReportingStrategy(SupervisorStrategy):
    """The probe's strategy for its children: ``inner`` decides, the probe is told."""

    def __init__(self, probe: TestProbe, inner: SupervisorStrategy) -> None:
        super().__init__(inner.max_restarts, inner.within, inner.decider)
        self.applies_to_all = inner.applies_to_all  # type: ignore[misc]
        self.probe = probe
        self.inner = inner

    def directive_for(self, child: ActorRef, error: BaseException) -> Directive:
        directive = self.inner.directive_for(child, error)
        self.probe._received(ChildFailed(child, error, directive), None, Reply(None, None))
        return directive


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

    Asks to the probe are answered with ``probe.reply(value)``. The probe can
    also be the parent and supervisor of the actor under test
    (``spawn_child``): it then gets what the child tells ``context.parent``,
    and a ``ChildFailed`` for each of its failures.

    Attributes:
        ref: the probe's ``ActorRef``.
        last_sender: the sender of the message the last ``expect_*``,
            ``receive_n`` or ``fish_for_message`` returned: the ref given to
            ``tell(..., sender=ref)`` (or ``context.sender`` of the actor that
            told it), None for an ask or an anonymous tell. Reply to it with
            ``probe.last_sender.tell(...)``, or to an ask with ``probe.reply``.

    Every wait (``expect_*``, ``receive_n``, ``fish_for_message``) takes a
    ``timeout`` (``expect_no_msg`` a ``duration``) that must be a finite
    number of seconds > 0: a bool, NaN or infinity raises TypeError or
    ValueError before any message is taken.

    Args:
        system: the system to spawn the probe in (needs a running loop).
        name: optional actor name.
        supervisor_strategy: how the probe supervises its children
            (default: restart, as any actor).

    Raises:
        TypeError: ``system`` is not an ``ActorSystem``, or
            ``supervisor_strategy`` not a ``SupervisorStrategy``.
        RuntimeError, InvalidActorNameError, ActorNameTakenError: as
            ``system.spawn`` (no running loop, a bad or taken name).
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        system: ActorSystem,
        name: str | None = None,
        supervisor_strategy: SupervisorStrategy | None = None,
    ) -> None:
        if not isinstance(system, ActorSystem):
            raise TypeError(f"system must be an ActorSystem, got {bounded_repr(system)}")
        if supervisor_strategy is not None and not isinstance(
            supervisor_strategy, SupervisorStrategy
        ):
            raise TypeError(
                "supervisor_strategy must be a SupervisorStrategy (e.g. OneForOneStrategy()), "
                f"got {bounded_repr(supervisor_strategy)}"
            )
        self._queue: asyncio.Queue[tuple[Any, ActorRef | None, Reply]] = asyncio.Queue()
        self._ignore: Callable[[Any], bool] | None = None
        self._deadline: float | None = None
        self._cut_no_msg = False  # the last wait was an expect_no_msg cut by within
        self.last_sender: ActorRef | None = None
        self._last_reply: Reply | None = None
        strategy = _ReportingStrategy(self, supervisor_strategy or OneForOneStrategy())
        props = Props(_ProbeActor, self).with_supervisor_strategy(strategy)
        self.ref: ActorRef = system.spawn(props, name=name)

    def _received(self, message: Any, sender: ActorRef | None, reply: Reply) -> None:
        ignore = self._ignore
        if ignore is not None:
            try:
                if not_awaitable(ignore(message), "ignore_msg's predicate"):
                    return
            except Exception as error:  # on the probe's turn: the test's wait reports it
                message = Unfiltered(message, error)
        self._queue.put_nowait((message, sender, reply))

    def _bound(self, timeout: float, name: str = "timeout") -> float:
        """``timeout`` (the argument ``name``), checked, cut to what is left
        of an enclosing ``within`` block.

        Raises:
            TypeError, ValueError: not a finite number of seconds > 0 (NaN
                and infinity included: a probe's wait always ends).
        """
        timeout = check_delay(name, timeout, allow_zero=False, finite=True)
        if self._deadline is None:
            return timeout
        left = self._deadline - asyncio.get_running_loop().time()
        return max(min(timeout, left), 0.0)

    async def _get(self, timeout: float) -> tuple[Any, ActorRef | None, Reply] | None:
        """The next queued entry within ``timeout`` seconds, None if none came
        (one already here is taken even with no time left: 3.11's
        ``wait_for(0)`` would not take it)."""
        self._cut_no_msg = False  # the block's last wait is this one, not an expect_no_msg
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            if timeout <= 0:
                return None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    async def _take(self, timeout: float, what: str) -> Any:
        """The next message, within ``timeout`` seconds, already bounded (0:
        the deadline of a wait for several messages has passed).

        Raises:
            AssertionError: none came in time.
        """
        entry = await self._get(timeout)
        if entry is None:
            deadline = self._deadline
            late = deadline is not None and asyncio.get_running_loop().time() >= deadline
            why = ": the enclosing within block's max has passed" if late else ""
            raise AssertionError(f"timeout ({timeout:.3g} s) waiting for {what}{why}")
        message, sender, reply = entry
        if isinstance(message, Unfiltered):
            message.fail()
        self.last_sender = sender
        self._last_reply = reply
        return message

    async def expect_msg(self, expected: Any = _MISSING, timeout: float = 3.0) -> Any:
        """Wait for the next message; if ``expected`` is given it must be equal.

        Equal is ``==``, and for NumPy arrays the same shape and elements.

        Returns:
            The message.
        Raises:
            AssertionError: on timeout or a different message.
            TypeError: if ``==`` gives no answer (arrays inside a tuple or a
                dataclass): the message is taken; compare it yourself.
            TypeError, ValueError: a bad ``timeout`` (see the class).
        """
        what = "any message" if expected is _MISSING else bounded_repr(expected)
        message = await self._take(self._bound(timeout), what)
        if expected is not _MISSING and not same(message, expected):
            raise AssertionError(f"expected {bounded_repr(expected)}, got {bounded_repr(message)}")
        return message

    async def expect_msg_type(self, cls: type[T], timeout: float = 3.0) -> T:
        """Wait for the next message and check it is an instance of ``cls``.

        Raises:
            AssertionError: on timeout or a message of another type.
            TypeError: ``cls`` is not a class, or one ``isinstance`` refuses (a
                Protocol not ``runtime_checkable``), before any message is taken.
            TypeError, ValueError: a bad ``timeout`` (see the class).
        """
        message = await self._take(self._bound(timeout), check_class(cls).__name__)
        if not isinstance(message, cls):
            raise AssertionError(f"expected a {cls.__name__}, got {bounded_repr(message)}")
        return message

    async def expect_no_msg(self, duration: float = 0.1) -> None:
        """Check that no message arrives for ``duration`` seconds; inside a
        ``within`` block, only until its max (and a block whose last wait is
        one cut so is not failed for ending just after its max, as in Akka).

        Raises:
            AssertionError: if one arrives (it is taken), or if the enclosing
                ``within`` block's max has already passed, leaving no time to
                check.
            TypeError, ValueError: a bad ``duration`` (see the class).
        """
        bound = self._bound(duration, "duration")  # checked first: a refusal takes nothing
        if bound == 0.0 and self._queue.empty():
            raise AssertionError(
                "expect_no_msg: the enclosing within block's max has passed, "
                "leaving no time to check that no message comes"
            )
        entry = await self._get(bound)
        if entry is None:
            self._cut_no_msg = bound < duration  # it ran to the within block's max
            return
        if isinstance(entry[0], Unfiltered):
            entry[0].fail()
        raise AssertionError(f"expected no message, got {bounded_repr(entry[0])}")

    async def receive_n(self, n: int, timeout: float = 3.0) -> list[Any]:
        """Wait for the next ``n`` messages (``timeout`` for all of them together).

        Returns:
            The messages in arrival order.
        Raises:
            AssertionError: if fewer than ``n`` arrive in time.
            TypeError: if ``n`` is not an int (a bool is not).
            ValueError: if ``n`` < 0.
            TypeError, ValueError: a bad ``timeout`` (see the class).
        """
        n = int_at_least("n", n, 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._bound(timeout)
        out: list[Any] = []
        for i in range(n):
            remaining = max(deadline - loop.time(), 0.0)
            got = bounded_repr(out)
            out.append(await self._take(remaining, f"message {i + 1} of {n} (got {got})"))
        return out

    async def fish_for_message(self, predicate: Callable[[Any], bool], timeout: float = 3.0) -> Any:
        """Take messages until ``predicate(message)`` is true (Akka's ``fishForMessage``);
        those for which it is false are dropped.

        Returns:
            The first message the predicate accepts.
        Raises:
            AssertionError: if none comes within ``timeout`` (for all of them).
            TypeError: ``predicate`` is not callable or is an ``async def``
                function (before any message is taken), or returned an
                awaitable (always true; that message is taken).
            TypeError, ValueError: a bad ``timeout`` (see the class).
            Exception: whatever ``predicate`` raises (use it to fail on a
                message that must not come).
        """
        check_predicate(predicate)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._bound(timeout)
        skipped = 0
        while True:
            remaining = max(deadline - loop.time(), 0.0)
            message = await self._take(remaining, f"a fish (skipped {skipped} message(s))")
            if not_awaitable(predicate(message), "fish_for_message's predicate"):
                return message
            skipped += 1

    def ignore_msg(self, predicate: Callable[[Any], bool] | None) -> None:
        """Drop, from now on, every arriving message for which ``predicate`` is
        true (Akka's ``ignoreMsg``); None stops ignoring. Messages already
        queued stay. An ignored ask is never answered. A message the predicate
        raises on (or returns an awaitable for) is kept, and the wait that
        takes it fails with an ``AssertionError`` saying so.

        Raises:
            TypeError: ``predicate`` is neither callable nor None, or is an
                ``async def`` function (its coroutine is always true).
        """
        check_predicate(predicate, or_none=True)
        self._ignore = predicate

    @asynccontextmanager
    async def within(self, max: float, min: float = 0.0) -> AsyncIterator[None]:
        """Assert that the block takes between ``min`` and ``max`` seconds (Akka's
        ``within``); inside it, every wait of this probe ends by ``max`` at the latest.

        ``async with probe.within(0.5): ...``; blocks nest (the inner one ends
        no later than the outer). A block whose last wait is an
        ``expect_no_msg`` cut to its max is not failed for ending just after
        it (Akka's rule: that wait ends at the max by design).

        Raises:
            AssertionError: if the block finishes after ``max`` or before ``min``.
            TypeError: if ``max`` or ``min`` is not a number of seconds.
            ValueError: if ``max`` < ``min``, or either is negative, NaN or
                infinite (such a ``max`` would bound nothing and never fail).
        """
        max = check_delay("max", max, allow_zero=True, finite=True)
        min = check_delay("min", min, allow_zero=True, finite=True)
        if max < min:
            raise ValueError(f"need 0 <= min <= max, got min={min}, max={max}")
        loop = asyncio.get_running_loop()
        start = loop.time()
        outer = self._deadline
        end = start + max
        self._deadline = end if outer is None else (end if end < outer else outer)
        self._cut_no_msg = False
        try:
            yield
        finally:
            self._deadline = outer
        elapsed = loop.time() - start
        if elapsed > max and not self._cut_no_msg:
            raise AssertionError(f"block took {elapsed:.3f} s, more than within's max {max} s")
        if elapsed < min:
            raise AssertionError(f"block took {elapsed:.3f} s, less than within's min {min} s")

    def spawn_child(self, props: Props, name: str | None = None) -> ActorRef:
        """Start an actor as a child of the probe, which supervises it with the
        probe's ``supervisor_strategy`` and receives a ``ChildFailed`` for each of
        its failures; what it tells ``context.parent`` comes to the probe.

        Returns:
            The child's ref.
        Raises:
            TypeError, InvalidActorNameError, ActorNameTakenError: as ``spawn``.
        """
        return self.ref._cell.context.spawn(props, name)

    def watch(self, ref: ActorRef) -> ActorRef:
        """Get ``Terminated(ref)`` on this probe when ``ref`` stops. Returns ``ref``."""
        return self.ref._cell.context.watch(ref)

    async def expect_terminated(self, ref: ActorRef, timeout: float = 3.0) -> Terminated:
        """Wait for ``Terminated(ref)`` (call ``watch(ref)`` first).

        Raises:
            AssertionError: on timeout or another message.
            TypeError: ``ref`` is no ``ActorRef`` (before any message is taken).
            TypeError, ValueError: a bad ``timeout`` (see the class).
        """
        if not isinstance(ref, ActorRef):
            raise TypeError(f"ref must be an ActorRef, got {bounded_repr(ref)}")
        message = await self.expect_msg_type(Terminated, timeout)
        if message.ref is not ref:
            raise AssertionError(f"expected Terminated({ref}), got {bounded_repr(message)}")
        return message

    def reply(self, value: Any) -> bool:
        """Answer the last received message's ask with ``value``.

        Returns:
            True if there was an ask to answer.
        """
        return self._last_reply.set_result(value) if self._last_reply is not None else False

    def __repr__(self) -> str:
        return f"<TestProbe {self.ref.path}>"
