"""Learning-rate schedules with `torch.optim.lr_scheduler`'s semantics.

A schedule maps the optimizer's base learning rate and an *epoch* to the
learning rate of an update. As in torch, the epoch counts scheduler steps,
and the schedule is stepped once per optimizer update: update `t` (1-based)
uses epoch `t - 1`, so the first update uses the base rate times the
schedule's factor at 0. Schedules are pure functions of the epoch (the closed
forms torch documents), so an optimizer's step count is all the state they
need: replicas, shards, stages and servers agree without messages, and a
checkpoint (which stores the optimizer's config and step) resumes a schedule
exactly.

| schedule | learning rate at epoch `e` |
|---|---|
| `StepLR(step_size, gamma)` | `base * gamma ** (e // step_size)` |
| `MultiStepLR(milestones, gamma)` | `base * gamma ** (number of milestones <= e)` |
| `CosineAnnealingLR(t_max, eta_min)` | `eta_min + (base - eta_min) * (1 + cos(pi * e / t_max)) / 2` |
| `LinearLR(start_factor, end_factor, total_iters)` | `base * (start + (end - start) * min(e, total_iters) / total_iters)` |
| `SequentialLR(schedules, milestones)` | schedule `i` from milestone `i - 1` on, its epoch counted from there |
| `ChainedScheduler(schedules)` | `base *` the product of each schedule's factor (multiplicative ones only) |
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from atomr._arguments import int_at_least, real_number
from atomr._repr import bounded_repr

__all__ = [
    "ChainedScheduler",
    "CosineAnnealingLR",
    "LinearLR",
    "LrSchedule",
    "MultiStepLR",
    "SequentialLR",
    "StepLR",
    "check_restorable",
    "register_schedule",
    "schedule_from_config",
]


def _finite(name: str, value: object, *, low: float = 0.0, strict: bool = False) -> float:
    """`value` as a float (NumPy's real scalars too), checked to be finite
    and at least `low` (above it when `strict`).

    Raises:
        TypeError: not a real number (a bool is none).
        ValueError: not finite, or out of range.
    """
    number = real_number(name, value)
    if not math.isfinite(number) or number < low or (strict and number == low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{name} must be finite and {bound}, got {reprlib.repr(value)}")
    return number


class LrSchedule:
    """The interface of every schedule (see the module docstring)."""

    kind: ClassVar[str]
    multiplicative: ClassVar[bool] = True  # lr = base * factor(epoch)

    def lr(self, base: float, epoch: int) -> float:
        """The learning rate at `epoch` (>= 0) for base rate `base`."""
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable description (`schedule_from_config` reverses it)."""
        raise NotImplementedError


@dataclass(frozen=True)
class StepLR(LrSchedule):
    """Decay by `gamma` every `step_size` epochs (torch's `StepLR`).

    Raises:
        TypeError: `step_size` not an int (a bool is none), `gamma` not a number.
        ValueError: `step_size` below 1, `gamma` negative or not finite.
    """

    step_size: int
    gamma: float = 0.1
    kind: ClassVar[str] = "step"

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_size", int_at_least("step_size", self.step_size, high=None))
        object.__setattr__(self, "gamma", _finite("gamma", self.gamma))

    def lr(self, base: float, epoch: int) -> float:
        return base * self.gamma ** (epoch // self.step_size)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "step_size": self.step_size, "gamma": self.gamma}


@dataclass(frozen=True)
class MultiStepLR(LrSchedule):
    """Decay by `gamma` at each milestone epoch (torch's `MultiStepLR`).

    Raises:
        TypeError: `milestones` not a sequence (`MultiStepLR(5)`), a milestone
            not an int (a bool is none), `gamma` not a number.
        ValueError: milestones empty, below 1 or not increasing; `gamma`
            negative or not finite.
    """

    milestones: tuple[int, ...]
    gamma: float = 0.1
    kind: ClassVar[str] = "multistep"

    def __post_init__(self) -> None:
        milestones = _milestones(self.milestones)
        if not milestones or any(b <= a for a, b in zip(milestones, milestones[1:], strict=False)):
            raise ValueError(f"milestones must be increasing and non-empty, got {milestones}")
        object.__setattr__(self, "milestones", milestones)
        object.__setattr__(self, "gamma", _finite("gamma", self.gamma))

    def lr(self, base: float, epoch: int) -> float:
        return base * self.gamma ** bisect.bisect_right(self.milestones, epoch)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "milestones": list(self.milestones), "gamma": self.gamma}


@dataclass(frozen=True)
class CosineAnnealingLR(LrSchedule):
    """Cosine from the base rate down to `eta_min` over `t_max` epochs, then
    back up (the closed form of torch's `CosineAnnealingLR`).

    Raises:
        TypeError: `t_max` not an int (a bool is none), `eta_min` not a number.
        ValueError: `t_max` below 1, `eta_min` negative or not finite.
    """

    t_max: int
    eta_min: float = 0.0
    kind: ClassVar[str] = "cosine"
    multiplicative: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "t_max", int_at_least("t_max", self.t_max, high=None))
        object.__setattr__(self, "eta_min", _finite("eta_min", self.eta_min))

    def lr(self, base: float, epoch: int) -> float:
        try:
            phase = math.pi * epoch / self.t_max
        except OverflowError:  # a t_max beyond float's range: the phase is 0
            phase = 0.0
        cos = math.cos(phase)
        return self.eta_min + (base - self.eta_min) * (1.0 + cos) / 2.0

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "t_max": self.t_max, "eta_min": self.eta_min}


@dataclass(frozen=True)
class LinearLR(LrSchedule):
    """Scale the base rate linearly from `start_factor` to `end_factor` over
    `total_iters` epochs, then hold it (torch's `LinearLR`; a warm-up).

    Raises:
        TypeError: a factor not a number, `total_iters` not an int (a bool
            is none).
        ValueError: `start_factor` not in (0, 1], `end_factor` not in [0, 1],
            `total_iters` below 1 (torch's bounds).
    """

    start_factor: float = 1.0 / 3.0
    end_factor: float = 1.0
    total_iters: int = 5
    kind: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        start = _finite("start_factor", self.start_factor, strict=True)
        end = _finite("end_factor", self.end_factor)
        if start > 1.0 or end > 1.0:
            raise ValueError(f"start_factor and end_factor must be <= 1, got {start}, {end}")
        object.__setattr__(
            self, "total_iters", int_at_least("total_iters", self.total_iters, high=None)
        )
        object.__setattr__(self, "start_factor", start)
        object.__setattr__(self, "end_factor", end)

    def lr(self, base: float, epoch: int) -> float:
        done = min(epoch, self.total_iters) / self.total_iters
        return base * (self.start_factor + (self.end_factor - self.start_factor) * done)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start_factor": self.start_factor,
            "end_factor": self.end_factor,
            "total_iters": self.total_iters,
        }


def _sequence(name: str, value: object) -> tuple[Any, ...]:
    """`value` (a list, tuple or other iterable, not a string) as a tuple.

    Raises:
        TypeError: not such an iterable (`MultiStepLR(5)`; the message names `name`).
    """
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence, got {bounded_repr(value)}")
    return tuple(value)


def _milestones(value: object) -> tuple[int, ...]:
    """The milestones, each checked to be an int >= 1.

    Raises:
        TypeError: not a sequence, or a milestone not an int (a bool is none).
        ValueError: a milestone below 1.
    """
    return tuple(int_at_least("a milestone", m, high=None) for m in _sequence("milestones", value))


def _schedules(value: Sequence[LrSchedule]) -> tuple[LrSchedule, ...]:
    schedules = _sequence("schedules", value)
    if not schedules or not all(isinstance(s, LrSchedule) for s in schedules):
        raise TypeError(f"schedules must be a non-empty sequence of schedules, got {value!r}")
    return schedules


@dataclass(frozen=True)
class SequentialLR(LrSchedule):
    """Schedule `i` runs from milestone `i - 1` (or 0) to milestone `i`, its
    epochs counted from its start (torch's `SequentialLR`: warm-up, then decay).

    Raises:
        TypeError: `schedules` not schedules, `milestones` not a sequence, a
            milestone not an int (a bool is none).
        ValueError: not exactly `len(schedules) - 1` increasing milestones >= 1.
    """

    schedules: tuple[LrSchedule, ...]
    milestones: tuple[int, ...]
    kind: ClassVar[str] = "sequential"
    multiplicative: ClassVar[bool] = False

    def __post_init__(self) -> None:
        schedules = _schedules(self.schedules)
        milestones = _milestones(self.milestones)
        if len(milestones) != len(schedules) - 1 or any(
            b <= a for a, b in zip(milestones, milestones[1:], strict=False)
        ):
            raise ValueError(
                f"SequentialLR needs {len(schedules) - 1} increasing milestones "
                f"(one between each two schedules), got {milestones}"
            )
        object.__setattr__(self, "schedules", schedules)
        object.__setattr__(self, "milestones", milestones)

    def lr(self, base: float, epoch: int) -> float:
        index = bisect.bisect_right(self.milestones, epoch)
        start = self.milestones[index - 1] if index else 0
        return self.schedules[index].lr(base, epoch - start)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "schedules": [s.to_config() for s in self.schedules],
            "milestones": list(self.milestones),
        }


@dataclass(frozen=True)
class ChainedScheduler(LrSchedule):
    """Several multiplicative schedules at once: their factors multiply
    (torch's `ChainedScheduler`, e.g. a `LinearLR` warm-up with a `StepLR`).

    Raises:
        TypeError: `schedules` not schedules.
        ValueError: a schedule that is not multiplicative (`CosineAnnealingLR`,
            `SequentialLR`): put those in a `SequentialLR` instead.
    """

    schedules: tuple[LrSchedule, ...]
    kind: ClassVar[str] = "chained"

    def __post_init__(self) -> None:
        schedules = _schedules(self.schedules)
        for schedule in schedules:
            if not schedule.multiplicative:
                raise ValueError(
                    f"{type(schedule).__name__} is not multiplicative and cannot be chained; "
                    "use SequentialLR to run it after another schedule"
                )
        object.__setattr__(self, "schedules", schedules)

    def lr(self, base: float, epoch: int) -> float:
        factor = 1.0
        for schedule in self.schedules:
            factor *= schedule.lr(1.0, epoch)
        return base * factor

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "schedules": [s.to_config() for s in self.schedules]}


_KINDS: dict[str, type[LrSchedule]] = {
    cls.kind: cls
    for cls in (StepLR, MultiStepLR, CosineAnnealingLR, LinearLR, SequentialLR, ChainedScheduler)
}
_MAX_DEPTH = 4  # nesting a checkpoint may hold (sequential of chained of ...)
S = TypeVar("S", bound=type[LrSchedule])


def register_schedule(cls: S) -> S:
    """Class decorator: make a schedule class of your own (a dataclass, as
    the built-in ones are) rebuildable from its `to_config()` (whose `kind`
    names it, the other keys its fields) by `schedule_from_config`, so that
    a checkpoint of it resumes. Registering
    it again, or a redefinition of the same module and qualified name (a
    notebook cell run again), replaces it.

    Raises:
        TypeError: `cls` is not an `LrSchedule` class.
        ValueError: it has no `kind`, or another class holds that kind.
    """
    if not (isinstance(cls, type) and issubclass(cls, LrSchedule)):
        raise TypeError(f"register_schedule takes an LrSchedule class, got {bounded_repr(cls)}")
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__name__} needs a str `kind` to be registered")
    holder = _KINDS.get(kind, cls)
    if (holder.__module__, holder.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"schedule kind {kind!r} is taken by {holder.__qualname__}")
    _KINDS[kind] = cls
    return cls


def check_restorable(schedule: LrSchedule) -> None:
    """Check that `schedule.to_config()`, through JSON, rebuilds a schedule:
    a checkpoint stores that config, and one that does not rebuild would be
    saved, then fail to load.

    Raises:
        ValueError: it does not (a class not registered with
            `register_schedule`, or a config that is not JSON or not its fields).
    """
    try:
        schedule_from_config(json.loads(json.dumps(schedule.to_config())))
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise ValueError(
            f"{type(schedule).__name__}'s config does not rebuild it, so a checkpoint "
            f"could not resume it ({exc}); a schedule of your own needs @register_schedule"
        ) from exc


def schedule_from_config(config: Any, depth: int = 0) -> LrSchedule:
    """Rebuild a schedule from `to_config()`'s output.

    Raises:
        ValueError: an unknown kind, unknown or missing fields, bad values, or
            nesting deeper than a few levels (a hostile checkpoint).
        TypeError: not a dict, or values of the wrong type (a `step_size`
            of '3', a `milestones` that is no list), as the classes raise.
    """
    if not isinstance(config, dict) or not isinstance(config.get("kind"), str):
        raise TypeError(f"a schedule config must be a dict with a 'kind', got {config!r}")
    if depth > _MAX_DEPTH:
        raise ValueError(f"schedule nested deeper than {_MAX_DEPTH} levels")
    cls = _KINDS.get(config["kind"])
    if cls is None:
        raise ValueError(f"unknown schedule {config['kind']!r}; expected one of {sorted(_KINDS)}")
    fields = {k: v for k, v in config.items() if k != "kind"}
    if "schedules" in fields:
        if not isinstance(fields["schedules"], list):
            raise TypeError("a schedule's 'schedules' must be a list")
        fields["schedules"] = [schedule_from_config(c, depth + 1) for c in fields["schedules"]]
    if "milestones" in fields:
        if not isinstance(fields["milestones"], list):
            raise TypeError("a schedule's 'milestones' must be a list")
        fields["milestones"] = tuple(fields["milestones"])
    _check_fields(config["kind"], cls, fields)
    return cls(**fields)


def _check_fields(kind: str, cls: type[LrSchedule], given: dict[str, Any]) -> None:
    """Raises ValueError when `given` names a field `cls` does not have, or
    lacks one it needs (their values are `cls`'s to check)."""
    known = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    needed = {f.name for f in known if f.default is dataclasses.MISSING}
    unknown = sorted(set(given) - {f.name for f in known})
    missing = sorted(needed - set(given))
    if unknown or missing:
        raise ValueError(f"bad fields for schedule {kind!r}: unknown {unknown}, missing {missing}")
