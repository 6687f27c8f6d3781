"""Benchmark: each CPU kernel twin against the plain NumPy expression of the same math.

Prints one JSON object: for every kernel the best-of-N wall time of the twin and
of NumPy (same run, same inputs) and ``speedup`` = numpy_s / twin_s (> 1: the
twin is faster); plus the wall time of the first call of every kernel in a
fresh interpreter with an empty numba cache (cold) and with the cache filled by
that run (warm).

    .venv/bin/python benchmarks/kernels.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _args import names_among

from atomr.accel import AdamHyperparameters, SgdHyperparameters, backend_for


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Best wall time of ``repeat`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def cases(
    n: int, mm: int, batch: int, classes: int
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """name -> (twin call, NumPy call) on float32 inputs."""
    be = backend_for("cpu:0")
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x, y, dy, out, dx = f(n), f(n), f(n), f(n), f(n)
    a, b, c = f(mm, mm), f(mm, mm), f(mm, mm)
    logits, grad = f(batch, classes), f(batch, classes)
    labels = rng.integers(0, classes, batch)
    bufs = [f(n) for _ in range(4)]
    p, g, m, v, buf = f(n), f(n), np.zeros(n, np.float32), np.zeros(n, np.float32), f(n)
    t1, t2 = np.empty(n, np.float32), np.empty(n, np.float32)
    k = np.float32(np.sqrt(2 / np.pi))

    def np_gelu() -> None:
        nonlocal t1, out
        np.multiply(x, x, out=t1)
        t1 *= x
        t1 *= np.float32(0.044715)
        t1 += x
        t1 *= k
        np.tanh(t1, out=t1)
        t1 += 1
        np.multiply(x, t1, out=out)
        out *= np.float32(0.5)

    def np_gelu_bwd() -> None:
        nonlocal t1, t2, dx
        np.multiply(x, x, out=t1)
        t2[:] = t1
        t1 *= x
        t1 *= np.float32(0.044715)
        t1 += x
        t1 *= k
        np.tanh(t1, out=t1)  # t
        t2 *= np.float32(3 * 0.044715)
        t2 += 1
        t2 *= k  # k (1 + 3c x^2)
        np.multiply(t1, t1, out=dx)
        np.subtract(1, dx, out=dx)
        dx *= t2
        dx *= x
        t1 += 1
        dx += t1
        dx *= np.float32(0.5)
        dx *= dy

    def np_tanh_bwd() -> None:
        nonlocal t1
        np.tanh(x, out=t1)
        t1 *= t1
        np.subtract(1, t1, out=t1)
        np.multiply(dy, t1, out=dx)

    def np_ce() -> None:
        nonlocal grad
        mx = logits.max(axis=1, keepdims=True)
        np.subtract(logits, mx, out=grad)
        np.exp(grad, out=grad)
        s = grad.sum(axis=1, keepdims=True)
        grad /= s
        loss = float(np.sum(np.log(s[:, 0]) + mx[:, 0] - logits[np.arange(batch), labels]))
        grad[np.arange(batch), labels] -= 1
        del loss

    def np_mse() -> float:
        nonlocal dx
        np.subtract(x, y, out=dx)
        loss = float(np.dot(dx, dx))
        dx *= 2
        return loss

    def np_sum() -> None:
        nonlocal out
        np.add(bufs[0], bufs[1], out=out)
        for extra in bufs[2:]:
            out += extra

    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01
    sgd = SgdHyperparameters(lr, momentum=0.9, weight_decay=wd, nesterov=True)
    adam = AdamHyperparameters(lr, b1, b2, eps, weight_decay=wd)

    def np_adam() -> None:  # torch.optim.Adam's single-tensor path, in place
        nonlocal t1, t2, m, v
        np.multiply(p, np.float32(wd), out=t1)
        t1 += g
        m *= np.float32(b1)
        m += np.float32(1 - b1) * t1
        v *= np.float32(b2)
        t1 *= t1
        t1 *= np.float32(1 - b2)
        v += t1
        np.sqrt(v, out=t2)
        t2 /= np.float32(np.sqrt(1 - b2**3))
        t2 += np.float32(eps)
        np.divide(m, t2, out=t2)
        t2 *= np.float32(lr / (1 - b1**3))
        p.__isub__(t2)

    def np_sgd() -> None:  # momentum + weight decay + nesterov
        nonlocal t1
        np.multiply(p, np.float32(wd), out=t1)
        t1 += g
        buf.__imul__(np.float32(0.9))
        buf.__iadd__(t1)
        t1 += np.float32(0.9) * buf
        t1 *= np.float32(lr)
        p.__isub__(t1)

    return {
        "matmul": (lambda: be.matmul(a, b, c), lambda: np.matmul(a, b, out=c)),
        "matmul_trans_a": (
            lambda: be.matmul(a, b, c, trans_a=True),
            lambda: np.matmul(a.T, b, out=c),
        ),
        "relu_forward": (
            lambda: be.activation_forward("relu", x, out),
            lambda: np.maximum(x, 0, out=out),
        ),
        "relu_backward": (
            lambda: be.activation_backward("relu", x, dy, dx),
            lambda: np.multiply(dy, x > 0, out=dx),
        ),
        "tanh_forward": (
            lambda: be.activation_forward("tanh", x, out),
            lambda: np.tanh(x, out=out),
        ),
        "tanh_backward": (lambda: be.activation_backward("tanh", x, dy, dx), np_tanh_bwd),
        "gelu_forward": (lambda: be.activation_forward("gelu", x, out), np_gelu),
        "gelu_backward": (lambda: be.activation_backward("gelu", x, dy, dx), np_gelu_bwd),
        "bias_add": (lambda: be.bias_add(c, b[0]), lambda: np.add(c, b[0], out=c)),
        "bias_grad": (lambda: be.bias_grad(a, out[:mm]), lambda: np.sum(a, axis=0, out=out[:mm])),
        "softmax_cross_entropy": (
            lambda: be.softmax_cross_entropy(logits, labels, None, grad),
            np_ce,
        ),
        "mse": (lambda: be.mse(x, y, dx), np_mse),
        "axpy": (lambda: be.axpy(0.5, x, y), lambda: np.add(y, np.float32(0.5) * x, out=y)),
        "scale": (lambda: be.scale(y, 1.0), lambda: np.multiply(y, np.float32(1.0), out=y)),
        "sum_into_4": (lambda: be.sum_into(out, bufs), np_sum),
        "squared_norm": (lambda: be.squared_norm(x), lambda: float(np.dot(x, x))),
        "sgd_nesterov": (
            lambda: be.sgd_step(p, g, buf, sgd, step=2),
            np_sgd,
        ),
        "adam": (lambda: be.adam_step(p, g, m, v, adam, step=3), np_adam),
    }


FIRST_CALLS = """
import time, numpy as np
t0 = time.perf_counter()
from atomr.accel import AdamHyperparameters, SgdHyperparameters, backend_for
be = backend_for("cpu:0")
x = np.ones(8, np.float32); y = np.ones(8, np.float32); a = np.ones((2, 4), np.float32)
for k in ("relu", "tanh", "gelu"):
    be.activation_forward(k, x, y); be.activation_backward(k, x, x, y)
be.bias_add(a, x[:4]); be.bias_grad(a, x[:4]); be.axpy(1.0, x, y); be.scale(y, 1.0)
be.softmax_cross_entropy(a, np.array([0, 1]), None, a.copy()); be.mse(x, y, y.copy())
be.sum_into(y, [x, x]); be.squared_norm(x)
be.sgd_step(x, y, y.copy(), SgdHyperparameters(0.1, momentum=0.9), 1)
be.adam_step(x, y, y.copy(), y.copy(), AdamHyperparameters(0.1), 1)
print(time.perf_counter() - t0)
"""


def first_call_times() -> dict[str, float]:
    """Import + first call of every CPU kernel: empty numba cache (cold) vs filled (warm)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", FIRST_CALLS],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append((time.perf_counter() - t0, float(out.stdout.strip())))
    return {
        "cold_process_s": round(runs[0][0], 3),
        "cold_first_calls_s": round(runs[0][1], 3),
        "warm_process_s": round(runs[1][0], 3),
        "warm_first_calls_s": round(runs[1][1], 3),
        "cold_over_warm": round(runs[0][1] / runs[1][1], 1),
    }


def main() -> None:
    """Run the benchmark and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    kernels = list(cases(8, 8, batch=8, classes=2))  # the names alone: tiny inputs
    parser.add_argument(
        "--only", type=names_among(kernels), help="comma-separated kernel names to run"
    )
    parser.add_argument("--no-first-call", action="store_true", help="skip the cold/warm start")
    args = parser.parse_args()
    only = set(args.only or ())
    n, mm, repeat = (1 << 18, 256, 5) if args.quick else (1 << 20, 512, 15)
    results = {}
    for name, (twin, ref) in cases(n, mm, batch=4096, classes=10).items():
        if only and name not in only:
            continue
        t_twin, t_np = best(twin, repeat), best(ref, repeat)
        results[name] = {"twin_s": t_twin, "numpy_s": t_np, "speedup": round(t_np / t_twin, 2)}
    report = {
        "benchmark": "kernels",
        "elements": n,
        "matmul_size": mm,
        "ce_batch_x_classes": [4096, 10],
        "dtype": "float32",
        "cores": os.cpu_count(),
        "kernels": results,
    }
    if not args.no_first_call:
        report["first_call"] = first_call_times()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
