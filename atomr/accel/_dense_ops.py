"""Backend's dense-layer ops: matmul, bias add and gradient, activations.

A mixin of ``Backend`` (atomr/accel/backend.py): each checked op validates its
arguments, then calls the ``*_unchecked`` hook a backend implements.
"""

from __future__ import annotations

import abc
from typing import Any

from atomr._arguments import bool_flag
from atomr.accel._ops_base import OpsBase
from atomr.accel.kernels.elementwise import ACTIVATIONS

__all__ = ["DenseOps"]


class DenseOps(OpsBase, abc.ABC):
    """``Backend``'s matmul, bias and activation ops.

    The checked ops validate, then call their ``*_unchecked`` hook (abstract
    here, implemented by each backend); "Unchecked entries" in ``Backend``'s
    docstring says when a caller may call a hook directly.
    """

    # ------------------------------------------------------------ matmul

    def matmul(
        self,
        a: Any,
        b: Any,
        out: Any,
        trans_a: bool = False,
        trans_b: bool = False,
        accumulate: bool = False,
    ) -> None:
        """``out (+)= op(a) @ op(b)``, op the transpose when ``trans_*`` is set.

        Args:
            a: 2-D, (m, k), or (k, m) with trans_a.
            b: 2-D, (k, n), or (n, k) with trans_b.
            out: 2-D (m, n), written (or added to with ``accumulate``); must not
                overlap a or b.
            trans_a: use a.T.
            trans_b: use b.T.
            accumulate: add to ``out`` instead of overwriting it.

        Raises:
            TypeError: wrong array type or dtype, mixed dtypes, a flag that is
                not True or False.
            ValueError: not 2-D, inner or output dimensions mismatch, not contiguous,
                out overlaps a or b.
        """
        trans_a = bool_flag("matmul: trans_a", trans_a)
        trans_b = bool_flag("matmul: trans_b", trans_b)
        accumulate = bool_flag("matmul: accumulate", accumulate)
        self.validate("matmul", a=a, b=b, out=out, read_only=("a", "b"))
        self._ndim("matmul", 2, a=a, b=b, out=out)
        m, ka = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
        kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
        if ka != kb:
            raise ValueError(
                f"matmul: inner dimensions differ: op(a) is ({m}, {ka}), op(b) is ({kb}, {n})"
                f" (trans_a={trans_a}, trans_b={trans_b})"
            )
        if tuple(out.shape) != (m, n):
            raise ValueError(f"matmul: out has shape {tuple(out.shape)}, expected ({m}, {n})")
        for name, x in (("a", a), ("b", b)):
            if self._overlaps(out, x):
                raise ValueError(f"matmul: out overlaps {name}; write to a separate buffer")
        self.matmul_unchecked(a, b, out, trans_a, trans_b, accumulate)

    @abc.abstractmethod
    def matmul_unchecked(
        self, a: Any, b: Any, out: Any, trans_a: bool, trans_b: bool, accumulate: bool
    ) -> None:
        """``matmul`` without the checks. See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ bias

    def bias_add(self, x: Any, bias: Any) -> None:
        """``x[i, :] += bias`` in place.

        Args:
            x: 2-D (n, f).
            bias: 1-D (f,).

        Raises:
            TypeError: wrong array type or dtype.
            ValueError: shapes do not match, not contiguous.
        """
        self.validate("bias_add", x=x, bias=bias, read_only=("bias",))
        self._ndim("bias_add", 2, x=x)
        self._ndim("bias_add", 1, bias=bias)
        if bias.shape[0] != x.shape[1]:
            raise ValueError(
                f"bias_add: bias has shape {tuple(bias.shape)}, expected ({x.shape[1]},)"
                f" for x of shape {tuple(x.shape)}"
            )
        self.bias_add_unchecked(x, bias)

    @abc.abstractmethod
    def bias_add_unchecked(self, x: Any, bias: Any) -> None:
        """``bias_add`` without the checks. See "Unchecked entries" in the class docstring."""

    def bias_grad(self, dy: Any, out: Any, accumulate: bool = False) -> None:
        """``out (+)= dy.sum(axis=0)``: the bias gradient.

        Args:
            dy: 2-D (n, f), the gradient of the layer output.
            out: 1-D (f,).
            accumulate: add to ``out`` instead of overwriting it.

        Raises:
            TypeError: wrong array type or dtype, accumulate not True or False.
            ValueError: shapes do not match, not contiguous.
        """
        accumulate = bool_flag("bias_grad: accumulate", accumulate)
        self.validate("bias_grad", dy=dy, out=out, read_only=("dy",))
        self._ndim("bias_grad", 2, dy=dy)
        self._ndim("bias_grad", 1, out=out)
        if out.shape[0] != dy.shape[1]:
            raise ValueError(
                f"bias_grad: out has shape {tuple(out.shape)}, expected ({dy.shape[1]},)"
            )
        self.bias_grad_unchecked(dy, out, accumulate)

    @abc.abstractmethod
    def bias_grad_unchecked(self, dy: Any, out: Any, acc: bool) -> None:
        """``bias_grad`` without the checks. See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ activations

    def activation_forward(self, kind: str, x: Any, out: Any) -> None:
        """``out = f(x)``, f one of identity, relu, tanh, gelu (tanh approximation).

        Args:
            kind: the activation's name.
            x: any shape.
            out: same shape as x (may be x itself).

        Raises:
            ValueError: unknown kind, shapes differ, not contiguous.
            TypeError: wrong array type or dtype.
        """
        code = self._activation("activation_forward", kind)
        self.validate("activation_forward", x=x, out=out, read_only=("x",))
        self._same_shape("activation_forward", ("x", x), ("out", out))
        self.activation_forward_unchecked(code, self._flat(x), self._flat(out))

    def activation_backward(self, kind: str, x: Any, dy: Any, dx: Any) -> None:
        """``dx = dy * f'(x)``, x the pre-activation.

        Args:
            kind: the activation's name.
            x: the pre-activation, any shape.
            dy: the gradient of the activation's output, same shape.
            dx: written, same shape (may be dy itself).

        Raises:
            ValueError: unknown kind, shapes differ, not contiguous.
            TypeError: wrong array type or dtype.
        """
        code = self._activation("activation_backward", kind)
        self.validate("activation_backward", x=x, dy=dy, dx=dx, read_only=("x", "dy"))
        self._same_shape("activation_backward", ("x", x), ("dy", dy), ("dx", dx))
        self.activation_backward_unchecked(code, self._flat(x), self._flat(dy), self._flat(dx))

    @abc.abstractmethod
    def activation_forward_unchecked(self, code: int, x: Any, out: Any) -> None:
        """``activation_forward`` without the checks, on flat buffers; ``code`` is ``ACTIVATIONS[kind]``. See "Unchecked entries" in the class docstring."""

    @abc.abstractmethod
    def activation_backward_unchecked(self, code: int, x: Any, dy: Any, dx: Any) -> None:
        """``activation_backward`` without the checks, on flat buffers; ``code`` is ``ACTIVATIONS[kind]``. See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ validation helpers

    def _activation(self, op: str, kind: str) -> int:
        if not isinstance(kind, str) or kind.lower() not in ACTIVATIONS:
            raise ValueError(
                f"{op}: unknown activation {kind!r}; expected one of {', '.join(ACTIVATIONS)}"
            )
        return ACTIVATIONS[kind.lower()]
