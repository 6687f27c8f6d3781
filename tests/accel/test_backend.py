"""The Backend facade: memory ops, float64 on the CPU, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import get, put

from atomr.accel import AdamHyperparameters, CpuBackend, SgdHyperparameters, backend_for

SGD, ADAM = SgdHyperparameters(0.1), AdamHyperparameters(0.1)


def f32(*shape):
    return np.zeros(shape, np.float32)


def test_memory_round_trip(be):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = be.to_device(host)
    host[0, 0] = 99  # the device copy does not share memory
    np.testing.assert_array_equal(get(be, buf)[0], [0, 1, 2, 3])
    dst = be.empty((3, 4))
    be.copy(buf, dst)
    np.testing.assert_array_equal(get(be, dst), get(be, buf))
    np.testing.assert_array_equal(get(be, be.zeros((2, 2))), np.zeros((2, 2)))
    assert get(be, be.empty(5, dtype=np.int32)).dtype == np.int32


def test_backend_for_is_per_device():
    assert backend_for("cpu:0") is backend_for("cpu")
    assert backend_for("cpu:1") is not backend_for("cpu:0")
    assert isinstance(backend_for("cpu:3"), CpuBackend)


def test_cpu_accepts_float64_but_not_mixed():
    be = backend_for("cpu:0")
    a = np.ones((2, 3))
    out = np.empty((2, 2))
    be.matmul(a, a, out, trans_b=True)
    np.testing.assert_array_equal(out, np.full((2, 2), 3.0))
    with pytest.raises(TypeError, match="mixed dtypes"):
        be.matmul(a, a.astype(np.float32), out, trans_b=True)


def test_cuda_rejects_float64(cuda_be):
    x = cuda_be.to_device(np.ones(3))
    with pytest.raises(TypeError, match="float64.*accepts float32"):
        cuda_be.scale(x, 2.0)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (
            lambda be: be.matmul(put(be, f32(2, 3)), put(be, f32(4, 5)), put(be, f32(2, 5))),
            ValueError,
            "inner dimensions differ",
        ),
        (
            lambda be: be.matmul(put(be, f32(2, 3)), put(be, f32(3, 5)), put(be, f32(5, 2))),
            ValueError,
            r"out has shape \(5, 2\), expected \(2, 5\)",
        ),
        (
            lambda be: be.matmul(put(be, f32(6)), put(be, f32(3, 5)), put(be, f32(2, 5))),
            ValueError,
            "must be 2-D",
        ),
        (  # a truthy 'no' transposed a: out got a.T @ b
            lambda be: be.matmul(put(be, f32(3, 3)), put(be, f32(3, 3)), put(be, f32(3, 3)), "no"),
            TypeError,
            "matmul: trans_a must be True or False, got 'no'",
        ),
        (
            lambda be: be.matmul(
                put(be, f32(3, 3)), put(be, f32(3, 3)), put(be, f32(3, 3)), accumulate=1
            ),
            TypeError,
            "matmul: accumulate must be True or False, got 1",
        ),
        (
            lambda be: be.bias_grad(put(be, f32(2, 3)), put(be, f32(3)), accumulate="False"),
            TypeError,
            "bias_grad: accumulate must be True or False, got 'False'",
        ),
        (lambda be: be.bias_add(put(be, f32(2, 3)), put(be, f32(4))), ValueError, "bias has shape"),
        (lambda be: be.bias_grad(put(be, f32(2, 3)), put(be, f32(2))), ValueError, "out has shape"),
        (
            lambda be: be.activation_forward("swish", put(be, f32(3)), put(be, f32(3))),
            ValueError,
            "unknown activation 'swish'",
        ),
        (
            lambda be: be.activation_backward(
                "relu", put(be, f32(3)), put(be, f32(4)), put(be, f32(3))
            ),
            ValueError,
            "dy has shape",
        ),
        (
            lambda be: be.mse(put(be, f32(3)), put(be, f32(3)), put(be, f32(2))),
            ValueError,
            "grad has shape",
        ),
        (lambda be: be.axpy(1.0, put(be, f32(3)), put(be, f32(4))), ValueError, "y has shape"),
        (
            lambda be: be.axpy("2", put(be, f32(3)), put(be, f32(3))),
            TypeError,
            "alpha must be a real number",
        ),
        (  # float() of it is an OverflowError
            lambda be: be.axpy(10**400, put(be, f32(3)), put(be, f32(3))),
            ValueError,
            r"axpy: alpha must be finite, got 100000000000000000\.\.\.0000000000000000000",
        ),
        (lambda be: be.scale(put(be, f32(3)), -(10**400)), ValueError, "scale: alpha must be"),
        (  # finite in float64 but inf in the buffers' float32: x became inf
            lambda be: be.scale(put(be, f32(3)), 1e39),
            ValueError,
            r"scale: alpha=1e\+39 is infinite in float32",
        ),
        (
            lambda be: be.axpy(-1e39, put(be, f32(3)), put(be, f32(3))),
            ValueError,
            r"axpy: alpha=-1e\+39 is infinite in float32",
        ),
        (
            lambda be: be.sum_scale_norm(put(be, f32(3)), [put(be, f32(3))], 1e39),
            ValueError,
            r"sum_scale_norm: alpha=1e\+39 is infinite in float32",
        ),
        (lambda be: be.sum_into(put(be, f32(3)), []), ValueError, "at least one buffer"),
        (
            lambda be: be.sum_into(put(be, f32(3)), [put(be, f32(3)), put(be, f32(2))]),
            ValueError,
            r"buffers\[1\] has shape",
        ),
        (
            lambda be: be.sgd_step(
                put(be, f32(3)), put(be, f32(3)), None, SgdHyperparameters(0.1, momentum=0.9), 1
            ),
            ValueError,
            "needs a momentum_buf",
        ),
        (
            lambda be: be.sgd_step(put(be, f32(3)), put(be, f32(3)), None, SGD, step=0),
            ValueError,
            "step must be an int >= 1",
        ),
        (
            lambda be: be.adam_step(
                put(be, f32(3)), put(be, f32(3)), put(be, f32(3)), put(be, f32(2)), ADAM, 1
            ),
            ValueError,
            "exp_avg_sq has shape",
        ),
        (
            lambda be: be.adam_step(
                put(be, f32(3)), put(be, f32(3)), put(be, f32(3)), put(be, f32(3)), SGD, 1
            ),
            TypeError,
            "must be an AdamHyperparameters",
        ),
        (lambda be: be.scale(put(be, np.zeros(3, np.float16)), 2.0), TypeError, "float16"),
        (
            lambda be: be.scale(
                np.zeros(3, np.float32) if not isinstance(be, CpuBackend) else [0.0], 2.0
            ),
            TypeError,
            "x must be a",
        ),
    ],
)
def test_bad_input_raises_clear_errors(be, call, error, match):
    with pytest.raises(error, match=match):
        call(be)


def test_non_contiguous_is_rejected(be):
    host = np.zeros((4, 6), np.float32)
    view = put(be, host)[:, ::2] if isinstance(be, CpuBackend) else put(be, host)[:, 1:]
    with pytest.raises(ValueError, match="not C-contiguous"):
        be.scale(view, 2.0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        be.matmul(
            put(be, f32(3, 4)), view.T if isinstance(be, CpuBackend) else view, put(be, f32(3, 3))
        )


def test_read_only_output_is_rejected():
    be = backend_for("cpu:0")
    x = np.zeros(3, np.float32)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        be.scale(x, 2.0)


def test_labels_out_of_range(be):
    logits, grad = put(be, f32(3, 4)), put(be, f32(3, 4))
    with pytest.raises(
        ValueError, match=r"label 4 at row 1 is out of range; expected 0 <= label < 4"
    ):
        be.softmax_cross_entropy(logits, np.array([0, 4, 1]), None, grad)
    with pytest.raises(ValueError, match="label -1 at row 0"):
        be.softmax_cross_entropy(logits, np.array([-1, 0, 1]), None, grad)


def test_labels_out_of_range_on_device_are_refused_before_writing(be):
    """Labels already in the backend's memory are range-checked before the
    kernel runs: a refused call leaves ``grad`` as it was."""
    logits, grad = put(be, f32(2, 3)), put(be, np.full((2, 3), 7.0, np.float32))
    with pytest.raises(
        ValueError, match=r"label 9 at row 1 is out of range; expected 0 <= label < 3"
    ):
        be.softmax_cross_entropy(logits, be.to_device(np.array([0, 9])), None, grad)
    np.testing.assert_array_equal(get(be, grad), np.full((2, 3), 7.0))


@pytest.mark.parametrize(
    "labels,weights,error,match",
    [
        (np.array([0.0, 1.0, 1.0]), None, TypeError, "labels must be an integer array"),
        (np.array([0, 1]), None, ValueError, r"labels have shape \(2,\), expected \(3,\)"),
        ([0, 1, 1], None, TypeError, "labels must be an integer NumPy array"),
        (np.array([0, 1, 1]), np.ones(3, np.float32), ValueError, "weights have shape"),
        (np.array([0, 1, 1]), np.ones(4, np.int64), TypeError, "weights must be floating point"),
    ],
)
def test_cross_entropy_bad_labels_or_weights(be, labels, weights, error, match):
    with pytest.raises(error, match=match):
        be.softmax_cross_entropy(put(be, f32(3, 4)), labels, weights, put(be, f32(3, 4)))


@pytest.mark.parametrize(
    "weights,match",
    [
        (np.array([np.nan, 1.0, 1.0]), r"weight nan of class 0"),
        (np.array([1.0, np.inf, 1.0]), r"weight inf of class 1"),
        (np.array([1.0, 1.0, -0.5]), r"weight -0.5 of class 2"),
    ],
)
@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_cross_entropy_refuses_non_finite_or_negative_weights(be, weights, match, on_device):
    """Class weights follow LossKind's rule (finite in the logits' dtype,
    non-negative), host or device arrays alike; a refused call writes nothing."""
    if on_device:
        weights = be.to_device(weights.astype(np.float32))
    grad = put(be, np.full((2, 3), 7.0, np.float32))
    with pytest.raises(ValueError, match=match):
        be.softmax_cross_entropy(put(be, f32(2, 3)), np.zeros(2, np.int64), weights, grad)
    np.testing.assert_array_equal(get(be, grad), np.full((2, 3), 7.0))


@pytest.mark.parametrize(
    "weight,match",
    [
        (1e39, r"weight 1e\+39 of class 1.*finite in float32"),
        (1e-50, r"^softmax_cross_entropy: weights\[1\]=1e-50 rounds to 0 in float32; give 0 or"),
    ],
)
def test_cross_entropy_refuses_weights_the_logits_dtype_cannot_hold(be, weight, match):
    """1e39 is finite in float64 but the float32 kernel would use inf; 1e-50
    is not 0 but the float32 kernel would use 0 (its class silently dropped)."""
    with pytest.raises(ValueError, match=match):
        be.softmax_cross_entropy(
            put(be, f32(2, 3)),
            np.zeros(2, np.int64),
            np.array([1.0, weight, 1.0]),
            put(be, f32(2, 3)),
        )


def test_cuda_refuses_float64_device_weights(cuda_be):
    weights = cuda_be.to_device(np.ones(3, np.float64))
    logits, grad = cuda_be.to_device(f32(2, 3)), cuda_be.to_device(f32(2, 3))
    with pytest.raises(TypeError, match="weights have dtype float64; expected float32"):
        cuda_be.softmax_cross_entropy(logits, np.zeros(2, np.int64), weights, grad)


def test_validation_happens_before_writing(be):
    out = put(be, np.full((2, 2), 7.0, np.float32))
    with pytest.raises(ValueError):
        be.matmul(put(be, f32(2, 3)), put(be, f32(4, 2)), out)
    np.testing.assert_array_equal(get(be, out), np.full((2, 2), 7.0))


def test_to_device_keeps_a_zero_d_shape(be):
    buf = be.to_device(np.array(2.5, np.float32))
    assert tuple(buf.shape) == ()
    assert get(be, buf).shape == ()
    assert float(get(be, buf)) == 2.5


def test_read_only_inputs_are_accepted():
    """Only outputs must be writeable: read-only inputs (np.load(mmap_mode="r"),
    frozen arrays) are read, not rejected."""
    be = backend_for("cpu:0")

    def frozen(a):
        a = np.array(a, np.float32)
        a.flags.writeable = False
        return a

    a, b = frozen(np.ones((2, 3))), frozen(np.full((3, 2), 2.0))
    out = np.empty((2, 2), np.float32)
    be.matmul(a, b, out)
    np.testing.assert_array_equal(out, np.full((2, 2), 6.0))
    be.matmul(a, out, np.empty((3, 2), np.float32), trans_a=True)
    x = frozen([-1.0, 2.0])
    y = np.empty(2, np.float32)
    be.activation_forward("relu", x, y)
    be.activation_backward("relu", x, frozen([1.0, 1.0]), y)
    be.axpy(1.0, x, y)
    np.testing.assert_array_equal(y, [-1.0, 3.0])
    be.sum_into(y, [x, y, frozen([1.0, 1.0])])
    np.testing.assert_array_equal(y, [-1.0, 6.0])
    be.sum_scale_norm(y, [x, y], 1.0)
    be.sum_scale_norm(y, [x, y, x], 1.0)
    assert be.squared_norm(x) == 5.0
    assert be.mse(x, frozen([0.0, 0.0]), np.empty(2, np.float32)) == 5.0
    be.bias_add(np.zeros((2, 2), np.float32), x)
    be.bias_grad(frozen(np.ones((2, 2))), np.empty(2, np.float32))
    logits = frozen(np.zeros((2, 3)))
    loss, _ = be.softmax_cross_entropy(logits, np.array([0, 1]), None, np.empty((2, 3), np.float32))
    assert loss == pytest.approx(2 * np.log(3.0))
    p = np.ones(2, np.float32)
    be.sgd_step(p, x, None, SgdHyperparameters(0.5), 1)
    np.testing.assert_array_equal(p, [1.5, 0.0])
    m, v = np.zeros(2, np.float32), np.zeros(2, np.float32)
    be.adam_step(p, x, m, v, ADAM, 1)
    be.adam_step(
        frozen(p),
        x,
        frozen(m),
        frozen(v),
        ADAM,
        2,
        params_out=p,
        exp_avg_out=m,
        exp_avg_sq_out=v,
    )
    be.copy(x, y)
    with pytest.raises(ValueError, match="read-only"):
        be.activation_forward("relu", x, x)


@pytest.mark.parametrize(
    "call",
    [
        # the two moments given as one buffer: each step overwrote m with v
        lambda be, buf: be.adam_step(buf[0:3], buf[3:6], buf[6:9], buf[6:9], ADAM, 1),
        lambda be, buf: be.adam_step(
            buf[0:3], buf[3:6], buf[6:9], buf[9:12], ADAM, 1, params_out=buf[6:9]
        ),
        lambda be, buf: be.sgd_step(
            buf[0:3],
            buf[3:6],
            buf[6:9],
            SgdHyperparameters(0.1, momentum=0.9),
            1,
            params_out=buf[9:12],
            momentum_out=buf[9:12],
        ),
        # an output one element off its input: a shifted copy of the first result
        lambda be, buf: be.activation_forward("tanh", buf[0:5], buf[1:6]),
        lambda be, buf: be.activation_backward("relu", buf[0:3], buf[3:6], buf[4:7]),
        lambda be, buf: be.axpy(1.0, buf[1:6], buf[0:5]),
        lambda be, buf: be.mse(buf[0:3], buf[3:6], buf[2:5]),
        lambda be, buf: be.sum_into(buf[1:6], [buf[0:5]]),
        lambda be, buf: be.sum_scale_norm(buf[0:4], [buf[2:6], buf[6:10]], 0.5),
        lambda be, buf: be.copy(buf[0:5], buf[1:6]),
        # out is dy's first row: zeroed before the sum
        lambda be, buf: be.bias_grad(buf[0:3].reshape(1, 3), buf[0:3]),
        lambda be, buf: be.softmax_cross_entropy(
            buf[0:6].reshape(2, 3), np.array([0, 1]), None, buf[3:9].reshape(2, 3)
        ),
    ],
)
def test_outputs_sharing_memory_with_other_buffers_are_refused(be, call):
    """A written buffer may be the very buffer of an input (in place), but
    not part of another buffer: that gave wrong numbers without an error."""
    host = np.arange(12, dtype=np.float32) / 12
    buf = put(be, host)
    with pytest.raises(ValueError, match="shares memory with"):
        call(be, buf)
    np.testing.assert_array_equal(get(be, buf), host)  # nothing written


def test_in_place_outputs_are_still_accepted(be):
    """The same buffer as input and output (in place) stays allowed."""
    x = put(be, np.array([-1.0, 2.0], np.float32))
    be.activation_forward("relu", x, x)
    be.axpy(1.0, x, x)
    be.sum_into(x, [x, x])
    be.copy(x, x)
    np.testing.assert_array_equal(get(be, x), [0.0, 8.0])
    m, v = put(be, f32(2)), put(be, f32(2))
    be.adam_step(x, put(be, f32(2)), m, v, ADAM, 1, params_out=x, exp_avg_out=m)


def test_empty_buffers_may_be_used_in_place(be):
    """An empty buffer passed as its own output was refused on the CPU as
    sharing memory (a replica's empty shard: loss with grad is logits, the
    in-place gradient scaling)."""
    x = put(be, np.zeros(0, np.float32))
    be.activation_forward("relu", x, x)
    be.copy(x, x)
    be.sum_into(x, [x])
    assert be.sum_scale_norm(x, [x, x], 0.5) == 0.0
    assert be.mse(x, x, x) == 0.0
    logits = put(be, np.zeros((0, 3), np.float32))
    assert be.softmax_cross_entropy(logits, np.zeros(0, np.int64), None, logits) == (0.0, 0.0)
