"""The hooks `inject_faults` puts on a worker class: a method or `receive`
that consults a `Plan` first; `Armed`, one armed phase; `Roster`, the
workers a faulty class built (`faults.py` is the public side: `Plan`,
`inject_faults`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Armed",
    "ErrorSpec",
    "Roster",
    "check_error",
    "check_hook",
    "hooked",
    "hooked_receive",
]

ErrorSpec = type[BaseException] | BaseException | None
"""What a phase raises when it fires: an exception class or instance, or
None (a delay only)."""


@dataclass
class Armed:
    """One armed phase: what it does when it fires, and how often still."""

    error: ErrorSpec
    times: int
    delay: float
    after: bool
    skip: int

    def raise_error(self, phase: str) -> None:
        """Raise the armed error (nothing when only a delay was armed)."""
        if self.error is None:
            return
        if isinstance(self.error, BaseException):
            raise self.error
        raise self.error(f"injected failure: {phase}")


Taker = Callable[[Any, list[str]], "tuple[str, Armed] | None"]


def hooked(original: Callable[..., Any], names: list[str], take: Taker) -> Callable[..., Any]:
    """`original`, consulting the plan first (async if `original` is).

    A fault stalls for its delay, then raises before the work, or with
    `after` once the work is done (a delay-only fault raises nothing)."""
    if inspect.iscoroutinefunction(original):

        async def hooked_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            fault = take(self, names)
            if fault is None:
                return await original(self, *args, **kwargs)
            phase, armed = fault
            if armed.delay:
                await asyncio.sleep(armed.delay)  # the injected slowness
            if not armed.after:
                armed.raise_error(phase)
            result = await original(self, *args, **kwargs)
            armed.raise_error(phase)
            return result

        return _named_like(hooked_async, original)

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        fault = take(self, names)
        if fault is None:
            return original(self, *args, **kwargs)
        phase, armed = fault
        if armed.delay:
            time.sleep(armed.delay)  # the injected slowness, on the hook's own thread
        if not armed.after:
            armed.raise_error(phase)
        result = original(self, *args, **kwargs)
        armed.raise_error(phase)
        return result

    return _named_like(hooked, original)


def hooked_receive(
    original: Callable[..., Any], on_message: list[tuple[str, type]], take: Taker
) -> Callable[..., Any]:
    """`receive`, consulting the plan for the message phases first (as `hooked`)."""

    async def receive(self: Any, message: Any) -> Any:
        names = [phase for phase, kind in on_message if isinstance(message, kind)]
        fault = take(self, names) if names else None
        if fault is not None:
            if fault[1].delay:
                await asyncio.sleep(fault[1].delay)  # the injected slowness
            if not fault[1].after:
                fault[1].raise_error(fault[0])
        result = original(self, message)
        if inspect.isawaitable(result):
            result = await result
        if fault is not None:
            fault[1].raise_error(fault[0])
        return result

    return _named_like(receive, original)


def _named_like(hook: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    hook.__name__ = hook.__qualname__ = original.__name__
    hook.__doc__ = original.__doc__
    return hook


class Roster:
    """The instances a faulty class with `worker=k` built and the
    `worker_index` each had, so a plan armed for worker k can tell that its
    trainer has no worker k (thread-safe: hooks run on worker threads).

    The indices counted are those of the live instances and of those gone
    while another lived (a restarted worker, before its new instance is
    built). Once every instance is gone (garbage-collected: a stopped
    trainer) the roster starts afresh, so a class reused for the next
    trainer is checked against that trainer's workers only. Instances that
    cannot be weakly referenced (`__slots__`) are never known to be gone:
    their indices always count."""

    def __init__(self, class_name: str, worker: int) -> None:
        self.class_name = class_name
        self.worker = worker
        self._live: list[weakref.ref[Any]] = []  # weak: works for unhashable instances too
        self._seen: set[Any] = set()  # also those of instances gone (restarted)
        self._unreferenced = False  # an instance no weak reference can follow
        self._lock = threading.Lock()

    def note(self, instance: Any) -> None:
        """Count `instance` (built, or passing a hook) and its index now."""
        index = _index(instance)
        try:
            ref = weakref.ref(instance)
        except TypeError:  # no weak references (`__slots__`): its index still counts
            ref = None
        with self._lock:
            if ref is None:
                self._unreferenced = True
            elif not self._unreferenced and all(old() is None for old in self._live):
                self._live, self._seen = [], set()  # every instance gone: a new trainer
            self._seen.add(index)
            if ref is not None and all(old() is not instance for old in self._live):
                self._live = [old for old in self._live if old() is not None] + [ref]

    def missing(self) -> str | None:
        """Why worker k cannot fail: the workers built have other indices
        (None: k is one of them, or none is built yet or alive)."""
        with self._lock:
            refs, seen = list(self._live), set(self._seen)
            unreferenced = self._unreferenced
        live = [instance for instance in (ref() for ref in refs) if instance is not None]
        if not live and not unreferenced:
            return None  # none built yet, or every one gone: the next trainer's are not known
        indices = seen | {_index(instance) for instance in live}
        if self.worker in indices:
            return None
        known = ", ".join(str(i) for i in sorted(indices, key=str))
        return (
            f"{self.class_name} was made with worker={self.worker}, but its trainer has no "
            f"worker {self.worker} (the worker_index of those built: {known}): "
            "nothing would ever fail"
        )

    def counting(self, cls: type) -> Callable[..., None]:
        """`cls.__init__`, then `note` (the `__init__` of the faulty class)."""
        original: Callable[..., None] = cls.__init__  # type: ignore[misc]

        @functools.wraps(original)
        def __init__(self_: Any, *args: Any, **kwargs: Any) -> None:
            original(self_, *args, **kwargs)
            self.note(self_)

        return __init__


def _index(instance: Any) -> Any:
    """`instance.worker_index`, None if reading it fails (or it is unhashable)."""
    try:
        index = instance.worker_index
        hash(index)
    except Exception:
        return None
    return index


def check_error(error: object) -> None:
    """Raises TypeError: `error` is no exception class or instance (nor None)."""
    if error is None or isinstance(error, BaseException):
        return
    if not (isinstance(error, type) and issubclass(error, BaseException)):
        raise TypeError(f"error must be an exception class or instance, got {error!r}")


def check_hook(worker_class: type, name: str) -> None:
    """Raises ValueError: `name` is private, or no public method of `worker_class`."""
    if name.startswith("_"):
        raise ValueError(
            f"{name!r} is private: put phases on messages or documented public hooks "
            f"of {worker_class.__name__}"
        )
    if not inspect.isfunction(inspect.getattr_static(worker_class, name, None)):
        raise ValueError(f"{worker_class.__name__} has no public method {name!r}")
