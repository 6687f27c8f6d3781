"""`Sequential.set_params` writes the caller's vector into the model's own
parameter buffer in one copy (`Backend.upload`), never aliasing it: the
caller changing its array afterwards changes nothing in the model. A
parameter-server worker calls it on every pull (`checked=False`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.accel import backend_for, cuda_available
from atomr.train import Mlp


def _given(model: Any, dtype: Any) -> np.ndarray:
    return np.arange(model.n_params, dtype=dtype) / 10


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize(
    ("model_dtype", "given_dtype"),
    [(np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64)],
    ids=["f32", "f64", "f64-into-f32"],
)
def test_the_model_never_aliases_the_given_vector(
    model_dtype: Any, given_dtype: Any, checked: bool
) -> None:
    model = Mlp([3, 2], seed=0, dtype=model_dtype)
    buffer = model.params
    given = _given(model, given_dtype)
    model.set_params(given, checked=checked)
    expected = given.astype(model_dtype)
    assert model.params is buffer  # written in place: views and optimizers keep it
    assert not np.may_share_memory(model.params, given)
    given[:] = -7.0
    np.testing.assert_array_equal(model.get_params(), expected)


def test_set_params_makes_no_second_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vector already of the model's dtype is copied once, straight into
    the parameters: no device buffer made (`to_device`) and copied again."""
    model = Mlp([3, 2], seed=0)

    def refused(*args: Any) -> None:
        raise AssertionError("set_params made a second copy")

    monkeypatch.setattr(model.backend, "to_device", refused)
    monkeypatch.setattr(model.backend, "copy", refused)
    model.set_params(_given(model, np.float32), checked=False)
    np.testing.assert_array_equal(model.get_params(), _given(model, np.float32))


@pytest.mark.parametrize(
    ("host", "error", "needle"),
    [
        ([0.0, 1.0, 2.0], TypeError, "NumPy array of float32, got list (no NumPy array)"),
        (np.float32(0.0), TypeError, "got float32 (no NumPy array)"),
        (np.zeros(3, dtype=np.float64), TypeError, "of float32, got float64"),
        (np.zeros(3, dtype=">f4"), TypeError, "of float32, got >f4"),
        (np.zeros(4, dtype=np.float32), ValueError, "shape (3,), got (4,)"),
        (np.zeros(6, dtype=np.float32)[::2], ValueError, "host must be C-contiguous ("),
    ],
    ids=["list", "scalar", "dtype", "byte-order", "shape", "strided"],
)
def test_upload_refuses_a_host_array_that_does_not_fit(host: Any, error: type, needle: str) -> None:
    be = backend_for("cpu:0")
    dst = np.ones(3, dtype=np.float32)
    with pytest.raises(error) as info:
        be.upload(host, dst)
    assert needle in str(info.value)
    np.testing.assert_array_equal(dst, np.ones(3, dtype=np.float32))


def test_upload_refuses_a_read_only_destination() -> None:
    dst = np.ones(3, dtype=np.float32)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        backend_for("cpu:0").upload(np.zeros(3, dtype=np.float32), dst)
    np.testing.assert_array_equal(dst, np.ones(3, dtype=np.float32))


@pytest.mark.parametrize(
    ("dst", "needle"),
    [
        ([1.0, 1.0, 1.0], "dst must be a NumPy array for cpu:0, got list"),
        (np.ones(6, dtype=np.float32)[::2], "dst is not C-contiguous"),
    ],
    ids=["list", "strided"],
)
def test_upload_refuses_a_destination_that_is_no_buffer_to_write(dst: Any, needle: str) -> None:
    before = list(dst)
    with pytest.raises((TypeError, ValueError)) as info:
        backend_for("cpu:0").upload(np.zeros(3, dtype=np.float32), dst)
    assert needle in str(info.value)
    assert list(dst) == before


def test_upload_of_a_host_array_overlapping_dst_copies_as_if_through_a_temporary() -> None:
    buf = np.arange(4, dtype=np.float32)
    backend_for("cpu:0").upload(buf[:3], buf[1:])
    np.testing.assert_array_equal(buf, [0.0, 0.0, 1.0, 2.0])


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="numba.cuda is not available")
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_on_cuda_the_model_never_aliases_the_given_vector(checked: bool) -> None:
    """On CUDA the vector goes host to device straight into the parameters
    (one transfer, was a host copy, a transfer and a device copy)."""
    model = Mlp([3, 2], seed=0).to("cuda:0")
    buffer = model.params
    given = _given(model, np.float32)
    model.set_params(given, checked=checked)
    assert model.params is buffer
    given[:] = -7.0
    np.testing.assert_array_equal(model.get_params(), _given(model, np.float32))
    with pytest.raises(TypeError, match="of float32, got float64"):
        model.backend.upload(np.zeros(model.n_params), model.params)
    with pytest.raises(TypeError, match="dst must be a numba CUDA device array"):
        model.backend.upload(given, np.zeros(model.n_params, dtype=np.float32))
    with pytest.raises(TypeError, match="got FakeCUDAArray|got DeviceNDArray"):
        model.backend.upload(model.params, model.params)
    with pytest.raises(TypeError, match="dst must be a NumPy array for cpu:0"):
        backend_for("cpu:0").upload(given, model.params)
    np.testing.assert_array_equal(model.get_params(), _given(model, np.float32))
