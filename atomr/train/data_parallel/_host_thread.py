"""`HostThread`: one worker thread on which a data-parallel trainer runs its
host-side math (scaling and clipping the reduced gradient) and checkpoint
file I/O, so that neither blocks the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["HostThread"]


class HostThread:
    """A single worker thread, started on first use.

    Args:
        name: the thread's name prefix.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the thread.

        Returns:
            What `fn` returned.

        Raises:
            Exception: what `fn` raised.
        """
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Stop the thread (a later `run` starts a new one)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
