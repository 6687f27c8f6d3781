"""The training numerics on a CUDA device equal the CPU ones (tiny shapes, so
the numba CUDA simulator can run them: `NUMBA_ENABLE_CUDASIM=1 pytest -m cuda`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cuda_available
from atomr.accel.cuda_backend import CudaBackend
from atomr.train import GetWeights, LossKind, Mlp, OptimizerKind, Step, Trainer, TrainerConfig
from atomr.train.core.clip import global_norm

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="numba.cuda is not available"),
]


def test_mlp_loss_and_optimizer_on_cuda_equal_cpu() -> None:
    cpu = Mlp([3, 4, 2], activation="gelu", seed=0)
    gpu = cpu.to("cuda:0")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=5)
    loss = LossKind.weighted_cross_entropy([1.0, 2.0])
    results = []
    for m in (cpu, gpu):
        be = m.backend
        tape = m.forward_train(be.to_device(x))
        d = be.empty(tape.output.shape)
        s, n = loss.sums(be, tape.output, be.to_device(y), d)
        be.scale(d, 1.0 / n)
        m.backward(tape, d)
        norm = global_norm(be, m.grads)
        opt = OptimizerKind.adam(0.1).create(m.n_params, be)
        opt.step(m.params, m.grads)
        results.append((s / n, norm, be.to_host(m.grads), m.get_params()))
    (l0, n0, g0, p0), (l1, n1, g1, p1) = results
    assert l1 == pytest.approx(l0, rel=1e-5) and n1 == pytest.approx(n0, rel=1e-5)
    np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(p1, p0, rtol=1e-5, atol=1e-6)


async def test_trainer_on_cuda_equals_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    launches = {"matmul": 0}
    original = CudaBackend.matmul_unchecked

    def counting(self: CudaBackend, *args: Any, **kwargs: Any) -> Any:
        launches["matmul"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CudaBackend, "matmul_unchecked", counting)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=4)
    config = TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)
    async with ActorSystem() as system:
        refs = [
            await Trainer.spawn(system, Mlp([3, 4, 2], seed=2), dev, config)
            for dev in ("cpu:0", "cuda:0")
        ]
        for _ in range(2):
            stats = [await r.ask(Step(x, y), timeout=120) for r in refs]
            assert stats[1].loss == pytest.approx(stats[0].loss, rel=1e-5)
        w = [await r.ask(GetWeights(), timeout=120) for r in refs]
    np.testing.assert_allclose(w[1], w[0], rtol=1e-5, atol=1e-6)
    # the cuda:0 trainer ran its matmuls as CUDA kernels (2 steps x 2 layers x
    # forward + backward), not on a silent CPU fallback
    assert launches["matmul"] >= 8
