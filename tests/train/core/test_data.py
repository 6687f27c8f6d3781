"""Data helpers: digits split and synthetic classification."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.train.core import load_digits_split, synthetic_classification
from atomr.train.core.data import epoch_order


def test_digits_split_shapes_dtypes_and_range() -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
    assert x_tr.shape[1] == x_te.shape[1] == 64
    assert len(x_tr) + len(x_te) == 1797 and len(x_te) == 449
    assert x_tr.min() >= 0.0 and x_tr.max() == 1.0
    assert set(np.unique(y_te)) == set(range(10))


def test_digits_split_is_deterministic_per_seed() -> None:
    a, b = load_digits_split(1), load_digits_split(1)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], load_digits_split(2)[0])
    with pytest.raises(ValueError):
        load_digits_split(0, test_fraction=1.0)


def test_synthetic_classification() -> None:
    x, y = synthetic_classification(200, 5, 3, seed=4)
    assert x.shape == (200, 5) and x.dtype == np.float32 and y.dtype == np.int64
    assert y.min() >= 0 and y.max() < 3
    x2, y2 = synthetic_classification(200, 5, 3, seed=4)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(ValueError):
        synthetic_classification(0, 5, 3)


@pytest.mark.parametrize("fraction", [1e-6, 0.5, 0.9999])
def test_digits_split_keeps_every_sample_and_both_sides_non_empty(fraction: float) -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(0, test_fraction=fraction)
    assert len(y_tr) >= 1 and len(y_te) >= 1
    assert len(x_tr) == len(y_tr) and len(x_te) == len(y_te)
    assert len(y_tr) + len(y_te) == 1797
    # a permutation: no sample dropped or duplicated
    x_all = np.concatenate([x_tr, x_te])
    from sklearn.datasets import load_digits

    raw = np.asarray(load_digits().data, dtype=np.float32) / np.float32(16.0)
    assert sorted(map(bytes, x_all)) == sorted(map(bytes, raw))


@pytest.mark.parametrize(
    ("make", "error", "needle"),
    [
        (lambda: synthetic_classification(True, 4, 3), TypeError, "n must be an int, got True"),
        (lambda: synthetic_classification(8, 2.0, 3), TypeError, "features must be an int"),
        (lambda: synthetic_classification(8, 4, True), TypeError, "classes must be an int"),
        (lambda: synthetic_classification(8, 4, 1), ValueError, "classes must be >= 2, got 1"),
        (lambda: synthetic_classification(8, 4, 3, seed=-1), ValueError, "seed must be >= 0"),
        (lambda: load_digits_split(seed=1.5), TypeError, "seed must be an int, got 1.5"),
        (lambda: load_digits_split(0, "0.2"), TypeError, "test_fraction must be a real"),
    ],
)
def test_a_size_seed_or_fraction_of_the_wrong_type_is_named(
    make: Any, error: type, needle: str
) -> None:
    """A bool size was taken as 1 (`classes=True` then failed as 'need
    classes >= 2; got True'), a float one failed inside NumPy ('float object
    cannot be interpreted as an integer'), a bad seed or fraction without
    its name."""
    with pytest.raises(error) as info:
        make()
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        ((-1, 0, 0), ValueError, "n must be >= 0, got -1"),  # was: an empty order
        ((4, -1, 0), ValueError, "seed must be >= 0, got -1"),
        ((4, 0, True), TypeError, "epoch must be an int, got True"),  # was: epoch 1's order
    ],
)
def test_epoch_order_refuses_a_count_of_the_wrong_type_or_sign(
    args: tuple[Any, ...], error: type, needle: str
) -> None:
    with pytest.raises(error) as info:
        epoch_order(*args)
    assert needle in str(info.value)
    assert sorted(epoch_order(4, 0, 1).tolist()) == [0, 1, 2, 3]
