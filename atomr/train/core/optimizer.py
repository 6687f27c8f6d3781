"""`OptimizerKind` and its optimizers: torch.optim's SGD, Adam and AdamW.

The update rules are those published in torch.optim's documentation (with
`maximize=False`, `amsgrad=False`, `foreach`/`fused` giving the same math),
applied to one flat parameter vector by one fused kernel pass of the device
backend (`sgd_step` / `adam_step`). Per element, with gradient `g`:

SGD (`momentum`, `dampening`, `weight_decay`, `nesterov`)::

    g = g + weight_decay * p                       if weight_decay != 0
    b = g                                          first step (if momentum != 0)
    b = momentum * b + (1 - dampening) * g         later steps
    g = g + momentum * b if nesterov else b        if momentum != 0
    p = p - lr * g

Adam / AdamW (`t` the step count, from 1)::

    p = p * (1 - lr * weight_decay)                AdamW only
    g = g + weight_decay * p                       Adam only, if weight_decay != 0
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from atomr._arguments import array_bytes, building, sequence_entries
from atomr._repr import bounded_repr
from atomr.accel import AdamHyperparameters, SgdHyperparameters
from atomr.accel.hyperparameters import given_in
from atomr.train.core._cpu import cpu_backend
from atomr.train.core.model.inputs import model_dtype
from atomr.train.core.optimizer_state import Adam, Optimizer, Sgd
from atomr.train.core.schedule import LrSchedule, check_restorable, schedule_from_config

__all__ = ["OptimizerKind"]

_KINDS = ("sgd", "adam", "adamw")

_ADAM_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8}
_SGD_DEFAULTS = {"momentum": 0.0, "dampening": 0.0, "nesterov": False}


@dataclass(frozen=True)
class OptimizerKind:
    """An update rule and its hyper-parameters; build one with `sgd`, `adam`
    or `adamw`, then `create(n)` the state for `n` parameters.

    The hyper-parameters are validated here, into the kernel's
    `hyperparameters` object (`atomr.accel.SgdHyperparameters` or
    `AdamHyperparameters`), for what is wrong in every dtype, and by
    `check_dtype` for the dtype of the parameters they update, once it is
    known: an `Optimizer` checks its rule when it is built (before it
    allocates anything) and whenever it takes a new one, a trainer when it is
    spawned, before any step. So `eps=1e-50` (0 in float32) is taken here and
    by a float64 model, and refused for a float32 one. No step checks them
    again (a scheduled rate is checked when it changes: `hyperparameters_at`).

    Attributes:
        name: "sgd", "adam" or "adamw".
        lr: learning rate.
        momentum, dampening, nesterov: SGD only.
        betas, eps: Adam and AdamW only.
        weight_decay: L2 penalty (SGD, Adam) or decoupled decay (AdamW).
        schedule: a learning-rate schedule (`atomr.train.core.schedule`), or
            None for a constant `lr`; update `t` uses `schedule.lr(lr, t - 1)`.
        hyperparameters: the validated values, as the update kernel takes them
            (at the base `lr`; `hyperparameters_at` gives an update's own).

    Raises:
        ValueError: an unknown name; a value that is negative, NaN or
            infinite in float64; betas outside [0, 1); nesterov without
            momentum or with dampening; a setting of the other rule
            (momentum for Adam, betas for SGD) that is not its default; a
            schedule whose config does not rebuild it (`check_restorable`:
            a class of your own not registered with `register_schedule`).
        TypeError: a value that is not a number; `nesterov` not a bool
            (numpy's is one); a schedule that is not an `LrSchedule`.
    """

    name: str
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: LrSchedule | None = None
    hyperparameters: SgdHyperparameters | AdamHyperparameters = field(
        init=False, repr=False, compare=False
    )
    # the last scheduled learning rate asked for, its dtype and hyper-parameters
    _scheduled: tuple[float, Any, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.name not in _KINDS:
            raise ValueError(f"unknown optimizer {self.name!r}; expected one of {_KINDS}")
        hyper: SgdHyperparameters | AdamHyperparameters
        if self.name == "sgd":
            self._refuse_settings_of_other_rule(_ADAM_DEFAULTS)
            hyper = SgdHyperparameters(
                self.lr, self.momentum, self.dampening, self.weight_decay, self.nesterov
            )
            object.__setattr__(self, "nesterov", hyper.nesterov)  # numpy's bool as a bool
        else:
            self._refuse_settings_of_other_rule(_SGD_DEFAULTS)
            b1, b2 = _pair(self.betas)
            hyper = AdamHyperparameters(
                self.lr, b1, b2, self.eps, self.weight_decay, decoupled=self.name == "adamw"
            )
        object.__setattr__(self, "hyperparameters", hyper)
        object.__setattr__(self, "_scheduled", (self.lr, None, hyper))
        if self.schedule is not None:
            if not isinstance(self.schedule, LrSchedule):
                name = type(self.schedule).__name__
                raise TypeError(f"schedule must be an LrSchedule, got {name}")
            check_restorable(self.schedule)

    def _refuse_settings_of_other_rule(self, defaults: dict[str, Any]) -> None:
        for setting, default in defaults.items():
            if getattr(self, setting) != default:
                raise ValueError(f"{setting} does not apply to {self.name}")

    @classmethod
    def sgd(
        cls,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> OptimizerKind:
        """torch.optim.SGD's rule.

        Raises:
            TypeError: a value that is not a number, or `nesterov` not a bool.
            ValueError: negative values, values infinite or non-zero but 0 in
                float64 (float32's range: `check_dtype`); nesterov without
                momentum or with dampening.
        """
        return cls(
            "sgd",
            _given("lr", lr),
            _given("momentum", momentum),
            _given("dampening", dampening),
            _given("weight_decay", weight_decay),
            nesterov,
        )

    @classmethod
    def adam(
        cls,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> OptimizerKind:
        """torch.optim.Adam's rule (L2 weight decay added to the gradient).

        Raises:
            TypeError: a value that is not a number.
            ValueError: betas outside [0, 1); negative values, values infinite
                or non-zero but 0 in float64 (float32's range: `check_dtype`).
        """
        return cls._adam_family("adam", lr, betas, eps, weight_decay)

    @classmethod
    def adamw(
        cls,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> OptimizerKind:
        """torch.optim.AdamW's rule (decoupled weight decay).

        Raises:
            TypeError: a value that is not a number.
            ValueError: betas outside [0, 1); negative values, values infinite
                or non-zero but 0 in float64 (float32's range: `check_dtype`).
        """
        return cls._adam_family("adamw", lr, betas, eps, weight_decay)

    @classmethod
    def _adam_family(
        cls, name: str, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
    ) -> OptimizerKind:
        b1, b2 = _pair(betas)
        return cls(
            name,
            _given("lr", lr),
            weight_decay=_given("weight_decay", weight_decay),
            betas=(_given("beta1", b1), _given("beta2", b2)),
            eps=_given("eps", eps),
        )

    def with_lr(self, lr: float) -> OptimizerKind:
        """The same rule with another learning rate.

        Raises:
            TypeError: `lr` is not a real number (a str or bool included).
            ValueError: `lr` is not valid for the rule (checked as when built;
                float32's range: `check_dtype`, which `Optimizer.set_lr` runs).
        """
        return replace(self, lr=_given("lr", lr))

    def with_schedule(self, schedule: LrSchedule | None) -> OptimizerKind:
        """The same rule with a learning-rate schedule (None: constant `lr`).

        Raises:
            TypeError: not an `LrSchedule`.
        """
        return replace(self, schedule=schedule)

    def lr_at(self, epoch: int) -> float:
        """The learning rate of the update made after `epoch` updates; inf
        for a growing schedule past float's range (`hyperparameters_at`
        refuses it)."""
        if self.schedule is None:
            return self.lr
        try:
            return self.schedule.lr(self.lr, epoch)
        except OverflowError:  # a growing power past float's range (StepLR's gamma > 1)
            return math.inf

    def check_dtype(self, dtype: Any) -> None:
        """Check that the rule can update parameters of `dtype` (the model's):
        each hyper-parameter finite and, if non-zero, not 0 there
        (`given_in`), and the kernel's coefficients finite
        (`hyperparameters.check_dtype`). An `Optimizer` runs it when it is
        built and on every rule it takes; trainers when they are spawned.

        Raises:
            ValueError: `dtype` is not float32 or float64, or a value out of
                its range, e.g. "adam cannot compute in float32: eps=1e-50
                rounds to 0 in float32; give 0 or a value >= 1e-45".
        """
        dt = model_dtype(dtype)
        if self.name == "sgd":
            names = {"momentum": self.momentum, "dampening": self.dampening}
        else:
            names = {"beta1": self.betas[0], "beta2": self.betas[1], "eps": self.eps}
        try:
            for name, value in {"lr": self.lr, **names, "weight_decay": self.weight_decay}.items():
                given_in(name, value, dt)
            self.hyperparameters.check_dtype(dt)
        except ValueError as exc:
            raise ValueError(f"{self.name} cannot compute in {dt}: {exc}") from None

    def hyperparameters_at(
        self, epoch: int, dtype: np.dtype[Any]
    ) -> SgdHyperparameters | AdamHyperparameters:
        """The kernel's hyper-parameters for the update made after `epoch`
        updates of parameters of `dtype` (float32 or float64). Without a
        schedule, the base ones, not checked again (`check_dtype` did when
        the optimizer was built); a scheduled rate is checked in `dtype`
        whenever it changes.

        Raises:
            ValueError: the scheduled learning rate is out of range in `dtype`
                (a growing schedule), naming the update; nothing is updated.
        """
        if self.schedule is None:
            return self.hyperparameters
        lr = self.lr_at(epoch)  # inf past float's range: refused below
        last_lr, last_dtype, hyper = self._scheduled
        if lr != last_lr or dtype != last_dtype:
            try:
                hyper = replace(self.hyperparameters, lr=lr)
                hyper.check_dtype(dtype)
            except ValueError as exc:
                raise ValueError(f"update {epoch + 1}: scheduled {exc}") from None
            object.__setattr__(self, "_scheduled", (lr, dtype, hyper))
        return hyper

    def create(self, n: int, backend: Any = None, dtype: Any = np.float32) -> Optimizer:
        """The optimizer state for `n` parameters.

        Args:
            n: number of parameters (>= 1).
            backend: the kernels of the device holding the parameters
                (`atomr.accel.backend_for(device)`); default the CPU backend.
            dtype: the parameters' dtype (float32; float64 on the CPU only).

        Returns:
            A `Sgd` or `Adam` optimizer with zeroed state and step count 0.

        Raises:
            ValueError: `n < 1`, a state no array holds (`array_bytes`), or a
                hyper-parameter out of range in `dtype` (`check_dtype`);
                checked before anything is allocated.
            MemoryError: a state too large for memory (the message names it).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if backend is None:
            backend = cpu_backend()
        state, buffers = (Sgd, 1) if self.name == "sgd" else (Adam, 2)  # momentum; two moments
        dt = np.dtype(dtype)
        what = f"{self.name} optimizer state ({buffers} x {n} {dt})"
        with building(what, array_bytes(what, buffers * n, dt.itemsize)):
            return state(self, n, backend, dt)

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable description (checkpoints, the CLI); the
        schedule's key is present only when there is one."""
        config: dict[str, Any] = {
            "name": self.name,
            "lr": self.lr,
            "momentum": self.momentum,
            "dampening": self.dampening,
            "weight_decay": self.weight_decay,
            "nesterov": self.nesterov,
            "betas": list(self.betas),
            "eps": self.eps,
        }
        if self.schedule is not None:
            config["schedule"] = self.schedule.to_config()
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> OptimizerKind:
        """Rebuild from `to_config()`'s output.

        Raises:
            ValueError: bad values; KeyError: missing name or lr.
        """
        cfg = dict(config)
        cfg["betas"] = tuple(cfg.get("betas", (0.9, 0.999)))
        if cfg.get("schedule") is not None:
            cfg["schedule"] = schedule_from_config(cfg["schedule"])
        return cls(**cfg)


def _given(name: str, value: Any) -> float:
    """A hyper-parameter as given: `given_in` float64, the widest dtype the
    kernels compute in (the parameters' own: `OptimizerKind.check_dtype`).

    Raises:
        TypeError: not a real number (a bool included).
        ValueError: NaN, infinite in float64, or non-zero but 0 there.
    """
    return given_in(name, value, np.float64)


def _pair(betas: Any) -> tuple[Any, Any]:
    """Adam's `(beta1, beta2)`, the entries of `betas` (checked as numbers
    by the caller).

    Raises:
        TypeError: not a sequence (a number, a string: `sequence_entries`).
        ValueError: not two entries.
    """
    entries = sequence_entries("betas", betas, "two numbers")
    if len(entries) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {bounded_repr(betas)}")
    return entries[0], entries[1]
