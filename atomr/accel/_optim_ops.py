"""Backend's fused optimizer steps: torch.optim.SGD and Adam / AdamW.

A mixin of ``Backend`` (atomr/accel/backend.py): each checked op validates its
arguments, then calls the ``*_unchecked`` hook a backend implements.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from atomr.accel._ops_base import OpsBase
from atomr.accel.hyperparameters import AdamHyperparameters, SgdHyperparameters

__all__ = ["OptimOps"]


class OptimOps(OpsBase, abc.ABC):
    """``Backend``'s fused optimizer steps over flat parameter buffers.

    The checked ops validate, then call their ``*_unchecked`` hook (abstract
    here, implemented by each backend); "Unchecked entries" in ``Backend``'s
    docstring says when a caller may call a hook directly.
    """

    # ------------------------------------------------------------ optimizers

    def sgd_step(
        self,
        params: Any,
        grads: Any,
        momentum_buf: Any | None,
        hyperparameters: SgdHyperparameters,
        step: int,
        *,
        params_out: Any | None = None,
        momentum_out: Any | None = None,
    ) -> bool:
        """One fused torch.optim.SGD step over a flat parameter buffer, in place
        or (``params_out`` / ``momentum_out``) out of place.

        Args:
            params: the parameters, updated in place.
            grads: their gradients (read only), same shape.
            momentum_buf: the momentum buffer (same shape, updated in place); may be
                None when ``momentum == 0``. Its content is ignored on step 1 (torch's
                first-step rule ``buf = grad``), so it need not be zeroed.
            hyperparameters: lr, momentum, dampening, weight decay and nesterov,
                validated when they were built, and here in the buffers' dtype
                (``SgdHyperparameters.check_dtype``).
            step: the 1-based step number (1 on the first step).
            params_out: where the new parameters go (same shape; default ``params``):
                out of place, ``params`` is read only.
            momentum_out: where the new momentum buffer goes (default ``momentum_buf``).
                With ``params_out``, the inputs are left as they were and the results
                are bit-identical to the in-place step's.

        Returns:
            True when every new parameter is finite (checked in the same pass;
            the results are written either way).

        Raises:
            TypeError: wrong array type or dtype, or ``hyperparameters`` is not an
                ``SgdHyperparameters``.
            ValueError: a hyperparameter infinite in the buffers' dtype, shapes
                differ, not contiguous, a step below 1, missing buffer,
                or an output sharing memory with a buffer it is not the in-place
                update of (``params`` or ``momentum_buf`` sharing ``grads``'s memory,
                the two sharing each other's, ``params_out`` sharing any buffer but
                ``params``, ``momentum_out`` any but ``momentum_buf``); nothing is
                written then.
        """
        if not isinstance(hyperparameters, SgdHyperparameters):
            raise TypeError(
                "sgd_step: hyperparameters must be an SgdHyperparameters,"
                f" got {type(hyperparameters).__name__}"
            )
        _step_number("sgd_step", step)
        if hyperparameters.momentum != 0 and momentum_buf is None:
            raise ValueError("sgd_step: momentum != 0 needs a momentum_buf")
        bufs: dict[str, Any] = {"params": params, "grads": grads}
        if momentum_buf is not None:
            bufs["momentum_buf"] = momentum_buf
        if params_out is not None:
            bufs["params_out"] = params_out
        if momentum_out is not None:
            if momentum_buf is None:
                raise ValueError("sgd_step: momentum_out needs a momentum_buf")
            bufs["momentum_out"] = momentum_out
        read_only = ["grads"] + ["params"] * (params_out is not None)
        read_only += ["momentum_buf"] * (momentum_out is not None)
        in_place = {"params_out": "params", "momentum_out": "momentum_buf"}
        self.validate("sgd_step", read_only=read_only, in_place=in_place, **bufs)
        self._same_shape("sgd_step", *bufs.items())
        _in_dtype("sgd_step", hyperparameters, params)
        flat_p = self._flat(params)
        flat_buf = self._flat(momentum_buf) if momentum_buf is not None else flat_p
        out_p = self._flat(params_out) if params_out is not None else flat_p
        out_buf = self._flat(momentum_out) if momentum_out is not None else flat_buf
        if momentum_buf is None:
            out_buf = out_p
        return self.sgd_step_unchecked(
            flat_p, self._flat(grads), flat_buf, hyperparameters, step, out_p, out_buf
        )

    @abc.abstractmethod
    def sgd_step_unchecked(
        self,
        p: Any,
        g: Any,
        buf: Any,
        hyper: SgdHyperparameters,
        step: int,
        p_out: Any,
        buf_out: Any,
    ) -> bool:
        """``sgd_step`` without the checks, on flat buffers; every output given (the input itself for in place; ``buf`` and ``buf_out`` may be ``p`` and ``p_out`` when momentum is 0). See "Unchecked entries" in the class docstring."""

    def adam_step(
        self,
        params: Any,
        grads: Any,
        exp_avg: Any,
        exp_avg_sq: Any,
        hyperparameters: AdamHyperparameters,
        step: int,
        *,
        params_out: Any | None = None,
        exp_avg_out: Any | None = None,
        exp_avg_sq_out: Any | None = None,
    ) -> bool:
        """One fused torch.optim.Adam (or AdamW, ``decoupled=True``) step, in place
        or (the ``*_out`` buffers) out of place.

        Adam adds ``weight_decay * p`` to the gradient (coupled L2); AdamW first
        scales ``p *= 1 - lr * weight_decay``. See ``atomr.accel.kernels.optim``
        for the exact formulas.

        Args:
            params: the parameters, updated in place.
            grads: their gradients (read only), same shape.
            exp_avg: first moment m (zeros before step 1), updated in place.
            exp_avg_sq: second moment v (zeros before step 1), updated in place.
            hyperparameters: lr, betas, eps, weight decay and ``decoupled``,
                validated when they were built, and here in the buffers' dtype
                (``AdamHyperparameters.check_dtype``).
            step: the 1-based step number t used in the bias corrections.
            params_out, exp_avg_out, exp_avg_sq_out: where the new parameters and
                moments go (same shape; each defaults to its input, in place). Out of
                place, the inputs are left as they were and the results are
                bit-identical to the in-place step's.

        Returns:
            True when every new parameter is finite (checked in the same pass;
            the results are written either way).

        Raises:
            TypeError: wrong array type or dtype, or ``hyperparameters`` is not an
                ``AdamHyperparameters``.
            ValueError: a hyperparameter (or coefficient) infinite in the buffers'
                dtype, shapes differ, not contiguous, a step below 1, or an output
                sharing memory with a buffer it is not the in-place update of
                (``params``, ``exp_avg`` or ``exp_avg_sq`` sharing ``grads``'s memory
                or one another's; ``params_out`` any buffer but ``params``,
                ``exp_avg_out`` any but ``exp_avg``, ``exp_avg_sq_out`` any but
                ``exp_avg_sq``); nothing is written then.
        """
        if not isinstance(hyperparameters, AdamHyperparameters):
            raise TypeError(
                "adam_step: hyperparameters must be an AdamHyperparameters,"
                f" got {type(hyperparameters).__name__}"
            )
        _step_number("adam_step", step)
        bufs = {"params": params, "grads": grads, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        outs = {"params": params_out, "exp_avg": exp_avg_out, "exp_avg_sq": exp_avg_sq_out}
        for name, out in outs.items():
            if out is not None:
                bufs[f"{name}_out"] = out
        read_only = ["grads"] + [name for name, out in outs.items() if out is not None]
        in_place = {f"{name}_out": name for name in outs}
        self.validate("adam_step", read_only=read_only, in_place=in_place, **bufs)
        self._same_shape("adam_step", *bufs.items())
        _in_dtype("adam_step", hyperparameters, params)
        flat = {name: self._flat(bufs[name] if out is None else out) for name, out in outs.items()}
        return self.adam_step_unchecked(
            self._flat(params),
            self._flat(grads),
            self._flat(exp_avg),
            self._flat(exp_avg_sq),
            hyperparameters,
            step,
            flat["params"],
            flat["exp_avg"],
            flat["exp_avg_sq"],
        )

    @abc.abstractmethod
    def adam_step_unchecked(
        self,
        p: Any,
        g: Any,
        m: Any,
        v: Any,
        hyper: AdamHyperparameters,
        step: int,
        p_out: Any,
        m_out: Any,
        v_out: Any,
    ) -> bool:
        """``adam_step`` without the checks, on flat buffers; every output given (the input itself for in place). See "Unchecked entries" in the class docstring."""


def _step_number(op: str, step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 1:
        raise ValueError(f"{op}: step must be an int >= 1 (1-based), got {step!r}")


def _in_dtype(op: str, hyper: SgdHyperparameters | AdamHyperparameters, params: Any) -> None:
    """Raises: ValueError: `hyper` cannot be used in `params`'s dtype
    (`check_dtype`), the message naming `op`."""
    try:
        hyper.check_dtype(params.dtype)
    except ValueError as exc:
        raise ValueError(f"{op}: {exc}") from None
