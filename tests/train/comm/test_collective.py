"""`HostCollective`, the in-process reference: what is its own beyond the
contract every collective keeps (that is `test_operations.py`): a reused
output buffer, the fused scaled sum, untouched inputs, and clear refusals."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train.comm.collective import Collective, HostCollective


def _buffers(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
async def test_host_all_reduce_is_the_sum(n: int) -> None:
    bufs = _buffers(n, 1001)
    before = [b.copy() for b in bufs]
    host = HostCollective()
    out = await host.all_reduce(bufs)
    expected = np.sum(np.stack(before).astype(np.float64), axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    for b, orig in zip(bufs, before, strict=True):  # inputs untouched
        np.testing.assert_array_equal(b, orig)
    host.close()


@pytest.mark.parametrize("n", [1, 2, 3])
async def test_host_all_reduce_scaled_equals_sum_then_scale(n: int) -> None:
    bufs = _buffers(n, 1001, seed=3)
    host = HostCollective()
    plain = (await host.all_reduce(bufs)).copy()
    plain *= np.float32(0.25)
    out, sumsq = await host.all_reduce_scaled(bufs, 0.25)
    np.testing.assert_array_equal(out, plain)
    assert sumsq == pytest.approx(float(np.sum(plain.astype(np.float64) ** 2)), rel=1e-9)
    assert host.last_squared_norm == sumsq
    host.close()


@pytest.mark.parametrize("n", [2, 3])
async def test_host_sums_take_strided_buffers_as_their_contiguous_copies(n: int) -> None:
    """A sliced 1-D view (`grads[::2]`) beside contiguous buffers made the
    kernel fail to compile (numba's TypingError on the mixed layouts) in
    `all_reduce` and `reduce_scatter`: `_sum`'s `reshape(-1)` copies a 2-D
    view but returns a 1-D one as it is."""
    strided = _buffers(n, 101, seed=5)
    strided[0] = np.repeat(strided[0], 2)[::2]
    assert not strided[0].flags.c_contiguous
    host = HostCollective()
    expected = (await host.all_reduce([b.copy() for b in strided])).copy()
    np.testing.assert_array_equal(await host.all_reduce(strided), expected)
    chunks = await host.reduce_scatter(strided)
    np.testing.assert_array_equal(np.concatenate(chunks), expected)
    host.close()


@pytest.mark.parametrize(
    ("scale", "error", "match"),
    [
        (True, TypeError, "must be a real number, got bool"),
        ("0.5", TypeError, "must be a real number, got str"),
        (float("nan"), ValueError, "must be finite, got nan"),
    ],
)
async def test_host_all_reduce_scaled_refuses_what_is_no_scale(scale, error, match) -> None:
    """The scale takes the kernel's rule for it (`sum_scale_norm`'s alpha):
    True was taken as 1 and "0.5" as 0.5 (a `float()` in front of it)."""
    host = HostCollective()
    with pytest.raises(error, match=match):
        await host.all_reduce_scaled(_buffers(2, 5), scale)
    out, _ = await host.all_reduce_scaled(_buffers(2, 5), np.float32(0.5))  # NumPy's too
    np.testing.assert_array_equal(out, (_buffers(2, 5)[0] + _buffers(2, 5)[1]) * np.float32(0.5))
    host.close()


@pytest.mark.parametrize("operation", ["all_reduce", "reduce_scatter", "all_gather", "broadcast"])
async def test_a_masked_array_is_refused_not_summed_with_its_hidden_values(operation: str) -> None:
    """A collective works on the raw memory: a masked array's hidden values
    were summed (or copied) with the rest, and the mask then hid the result
    on the participant that had it (`validation.refuse_masked`'s reason)."""
    host = HostCollective()
    plain = np.ones(4)
    masked = np.ma.masked_array(np.full(4, 1e30), mask=[0, 1, 1, 0])
    with pytest.raises(TypeError, match=r"^buffers\[1\] is a masked array; a collective"):
        await getattr(host, operation)([plain, masked])
    assert plain.tolist() == [1.0] * 4 and masked.data.tolist() == [1e30] * 4
    host.close()


@pytest.mark.parametrize("operation", ["all_reduce", "reduce_scatter", "all_gather"])
async def test_a_matrix_is_refused_clearly_not_by_the_kernel(operation: str) -> None:
    """A `np.matrix` stays 2-D when flattened: the host's sums failed inside
    numba (a TypingError) instead of naming the buffer."""
    host = HostCollective()
    with pytest.raises(TypeError, match=r"^buffers\[0\] is a numpy matrix"):
        await getattr(host, operation)([np.asmatrix(np.ones((2, 3)))] * 2)
    host.close()


async def test_host_all_reduce_reuses_its_output_buffer() -> None:
    host = HostCollective()
    first = await host.all_reduce(_buffers(2, 64, seed=1))
    second = await host.all_reduce(_buffers(2, 64, seed=2))
    assert first is second  # one output per shape/dtype, no per-call allocation
    other = await host.all_reduce(_buffers(2, 65))
    assert other is not first
    host.close()


async def test_host_all_reduce_rejects_bad_buffers() -> None:
    host = HostCollective()
    with pytest.raises(ValueError, match="at least one"):
        await host.all_reduce([])
    with pytest.raises(ValueError, match="must match"):
        await host.all_reduce([np.zeros(3, np.float32), np.zeros(4, np.float32)])
    with pytest.raises(TypeError, match="numpy array"):
        await host.all_reduce([np.zeros(3, np.float32), [1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match="list of arrays"):
        await host.all_reduce(np.zeros(3, np.float32))
    host.close()


@pytest.mark.parametrize("dtype", [np.int64, np.float16])
@pytest.mark.parametrize("n", [1, 2, 3])
async def test_host_sums_refuse_other_dtypes_at_every_group_size(n: int, dtype: type) -> None:
    """A group of one copied an integer buffer out as its "sum" where a
    group of two refused it: the rule is now the same at every size."""
    host = HostCollective()
    bufs = [np.arange(6).astype(dtype) for _ in range(n)]
    for operation in (host.all_reduce, host.reduce_scatter):
        with pytest.raises(TypeError, match=f"dtype {np.dtype(dtype)}.*float32 or float64"):
            await operation(bufs)
    host.close()


class _Float32Kernels:
    """A backend that sums float32 only (as a GPU backend may)."""

    float_dtypes = (np.dtype(np.float32),)


def test_a_backend_that_cannot_sum_every_summed_dtype_is_refused() -> None:
    """The sums take float32 and float64 in every collective, so a backend
    that sums less is refused up front, not at the first float64 sum."""
    with pytest.raises(ValueError, match="does not sum float64"):
        HostCollective(backend=_Float32Kernels())


async def test_host_broadcast_and_barrier() -> None:
    host = HostCollective()
    bufs = _buffers(3, 50)
    root = bufs[2].copy()
    await host.broadcast(bufs, root=2)
    for b in bufs:
        np.testing.assert_array_equal(b, root)
    with pytest.raises(IndexError):
        await host.broadcast(bufs, root=3)
    await host.barrier()
    assert isinstance(host, Collective)
    host.close()


async def test_host_reduce_scatter_and_all_gather_refuse_bad_buffers() -> None:
    host = HostCollective()
    for operation in (host.reduce_scatter, host.all_gather):
        with pytest.raises(ValueError, match="flat"):
            await operation([np.zeros((2, 3), np.float32)] * 2)
        frozen = np.zeros(6, np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match=r"buffers\[1\] must be writable"):
            await operation([np.zeros(6, np.float32), frozen])
        with pytest.raises(ValueError, match="must match"):
            await operation([np.zeros(6, np.float32), np.zeros(5, np.float32)])
        with pytest.raises(ValueError, match="at least one"):
            await operation([])
    host.close()


async def test_host_reduce_scatter_touches_only_each_participants_chunk() -> None:
    bufs = _buffers(3, 10, seed=5)
    before = [b.copy() for b in bufs]
    host = HostCollective()
    await host.reduce_scatter(bufs)
    for k, (lo, hi) in enumerate([(0, 4), (4, 7), (7, 10)]):
        np.testing.assert_array_equal(
            np.delete(bufs[k], range(lo, hi)), np.delete(before[k], range(lo, hi))
        )
    host.close()
