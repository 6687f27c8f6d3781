"""Where `fit` takes its batches from: arrays, map-style datasets, or any
iterable of batches.

- **Arrays** `(features, labels)`: each epoch is shuffled with
  `epoch_order(n, seed, epoch)` and cut into `batch_bounds`.
- **A map-style dataset**: an object with `__len__` and either
  `get_batch(indices) -> (features, labels)` or `__getitem__(i) ->
  (features, label)` (one sample; `fit` stacks them). It is shuffled and cut
  exactly as arrays of the same length are, so the same seed gives the same
  batches.
- **Any other iterable** of `(features, labels)` batches (a list, a
  generator function's result...), or a callable `epoch -> iterable`: taken
  as it comes, once per epoch (an iterable that is its own iterator, such as
  a generator, cannot be read twice: pass the callable). `fit` does not
  shuffle it, nor drop its short batches (`drop_last` is refused);
  resuming mid-epoch skips the batches already trained on.

Every batch is checked: features and labels of equal length, as many of each
as `get_batch` was given indices, every batch's sample shape like the first
one's. A bad dataset gives an `InvalidDataError` (a `ValueError`) that names
the sample or batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from atomr._arguments import bool_flag, int_at_least
from atomr.train.core._datasets import (
    Batch,
    InvalidDataError,
    dataset_length,
    is_pair,
    sample_fetcher,
)
from atomr.train.core.data import epoch_order

__all__ = [
    "BatchSource",
    "DataSourceError",
    "InvalidDataError",
    "as_source",
    "batch_bounds",
    "check_arrays",
]


def batch_bounds(
    n: int,
    batch_size: int,
    min_batch_size: int = 1,
    drop_last: bool = False,
    *,
    name: str = "train",
) -> list[tuple[int, int]]:
    """The `[start, stop)` bounds of an epoch's batches; a tail batch smaller
    than `min_batch_size` (or than `batch_size` with `drop_last`) is dropped.
    `name` names the set in the errors ("train", "validation").

    Raises:
        TypeError: a count that is not an int (a bool is none), or
            `drop_last` not a bool.
        ValueError: a negative `n`, a batch size below 1,
            `batch_size < min_batch_size`, or `n` holds no batch.
    """
    n = int_at_least("n", n, 0)
    batch_size, min_batch_size = _batch_sizes(batch_size, min_batch_size)
    drop_last = bool_flag("drop_last", drop_last)
    if batch_size < min_batch_size:
        raise ValueError(f"batch_size {batch_size} is below the smallest usable {min_batch_size}")
    bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    smallest = batch_size if drop_last else min_batch_size
    if bounds and bounds[-1][1] - bounds[-1][0] < smallest:
        bounds.pop()
    if not bounds:
        raise ValueError(f"{name}: the set ({n} samples) is smaller than one batch")
    return bounds


def _batch_sizes(batch_size: object, min_batch_size: object) -> tuple[int, int]:
    """Both sizes as ints; raises TypeError / ValueError unless each is an int >= 1."""
    return int_at_least("batch_size", batch_size), int_at_least("min_batch_size", min_batch_size)


def _check_position(epoch: object, start: object) -> None:
    """Raises TypeError / ValueError unless both are ints >= 0 (a negative
    `start` would count batches from the epoch's end)."""
    int_at_least("epoch", epoch, 0)
    int_at_least("start", start, 0)


def check_arrays(name: str, data: Any) -> Batch:
    """A `(features, labels)` pair of equal length.

    Raises:
        TypeError: not a pair of arrays.
        ValueError: the lengths differ, or nested lists that are no array
            (rows of different lengths): an `InvalidDataError` naming `name`.
    """
    if not is_pair(data):
        raise TypeError(f"{name} must be a (features, labels) pair, got {type(data).__name__}")
    try:
        x, y = (np.asarray(a) for a in data)
    except ValueError as exc:  # NumPy refuses a ragged nesting
        raise InvalidDataError(f"{name}: features or labels are not an array: {exc}") from None
    if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: features and labels differ in length ({x.shape}, {y.shape})")
    return x, y


class DataSourceError(RuntimeError):
    """The training data raised part way through an epoch; the trainer saved
    its checkpoint at the position reached first (see `FitCallback.on_checkpoint`)."""


class BatchSource:
    """The batches of one data set, epoch by epoch (see the module docstring).

    Attributes:
        arrays: the whole set as `(features, labels)` when it is in memory
            (evaluated in one request), else None (evaluated batch by batch).
    """

    arrays: Batch | None = None

    def batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """Epoch `epoch`'s batches from batch `start` on (both 0-based).

        Raises:
            TypeError, ValueError: `epoch` or `start` not an int >= 0 (at
                the call, before any batch is read).
        """
        raise NotImplementedError

    def count(self) -> int | None:
        """Batches per epoch, or None when only reading tells (iterables)."""
        return None


class _Shape:
    """The sample shapes of the first batch; later batches must match."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def check(self, x: np.ndarray, y: np.ndarray, where: str) -> Batch:
        if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
            raise InvalidDataError(
                f"{self.name}: {where} has {x.shape[0] if x.ndim else 0} features and "
                f"{y.shape[0] if y.ndim else 0} labels; a batch needs as many of each, >= 1"
            )
        shapes = (x.shape[1:], y.shape[1:])
        if self.shapes is None:
            self.shapes = shapes
        elif shapes != self.shapes:
            raise InvalidDataError(
                f"{self.name}: {where} has samples of shape {shapes}, the first batch "
                f"{self.shapes} (features, labels)"
            )
        return np.ascontiguousarray(x), np.ascontiguousarray(y)


class _Indexed(BatchSource):
    """Arrays or a map-style dataset: shuffled by the seed, cut into bounds."""

    def __init__(
        self, name: str, n: int, fetch: Callable[[np.ndarray], Batch], seed: int, bounds: Any
    ) -> None:
        self._name, self._n, self._fetch, self._seed = name, n, fetch, seed
        self._bounds: list[tuple[int, int]] = bounds
        self._shape = _Shape(name)

    def batches(self, epoch: int, start: int) -> Iterator[Batch]:
        _check_position(epoch, start)
        return self._batches(epoch, start)

    def _batches(self, epoch: int, start: int) -> Iterator[Batch]:
        order = epoch_order(self._n, self._seed, epoch)
        for k in range(start, len(self._bounds)):
            lo, hi = self._bounds[k]
            yield self._fetched(order[lo:hi], f"batch {k} of epoch {epoch}")

    def count(self) -> int | None:
        return len(self._bounds)

    def probe(self) -> None:
        """Fetch the first and the last sample before training: a wrong
        `len()` or a shape that changes fails here, with nothing trained.

        Raises:
            InvalidDataError: see `_Shape.check` and the fetchers.
        """
        # unique and increasing, as h5py's indexing needs (a set of one sample: [0])
        self._fetched(np.unique([0, self._n - 1]), "the first and last samples")

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """The whole set in its own order (evaluation)."""
        for lo in range(0, self._n, batch_size):
            yield self._fetched(np.arange(lo, min(lo + batch_size, self._n)), f"samples {lo}..")

    def _fetched(self, idx: np.ndarray, where: str) -> Batch:
        """The samples `idx`, checked (`where` names them in the error).

        Raises:
            InvalidDataError: see `_Shape.check` and the fetchers.
        """
        try:
            x, y = self._fetch(idx)
        except InvalidDataError as exc:
            exc.add_note(f"{self._name}: fetching {where}")
            raise
        return self._shape.check(np.asarray(x), np.asarray(y), where)


class _Streamed(BatchSource):
    """Any iterable of batches, read once per epoch."""

    def __init__(self, name: str, make: Callable[[int], Iterable[Any]], min_batch: int) -> None:
        self._name, self._make, self._min_batch = name, make, min_batch
        self._shape = _Shape(name)

    def batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """The epoch's batches from `start` on.

        Raises:
            TypeError, ValueError: `epoch` or `start` not an int >= 0 (at the call).
            InvalidDataError: a callable that gave no iterable; a batch that is not a pair, of another shape or
                too small; an epoch without batches; fewer batches than
                `start` (a resume position past the epoch's end).
        """
        _check_position(epoch, start)
        return self._batches(epoch, start)

    def _batches(self, epoch: int, start: int) -> Iterator[Batch]:
        made = self._make(epoch)
        if not isinstance(made, Iterable):
            raise InvalidDataError(
                f"{self._name}: epoch {epoch}'s batches are a {type(made).__name__}, "
                "not an iterable of (features, labels) batches"
            )
        seen = 0
        for k, batch in enumerate(made):
            seen = k + 1
            if not is_pair(batch):
                raise InvalidDataError(f"{self._name}: batch {k} of epoch {epoch} is not a pair")
            if k < start:
                continue  # trained on before the resume
            x, y = self._shape.check(np.asarray(batch[0]), np.asarray(batch[1]), f"batch {k}")
            if x.shape[0] < self._min_batch:
                raise InvalidDataError(
                    f"{self._name}: batch {k} of epoch {epoch} has {x.shape[0]} samples; "
                    f"this trainer needs at least {self._min_batch}"
                )
            yield x, y
        if seen == 0:
            raise InvalidDataError(f"{self._name}: epoch {epoch} has no batches")
        if seen < start:
            raise InvalidDataError(
                f"{self._name}: the resume position (batch {start}) is past epoch "
                f"{epoch}'s {seen} batches"
            )


def _streamed(
    name: str, make: Callable[[int], Iterable[Any]], min_batch: int, drop_last: bool
) -> _Streamed:
    """Batches taken as they come.

    Raises:
        ValueError: `drop_last`, which does not apply to them.
    """
    if drop_last:
        raise ValueError(
            f"{name}: drop_last applies to arrays and datasets, not to batches taken as "
            "they come (an iterable or a callable): leave out a short batch yourself"
        )
    return _Streamed(name, make, min_batch)


def _check_takes_the_epoch(name: str, make: Callable[..., Any]) -> None:
    """Raises TypeError when `make` cannot be called with the epoch alone
    (a generator function of no arguments, say); a callable whose signature
    cannot be read is taken as it is."""
    try:
        signature = inspect.signature(make)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(0)
    except TypeError:
        raise TypeError(
            f"{name}: a callable must take the epoch (epoch -> iterable of batches); "
            f"{getattr(make, '__qualname__', type(make).__name__)}{signature} does not"
        ) from None


def _is_array_pair(data: Any) -> bool:
    """`(features, labels)`, not a list of two `(features, labels)` batches:
    the second item is labels (a label per row), not a batch whose features
    have rows of their own, whether arrays or nested lists."""
    if not is_pair(data):
        return False
    second = data[1]
    return not (is_pair(second) and _ndim(second[0]) >= 2)


def _ndim(value: Any) -> int:
    """`value`'s dimensions as an array (1 for a ragged nesting)."""
    try:
        return int(np.ndim(value))
    except ValueError:  # numpy refuses a ragged nesting
        return 1


def as_source(
    name: str,
    data: Any,
    *,
    batch_size: int,
    seed: int,
    min_batch_size: int = 1,
    drop_last: bool = False,
) -> BatchSource:
    """The `BatchSource` for `data` (see the module docstring).

    Raises:
        TypeError: not arrays, a dataset, an iterable or a callable; a
            callable that does not take the epoch; a batch size or the seed
            not an int (a bool is none); or `drop_last` not a bool.
        ValueError: a batch size below 1, a negative seed, arrays of
            different lengths, an empty dataset, fewer
            samples than one batch, or `drop_last` for batches taken as they
            come (an iterable or a callable), which it does not apply to.
    """
    batch_size, min_batch_size = _batch_sizes(batch_size, min_batch_size)
    seed = int_at_least("seed", seed, 0, high=None)
    drop_last = bool_flag("drop_last", drop_last)
    if isinstance(data, np.ndarray):
        raise TypeError(f"{name} must be a (features, labels) pair of arrays, got one ndarray")
    if _is_array_pair(data):
        x, y = check_arrays(name, data)
        bounds = batch_bounds(x.shape[0], batch_size, min_batch_size, drop_last, name=name)
        source = _Indexed(name, x.shape[0], lambda idx: (x[idx], y[idx]), seed, bounds)
        source.arrays = (x, y)
        return source
    if isinstance(data, list | tuple):  # a list of batches, not a dataset of samples
        return _streamed(name, lambda epoch: data, min_batch_size, drop_last)
    if hasattr(data, "__len__") and (
        hasattr(data, "__getitem__") or callable(getattr(data, "get_batch", None))
    ):
        n = dataset_length(name, data)
        bounds = batch_bounds(n, batch_size, min_batch_size, drop_last, name=name)
        source = _Indexed(name, n, sample_fetcher(name, data), seed, bounds)
        source.probe()
        return source
    if callable(data):
        _check_takes_the_epoch(name, data)
        return _streamed(name, data, min_batch_size, drop_last)
    if isinstance(data, Iterable):
        if iter(data) is data:
            raise TypeError(
                f"{name}: this iterable is its own iterator (a generator?) and can be read "
                "only once; pass a callable epoch -> iterable instead"
            )
        return _streamed(name, lambda epoch: data, min_batch_size, drop_last)
    raise TypeError(
        f"{name} must be (features, labels) arrays, a dataset (__len__ and __getitem__ or "
        f"get_batch), an iterable of batches or a callable epoch -> iterable; "
        f"got {type(data).__name__}"
    )
