"""Fault injection: fail worker k at phase p.

A `Plan` says which phase fails next, how (the error to raise, a delay
before it, whether the phase's own work runs first), how many passes it
lets through first and how often it fails. It is
shared by reference between a test and the workers it makes faulty: actors
are built from `Props`, so the test keeps the plan and arms it between
requests.

`inject_faults(worker_class, plan, phases, worker=k)` derives from a worker
class a subclass whose phases consult the plan. A phase is named after a
step of the worker's protocol and placed either on a message (the fault
fires in `receive` when such a message arrives: the actor itself fails and
its supervisor decides what follows) or on a public hook method (the fault
fires when the hook is called, on whatever thread the worker runs it, and
the worker handles the error as any failure there). The subclass goes where
the worker class would: a trainer's `replica_class` / `shard_class` /
`stage_class` / `worker_class` option, or `Props` handed to a trainer's
`props`.

    plan = Plan()
    Shard = inject_faults(ShardActor, plan, {"loss": "compute_loss"}, worker=1)
    trainer = await TensorParallelTrainer.spawn(
        system, model, devices, config, TensorParallelOptions(shard_class=Shard)
    )
    plan.arm("loss", ContextPoisoned)      # shard 1's next loss fails

A plan knows the phases that code checks: `inject_faults` declares its
phases in the plan, and a hand-written hook declares its own
(`Plan.declare`); arming, firing or disarming any other name is refused, so
a misspelt phase is an error, not a fault that silently never fires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from atomr._arguments import bool_flag, int_at_least
from atomr.actor.timers import check_delay
from atomr.testkit._fault_hooks import (
    Armed,
    ErrorSpec,
    Roster,
    check_error,
    check_hook,
    hooked,
    hooked_receive,
)

__all__ = ["Plan", "inject_faults"]

W = TypeVar("W", bound=type)


class Plan:
    """Which phases fail, how, and how often; shared by a test and its
    faulty workers (thread-safe: device hooks fire on worker threads).

    Attributes:
        fired: the phases that fired, in order (a test asserts on it to see
            that its fault really was injected).
    """

    def __init__(self) -> None:
        self._armed: dict[str, Armed] = {}
        self._declared: set[str] = set()
        # per phase, each place that checks it: why it cannot fire there (None: it can)
        self._places: dict[str, list[Callable[[], str | None]]] = {}
        self._lock = threading.Lock()
        self.fired: list[str] = []

    def declare(self, *phases: str) -> None:
        """Name phases that code checks: a hand-written hook declares what it
        passes to `fire` / `due` / `armed` (`inject_faults` declares its
        phases itself). Declaring a phase again changes nothing.

        Raises:
            TypeError: a phase name that is not a str (nothing is declared).
            ValueError: an empty or blank phase name (nothing is declared).
        """
        self._declare(phases, _anywhere)

    def _declare(self, phases: Iterable[str], place: Callable[[], str | None]) -> None:
        """`declare`, saying of each phase why it cannot fire at this place.

        Raises:
            TypeError, ValueError: as `declare`.
        """
        phases = list(phases)
        for phase in phases:
            _check_phase_name(phase)
        with self._lock:
            self._declared.update(phases)
            for phase in phases:
                places = self._places.setdefault(phase, [])
                if place not in places:  # declared again: nothing changes
                    places.append(place)

    @property
    def phases(self) -> tuple[str, ...]:
        """The declared phases, sorted."""
        with self._lock:
            return tuple(sorted(self._declared))

    def _check_declared(self, phase: object) -> None:
        """Raises TypeError (not a str) or ValueError (not declared); call
        it holding `_lock`."""
        _check_phase_type(phase)
        if phase not in self._declared:
            known = ", ".join(repr(p) for p in sorted(self._declared)) or "none"
            raise ValueError(
                f"no code checks phase {phase!r} of this plan (the declared phases: {known}): "
                "give it to inject_faults, or declare a hand-written hook's with Plan.declare"
            )

    def arm(
        self,
        phase: str,
        error: ErrorSpec = RuntimeError,
        *,
        times: int = 1,
        delay: float = 0.0,
        after: bool = False,
        skip: int = 0,
    ) -> None:
        """Make the next `times` passes through `phase` fail, after letting
        `skip` passes through (replacing whatever `phase` was armed with).

        Args:
            phase: the phase's name, declared (as given to `inject_faults`,
                or to `declare` for a hand-written hook).
            error: the exception to raise: a class (built with the message
                "injected failure: <phase>") or an instance; None for a
                delay only.
            times: how many passes fail.
            delay: seconds to stall first (a slow worker): blocking the
                thread a hook method runs on, or awaited in `receive`.
            after: let the phase's own work run first, then raise (a
                failure after the work wrote its results); in `receive`,
                the message is handled and the actor fails instead of
                replying.
            skip: how many passes to let through first (worker k's third
                batch fails: `skip=2`); `fire`, `due` and the hooks of
                `inject_faults` count them (of worker k only, with `worker=k`).

        Raises:
            TypeError: `phase` is not a str, `error` is not an exception
                class or instance, `times` or `skip` not an int, `after`
                not a bool, `delay` not a number of seconds (a bool is not).
            ValueError: a `phase` no code declared (the message names the
                declared ones), `times < 1`, `skip < 0`, a negative, NaN or
                infinite `delay`, or neither an error nor a delay; or the
                phase is `inject_faults(worker=k)`'s and its trainer's
                workers are built with no worker k; nothing is armed.
        """
        with self._lock:
            self._check_declared(phase)
        check_error(error)
        int_at_least("times", times, 1)
        int_at_least("skip", skip, 0)
        bool_flag("after", after)
        delay = check_delay("delay", delay, allow_zero=True, finite=True)
        if error is None and delay == 0.0:
            raise ValueError(f"arming {phase!r} with neither an error nor a delay injects nothing")
        problem = self._cannot_fire([phase])
        if problem is not None:
            raise ValueError(f"cannot arm {phase!r}: {problem}")
        with self._lock:
            self._armed[phase] = Armed(error, times, delay, bool(after), skip)

    def _cannot_fire(self, phases: Iterable[str], *, armed: bool = False) -> str | None:
        """Why one of `phases` (with `armed`, of those armed) can never fire:
        each place that checks it says why; None when one of them can."""
        with self._lock:
            places = [self._places.get(p, []) for p in phases if not armed or p in self._armed]
            places = [list(checks) for checks in places]
        for checks in places:
            problems = [check() for check in checks]  # outside the lock: they read workers
            if problems and None not in problems:
                return problems[0]
        return None

    def disarm(self, phase: str) -> int:
        """Stop failing `phase` (a worker that recovers).

        Returns:
            How many more passes would have failed (0: it was not armed).

        Raises:
            TypeError, ValueError: `phase` is not a declared phase (`arm`).
        """
        with self._lock:
            self._check_declared(phase)
            armed = self._armed.pop(phase, None)
            return 0 if armed is None else armed.times

    def _take(self, phase: str) -> Armed | None:
        """Use up one pass through `phase`: its fault (recorded in `fired`),
        or None when `phase` is not armed or this pass is let through (`skip`).

        Raises:
            TypeError, ValueError: `phase` is not a declared phase (`arm`).
        """
        with self._lock:
            self._check_declared(phase)
            armed = self._armed.get(phase)
            if armed is None:
                return None
            if armed.skip:
                armed.skip -= 1
                return None
            armed.times -= 1
            if armed.times == 0:
                del self._armed[phase]
            self.fired.append(phase)
            return armed

    def fire(self, phase: str) -> None:
        """In a hand-written hook: if `phase` is armed, stall for its delay,
        then raise its error (`after` is the hook's own business).

        Raises:
            BaseException: the armed error.
            TypeError, ValueError: `phase` is not a declared phase (`arm`).
        """
        armed = self._take(phase)
        if armed is not None:
            if armed.delay:
                time.sleep(armed.delay)  # the injected slowness
            armed.raise_error(phase)

    def due(self, phase: str) -> bool:
        """In a hand-written hook that does something else than raise (e.g.
        corrupts state first): True, using up one arming, if `phase` is armed.

        Raises:
            TypeError, ValueError: `phase` is not a declared phase (`arm`).
        """
        return self._take(phase) is not None

    def armed(self, phase: str) -> int:
        """How many more passes through `phase` will fail (after those still
        to be let through: a hook written by hand that checks this before
        `fire` must not be armed with `skip`).

        Raises:
            TypeError, ValueError: `phase` is not a declared phase (`arm`).
        """
        with self._lock:
            self._check_declared(phase)
            armed = self._armed.get(phase)
            return 0 if armed is None else armed.times


def _anywhere() -> None:
    """A place where a phase can always fire (a hand-written hook; every
    instance of a faulty class)."""
    return None


def inject_faults(
    worker_class: W,
    plan: Plan,
    phases: Mapping[str, str | type],
    *,
    worker: int | None = None,
) -> W:
    """A subclass of `worker_class` whose phases fail when `plan` says so.

    Args:
        worker_class: the worker (an actor class such as `ReplicaActor`,
            `ShardActor`, `StageActor`, `ParameterServerWorker`,
            `ServerShard`, a user's own; or any class whose public methods
            are its steps, e.g. a `Collective`).
        plan: the plan the phases consult (armed by the test).
        phases: phase name -> where it fires (the names are declared in
            `plan`, so it may arm them):
            - a message class: when the worker's `receive` gets such a
              message, before handling it (the actor fails: its supervisor
              decides what follows);
            - the name of a public method (a documented hook such as
              `StageActor.apply_gradients`): when it is called, before it
              runs (or after, see `Plan.arm`), sync or async as the method is.
            Several phases may share a place; the first armed one fires.
        worker: fail only the instance whose `worker_index` is `worker`
            (the trainers' workers number themselves); None: every instance.
            A trainer with no worker `worker` is an error: `plan.arm` raises
            ValueError once its workers are built; armed before, a pass
            of another worker through an armed phase raises it (before
            that worker's work: the step fails, changing nothing).
            Only live instances (and a restarted one) count: reused once a
            trainer's are gone, the class checks the next trainer's workers.

    Returns:
        The subclass (named "Faulty" + the class's name), used wherever
        `worker_class` would be.

    Raises:
        TypeError: `worker_class` is not a class, `plan` not a `Plan`,
            `phases` not a mapping or a phase name not a str, a place
            neither a str nor a class, a message phase on a class
            without `receive`, `worker` not an int (a bool is not), or
            given for a class without a `worker_index` (declared on the
            class: a property, or a class attribute `__init__` overrides).
        ValueError: no phases, an empty or blank phase name, a negative
            `worker`, or a method name that is private (starts with "_") or
            not a method of the class.
    """
    if not isinstance(worker_class, type):
        raise TypeError(f"worker_class must be a class, got {worker_class!r}")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a Plan, got {type(plan).__name__}")
    if worker is not None:
        worker = int_at_least("worker", worker, 0)  # True or "1" would match no worker, or 1
    if worker is not None and not hasattr(worker_class, "worker_index"):
        raise TypeError(
            f"{worker_class.__name__} has no worker_index, so worker={worker} cannot pick one "
            "instance: declare it on the class (a property, or a class attribute that "
            "__init__ overrides: one set only in __init__ is not seen here), or make only "
            "that worker's Props from the faulty class (worker=None)"
        )
    receive = getattr(worker_class, "receive", None)
    on_message, on_method = _places(worker_class, phases, callable(receive))
    name = f"Faulty{worker_class.__name__}"
    roster = None if worker is None else Roster(name, worker)
    plan._declare(phases, _anywhere if roster is None else roster.missing)

    def take(instance: Any, names: list[str]) -> tuple[str, Armed] | None:
        if roster is not None and getattr(instance, "worker_index", None) != worker:
            roster.note(instance)
            if (problem := plan._cannot_fire(names, armed=True)) is not None:
                raise ValueError(f"inject_faults: {problem}")
            return None
        for name in names:
            armed = plan._take(name)
            if armed is not None:
                return name, armed
        return None

    namespace: dict[str, Any] = {"__module__": worker_class.__module__}
    for method, names in on_method.items():
        namespace[method] = hooked(getattr(worker_class, method), names, take)
    if on_message and receive is not None:
        namespace["receive"] = hooked_receive(receive, on_message, take)
    if roster is not None:
        namespace["__init__"] = roster.counting(worker_class)
    namespace["__qualname__"] = name
    return type(name, (worker_class,), namespace)  # type: ignore[return-value]


def _places(
    worker_class: type, phases: Mapping[str, str | type], has_receive: bool
) -> tuple[list[tuple[str, type]], dict[str, list[str]]]:
    """`phases` split into message phases `(phase, message class)` and hook
    phases `{method name: [phase, ...]}`, checked (see `inject_faults`)."""
    if not isinstance(phases, Mapping):
        raise TypeError(f"phases must be a mapping of phase name -> place, got {phases!r}")
    if not phases:
        raise ValueError("phases is empty: name at least one phase to fail")
    on_message: list[tuple[str, type]] = []
    on_method: dict[str, list[str]] = {}
    for phase, place in phases.items():
        _check_phase_name(phase)  # Plan.arm takes str names only: it could never fire
        if isinstance(place, type):
            if not has_receive:
                raise TypeError(
                    f"{worker_class.__name__} has no receive for message phase {phase!r}"
                )
            on_message.append((phase, place))
        elif isinstance(place, str):
            check_hook(worker_class, place)
            on_method.setdefault(place, []).append(phase)
        else:
            raise TypeError(
                f"phase {phase!r}: place must be a message class or a method name, got {place!r}"
            )
    return on_message, on_method


def _check_phase_type(phase: object) -> None:
    """Raises TypeError: `phase` is not a str."""
    if not isinstance(phase, str):
        raise TypeError(f"phase must be a str, got {type(phase).__name__}")


def _check_phase_name(phase: object) -> None:
    """A phase name code may declare (`Plan.declare`, `inject_faults`).

    Raises:
        TypeError: `phase` is not a str.
        ValueError: `phase` is empty or blank (no step of a protocol).
    """
    _check_phase_type(phase)
    assert isinstance(phase, str)
    if not phase.strip():
        raise ValueError(f"phase must be a non-empty name, got {phase!r}")
