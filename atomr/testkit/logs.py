"""``expect_log``: assert what a block logs (Akka's ``EventFilter``)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from atomr._arguments import int_at_least
from atomr.actor.errors import bounded_repr
from atomr.actor.timers import check_delay

__all__ = ["expect_log"]


class _Recorder(logging.Handler):
    """Keeps the records that match, and wakes the waiting test when enough did."""

    def __init__(self, level: int, pattern: re.Pattern[str], count: int) -> None:
        super().__init__(level)
        self.pattern = pattern
        self.count = count
        self.matched: list[logging.LogRecord] = []
        self.loop = asyncio.get_running_loop()
        self.enough = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.pattern.search(record.getMessage()):
            return
        self.matched.append(record)
        if len(self.matched) >= self.count:
            self.loop.call_soon_threadsafe(self.enough.set)


@asynccontextmanager
async def expect_log(
    pattern: str = "",
    *,
    level: int | str = logging.WARNING,
    logger: str = "atomr",
    count: int = 1,
    timeout: float = 3.0,
) -> AsyncIterator[list[logging.LogRecord]]:
    """Assert that the block logs exactly ``count`` records matching ``pattern``.

    ``async with expect_log("failed on", level="WARNING"): ref.tell(bad)``.
    Records are counted from ``logger`` and its children, at ``level`` or
    above, whose message ``re.search``-es ``pattern``; they are still logged
    as usual. Actors log on their own turn, so on leaving the block it waits
    up to ``timeout`` seconds for ``count`` of them (with ``count=0`` it only
    checks that none came). The logger's level is lowered for the block if
    it would drop such records.

    Yields:
        The list of matching records, filled as they come.
    Raises:
        AssertionError: on leaving the block, if fewer than ``count`` matching
            records came within ``timeout``, or more than ``count``.
        TypeError: ``count`` is not an int (a bool is not), ``timeout``
            not a number of seconds, ``level`` neither a level name nor
            an int (a bool is not: True would count DEBUG records),
            ``logger`` no str, or ``pattern`` no str (nor compiled pattern).
        ValueError: for ``count`` < 0, a negative, NaN or infinite ``timeout``
            (the wait for records that never come would never end), or an
            unknown level name.
        re.error: ``pattern`` is no regular expression.

    Each refusal comes before the block runs, with the logger unchanged.
    """
    count = int_at_least("count", count, 0)
    timeout = check_delay("timeout", timeout, allow_zero=True, finite=True)  # a wait ends
    if not isinstance(level, str):
        level = int_at_least("level", level, 0)
    number = logging.getLevelName(level) if isinstance(level, str) else level
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {bounded_repr(level)}")
    target = logging.getLogger(logger)
    recorder = _Recorder(number, re.compile(pattern), max(count, 1))
    saved_level = target.level
    if target.getEffectiveLevel() > number:
        target.setLevel(max(number, 1))  # 0 (NOTSET) would defer to the parent's level
    target.addHandler(recorder)
    try:
        yield recorder.matched
        if count and len(recorder.matched) < count:
            with suppress(TimeoutError):
                await asyncio.wait_for(recorder.enough.wait(), timeout)
    finally:
        target.removeHandler(recorder)
        target.setLevel(saved_level)
    seen = [bounded_repr(record.getMessage()) for record in recorder.matched]
    if len(seen) != count:
        raise AssertionError(
            f"expected {count} log record(s) at {logging.getLevelName(number)}+ on "
            f"{logger!r} matching {pattern!r}, got {len(seen)}: {seen}"
        )
