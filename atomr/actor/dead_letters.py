"""Dead letters: messages that reached no live actor, recorded and observable."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from atomr._arguments import int_at_least

from .errors import bounded_repr
from .messages import DeadLetter

__all__ = ["DeadLetters"]

logger = logging.getLogger("atomr.actor")


class DeadLetters:
    """Records undelivered messages and tells subscribers about each one.

    Attributes:
        count: how many dead letters were published.
        recent: the last ``keep`` dead letters, oldest first.
    """

    def __init__(self, keep: int = 1000) -> None:
        """Args:
        keep: how many recent dead letters to keep in ``recent``.

        Raises:
            ValueError: ``keep`` is negative, or beyond what a queue can index.
            TypeError: ``keep`` is not an int (NumPy's are; a bool is not).
        """
        self.count = 0
        self.recent: deque[DeadLetter] = deque(maxlen=int_at_least("keep", keep, 0))
        self._subscribers: list[Callable[[DeadLetter], object]] = []
        self._publishing = False

    def subscribe(self, callback: Callable[[DeadLetter], object]) -> Callable[[], None]:
        """Call ``callback(dead_letter)`` for every future dead letter.

        ``probe.ref.tell`` is a fine callback. Errors in a callback are logged.
        A dead letter that a callback itself causes (say, ``tell`` to a
        stopped actor) is recorded but not passed to the callbacks again, so
        a subscriber can never loop.

        Returns:
            A function that unsubscribes the callback.
        Raises:
            TypeError: if ``callback`` is not callable.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def publish(self, letter: DeadLetter) -> None:
        """Record ``letter`` and pass it to every subscriber (unless a subscriber
        is what caused it)."""
        self.count += 1
        self.recent.append(letter)
        logger.debug("dead letter: %r", letter)
        if self._publishing:
            return
        self._publishing = True
        try:
            for callback in list(self._subscribers):
                try:
                    callback(letter)
                except Exception:
                    logger.exception("dead-letter subscriber %s failed", bounded_repr(callback))
        finally:
            self._publishing = False
