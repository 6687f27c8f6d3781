"""The optimizer state over a flat parameter vector: `Optimizer`, and the
update rules' `Sgd` and `Adam` (which also runs AdamW). `OptimizerKind`
(`optimizer.py`) describes a rule; its `create` builds one of these."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from atomr.train.core.errors import NonFiniteError
from atomr.train.core.validation import cast_finite

__all__ = ["Adam", "Optimizer", "Sgd", "UpdateRule"]


class UpdateRule(Protocol):
    """What an optimizer needs of its rule (`OptimizerKind` is the one there is;
    this module does not import it, since `OptimizerKind.create` builds these)."""

    @property
    def name(self) -> str: ...
    @property
    def momentum(self) -> float: ...
    def check_dtype(self, dtype: Any) -> None: ...
    def hyperparameters_at(self, epoch: int, dtype: np.dtype[Any]) -> Any: ...
    def lr_at(self, epoch: int) -> float: ...
    def with_lr(self, lr: float) -> Any: ...
    def to_config(self) -> dict[str, Any]: ...
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any: ...


class Optimizer:
    """Optimizer state over a flat parameter vector; see `OptimizerKind.create`.

    Attributes:
        kind: the rule and hyper-parameters, checked in `dtype`
            (`OptimizerKind.check_dtype`) when built and whenever replaced.
        n: number of parameters.
        dtype: the parameters' dtype (float32 or float64).
        step_count: steps applied so far.

    Raises:
        ValueError: a hyper-parameter of `kind` out of range in `dtype`, or
            `dtype` not float32 or float64 (before anything is allocated).
    """

    _buffers: tuple[str, ...] = ()
    _nonnegative_buffers: tuple[str, ...] = ()

    def __init__(self, kind: UpdateRule, n: int, backend: Any, dtype: np.dtype) -> None:
        kind.check_dtype(dtype)
        self.kind: Any = kind  # the OptimizerKind (an UpdateRule here: no import cycle)
        self.n = int(n)
        self.backend = backend
        self.dtype = dtype
        self.step_count = 0

    def set_lr(self, lr: float) -> float:
        """Use `lr` as the base learning rate from the next update on.

        Returns:
            The base rate it replaces (a coordinator that must undo a
            `SetLearningRate` gives it back).

        Raises:
            ValueError, TypeError: as `OptimizerKind` for a bad `lr`, or one
                out of range in this optimizer's dtype (nothing changed).
        """
        old, kind = float(self.kind.lr), self.kind.with_lr(lr)
        kind.check_dtype(self.dtype)
        self.kind = kind
        return old

    def _check_args(self, op: str, read_only: tuple[str, ...], **buffers: Any) -> None:
        """The caller's buffers, checked once: `(n,)`, this optimizer's dtype,
        and what the backend's kernels need (`Backend.validate`; no output may
        share memory with any input: `params` updated in place is not `grads`,
        `params_out` is neither); the steps then launch the unchecked kernels
        over them and the optimizer's own state."""
        for name, arr in buffers.items():
            shape = getattr(arr, "shape", None)
            if shape is None:
                continue  # not an array: validate's TypeError names its type
            if tuple(shape) != (self.n,):
                raise ValueError(f"{name} must have shape ({self.n},), got {tuple(shape)}")
            if np.dtype(arr.dtype) != self.dtype:
                raise ValueError(f"{name} must be {self.dtype}, got {arr.dtype}")
        self.backend.validate(op, read_only=read_only, in_place={}, **buffers)

    def step(self, params: Any, grads: Any) -> None:
        """Apply one update to `params` in place (one fused kernel pass).

        Args:
            params: flat parameter vector `(n,)` in the backend's memory.
            grads: flat gradient vector `(n,)`, same memory and dtype.

        Raises:
            ValueError: wrong shape or dtype, or `params` sharing memory with
                `grads` or the optimizer's state (nothing is changed).
            TypeError: not buffers of the optimizer's backend.
            NonFiniteError: the update made a weight non-finite. In place it
                cannot be undone: `params` and the state hold it (the step is
                counted). Use `step_into` to refuse it with nothing changed.
        """
        finite = self._step_in_place(params, grads)
        self.step_count += 1
        if not finite:
            raise self._non_finite(self.step_count, "applied in place")

    def _non_finite(self, step: int, outcome: str = "not applied") -> NonFiniteError:
        return NonFiniteError(
            f"update {step} ({self.kind.name}, lr={self.kind.lr_at(step - 1):g}) makes a weight"
            f" non-finite; {outcome}"
        )

    def step_into(
        self, params: Any, grads: Any, params_out: Any, spare: dict[str, Any]
    ) -> dict[str, Any]:
        """One update out of place: the new parameters go to `params_out`,
        the new state to buffers taken from `spare` (by name; allocated where
        missing or of the wrong size). `params`, the current buffers and the
        step count are left as they were; `adopt` the returned buffers with
        `step_count + 1` to commit. Bit-identical to `step`.

        Args:
            params: flat parameter vector `(n,)` (read only).
            grads: flat gradient vector `(n,)`.
            params_out: `(n,)` for the new parameters (not `params`).
            spare: buffers to reuse, by name (see `buffers`); not modified.

        Returns:
            The new state buffers by name (as `buffers()` would give after `step`).

        Raises:
            ValueError: wrong shape or dtype, or `params_out` or a spare buffer
                it would reuse sharing memory with `params`, `grads`, the current
                state or one another (nothing is changed).
            TypeError: not buffers of the optimizer's backend.
            NonFiniteError: a new weight would be non-finite (checked in the
                kernel's pass); nothing is changed (`params_out` and the spare
                buffers hold garbage).
        """
        state = self._state()
        reused = {
            f"spare[{k!r}]": b
            for k in self._buffers
            if (b := self._spare(spare, k, False)) is not None
        }
        self._check_args(
            f"{type(self).__name__}.step_into",
            ("params", "grads", *state),
            params=params,
            grads=grads,
            params_out=params_out,
            **state,
            **reused,
        )
        return self.step_into_unchecked(params, grads, params_out, spare)

    def step_into_unchecked(
        self, params: Any, grads: Any, params_out: Any, spare: dict[str, Any]
    ) -> dict[str, Any]:
        """`step_into` without checking the buffers: for a worker stepping
        buffers it owns (an atomic apply, `DoubleBuffer`), checked where they
        came in, so that a step does not check them again every time.

        The caller guarantees what `step_into` checks: `params`, `grads` and
        `params_out` are `(n,)`, C-contiguous, of this optimizer's dtype and
        in its backend's memory; `params_out` is writable and is none of the
        inputs. Nothing is checked: a wrong buffer gives wrong numbers or a
        numba error, not a clear `ValueError`.

        Raises:
            NonFiniteError: as `step_into`.
        """
        raise NotImplementedError

    def _step_in_place(self, params: Any, grads: Any) -> bool:
        """The in-place update; True when every new weight is finite."""
        raise NotImplementedError

    def adopt(self, buffers: dict[str, Any], step_count: int) -> None:
        """Make `buffers` (by name, as from `buffers()` or `step_into`) and
        `step_count` the current state; no data is copied."""
        for name in self._buffers:
            setattr(self, name, buffers.get(name))
        self.step_count = int(step_count)

    def _spare(self, spare: dict[str, Any], name: str, allocate: bool = True) -> Any:
        """The spare buffer `name` when it is reused (`(n,)` of this dtype);
        else a new one, or None when not `allocate`."""
        buf = spare.get(name)
        if buf is not None and tuple(buf.shape) == (self.n,) and np.dtype(buf.dtype) == self.dtype:
            return buf
        return self.backend.empty((self.n,), dtype=self.dtype) if allocate else None

    def _state(self) -> dict[str, Any]:
        """The state buffers created so far, by name (checked with the caller's)."""
        return {k: b for k, b in self.buffers().items() if b is not None}

    def buffers(self) -> dict[str, Any]:
        """The state buffers by name (SGD: `momentum_buffer`; Adam and AdamW:
        `exp_avg`, `exp_avg_sq`), each in the backend's memory, or None while
        not created yet (SGD's momentum before its first step).

        Returns:
            A new dict; the buffers themselves are not copied.
        """
        found = {}
        for name in self._buffers:
            found[name] = getattr(self, name)
        return found

    def set_buffer(self, name: str, buffer: Any) -> None:
        """Replace the state buffer `name` (one of `buffers()`) with `buffer`
        (`(n,)` in the backend's memory, or None: not created yet).

        Raises:
            ValueError: `name` is not one of this optimizer's buffers, or the
                buffer is not `(n,)` of the optimizer's dtype, not contiguous or
                read-only (nothing is changed).
            TypeError: not a buffer of the optimizer's backend.
        """
        if name not in self._buffers:
            raise ValueError(f"{type(self).__name__} has no buffer {name!r}")
        if buffer is not None:
            self._check_args(f"{type(self).__name__}.set_buffer", (), **{name: buffer})
        setattr(self, name, buffer)

    def state_dict(self) -> dict[str, Any]:
        """The state as host data: `kind` (config dict), `step` (int) and one
        ndarray per buffer. Suitable for `save_checkpoint`."""
        state: dict[str, Any] = {"kind": self.kind.to_config(), "step": self.step_count}
        for name in self._buffers:
            buf = getattr(self, name)
            if buf is not None:
                state[name] = np.asarray(self.backend.to_host(buf))
        return state

    def _required_buffers(self, kind: UpdateRule, step: int) -> tuple[str, ...]:
        """The buffers a state at `step` must hold (all of them, by default)."""
        return self._buffers

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state from `state_dict()` output (hyper-parameters are
        taken from `state["kind"]` too, so a learning-rate schedule survives).

        Raises:
            ValueError: another optimizer kind, hyper-parameters out of
                range in this optimizer's dtype, a step that is not a
                non-negative integer, a buffer missing that the step needs,
                or one `_checked_buffer` refuses (nothing is changed).
        """
        kind = type(self.kind).from_config(state["kind"])
        if kind.name != self.kind.name:
            raise ValueError(f"state is for {kind.name!r}, this optimizer is {self.kind.name!r}")
        kind.check_dtype(self.dtype)
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        loaded: dict[str, Any] = {}
        required = self._required_buffers(kind, int(step))
        for name in self._buffers:
            host = state.get(name)
            if host is None and name in required:
                raise ValueError(f"buffer {name!r} is missing at step {step}")
            loaded[name] = None if host is None else self._checked_buffer(name, host)
        self.kind = kind
        self.step_count = int(step)
        for name, buf in loaded.items():
            setattr(self, name, buf)

    def _checked_buffer(self, name: str, host: Any) -> Any:
        """The saved buffer `name` on this optimizer's backend, in its dtype.

        Raises:
            ValueError: the wrong shape, a value not finite in this dtype
                (`cast_finite`: 1e39 for float32, whatever dtype it was saved
                in), or a negative value in a buffer that cannot hold one.
        """
        host = np.asarray(host)
        if host.shape != (self.n,):
            raise ValueError(f"buffer {name!r} has shape {host.shape}, expected ({self.n},)")
        cast = cast_finite(host, self.dtype, f"the entries of buffer {name!r}", ValueError)
        if name in self._nonnegative_buffers and (cast < 0).any():
            raise ValueError(f"buffer {name!r} holds negative values")
        return self.backend.to_device(cast)


class Sgd(Optimizer):
    """torch.optim.SGD over a flat vector (see the module docstring).

    Attributes:
        momentum_buffer: the momentum buffer (None until the first step with
            momentum, as in torch).
    """

    _buffers = ("momentum_buffer",)

    def __init__(self, kind: UpdateRule, n: int, backend: Any, dtype: np.dtype) -> None:
        super().__init__(kind, n, backend, dtype)
        self.momentum_buffer: Any = None

    def _required_buffers(self, kind: UpdateRule, step: int) -> tuple[str, ...]:
        """The momentum buffer, once a step with momentum was taken (without
        it the next step would start the momentum afresh)."""
        return self._buffers if step > 0 and kind.momentum != 0.0 else ()

    def _step_in_place(self, params: Any, grads: Any) -> bool:
        self._check_args("Sgd.step", ("grads",), params=params, grads=grads, **self._state())
        k = self.kind
        step = self.step_count + 1
        if k.momentum != 0.0 and self.momentum_buffer is None:
            # torch creates the buffer on the first step as a copy of the gradient;
            # the kernel does the same when `step == 1`, so zeros suffice here.
            self.momentum_buffer = self.backend.zeros((self.n,), dtype=self.dtype)
            step = 1
        buf = params if self.momentum_buffer is None else self.momentum_buffer
        return bool(
            self.backend.sgd_step_unchecked(
                params,
                grads,
                buf,
                k.hyperparameters_at(self.step_count, self.dtype),
                step,
                params,
                buf,
            )
        )

    def step_into_unchecked(
        self, params: Any, grads: Any, params_out: Any, spare: dict[str, Any]
    ) -> dict[str, Any]:
        k = self.kind
        step = self.step_count + 1
        buf, out = self.momentum_buffer, None
        if k.momentum != 0.0:
            out = self._spare(spare, "momentum_buffer")
            if buf is None:  # torch's first step: the kernel ignores buf when step == 1
                buf, step = out, 1
        finite = self.backend.sgd_step_unchecked(
            params,
            grads,
            params if buf is None else buf,
            k.hyperparameters_at(self.step_count, self.dtype),
            step,
            params_out,
            params_out if out is None else out,
        )
        if not finite:
            raise self._non_finite(self.step_count + 1)
        return {"momentum_buffer": out if out is not None else self.momentum_buffer}


class Adam(Optimizer):
    """torch.optim.Adam / AdamW over a flat vector (see the module docstring).

    Attributes:
        exp_avg: first-moment buffer `m`.
        exp_avg_sq: second-moment buffer `v`.
    """

    _buffers = ("exp_avg", "exp_avg_sq")
    _nonnegative_buffers = ("exp_avg_sq",)

    def __init__(self, kind: UpdateRule, n: int, backend: Any, dtype: np.dtype) -> None:
        super().__init__(kind, n, backend, dtype)
        self.exp_avg: Any = backend.zeros((n,), dtype=dtype)
        self.exp_avg_sq: Any = backend.zeros((n,), dtype=dtype)

    def _step_in_place(self, params: Any, grads: Any) -> bool:
        self._check_args("Adam.step", ("grads",), params=params, grads=grads, **self._state())
        m, v = self.exp_avg, self.exp_avg_sq
        hyper, step = self.kind.hyperparameters_at(self.step_count, self.dtype), self.step_count + 1
        return bool(
            self.backend.adam_step_unchecked(params, grads, m, v, hyper, step, params, m, v)
        )

    def step_into_unchecked(
        self, params: Any, grads: Any, params_out: Any, spare: dict[str, Any]
    ) -> dict[str, Any]:
        m, v = self._spare(spare, "exp_avg"), self._spare(spare, "exp_avg_sq")
        finite = self.backend.adam_step_unchecked(
            params,
            grads,
            self.exp_avg,
            self.exp_avg_sq,
            self.kind.hyperparameters_at(self.step_count, self.dtype),
            self.step_count + 1,
            params_out,
            m,
            v,
        )
        if not finite:
            raise self._non_finite(self.step_count + 1)
        return {"exp_avg": m, "exp_avg_sq": v}
