"""What the op-family mixins of ``Backend`` rely on, declared for type checkers.

``Backend`` (atomr/accel/backend.py) inherits its ops from one mixin per family:
``DenseOps`` (matmul, bias, activations), ``LossOps``, ``ReduceOps`` (blas-1 and
reductions) and ``OptimOps`` (optimizer steps). Each checked op validates its
arguments with ``Backend``'s validation helpers and subclass hooks; ``OpsBase``
declares those for mypy only (under ``TYPE_CHECKING``), so at run time every
name resolves to ``Backend``'s (or its subclass's) own definition.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

__all__ = ["OpsBase"]


class OpsBase:
    """The base of ``Backend``'s op mixins: the helpers they call, which
    ``Backend`` defines. Each mixin is also an ``abc.ABC``, so that its
    abstract ``*_unchecked`` hooks stay abstract in ``Backend``."""

    if TYPE_CHECKING:

        def validate(
            self,
            op: str,
            any_dtype: bool = False,
            read_only: Collection[str] = (),
            in_place: Mapping[str, str] | None = None,
            **buffers: Any,
        ) -> None: ...

        def _is_buffer(self, x: Any) -> bool: ...

        def to_host(self, buf: Any) -> Any: ...

        def _overlaps(self, x: Any, y: Any) -> bool: ...

        def _check_aliasing(
            self,
            op: str,
            read_only: Collection[str],
            buffers: dict[str, Any],
            in_place: Mapping[str, str] | None = None,
        ) -> None: ...

        def _flat(self, x: Any) -> Any: ...

        @staticmethod
        def _ndim(op: str, ndim: int, **buffers: Any) -> None: ...

        @staticmethod
        def _same_shape(op: str, *named: tuple[str, Any]) -> None: ...
