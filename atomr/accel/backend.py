"""The Backend facade: the kernels of one device behind one set of methods.

``backend_for(device)`` gives a ``CpuBackend`` (NumPy arrays) or a
``CudaBackend`` (numba device arrays). Both have the same methods and give
the same results (float tolerance); every op writes into caller-provided
buffers. This base class validates the arguments (types, dtypes, shapes,
contiguity) with clear ``TypeError`` / ``ValueError`` messages before any
launch, then calls the subclass's ``_op`` implementation.

The ops are grouped by family into mixins that ``Backend`` inherits, in
the private modules beside this one: ``_dense_ops`` (matmul, bias,
activations), ``_loss_ops``, ``_reduce_ops`` (blas-1 and reductions) and
``_optim_ops`` (optimizer steps).

Buffers are float32. The CPU backend also accepts float64 (all float
buffers of one call must then share it), so that finite-difference gradient
checks can run in double precision; the CUDA backend is float32 only.
Buffers must be C-contiguous. Labels are any integer dtype.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from atomr.accel._dense_ops import DenseOps
from atomr.accel._loss_ops import LossOps
from atomr.accel._optim_ops import OptimOps
from atomr.accel._reduce_ops import ReduceOps
from atomr.accel.device import Device, cuda_device_count
from atomr.accel.kernels.elementwise import ACTIVATIONS

__all__ = ["ACTIVATIONS", "Backend", "backend_for"]


class Backend(DenseOps, LossOps, ReduceOps, OptimOps, abc.ABC):
    """The kernels and memory of one device. Use ``backend_for(device)`` to get one.

    All ops validate their inputs first and raise ``TypeError`` (wrong array type
    or dtype) or ``ValueError`` (wrong shape, non-contiguous, read-only, bad
    argument value) without touching any buffer.

    Unchecked entries: each op ``name`` is ``validate``, then
    ``name_unchecked``, which launches the kernel at once. A caller that made
    and shaped its buffers itself (a model's forward and backward over its own
    parameters and activations, a loss on the model's output with targets
    validated at the trainer's boundary, an optimizer over buffers it checked
    once) may call ``name_unchecked`` directly and skip the checks it already
    knows hold. Such a caller guarantees what the checks would: buffers of this
    backend, C-contiguous, of one float dtype, shapes that fit, writable
    outputs that do not overlap the inputs where the op forbids it; element-wise
    ops and reductions take flat (1-D) buffers and scalars of the buffers'
    dtype. Nothing is checked, so a wrong argument may give wrong numbers or a
    numba error instead of a clear ``TypeError`` / ``ValueError``: users'
    code should call the checked ops.
    """

    #: the float dtypes this backend computes in (float32 first: the default)
    float_dtypes: tuple[np.dtype[Any], ...] = (np.dtype(np.float32),)

    def __init__(self, device: Device) -> None:
        self.device = device

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device})"

    # ------------------------------------------------------------ subclass hooks

    @abc.abstractmethod
    def _is_buffer(self, x: Any) -> bool:
        """True when ``x`` is this backend's array type."""

    @abc.abstractmethod
    def _is_contiguous(self, x: Any) -> bool:
        """True when ``x`` is C-contiguous."""

    def _is_writeable(self, x: Any) -> bool:
        """True when ``x`` may be written (NumPy's flag; device arrays always)."""
        return True

    @abc.abstractmethod
    def _address(self, x: Any) -> int:
        """The address of ``x``'s first element (host or device memory)."""

    def _overlaps(self, x: Any, y: Any) -> bool:
        """True when the (contiguous) buffers ``x`` and ``y`` share memory."""
        if x.nbytes == 0 or y.nbytes == 0:
            return False
        x0, y0 = self._address(x), self._address(y)
        return x0 < y0 + y.nbytes and y0 < x0 + x.nbytes

    def _same_memory(self, x: Any, y: Any) -> bool:
        """True when the (contiguous) buffers ``x`` and ``y`` are the same memory."""
        return x.nbytes == y.nbytes and self._address(x) == self._address(y)

    _buffer_kind = "array"

    # ------------------------------------------------------------ memory

    @abc.abstractmethod
    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """An uninitialised buffer on this device.

        Args:
            shape: the shape.
            dtype: the element type (float32 by default; integer types for labels).

        Returns:
            The buffer.
        """

    @abc.abstractmethod
    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A zero-filled buffer on this device.

        Args:
            shape: the shape.
            dtype: the element type.

        Returns:
            The buffer.
        """

    @abc.abstractmethod
    def to_device(self, host: Any) -> Any:
        """Copy a host array (anything ``np.asarray`` takes) into a new buffer on this device.

        Args:
            host: the data; made C-contiguous, dtype kept.

        Returns:
            A new buffer that shares no memory with ``host``.
        """

    @abc.abstractmethod
    def to_host(self, buf: Any) -> np.ndarray:
        """Copy a buffer of this device into a new NumPy array.

        Args:
            buf: the buffer.

        Returns:
            A new array that shares no memory with ``buf``.

        Raises:
            TypeError: buf is not this backend's array type.
        """

    def copy(self, src: Any, dst: Any) -> None:
        """``dst[...] = src`` between two buffers of this device.

        Args:
            src: the source buffer.
            dst: the destination, same shape and dtype.

        Raises:
            TypeError: not buffers of this backend, or dtypes differ.
            ValueError: shapes differ, or a buffer is not contiguous.
        """
        self.validate("copy", src=src, dst=dst, any_dtype=True, read_only=("src",))
        self._same_shape("copy", ("src", src), ("dst", dst))
        self.copy_unchecked(src, dst)

    @abc.abstractmethod
    def copy_unchecked(self, src: Any, dst: Any) -> None:
        """``copy`` without the checks: ``dst[...] = src``. See "Unchecked entries" in the class docstring."""

    def upload(self, host: np.ndarray, dst: Any) -> None:
        """``dst[...] = host``: a host array written into a buffer of this
        device in one copy (``copy(to_device(host), dst)`` makes two).

        Args:
            host: a C-contiguous NumPy array of ``dst``'s dtype and shape
                (copied: ``dst`` never aliases it).
            dst: the destination buffer.

        Raises:
            TypeError: ``host`` is no NumPy array, ``dst`` no buffer of this
                backend, or their dtypes differ.
            ValueError: shapes differ, ``host`` or ``dst`` is not contiguous,
                or ``dst`` is read-only.
        """
        self.validate("upload", any_dtype=True, dst=dst)
        if not isinstance(host, np.ndarray):
            raise TypeError(
                f"upload: host must be a NumPy array of {dst.dtype}, got "
                f"{type(host).__name__} (no NumPy array)"
            )
        if host.dtype != dst.dtype:
            raise TypeError(f"upload: host must be a NumPy array of {dst.dtype}, got {host.dtype}")
        if host.shape != tuple(dst.shape):
            raise ValueError(f"upload: host must be of shape {tuple(dst.shape)}, got {host.shape}")
        if not host.flags.c_contiguous:
            raise ValueError("upload: host must be C-contiguous (a transposed or sliced view?)")
        self.upload_unchecked(host, dst)

    @abc.abstractmethod
    def upload_unchecked(self, host: np.ndarray, dst: Any) -> None:
        """``upload`` without the checks. See "Unchecked entries" in the class docstring."""

    def synchronize(self) -> None:
        """Wait until all work queued on this device is done (a no-op on the CPU)."""
        return None

    # ------------------------------------------------------------ validation helpers

    def _flat(self, x: Any) -> Any:
        """A 1-D view of a contiguous buffer."""
        return x.reshape(-1) if x.ndim != 1 else x

    def validate(
        self,
        op: str,
        any_dtype: bool = False,
        read_only: Collection[str] = (),
        in_place: Mapping[str, str] | None = None,
        **buffers: Any,
    ) -> None:
        """Check the buffers of one call of op ``op`` (what every checked op does first).

        Args:
            op: the op's name, for the messages.
            any_dtype: accept any dtype (else only ``float_dtypes``); all must share one.
            read_only: the names of the buffers the op only reads (the others
                must be writable).
            in_place: for an op whose outputs each update one input (an
                optimizer), each output's name to the one input it may be;
                see ``_check_aliasing``.
            **buffers: the buffers by name.

        Raises:
            TypeError: not a buffer of this backend, a dtype not accepted, or
                mixed dtypes.
            ValueError: not C-contiguous, a buffer to write that is read-only, or
                one that shares memory with another buffer of the call (see
                ``_check_aliasing``).
        """
        dtype = None
        for name, x in buffers.items():
            if not self._is_buffer(x):
                raise TypeError(
                    f"{op}: {name} must be a {self._buffer_kind} for {self.device},"
                    f" got {type(x).__name__}"
                )
            if not any_dtype and x.dtype not in self.float_dtypes:
                accepted = " or ".join(str(d) for d in self.float_dtypes)
                raise TypeError(
                    f"{op}: {name} has dtype {x.dtype}; {type(self).__name__} accepts {accepted}"
                )
            if dtype is None:
                dtype = x.dtype
            elif x.dtype != dtype:
                raise TypeError(
                    f"{op}: mixed dtypes: {name} is {x.dtype} but"
                    f" {next(iter(buffers))} is {dtype}; use one dtype for all buffers"
                )
            if not self._is_contiguous(x):
                raise ValueError(
                    f"{op}: {name} is not C-contiguous (a transposed or sliced view?);"
                    " pass a contiguous copy"
                )
            if name not in read_only and not self._is_writeable(x):
                raise ValueError(f"{op}: {name} is read-only")
        self._check_aliasing(op, read_only, buffers, in_place)

    def _check_aliasing(
        self,
        op: str,
        read_only: Collection[str],
        buffers: dict[str, Any],
        in_place: Mapping[str, str] | None = None,
    ) -> None:
        """A buffer the op writes may be the very buffer of an input it only
        reads (same memory, same shape: in place, as ``activation_forward(k, x,
        x)``), and must share no memory with any other buffer of the call:
        the kernels run element by element (in parallel on CUDA), so a shifted
        or partial overlap, or two outputs in one memory, gives wrong numbers.

        With ``in_place`` (output name -> input name), an output may be only
        the input it is the in-place update of (``params_out`` may be
        ``params``), and an output not named there may be no input at all:
        an optimizer's moment or weights written over its gradient would
        destroy a read-only input and make the result depend on the order of
        the stores.

        Raises:
            ValueError: naming the two buffers.
        """
        if len(buffers) < 2:
            return
        items = list(buffers.items())
        for k, (name, x) in enumerate(items):
            if name in read_only:
                continue
            for j, (other, y) in enumerate(items):
                if j == k or (j < k and other not in read_only):
                    continue  # itself, or a pair of outputs checked from the first
                if not self._overlaps(x, y):
                    continue
                allowed = other in read_only and (in_place is None or in_place.get(name) == other)
                if allowed and tuple(x.shape) == tuple(y.shape) and self._same_memory(x, y):
                    continue
                raise ValueError(_aliasing_message(op, name, other, in_place))

    @staticmethod
    def _ndim(op: str, ndim: int, **buffers: Any) -> None:
        for name, x in buffers.items():
            if x.ndim != ndim:
                raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(x.shape)}")

    @staticmethod
    def _same_shape(op: str, *named: tuple[str, Any]) -> None:
        (first_name, first), *rest = named
        for name, x in rest:
            if tuple(x.shape) != tuple(first.shape):
                raise ValueError(
                    f"{op}: {name} has shape {tuple(x.shape)} but {first_name} has"
                    f" shape {tuple(first.shape)}; they must match"
                )


def _aliasing_message(op: str, name: str, other: str, in_place: Mapping[str, str] | None) -> str:
    """The refusal of ``_check_aliasing``: ``name`` shares memory with ``other``."""
    if in_place is None:
        rule = "an output may be its input itself (in place) but must not overlap any other buffer"
    elif name in in_place:
        rule = f"{name} may be {in_place[name]} itself (in place) but no other buffer"
    else:
        rule = f"{name} is updated in place and must share no memory with any other buffer"
    return f"{op}: {name} shares memory with {other}; {rule}"


_BACKENDS: dict[Device, Backend] = {}


def backend_for(device: Device | str) -> Backend:
    """The Backend of a device (one instance per device, created on first use).

    Args:
        device: a Device or a name such as "cpu:0" or "cuda:0".

    Returns:
        A ``CpuBackend`` for "cpu:N", a ``CudaBackend`` for "cuda:N".

    Raises:
        ValueError: unknown device name, or a CUDA device this machine does not
            have (the message says how many there are).
    """
    dev = Device.parse(device)
    found = _BACKENDS.get(dev)
    if found is not None:
        return found
    backend: Backend
    if dev.is_cpu:
        from atomr.accel.cpu_backend import CpuBackend

        backend = CpuBackend(dev)
    else:
        count = cuda_device_count()
        if dev.index >= count:
            raise ValueError(
                f"no such device {dev}: this machine has {count} CUDA device(s)"
                + ("" if count else " (numba.cuda is not available; use a cpu device)")
            )
        from atomr.accel.cuda_backend import CudaBackend

        backend = CudaBackend(dev)
    return _BACKENDS.setdefault(dev, backend)
