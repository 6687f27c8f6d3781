"""matmul in its four transposed forms, with and without accumulate, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import get, put, rand, tol
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr.accel import backend_for

SHAPES = [(1, 1, 1), (1, 3, 1), (3, 5, 2), (5, 7, 6), (8, 8, 8), (2, 1, 9)]


def operands(rng, m, k, n, trans_a, trans_b, dtype=np.float32):
    a = rand(rng, k, m, dtype=dtype) if trans_a else rand(rng, m, k, dtype=dtype)
    b = rand(rng, n, k, dtype=dtype) if trans_b else rand(rng, k, n, dtype=dtype)
    ref = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    return a, b, ref


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(
    "trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)]
)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul(be, rng, m, k, n, trans_a, trans_b, accumulate):
    a, b, ref = operands(rng, m, k, n, trans_a, trans_b)
    start = rand(rng, m, n)
    out = put(be, start)
    be.matmul(put(be, a), put(be, b), out, trans_a=trans_a, trans_b=trans_b, accumulate=accumulate)
    expected = ref + start if accumulate else ref
    np.testing.assert_allclose(get(be, out), expected, rtol=1e-4, atol=1e-5)


def test_matmul_empty_inner_dimension_gives_zeros(be):
    out = put(be, np.ones((2, 3), np.float32))
    be.matmul(put(be, np.zeros((2, 0), np.float32)), put(be, np.zeros((0, 3), np.float32)), out)
    np.testing.assert_array_equal(get(be, out), np.zeros((2, 3)))


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 70),
    k=st.integers(1, 70),
    n=st.integers(1, 70),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_cpu_matmul_random(m, k, n, trans_a, trans_b, dtype, seed):
    be = backend_for("cpu:0")
    a, b, ref = operands(np.random.default_rng(seed), m, k, n, trans_a, trans_b, dtype)
    out = np.empty((m, n), dtype)
    be.matmul(a, b, out, trans_a=trans_a, trans_b=trans_b)
    np.testing.assert_allclose(
        out, ref, **({"rtol": 1e-4, "atol": 1e-4} if dtype == np.float32 else tol(dtype))
    )


@pytest.mark.parametrize("target", ["a", "b"])
def test_matmul_rejects_out_overlapping_an_operand(be, target):
    """out must not overlap a or b (the tiled CUDA kernel would read half-written
    tiles): both backends refuse it before writing anything."""
    a = put(be, np.arange(64, dtype=np.float32).reshape(8, 8))
    b = put(be, np.eye(8, dtype=np.float32) * 2)
    out = a if target == "a" else b
    before = get(be, out)
    with pytest.raises(ValueError, match="overlap"):
        be.matmul(a, b, out)
    with pytest.raises(ValueError, match="overlap"):
        be.matmul(a, b, out.reshape(64).reshape(8, 8), trans_a=True)
    np.testing.assert_array_equal(get(be, out), before)
