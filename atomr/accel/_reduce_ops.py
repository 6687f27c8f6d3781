"""Backend's blas-1 ops and reductions: axpy, scale, sum_into, sum_scale_norm, squared_norm.

A mixin of ``Backend`` (atomr/accel/backend.py): each checked op validates its
arguments, then calls the ``*_unchecked`` hook a backend implements.
"""

from __future__ import annotations

import abc
import math
import reprlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr._arguments import real_as_float
from atomr.accel._ops_base import OpsBase
from atomr.accel.hyperparameters import finite_in

__all__ = ["ReduceOps"]


class ReduceOps(OpsBase, abc.ABC):
    """``Backend``'s blas-1 and reduction ops (gradient all-reduce and clipping).

    The checked ops validate, then call their ``*_unchecked`` hook (abstract
    here, implemented by each backend); "Unchecked entries" in ``Backend``'s
    docstring says when a caller may call a hook directly.
    """

    # ------------------------------------------------------------ blas-1 and reductions

    def axpy(self, alpha: float, x: Any, y: Any) -> None:
        """``y += alpha * x``.

        Args:
            alpha: the scale.
            x: any shape.
            y: same shape, updated in place.

        Raises:
            TypeError: wrong array type or dtype, alpha not a real number.
            ValueError: shapes differ, not contiguous.
        """
        self.validate("axpy", x=x, y=y, read_only=("x",))
        self._same_shape("axpy", ("x", x), ("y", y))
        self.axpy_unchecked(_real("axpy", "alpha", alpha, y.dtype), self._flat(x), self._flat(y))

    @abc.abstractmethod
    def axpy_unchecked(self, alpha: Any, x: Any, y: Any) -> None:
        """``axpy`` without the checks, on flat buffers; ``alpha`` a scalar of their dtype. See "Unchecked entries" in the class docstring."""

    def scale(self, x: Any, alpha: float) -> None:
        """``x *= alpha`` in place.

        Args:
            x: any shape.
            alpha: the scale.

        Raises:
            TypeError: wrong array type or dtype, alpha not a real number.
            ValueError: not contiguous.
        """
        self.validate("scale", x=x)
        self.scale_unchecked(self._flat(x), _real("scale", "alpha", alpha, x.dtype))

    @abc.abstractmethod
    def scale_unchecked(self, x: Any, alpha: Any) -> None:
        """``scale`` without the checks, on a flat buffer; ``alpha`` a scalar of its dtype. See "Unchecked entries" in the class docstring."""

    def sum_into(self, out: Any, buffers: Sequence[Any]) -> None:
        """``out = sum(buffers)`` element-wise (the reference all-reduce),
        added in float64 in the buffers' order and rounded once to out's dtype.

        Args:
            out: written; may be one of ``buffers``.
            buffers: one or more buffers of out's shape and dtype.

        Raises:
            TypeError: wrong array type or dtype, buffers not a sequence.
            ValueError: no buffers, shapes differ, not contiguous.
        """
        if not isinstance(buffers, Sequence) or isinstance(buffers, str | bytes):
            raise TypeError(
                f"sum_into: buffers must be a list or tuple, got {type(buffers).__name__}"
            )
        if len(buffers) == 0:
            raise ValueError("sum_into: needs at least one buffer")
        named = {f"buffers[{k}]": b for k, b in enumerate(buffers)}
        self.validate("sum_into", out=out, read_only=tuple(named), **named)
        self._same_shape("sum_into", ("out", out), *named.items())
        self.sum_into_unchecked(self._flat(out), [self._flat(b) for b in buffers])

    @abc.abstractmethod
    def sum_into_unchecked(self, out: Any, buffers: Sequence[Any]) -> None:
        """``sum_into`` on trusted flat buffers (see "Unchecked entries")."""

    def sum_scale_norm(self, out: Any, buffers: Sequence[Any], alpha: float) -> float:
        """``out = sum(buffers) * alpha`` and its ``sum(out^2)`` (float64), fused.

        The bits of ``out`` equal ``sum_into(out, buffers)`` then
        ``scale(out, alpha)``; the returned value is ``squared_norm(out)`` up to
        the order of the float64 additions. ``sum_scale_norm(g, [g], s)``
        scales ``g`` in place and measures it in one pass.

        Args:
            out: written; may be one of ``buffers``.
            buffers: one or more buffers of out's shape and dtype.
            alpha: the scale.

        Returns:
            ``sum(out^2)`` as a Python float (inf or NaN when not finite).

        Raises:
            TypeError: wrong array type or dtype, buffers not a sequence,
                alpha not a real number.
            ValueError: no buffers, shapes differ, not contiguous.
        """
        if not isinstance(buffers, Sequence) or isinstance(buffers, str | bytes):
            raise TypeError(
                f"sum_scale_norm: buffers must be a list or tuple, got {type(buffers).__name__}"
            )
        if len(buffers) == 0:
            raise ValueError("sum_scale_norm: needs at least one buffer")
        named = {f"buffers[{k}]": b for k, b in enumerate(buffers)}
        self.validate("sum_scale_norm", out=out, read_only=tuple(named), **named)
        self._same_shape("sum_scale_norm", ("out", out), *named.items())
        scalar = _real("sum_scale_norm", "alpha", alpha, out.dtype)
        flats = [self._flat(b) for b in buffers]
        return float(self.sum_scale_norm_unchecked(self._flat(out), flats, scalar))

    @abc.abstractmethod
    def sum_scale_norm_unchecked(self, out: Any, buffers: Sequence[Any], alpha: Any) -> float:
        """``sum_scale_norm`` on trusted flat buffers, ``alpha`` a scalar of their
        dtype; returns the raw sum (see "Unchecked entries")."""

    def squared_norm(self, x: Any) -> float:
        """``sum(x^2)`` accumulated in float64 (gradient clipping: norm = sqrt of it).

        Args:
            x: any shape.

        Returns:
            The sum as a Python float.

        Raises:
            TypeError: wrong array type or dtype.
            ValueError: not contiguous.
        """
        self.validate("squared_norm", x=x, read_only=("x",))
        return float(self.squared_norm_unchecked(self._flat(x)))

    @abc.abstractmethod
    def squared_norm_unchecked(self, x: Any) -> float:
        """``squared_norm`` without the checks, on a flat buffer. See "Unchecked entries" in the class docstring."""


def _real(op: str, name: str, value: Any, dtype: np.dtype[Any]) -> Any:
    """``value`` as a finite scalar of ``dtype`` (the buffers').

    Raises:
        TypeError: not a real number (a bool included).
        ValueError: NaN or infinite, an int beyond float's range, or a value
            infinite in ``dtype`` (``1e39`` for float32 buffers).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{op}: {name} must be a real number, got {type(value).__name__}")
    v = real_as_float(value)
    if not math.isfinite(v):
        shown = reprlib.repr(value) if isinstance(value, int) else v
        raise ValueError(f"{op}: {name} must be finite, got {shown}")
    if not finite_in(v, dtype):
        raise ValueError(f"{op}: {name}={v} is infinite in {dtype}, the buffers' dtype")
    return dtype.type(v)
