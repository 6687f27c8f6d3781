"""Routers: a pool of routee children behind one ref (round robin, broadcast)."""

from __future__ import annotations

from typing import Any

from atomr._arguments import int_at_least

from .actor import Actor
from .errors import MailboxFullError
from .messages import DeadLetter, Terminated
from .props import Props
from .ref import ActorRef
from .reply import Failure
from .supervision import SupervisorStrategy

__all__ = ["BroadcastPool", "RoundRobinPool"]


def _check(nr_of_instances: int, routee_props: Props) -> int:
    """``nr_of_instances`` as an int (NumPy's too), checked with ``routee_props``."""
    count = int_at_least("nr_of_instances", nr_of_instances)  # >= 1, at most INDEX_MAX
    if not isinstance(routee_props, Props):
        raise TypeError(f"routee_props must be Props, got {type(routee_props).__name__}")
    return count


class _PoolRouter(Actor):
    """Spawns the routees as children and forwards each message (sender and ask kept).

    A routee whose bounded mailbox refuses a message, or that has stopped
    before its ``Terminated`` is handled here, is skipped: round robin tries
    the next one, a broadcast leaves the ask to the others. When every routee refuses, an ask is answered with
    ``MailboxFullError`` and a tell becomes a dead letter; the router itself
    never fails for it (so it does not restart its routees).
    """

    def __init__(self, nr_of_instances: int, routee_props: Props, broadcast: bool) -> None:
        super().__init__()
        self.routees: list[ActorRef] = [
            self.context.watch(self.context.spawn(routee_props, name=f"routee-{i}"))
            for i in range(nr_of_instances)
        ]
        self.broadcast = broadcast
        self.next = 0

    def receive(self, message: Any) -> Any:
        if isinstance(message, Terminated):
            # also those of routees of an instance before a restart: never routed
            if message.ref in self.routees:
                self.routees.remove(message.ref)
                if not self.routees:
                    self.context.stop(self.context.self_ref)
            return None
        try:
            if self.broadcast:
                self.context.forward(*self.routees)  # every routee gets the ask
            else:
                self._forward_round_robin()
        except MailboxFullError as error:
            ctx = self.context
            ctx.system.dead_letters.publish(
                DeadLetter(message, ctx.sender, ctx.self_ref, "mailbox full")
            )
            return Failure(
                MailboxFullError(f"every routee of {ctx.self_ref.path} is full: {error}")
            )
        return None

    def _forward_round_robin(self) -> None:
        """Forward to the next routee with room; one that has stopped (its
        ``Terminated`` not handled yet) is skipped too. If every one has
        stopped, the message goes to one of them (an ask fails at once).

        Raises:
            MailboxFullError: if no routee takes it and one of them refused it.
        """
        count = len(self.routees)
        for _ in range(count):
            routee = self.routees[self.next % count]
            self.next += 1
            if not routee.is_alive:
                continue
            try:
                self.context.forward(routee)
                return
            except MailboxFullError:
                continue
        if not any(routee.is_alive for routee in self.routees):
            self.context.forward(self.routees[0])
            return
        raise MailboxFullError(f"all {count} routees refused the message")


class RoundRobinPool(Props):
    """Props of a router with ``nr_of_instances`` routees, each message to the next one.

    ``system.spawn(RoundRobinPool(4, Props(Worker)), name="workers")``. The
    router supervises its routees (``supervisor_strategy``, default restart);
    a routee that stops leaves the pool, the router stops when none is left.
    An ask through the router is answered by the routee.

    Args:
        nr_of_instances: how many routees (>= 1).
        routee_props: the routees' ``Props``.
        supervisor_strategy: how failed routees are supervised.
    Raises:
        ValueError, TypeError: for bad arguments.
    """

    broadcast = False

    def __init__(
        self,
        nr_of_instances: int,
        routee_props: Props,
        supervisor_strategy: SupervisorStrategy | None = None,
    ) -> None:
        count = _check(nr_of_instances, routee_props)
        super().__init__(_PoolRouter, count, routee_props, self.broadcast)
        if supervisor_strategy is not None:
            if not isinstance(supervisor_strategy, SupervisorStrategy):
                raise TypeError("supervisor_strategy must be a SupervisorStrategy")
            self.supervisor_strategy = supervisor_strategy


class BroadcastPool(RoundRobinPool):
    """Like ``RoundRobinPool`` but every message goes to every routee.

    An ask through it is answered by the first routee to reply.
    """

    broadcast = True
