"""`warm_up`: compile (and cache on disk) every kernel a training run uses.

numba compiles a kernel on its first call for the argument types of that
call, and keeps the machine code in its disk cache. A first `atomr train`
therefore spends its first seconds compiling. `warm_up` makes those first
calls ahead of time, on tiny arrays, for each backend: the training step of
every optimizer, loss and activation (forward, backward, loss, norm,
clipping, the out-of-place update the trainers apply), in float32 and in
float64 (gradient checks), the host reductions of data parallel, and the
sequence layers of a GPT (embedding, LayerNorm, attention, dropout). `atomr
warmup` runs it and reports each part.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba.core import event

from atomr.accel import ACTIVATIONS, backend_for, cuda_available, cuda_is_simulated
from atomr.train.core.clip import clip_grad_norm, global_norm
from atomr.train.core.loss import LossKind
from atomr.train.core.mlp import Mlp
from atomr.train.core.model.gpt import gpt
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.optimizer import OptimizerKind

__all__ = ["WarmupPart", "warm_up"]

_OPTIMIZERS = (
    OptimizerKind.sgd(0.01),
    OptimizerKind.sgd(0.01, momentum=0.9),
    OptimizerKind.adam(1e-3),
    OptimizerKind.adamw(1e-3),
)


@dataclass(frozen=True)
class WarmupPart:
    """One part of a warm-up and what it took.

    Attributes:
        name: what was compiled ("cpu float32 training steps", ...).
        seconds: wall time.
        compiled: kernels numba compiled (cache misses); 0 when all were cached.
    """

    name: str
    seconds: float
    compiled: int


class _CompileCounter(event.Listener):
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def on_start(self, ev: Any) -> None:
        with self._lock:
            self.count += 1

    def on_end(self, ev: Any) -> None:
        pass


def _training_steps(device: str, dtype: Any) -> None:
    """One step of each optimizer x loss x activation on a tiny model."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(dtype)
    labels = np.array([0, 1, 1, 0])
    for activation in (a for a in ACTIVATIONS if a != "identity"):
        model = Mlp([3, 4, 2], activation, dtype=dtype, device=device)
        be = model.backend
        for loss in (LossKind.CROSS_ENTROPY, LossKind.MSE):
            targets = labels if loss is LossKind.CROSS_ENTROPY else np.eye(2, dtype=dtype)[labels]
            tape = model.forward_train(be.to_device(x))
            d_out = be.empty(tape.output.shape, dtype=dtype)
            _, norm = loss.sums(be, tape.output, be.to_device(targets), d_out)
            be.scale(d_out, 1.0 / norm)
            model.backward(tape, d_out, input_grad=True)
            clip_grad_norm(be, model.grads, 1e-3, global_norm(be, model.grads))
            model.forward(be.to_device(x))
        for kind in _OPTIMIZERS:
            opt = kind.create(model.n_params, be, dtype)
            out = be.empty((model.n_params,), dtype=dtype)
            opt.step_into(model.params, model.grads, out, {})
            opt.step(model.params, model.grads)
        be.synchronize()


def _host_reductions(device: str, dtype: Any) -> None:
    """The data-parallel host side: sums, scaling, norms."""
    be = backend_for(device)
    parts = [be.to_device(np.ones(8, dtype=dtype)) for _ in range(3)]
    out = be.empty((8,), dtype=dtype)
    be.sum_into(out, parts)
    be.axpy(0.5, parts[0], out)
    be.squared_norm(out)
    be.synchronize()


def _sequence_layers(device: str, dtype: Any) -> None:
    """A tiny GPT with dropout forward and backward: the embedding,
    LayerNorm, attention and dropout kernels (`atomr train --model gpt`)."""
    model = gpt(5, 4, n_layer=1, n_head=2, d_model=4, dropout=0.1, dtype=dtype, device=device)
    be = model.backend
    ids = be.to_device(np.array([[0, 1, 2, 3], [4, 3, 2, 1]]))
    tape = model.forward_train(ids, ForwardContext(train=True))
    d_out = be.empty(tape.output.shape, dtype=dtype)
    LossKind.CROSS_ENTROPY.sums(be, tape.output, be.to_device(np.array([[1, 2, 3, 4]] * 2)), d_out)
    model.backward(tape, d_out)
    be.synchronize()


def _parts(device: str) -> Iterator[tuple[str, Callable[[], None]]]:
    for dtype in (np.float32, np.float64) if device == "cpu:0" else (np.float32,):
        name = np.dtype(dtype).name
        yield f"{device} {name} training steps", functools.partial(_training_steps, device, dtype)
        yield f"{device} {name} host reductions", functools.partial(_host_reductions, device, dtype)
        yield f"{device} {name} sequence layers", functools.partial(_sequence_layers, device, dtype)


def warm_up(report: Callable[[WarmupPart], None] = lambda part: None) -> list[WarmupPart]:
    """Compile every training kernel of the CPU backend, and of the CUDA
    backend when a GPU is there (not under the simulator, which compiles
    nothing).

    Args:
        report: called after each part (for progress output).

    Returns:
        The parts, in order.
    """
    devices = ["cpu:0"]
    if cuda_available() and not cuda_is_simulated():
        devices.append("cuda:0")
    done = []
    for device in devices:
        for name, run in _parts(device):
            counter = _CompileCounter()
            started = time.perf_counter()
            with event.install_listener("numba:compile", counter):
                run()
            part = WarmupPart(name, time.perf_counter() - started, counter.count)
            done.append(part)
            report(part)
    return done
