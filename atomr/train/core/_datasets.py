"""Reading a map-style dataset (`sources.py`): its length, and a batch of
its samples by index, through `get_batch(indices)` or `__getitem__(i)`
stacked, each checked so that a wrong `len()` or a reply of the wrong size
is an `InvalidDataError` naming the sample."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Batch", "InvalidDataError", "dataset_length", "is_pair", "sample_fetcher"]

Batch = tuple[np.ndarray, np.ndarray]


class InvalidDataError(ValueError):
    """A dataset or batch of the wrong length or shape (it names which)."""


def is_pair(value: Any) -> bool:
    """A tuple or list of two: `(features, labels)`, a sample or a batch."""
    return isinstance(value, tuple | list) and len(value) == 2


def dataset_length(name: str, dataset: Any) -> int:
    """`len(dataset)`, checked (`name` names the set in the errors).

    Raises:
        InvalidDataError: `len()` itself failed (a `__len__` returning no
            int, or one beyond `INDEX_MAX`, which `len()` refuses).
        ValueError: a length below 1.
    """
    try:
        n = len(dataset)
    except OverflowError:  # len() takes at most INDEX_MAX, sys.maxsize
        raise InvalidDataError(
            f"{name}: len(dataset) is more than {sys.maxsize}, what an index holds"
        ) from None
    except (TypeError, ValueError) as exc:  # Python's own checks of what __len__ returned
        raise InvalidDataError(f"{name}: len(dataset) failed: {exc}") from None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name}: len(dataset) must be an int >= 1, got {n!r}")
    return n


def sample_fetcher(name: str, dataset: Any) -> Callable[[np.ndarray], Batch]:
    """The function `indices -> (features, labels)` of `dataset`: its
    `get_batch`, checked, or its `__getitem__` per index, stacked; each
    raises `InvalidDataError` naming the sample or batch."""
    if callable(getattr(dataset, "get_batch", None)):
        return _batch_fetcher(name, dataset)

    def fetch(idx: np.ndarray) -> Batch:
        features, labels = [], []
        for i in idx.tolist():
            try:
                sample = dataset[i]
            except LookupError as exc:  # IndexError, or KeyError from a mapping
                raise InvalidDataError(
                    f"{name}: sample {i} is out of range although len(dataset) is "
                    f"{len(dataset)} ({exc!r})"
                ) from None
            if not is_pair(sample):
                raise InvalidDataError(f"{name}: sample {i} must be a (features, label) pair")
            features.append(np.asarray(sample[0]))
            labels.append(np.asarray(sample[1]))
        try:
            return np.stack(features), np.stack(labels)
        except ValueError as exc:
            raise InvalidDataError(
                f"{name}: samples {idx[:8].tolist()}.. differ in shape ({exc})"
            ) from None

    return fetch


def _batch_fetcher(name: str, dataset: Any) -> Callable[[np.ndarray], Batch]:
    """`dataset.get_batch(indices)`, checked: an index past a wrong `len()`,
    a reply that is not a pair, and one with another number of features or
    labels than indices (a reader that skips a record) are named."""

    def fetch(idx: np.ndarray) -> Batch:
        try:
            batch = dataset.get_batch(idx)
        except LookupError as exc:  # IndexError, or KeyError from a mapping
            raise InvalidDataError(
                f"{name}: get_batch of samples up to {int(idx.max())} failed although "
                f"len(dataset) is {len(dataset)} ({exc!r})"
            ) from None
        if not is_pair(batch):
            raise InvalidDataError(
                f"{name}: get_batch must return a (features, labels) pair, "
                f"got {type(batch).__name__}"
            )
        x, y = np.asarray(batch[0]), np.asarray(batch[1])
        for what, part in (("features", x), ("labels", y)):
            rows = part.shape[0] if part.ndim else 0
            if rows != len(idx):
                raise InvalidDataError(
                    f"{name}: get_batch returned {rows} {what} for {len(idx)} indices; "
                    "it must return one per index"
                )
        return x, y

    return fetch
