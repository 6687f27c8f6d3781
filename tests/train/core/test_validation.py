"""Batch validation: every kind of bad input is a clear InvalidBatchError."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train import InvalidBatchError, LossKind
from atomr.train.core import validate_batch
from atomr.train.core.validation import detached, validate_features

CE = LossKind.CROSS_ENTROPY


def _x(n: int = 3, w: int = 4, dtype=np.float32) -> np.ndarray:
    return np.ones((n, w), dtype=dtype)


def test_valid_batches_pass_and_are_cast() -> None:
    x, y = validate_batch(
        _x(dtype=np.float64), np.array([0, 1, 2], dtype=np.int32), 4, CE, out_width=3
    )
    assert x.dtype == np.float32 and y.dtype == np.int64
    x, t = validate_batch(_x(), np.zeros((3, 2)), 4, LossKind.MSE, out_width=2)
    assert t.dtype == np.float32 and t.shape == (3, 2)
    # a width of any integer type, or a per-sample shape
    x, _ = validate_batch(_x(), np.array([0, 1, 2]), np.int64(4), CE, out_width=3)
    assert x.shape == (3, 4)
    assert validate_features(np.ones((2, 5, 4)), (5, 4)).shape == (2, 5, 4)
    with pytest.raises(InvalidBatchError, match="per-sample shape"):
        validate_features(np.ones((2, 5, 4)), (4, 5))


@pytest.mark.parametrize(
    "features,labels,match",
    [
        (_x(w=5), np.array([0, 1, 2]), "width 5"),
        (_x().astype(np.int64), np.array([0, 1, 2]), "float32 or float64"),
        (_x().tolist(), np.array([0, 1, 2]), "numpy array"),
        (np.ones(4, dtype=np.float32), np.array([0]), "2-D"),
        # an empty batch is 2-D: the message says it holds no sample
        (np.ones((0, 4), dtype=np.float32), np.array([], dtype=np.int64), r"no sample \(shape"),
        (np.where(np.eye(3, 4) > 0, np.nan, 1.0).astype(np.float32), np.array([0, 1, 2]), "NaN"),
        (np.full((3, 4), np.inf, dtype=np.float32), np.array([0, 1, 2]), "NaN or Inf"),
        (_x(), np.array([0, 1, 3]), r"in \[0, 3\)"),
        (_x(), np.array([0, -1, 2]), r"in \[0, 3\)"),
        (_x(), np.array([0.0, 1.0, 2.0]), "integers"),
        (_x(), np.array([0, 1]), "shape"),
    ],
)
def test_bad_classification_batches(features, labels, match) -> None:
    with pytest.raises(InvalidBatchError, match=match):
        validate_batch(features, labels, 4, CE, out_width=3)


@pytest.mark.parametrize(
    ("labels", "ok"),
    [
        (np.array([0, 2, 1], dtype=np.int8), True),
        (np.array([0, 2, 1], dtype=np.uint64), True),
        (np.array([0, -1, 1], dtype=np.int8), False),
        (np.array([0, np.iinfo(np.int64).min, 1], dtype=np.int64), False),
        (np.array([0, 3, 1], dtype=np.uint8), False),
        (np.array([0, 2**63 + 1, 1], dtype=np.uint64), False),  # negative as int64
        (np.array([0, 2**64 - 1, 1], dtype=np.uint64), False),  # -1 as int64
        (np.array([2, 2, 2], dtype=np.int64)[::-1], True),
    ],
)
def test_labels_are_checked_at_both_ends_of_every_integer_dtype(labels, ok) -> None:
    """Both ends are checked in one pass over the labels as int64 read as
    unsigned; every integer dtype's extremes still land on the right side."""
    if ok:
        _, y = validate_batch(_x(), labels, 4, CE, out_width=3)
        assert y.dtype == np.int64 and y.flags.c_contiguous
        np.testing.assert_array_equal(y, labels.astype(np.int64))
        return
    low, high = int(labels.min()), int(labels.max())
    with pytest.raises(InvalidBatchError, match=rf"in \[0, 3\), got range \[{low}, {high}\]"):
        validate_batch(_x(), labels, 4, CE, out_width=3)


def test_features_already_in_the_models_dtype_are_checked_without_a_cast() -> None:
    """Features of the model's dtype skip the cast (and its overflow
    guard): taken as they are, or made contiguous, and still checked."""
    x = _x()
    assert validate_features(x, 4) is x
    strided = np.ones((3, 8), dtype=np.float32)[:, ::2]
    got = validate_features(strided, 4)
    assert got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_array_equal(got, strided)
    for bad in (np.nan, np.inf, -np.inf):
        x = _x()
        x[1, 2] = bad
        with pytest.raises(InvalidBatchError, match="features contain NaN or Inf"):
            validate_features(x, 4)
        with pytest.raises(InvalidBatchError, match="features contain NaN or Inf"):
            validate_features(x.astype(np.float64), 4, np.float64)


def test_bad_mse_targets() -> None:
    with pytest.raises(InvalidBatchError, match="shape"):
        validate_batch(_x(), np.zeros((3, 3)), 4, LossKind.MSE, out_width=2)
    with pytest.raises(InvalidBatchError, match="float32 or float64"):
        validate_batch(_x(), np.zeros((3, 2), dtype=np.int64), 4, LossKind.MSE, out_width=2)
    with pytest.raises(InvalidBatchError, match="NaN"):
        validate_batch(_x(), np.full((3, 2), np.nan), 4, LossKind.MSE, out_width=2)


def test_values_are_checked_after_the_cast_to_the_models_dtype() -> None:
    huge = _x(dtype=np.float64) * 1e300  # finite in float64, infinite in float32
    with pytest.raises(InvalidBatchError, match="too large for float32"):
        validate_batch(huge, np.array([0, 1, 2]), 4, CE, out_width=3)
    with pytest.raises(InvalidBatchError, match="targets hold values too large for float32"):
        validate_batch(_x(), np.full((3, 2), 1e300), 4, LossKind.MSE, out_width=2)
    x, _ = validate_batch(huge, np.array([0, 1, 2]), 4, CE, out_width=3, dtype=np.float64)
    assert x.dtype == np.float64  # a float64 model takes them


def test_a_non_finite_entry_of_a_batch_is_named_by_its_index() -> None:
    """In a batch of thousands, "features contain NaN or Inf" left the user
    searching: the message names the first such entry."""
    x = _x(5)
    x[3, 2] = np.nan
    with pytest.raises(InvalidBatchError, match=r"NaN or Inf \(the first at features\[3, 2\]\)$"):
        validate_batch(x, np.zeros(5, dtype=np.int64), 4, CE, out_width=3)
    big = _x(5, dtype=np.float64)
    big[4, 1] = 1e300
    with pytest.raises(InvalidBatchError, match=r"after the cast; the first at features\[4, 1\]\)"):
        validate_batch(big, np.zeros(5, dtype=np.int64), 4, CE, out_width=3)
    targets = np.zeros((5, 2))
    targets[1, 0] = -np.inf
    with pytest.raises(InvalidBatchError, match=r"\(the first at targets\[1, 0\]\)"):
        validate_batch(_x(5), targets, 4, LossKind.MSE, out_width=2)


def test_masked_arrays_are_refused() -> None:
    masked = np.ma.masked_array(_x(), mask=np.zeros((3, 4), dtype=bool))
    with pytest.raises(InvalidBatchError, match="features must be a plain numpy array"):
        validate_batch(masked, np.array([0, 1, 2]), 4, CE, out_width=3)
    labels = np.ma.masked_array(np.array([0, 1, 2]), mask=[False, True, False])
    with pytest.raises(InvalidBatchError, match="labels must be a plain numpy array"):
        validate_batch(_x(), labels, 4, CE, out_width=3)


def test_big_endian_floats_are_taken_as_their_values() -> None:
    """A `>f4` / `>f8` array (read from a file written on another machine)
    holds float32 / float64 values: it is cast to native, not refused."""
    rng = np.random.default_rng(0)
    native = rng.standard_normal((3, 4)).astype(np.float32)
    targets = rng.standard_normal((3, 2))
    for big in (native.astype(">f4"), native.astype(">f8")):
        x, _ = validate_batch(big, np.array([0, 1, 2]), 4, CE, out_width=3)
        assert x.dtype == np.float32 and x.dtype.isnative
        np.testing.assert_array_equal(x, native)
    _, t = validate_batch(native, targets.astype(">f8"), 4, LossKind.MSE, out_width=2)
    np.testing.assert_array_equal(t, targets.astype(np.float32))
    with pytest.raises(InvalidBatchError, match="float32 or float64, got >f2"):
        validate_batch(native.astype(">f2"), np.array([0, 1, 2]), 4, CE, out_width=3)


@pytest.mark.parametrize(
    ("features", "cast"),
    [
        (np.ones((4, 3), np.float32), False),  # taken as it is: validation returns it
        (np.ones((4, 3), np.float64), True),  # cast to float32: a new array
        (np.ones((4, 6), np.float32)[:, ::2], True),  # made contiguous: a new array
    ],
)
def test_detached_copies_only_the_callers_own_memory(features: np.ndarray, cast: bool) -> None:
    """The trainers that keep a batch past their answer (data parallel under
    CADENCE / ASYNC, a parameter server with a worker timeout) copied it
    even when validation had already made a new array (a float64 batch was
    copied twice). `detached` copies only what shares the caller's memory,
    and the result never does."""
    labels = np.array([0, 1, 2, 0])
    x, y = validate_batch(features, labels, 3, LossKind.CROSS_ENTROPY, out_width=3)
    kept_x, kept_y = detached(x, features), detached(y, labels)
    assert (kept_x is x) == cast  # a new array is kept as it is, no second copy
    assert kept_y is not y  # int64 labels are the caller's own: copied
    for kept, given in ((kept_x, features), (kept_y, labels)):
        assert not np.may_share_memory(kept, given)
    np.testing.assert_array_equal(kept_x, features)
    np.testing.assert_array_equal(kept_y, labels)
    share = x[1:3]  # a process's share of the validated rows (a view)
    assert (detached(share, features) is share) == cast
    features[:] = 7.0  # the caller refills its buffer
    assert np.all(kept_x == 1.0)
