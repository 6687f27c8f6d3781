"""``run``: run a coroutine on uvloop when installed, plain asyncio otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from atomr._arguments import bool_flag

__all__ = ["run"]

T = TypeVar("T")


def run(
    main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None, debug: bool | None = None
) -> T:
    """Run ``main`` to completion on a new event loop and return its result.

    Args:
        main: the coroutine to run.
        use_uvloop: True requires uvloop, False uses plain asyncio, None
            (default) uses uvloop when it is installed.
        debug: asyncio debug mode.
    Returns:
        What ``main`` returns.
    Raises:
        TypeError: if ``main`` is not a coroutine, or ``use_uvloop`` or
            ``debug`` is neither None nor a bool (``main`` is then closed).
        ImportError: if ``use_uvloop`` is True and uvloop is missing.
    """
    if not asyncio.iscoroutine(main):
        raise TypeError(f"run expects a coroutine, got {type(main).__name__}")
    try:
        for name, flag in (("use_uvloop", use_uvloop), ("debug", debug)):
            if flag is not None:
                bool_flag(name, flag)
    except TypeError:
        main.close()
        raise
    factory = None
    if use_uvloop is not False:
        try:
            import uvloop
        except ImportError:
            if use_uvloop:
                main.close()
                raise
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
        return runner.run(main)
