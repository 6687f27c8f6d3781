"""Every parallel trainer with its workers on CUDA devices equals the same
trainer on CPU devices (loss and weights, float32 tolerance).

Run by the simulator lane (`NUMBA_ENABLE_CUDASIM=1 pytest -m cuda`): the
simulator has one device, so every CUDA worker sits on "cuda:0"; several
workers sharing one device is allowed (each actor has its own worker thread,
like a stream), and the simulator's launch lock serialises their kernels.
Shapes and step counts are tiny: the simulator runs one Python thread per
CUDA thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import ContextPoisoned, cuda_available
from atomr.accel.cuda_backend import CudaBackend
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    EvalResult,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    StepStats,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.model import gpt
from atomr.train.data_parallel import GetReplicaWeights, ReplicaActor
from atomr.train.parameter_server import (
    AsyncParameterServer,
    Consistency,
    ParameterServerOptions,
)
from atomr.train.pipeline import PipelineOptions, PipelineParallelTrainer
from atomr.train.tensor_parallel import TensorParallelTrainer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="numba.cuda is not available"),
]

T = 300.0  # seconds per ask: the simulator is slow
STEPS = 2
BATCH = 6
CPU2 = ["cpu:0", "cpu:1"]
CUDA2 = ["cuda:0", "cuda:0"]  # the simulator has one device: both workers share it
RTOL, ATOL = 1e-5, 1e-6  # float32 tolerance, for losses and weights


class Handle:
    """One spawned trainer, whatever its kind: step (mean loss), weights,
    checkpoints, evaluation. Actor trainers answer the trainer messages."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    async def step(self, x: np.ndarray, y: np.ndarray) -> float:
        stats = await self.ref.ask(Step(x, y), timeout=T)
        assert isinstance(stats, StepStats) and stats.applied
        return float(stats.loss)

    async def weights(self) -> np.ndarray:
        return np.asarray(await self.ref.ask(GetWeights(), timeout=T))

    async def save(self, path: Path) -> None:
        await self.ref.ask(SaveCheckpoint(path), timeout=T)

    async def load(self, path: Path) -> None:
        await self.ref.ask(LoadCheckpoint(path), timeout=T)

    async def evaluate(self, x: np.ndarray, y: np.ndarray) -> EvalResult:
        result: EvalResult = await self.ref.ask(Evaluate(x, y), timeout=T)
        return result


# A driver spawns a trainer on the given devices in the given system.
Driver = Callable[[ActorSystem, Sequence[str]], Awaitable[Handle]]


@pytest.fixture(autouse=True)
def cuda_launches(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of CudaBackend matmuls and optimizer steps (the unchecked entries
    the models and optimizers call), to prove the CUDA
    runs really ran on the GPU (and the CPU runs did not)."""
    counts = {"matmul": 0, "optimizer": 0}

    def counting(name: str, key: str) -> None:
        original = getattr(CudaBackend, name)

        def wrapper(self: CudaBackend, *args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(CudaBackend, name, wrapper)

    counting("matmul_unchecked", "matmul")
    counting("sgd_step_unchecked", "optimizer")
    counting("adam_step_unchecked", "optimizer")
    return counts


def _batches(sizes: Sequence[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((BATCH, sizes[0])).astype(np.float32),
            rng.integers(0, sizes[-1], size=BATCH),
        )
        for _ in range(STEPS)
    ]


async def _run(
    driver: Driver, devices: Sequence[str], batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[list[float], np.ndarray]:
    async with ActorSystem() as system:
        trainer = await driver(system, devices)
        losses = [await trainer.step(x, y) for x, y in batches]
        return losses, await trainer.weights()


async def _assert_cuda_equals_cpu(
    driver: Driver,
    sizes: Sequence[int],
    launches: dict[str, int],
    cuda_devices: Sequence[str] = CUDA2,
) -> None:
    batches = _batches(sizes)
    cpu_losses, cpu_w = await _run(driver, CPU2, batches)
    assert launches == {"matmul": 0, "optimizer": 0}
    gpu_losses, gpu_w = await _run(driver, cuda_devices, batches)
    assert launches["matmul"] > 0 and launches["optimizer"] > 0
    assert all(np.isfinite(cpu_losses))
    assert gpu_losses == pytest.approx(cpu_losses, rel=RTOL, abs=ATOL)
    np.testing.assert_allclose(gpu_w, cpu_w, rtol=RTOL, atol=ATOL)
    assert not np.array_equal(cpu_w, Mlp(sizes, seed=1).get_params())  # it trained


def _actor_driver(spawn: Callable[[ActorSystem, Sequence[str]], Awaitable[Any]]) -> Driver:
    """A driver for a trainer actor answering the trainer messages."""

    async def driver(system: ActorSystem, devices: Sequence[str]) -> Handle:
        return Handle(await spawn(system, devices))

    return driver


# ------------------------------------------------------------ data parallel

DP_SIZES = [3, 4, 3]


def _dp_driver(collective: str) -> Driver:
    config = TrainerConfig(
        OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY, worker_timeout=T
    )

    async def spawn(system: ActorSystem, devices: Sequence[str]) -> Any:
        return await DataParallelTrainer.spawn(
            system,
            Mlp(DP_SIZES, seed=1),
            list(devices),
            config,
            DataParallelOptions(collective=collective, check_every=1),
        )

    return _actor_driver(spawn)


@pytest.mark.parametrize("collective", ["host", "ring"])
async def test_data_parallel_on_cuda_equals_cpu(collective: str, cuda_launches) -> None:
    await _assert_cuda_equals_cpu(_dp_driver(collective), DP_SIZES, cuda_launches)


async def test_data_parallel_refuses_mixed_cpu_and_cuda_replicas() -> None:
    # CPU and CUDA kernels round differently (FMA contraction, float32 versus
    # float64 intermediates), so a CPU and a CUDA replica applying the same
    # gradient would drift apart: data parallelism needs bit-identical replicas.
    async with ActorSystem() as system:
        with pytest.raises(ValueError, match="mix CPU and CUDA"):
            await _dp_driver("host")(system, ["cpu:0", "cuda:0"])


async def test_data_parallel_failed_apply_rolls_back_on_cuda() -> None:
    # Replica 1 fails after applying: replica 0 restores its device-side
    # snapshot (weights and Adam state), replica 1 is restarted and re-synced;
    # the step changed nothing, and the next one equals the CPU run.
    config = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY, worker_timeout=T)
    model = Mlp(DP_SIZES, seed=1)
    (x0, y0), (x1, y1) = _batches(DP_SIZES, seed=4)
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, model, "cpu:0", config)
        # replica 1's device fails right after its update (the plan survives its restart)
        plan = Plan()
        failing = inject_faults(ReplicaActor, plan, {"apply": "apply_gradients"})
        replicas = [
            ReplicaActor.props(model, "cuda:0", config),
            Props(failing, model, "cuda:0", config),
        ]
        dp = system.spawn(
            DataParallelTrainer.props(config, replicas, DataParallelOptions(check_every=1))
        )
        await dp.ask(Step(x0, y0), timeout=T)
        await ref.ask(Step(x0, y0), timeout=T)
        before = await dp.ask(GetReplicaWeights(), timeout=T)
        plan.arm("apply", ContextPoisoned, after=True)  # snapshotted and applied, then it dies
        with pytest.raises(ContextPoisoned):
            await dp.ask(Step(x1, y1), timeout=T)
        after = await dp.ask(GetReplicaWeights(), timeout=T)
        for w0, w1 in zip(before, after, strict=True):
            np.testing.assert_array_equal(w1, w0)
        stats = await dp.ask(Step(x1, y1), timeout=T)
        want = await ref.ask(Step(x1, y1), timeout=T)
        assert stats.loss == pytest.approx(want.loss, rel=RTOL, abs=ATOL)
        np.testing.assert_allclose(
            await dp.ask(GetWeights(), timeout=T),
            await ref.ask(GetWeights(), timeout=T),
            rtol=RTOL,
            atol=ATOL,
        )


# ------------------------------------------------------------ tensor parallel

TP_SIZES = [3, 4, 3]


TP_CONFIG = TrainerConfig(
    OptimizerKind.adamw(0.05, weight_decay=0.05),
    LossKind.CROSS_ENTROPY,
    gradient_clip=0.5,
    worker_timeout=T,
)


def _tp_driver() -> Driver:
    config = TP_CONFIG

    async def spawn(system: ActorSystem, devices: Sequence[str]) -> Any:
        return await TensorParallelTrainer.spawn(
            system, Mlp(TP_SIZES, seed=1), list(devices), config
        )

    return _actor_driver(spawn)


async def test_tensor_parallel_on_cuda_equals_cpu(cuda_launches) -> None:
    await _assert_cuda_equals_cpu(_tp_driver(), TP_SIZES, cuda_launches)


async def test_tensor_parallel_mixed_cpu_and_cuda_shards(cuda_launches) -> None:
    # shards own disjoint slices: a CPU and a CUDA shard may work together
    await _assert_cuda_equals_cpu(_tp_driver(), TP_SIZES, cuda_launches, ["cpu:0", "cuda:0"])


# ------------------------------------------------------------ pipeline parallel

PP_SIZES = [4, 5, 5, 3]


PP_CONFIG = TrainerConfig(
    OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY, gradient_clip=0.5, worker_timeout=T
)


def _pp_driver(schedule: str) -> Driver:
    config = PP_CONFIG

    async def spawn(system: ActorSystem, devices: Sequence[str]) -> Any:
        return await PipelineParallelTrainer.spawn(
            system,
            Mlp(PP_SIZES, activation="tanh", seed=1),
            list(devices),
            config,
            PipelineOptions(3, schedule),
        )

    return _actor_driver(spawn)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
async def test_pipeline_parallel_on_cuda_equals_cpu(schedule: str, cuda_launches) -> None:
    await _assert_cuda_equals_cpu(_pp_driver(schedule), PP_SIZES, cuda_launches)


async def test_pipeline_parallel_mixed_cpu_and_cuda_stages(cuda_launches) -> None:
    # stages own disjoint layers: the first on the host, the second on the GPU
    await _assert_cuda_equals_cpu(_pp_driver("1f1b"), PP_SIZES, cuda_launches, ["cpu:0", "cuda:0"])


# ------------------------------------------------------------ parameter server

PS_SIZES = [3, 4, 3]
PS_CONFIG = TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)


async def _ps_spawn(system: ActorSystem, devices: Sequence[str]) -> Any:
    options = ParameterServerOptions(workers=2, consistency=Consistency.synchronous())
    return await AsyncParameterServer.spawn(
        system, Mlp(PS_SIZES, seed=1), list(devices), PS_CONFIG, options
    )


_ps_driver = _actor_driver(_ps_spawn)


async def test_parameter_server_synchronous_on_cuda_equals_cpu(cuda_launches) -> None:
    # the server takes the workers' first device: cuda:0 here
    await _assert_cuda_equals_cpu(_ps_driver, PS_SIZES, cuda_launches)


async def test_parameter_server_mixed_cpu_and_cuda_workers(cuda_launches) -> None:
    # the workers only send gradients: one on the host, one on the GPU (the
    # server on cuda:0, its first device)
    await _assert_cuda_equals_cpu(_ps_driver, PS_SIZES, cuda_launches, ["cuda:0", "cpu:0"])


# ------------------------------------------------------------ checkpoints and evaluation


def _ckpt_cases() -> list[Any]:
    dp = TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)
    return [
        pytest.param(_dp_driver("ring"), DP_SIZES, dp, id="data-parallel"),
        pytest.param(_tp_driver(), TP_SIZES, TP_CONFIG, id="tensor-parallel"),
        pytest.param(_pp_driver("gpipe"), PP_SIZES, PP_CONFIG, id="pipeline"),
        pytest.param(_ps_driver, PS_SIZES, PS_CONFIG, id="parameter-server"),
    ]


@pytest.mark.parametrize(("driver", "sizes", "reference_config"), _ckpt_cases())
async def test_checkpoint_and_evaluate_on_cuda(
    driver: Driver, sizes: list[int], reference_config: TrainerConfig, tmp_path: Path
) -> None:
    # A checkpoint saved from CUDA workers holds their weights and optimizer
    # state (the CPU Trainer resumed from it takes the same next step), and
    # loads back onto them (the next step is taken again, bit for bit).
    (x0, y0), (x1, y1) = _batches(sizes, seed=3)
    path = tmp_path / "ckpt.npz"
    activation = "tanh" if sizes == PP_SIZES else "relu"
    async with ActorSystem() as system:
        trainer = await driver(system, CUDA2)
        await trainer.step(x0, y0)
        await trainer.save(path)
        loss = await trainer.step(x1, y1)
        after = await trainer.weights()
        reference = Handle(
            await Trainer.spawn(
                system, Mlp(sizes, activation=activation, seed=1), "cpu:0", reference_config
            )
        )
        await reference.load(path)
        assert await reference.step(x1, y1) == pytest.approx(loss, rel=RTOL, abs=ATOL)
        np.testing.assert_allclose(await reference.weights(), after, rtol=RTOL, atol=ATOL)
        await trainer.load(path)
        assert await trainer.step(x1, y1) == loss
        np.testing.assert_array_equal(await trainer.weights(), after)
        got, want = await trainer.evaluate(x0, y0), await reference.evaluate(x0, y0)
    assert got.loss == pytest.approx(want.loss, rel=RTOL, abs=ATOL)
    assert got.accuracy == want.accuracy and got.samples == want.samples == BATCH


# ------------------------------------------------------- sharded data parallel

ZERO_SIZES = [3, 4, 3]


def _zero_driver(stage: int) -> Driver:
    config = TrainerConfig(OptimizerKind.adamw(0.05), LossKind.CROSS_ENTROPY, worker_timeout=T)

    async def spawn(system: ActorSystem, devices: Sequence[str]) -> Any:
        return await ShardedDataParallelTrainer.spawn(
            system, Mlp(ZERO_SIZES, seed=1), list(devices), config, ShardedOptions(stage=stage)
        )

    return _actor_driver(spawn)


@pytest.mark.parametrize("stage", [2, 3])
async def test_sharded_data_parallel_on_cuda_equals_cpu(stage: int, cuda_launches) -> None:
    # CUDA replicas hand host copies to the collectives (the CPU ones their own
    # memory), so this runs the copy-back path: reduced gradients and gathered
    # parameters sent back in the next message
    await _assert_cuda_equals_cpu(_zero_driver(stage), ZERO_SIZES, cuda_launches)


# ------------------------------------------------------------------- a GPT

GPT_VOCAB, GPT_T = 5, 4


def _gpt_driver(trainer: Any, n: int) -> Driver:
    config = TrainerConfig(
        OptimizerKind.sgd(0.2, momentum=0.9), LossKind.CROSS_ENTROPY, worker_timeout=T
    )

    async def spawn(system: ActorSystem, devices: Sequence[str]) -> Any:
        model = gpt(GPT_VOCAB, GPT_T, n_layer=1, n_head=2, d_model=4, dropout=0.2, seed=1)
        return await trainer.spawn(system, model, list(devices)[:n], config)

    return _actor_driver(spawn)


async def _gpt_losses(driver: Driver, devices: Sequence[str]) -> tuple[list[float], np.ndarray]:
    rng = np.random.default_rng(0)
    text = rng.integers(0, GPT_VOCAB, size=(STEPS, 3, GPT_T + 1))
    return await _run(driver, devices, [(w[:, :-1].copy(), w[:, 1:].copy()) for w in text])


@pytest.mark.parametrize(("trainer", "n"), [("single", 1), ("tensor", 2)])
async def test_a_gpt_on_cuda_equals_cpu(trainer: str, n: int, cuda_launches) -> None:
    # LayerNorm, attention, embedding and dropout kernels on the GPU, and the
    # tensor-parallel shards meeting mid-pass through host copies
    cls = Trainer if trainer == "single" else TensorParallelTrainer
    driver = _gpt_driver(cls, n)
    cpu_losses, cpu_w = await _gpt_losses(driver, CPU2)
    gpu_losses, gpu_w = await _gpt_losses(driver, CUDA2)
    assert cuda_launches["matmul"] > 0 and cuda_launches["optimizer"] > 0
    assert gpu_losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-5)
    np.testing.assert_allclose(gpu_w, cpu_w, rtol=1e-4, atol=1e-5)
