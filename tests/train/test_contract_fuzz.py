"""Random message sequences against the trainer contract (docs/training.md):
every parallel trainer, driven through the same sequence as a single-device
`Trainer`, answers alike and holds the same weights and step after every
message (float64, so to the tolerance of the cadence tests).

A sequence mixes `Step` (batch sizes from one row up), `Evaluate`,
`GetWeights`, `SetLearningRate`, hostile messages (wrong widths, NaN,
labels out of range, wrong dtypes, bad rates, missing or damaged
checkpoints: refused alike by both, nothing changed), a `SaveCheckpoint`
loaded into a fresh trainer of another strategy (checkpoints load into any
trainer), and faults injected with `atomr.testkit` into worker k at phase p
(the failed step changes nothing: the run goes on as a `Trainer` that
skipped it, docs/reliability.md). Examples are derandomized, so CI is
deterministic; `ATOMR_FUZZ_EXAMPLES=300` hunts further.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atomr import ActorRef, ActorSystem
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    AsyncParameterServer,
    DataParallelOptions,
    DataParallelTrainer,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    PipelineOptions,
    PipelineParallelTrainer,
    SaveCheckpoint,
    SetLearningRate,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TensorParallelOptions,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
    WorkerStateLost,
)
from atomr.train.core import GetTrainingState, synthetic_classification
from atomr.train.core.schedule import StepLR
from atomr.train.data_parallel import ReplicaActor
from atomr.train.data_parallel.messages import ComputeGradients
from atomr.train.parameter_server import Consistency, ParameterServerWorker, ServerShard
from atomr.train.parameter_server.messages import PushGradient, TrainBatch
from atomr.train.pipeline import Schedule, StageActor
from atomr.train.pipeline.messages import ApplyStageGradients, RunMicroBatches
from atomr.train.sharded import ShardedReplica
from atomr.train.sharded.messages import ApplyShard
from atomr.train.tensor_parallel import ShardActor
from atomr.train.tensor_parallel.messages import ShardBackward

SIZES = [4, 6, 5, 3]
RTOL, ATOL = 1e-9, 1e-12
EXAMPLES = int(os.environ.get("ATOMR_FUZZ_EXAMPLES", "15"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SYNC = Consistency.synchronous()
STAGE_HOOKS = {
    p: p for p in ("forward_micro", "backward_micro", "gradient_sq_norm", "apply_gradients")
}

# name: (trainer class, options field for the faulty worker class, worker class,
#        {phase: hook}, options, device count)
SUBJECTS: dict[str, tuple[Any, str, type, dict[str, Any], Any, int]] = {
    "data-host-2": (
        DataParallelTrainer, "replica_class", ReplicaActor,
        {"grad": "compute_gradients", "apply": "apply_gradients", "crash": ComputeGradients},
        DataParallelOptions(), 2,
    ),
    "data-ring-3": (
        DataParallelTrainer, "replica_class", ReplicaActor,
        {"grad": "compute_gradients", "apply": "apply_gradients", "crash": ComputeGradients},
        DataParallelOptions(collective="ring"), 3,
    ),
    "tensor-2": (
        TensorParallelTrainer, "shard_class", ShardActor,
        {**{p: p for p in ("forward_stage", "compute_loss", "backward_stage", "sum_partials",
                           "apply_gradients")}, "crash": ShardBackward},
        TensorParallelOptions(), 2,
    ),
    "pipeline-3": (
        PipelineParallelTrainer, "stage_class", StageActor,
        {**STAGE_HOOKS, "crash": RunMicroBatches}, PipelineOptions(micro_batch_size=2), 3,
    ),
    "pipeline-gpipe-2": (
        PipelineParallelTrainer, "stage_class", StageActor,
        {**STAGE_HOOKS, "crash": ApplyStageGradients}, PipelineOptions(schedule=Schedule.GPIPE), 2,
    ),
    **{
        f"zero{stage}-{n}": (
            ShardedDataParallelTrainer, "replica_class", ShardedReplica,
            {"grad": "compute_gradients", "keep": "keep_reduced", "apply": "apply_shard",
             "crash": ApplyShard},
            ShardedOptions(stage=stage, shard_checkpoints=stage == 2), n,
        )
        for stage, n in ((1, 2), (2, 3), (3, 2))
    },
    "ps-sync-2": (
        AsyncParameterServer, "server_class", ServerShard,
        {"apply": "apply_gradients", "crash": PushGradient},
        ParameterServerOptions(workers=2, shards=2, consistency=SYNC), 2,
    ),
    "data-balanced-2": (
        DataParallelTrainer, "replica_class", ReplicaActor,
        {"grad": "compute_gradients", "apply": "apply_gradients", "crash": ComputeGradients},
        DataParallelOptions(balance=True, speed_hint=(1.0, 3.0), check_every=1), 2,
    ),
    "ps-sync-3": (
        AsyncParameterServer, "server_class", ServerShard,
        {"apply": "apply_gradients", "crash": PushGradient},
        ParameterServerOptions(workers=3, shards=3, consistency=SYNC), 3,
    ),
    "ps-worker-2": (
        AsyncParameterServer, "worker_class", ParameterServerWorker,
        {"grad": "compute_gradients", "crash": TrainBatch},
        ParameterServerOptions(workers=2, consistency=SYNC), 2,
    ),
}  # fmt: skip
LOADERS: dict[str, tuple[Any, Any, int]] = {
    "single": (Trainer, None, 1),
    "data-3": (DataParallelTrainer, None, 3),
    "tensor-1": (TensorParallelTrainer, None, 1),
    "pipeline-2": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=3), 2),
    "zero3-3": (ShardedDataParallelTrainer, ShardedOptions(stage=3), 3),
    "zero2-files-2": (ShardedDataParallelTrainer, ShardedOptions(stage=2, shard_checkpoints=True), 2),
    "ps-2": (AsyncParameterServer, ParameterServerOptions(workers=2, consistency=SYNC), 1),
}  # fmt: skip
ACCUMULATING = {"single", "data-3"}

OPTIMIZERS = [
    OptimizerKind.sgd(0.1),
    OptimizerKind.sgd(0.05, momentum=0.9, nesterov=True),
    OptimizerKind.adam(0.01),
    OptimizerKind.adamw(0.02, weight_decay=0.1),
]
CONFIGS = st.builds(
    lambda optimizer, clip, schedule, accumulate, loss, limit: TrainerConfig(
        optimizer, loss, gradient_clip=clip,
        schedule=StepLR(2, 0.5) if schedule else None, accumulation_steps=accumulate, max_steps=limit,
    ),
    st.sampled_from(OPTIMIZERS), st.sampled_from([None, 0.5]), st.booleans(), st.sampled_from([1, 2]),
    st.sampled_from([LossKind.CROSS_ENTROPY, LossKind.weighted_cross_entropy([1.0, 2.5, 0.5])]),
    st.sampled_from([None, None, 3]),
)  # fmt: skip

ROWS = st.sampled_from([1, 2, 3, 5, 8])
BAD = [
    "width", "nan", "inf", "label-high", "label-negative", "rows", "empty", "labels-float",
    "labels-2d", "features-int", "features-list", "features-1d", "float32", "huge",
]  # fmt: skip
RATES = [0.003, 0.2, 0.0, -0.1, math.nan, math.inf, 1e-320, 1e400, "0.1", True, None]
OPS = st.one_of(
    st.tuples(st.just("step"), ROWS, st.integers(0, 5)),
    st.tuples(st.just("evaluate"), ROWS, st.integers(0, 5)),
    st.tuples(st.just("weights")),
    st.tuples(st.just("rate"), st.sampled_from(RATES)),
    st.tuples(st.just("bad"), st.sampled_from(BAD), st.sampled_from(["step", "evaluate"])),
    st.tuples(st.just("bad-file"), st.sampled_from(["missing", "garbage", "other-model"])),
    st.tuples(st.just("checkpoint"), st.sampled_from(["same", *LOADERS]), st.booleans()),
    st.tuples(st.just("fault"), st.integers(0, 5), st.booleans(), ROWS, st.booleans()),
)


def _batch(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = synthetic_classification(rows, SIZES[0], SIZES[-1], seed=100 + seed)
    return x.astype(np.float64), y


def _bad(kind: str) -> tuple[Any, Any]:
    """A batch each trainer must treat alike (most of them refuse it)."""
    x, y = _batch(4, 9)
    return {
        "width": (x[:, :3], y), "nan": (np.where(x > 0.5, np.nan, x), y),
        "inf": (np.where(x > 0.5, np.inf, x), y), "label-high": (x, np.full_like(y, 3)),
        "label-negative": (x, -np.ones_like(y)), "rows": (x, y[:3]), "empty": (x[:0], y[:0]),
        "labels-float": (x, y.astype(np.float64) + 0.5), "labels-2d": (x, y[:, None]),
        "features-int": (np.round(x * 10).astype(np.int64), y), "features-list": (x.tolist(), y),
        "features-1d": (x[0], y[:1]), "float32": (x.astype(np.float32), y),
        "huge": (x * 1e300, y),  # finite, but its loss or gradient is not
    }[kind]  # fmt: skip


async def _answer(ref: ActorRef, message: Any) -> tuple[str, Any]:
    try:
        return "ok", await ref.ask(message, timeout=30.0)
    except Exception as error:  # compared by type below
        return "error", error


def _same_answers(got: tuple[str, Any], want: tuple[str, Any], what: str) -> None:
    assert got[0] == want[0], f"{what}: {got[1]!r} where the Trainer answered {want[1]!r}"
    if got[0] == "error":
        assert type(got[1]) is type(want[1]), f"{what}: {got[1]!r} against {want[1]!r}"
        return
    a, b = got[1], want[1]
    if hasattr(b, "loss"):
        np.testing.assert_allclose(a.loss, b.loss, rtol=RTOL, err_msg=what)
        assert a.samples == b.samples, what
    if hasattr(b, "accuracy"):
        np.testing.assert_allclose(a.accuracy, b.accuracy, rtol=RTOL, err_msg=what)
    if hasattr(b, "applied"):
        assert a.applied == b.applied, what


@dataclasses.dataclass
class Run:
    """The trainer under test, the reference `Trainer`, and what they share."""

    system: ActorSystem
    config: TrainerConfig
    subject: str
    tmp: Path
    plan: Plan
    faulty: Any
    ref: ActorRef | None = None
    one: ActorRef | None = None
    current: str = ""
    saves: int = 0
    lost: bool = False  # a worker lost its state: every request but a load is refused

    async def start(self) -> None:
        self.current = self.subject
        self.ref = await self.spawn(self.faulty, seed=0)
        self.one = await Trainer.spawn(
            self.system, Mlp(SIZES, seed=0, dtype=np.float64), "cpu:0", self.config
        )

    async def spawn(self, spec: tuple[Any, Any, int], seed: int) -> ActorRef:
        trainer_class, options, n = spec
        model = Mlp(SIZES, seed=seed, dtype=np.float64)
        return await trainer_class.spawn(self.system, model, cpu_devices(n), self.config, options)

    async def both(self, message: Any, what: str) -> tuple[str, Any]:
        assert self.ref is not None and self.one is not None
        got = await _answer(self.ref, message)
        if self.lost and not isinstance(message, LoadCheckpoint):
            assert isinstance(got[1], WorkerStateLost), f"{what} after a lost worker: {got[1]!r}"
            return got
        want = await _answer(self.one, message)
        _same_answers(got, want, what)
        return got

    async def check(self, what: str) -> None:
        assert self.ref is not None and self.one is not None
        if self.lost:
            return
        got, want = await self.ref.ask(GetWeights()), await self.one.ask(GetWeights())
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)
        steps = [(await r.ask(GetTrainingState())).step for r in (self.ref, self.one)]
        assert steps[0] == steps[1], f"{what}: step {steps[0]}, the Trainer's {steps[1]}"

    async def step(self, rows: int, seed: int) -> None:
        await self.both(Step(*_batch(rows, seed)), f"Step of {rows} rows")

    async def evaluate(self, rows: int, seed: int) -> None:
        await self.both(Evaluate(*_batch(rows, seed)), f"Evaluate of {rows} rows")

    async def weights(self) -> None:
        await self.both(GetWeights(), "GetWeights")

    async def rate(self, rate: Any) -> None:
        await self.both(SetLearningRate(rate), f"SetLearningRate({rate!r})")

    async def bad(self, kind: str, message: str) -> None:
        message_class = Step if message == "step" else Evaluate
        await self.both(message_class(*_bad(kind)), f"{message_class.__name__} of a {kind} batch")

    async def bad_file(self, kind: str) -> None:
        path = self.tmp / f"{kind}.ckpt"
        if kind == "garbage":
            path.write_bytes(b"ATOMRCK1" + bytes(range(256)) * 4)
        elif kind == "other-model" and not path.exists():
            other = await Trainer.spawn(
                self.system, Mlp([4, 7, 3], dtype=np.float64), "cpu:0", self.config
            )
            await other.ask(SaveCheckpoint(path))
            await other.stop()
        await self.both(LoadCheckpoint(path), f"LoadCheckpoint of a {kind} file")

    async def checkpoint(self, loader: str, swap: bool) -> None:
        """Both save; a fresh trainer of `loader`'s strategy loads the
        subject's file (or, with `swap`, the Trainer's) and a fresh
        `Trainer` the other; both go on from there."""
        assert self.ref is not None and self.one is not None
        self.saves += 1
        mine, theirs = self.tmp / f"s{self.saves}.ckpt", self.tmp / f"t{self.saves}.ckpt"
        if self.lost:  # the way back: load a checkpoint (the Trainer's state)
            assert await self.one.ask(SaveCheckpoint(theirs)) is None
            assert await self.ref.ask(LoadCheckpoint(theirs)) is None
            self.lost = False
            return
        assert await self.ref.ask(SaveCheckpoint(mine)) is None
        assert await self.one.ask(SaveCheckpoint(theirs)) is None
        if swap:
            mine, theirs = theirs, mine
        if self.config.accumulation_steps > 1 and loader not in ACCUMULATING:
            loader = "same"
        await self.ref.stop()
        await self.one.stop()
        self.ref = await self.spawn(self.faulty if loader == "same" else LOADERS[loader], seed=5)
        self.one = await self.spawn(LOADERS["single"], seed=5)
        if loader != "same":
            self.current = loader
        got = await _answer(self.ref, LoadCheckpoint(mine))
        _same_answers(got, await _answer(self.one, LoadCheckpoint(theirs)), f"load into {loader}")

    async def fault(self, index: int, after: bool, rows: int, poisoned: bool) -> None:
        """Worker k fails at a phase during a `Step` (a `RuntimeError`, or a
        lost device context): a step that fails changes nothing, so the
        Trainer fails one too; one that succeeds (a part sent again) is the
        Trainer's step. A worker that lost its state (not a data-parallel
        replica, which is re-synced) makes the trainer refuse until a load."""
        if self.current != self.subject or self.lost:
            return
        assert self.ref is not None and self.one is not None
        phases = list(SUBJECTS[self.subject][3])
        phase = phases[index % len(phases)]
        message = Step(*_batch(rows, 7))
        fired = len(self.plan.fired)
        self.plan.arm(phase, ContextPoisoned if poisoned else RuntimeError, after=after)
        got = await _answer(self.ref, message)
        self.plan.disarm(phase)
        did_fire = len(self.plan.fired) > fired
        what = f"Step of {rows} rows, {phase} failing (after={after}, poisoned={poisoned})"
        if not did_fire:  # e.g. max_steps reached: a plain Step
            _same_answers(got, await _answer(self.one, message), what)
            return
        self.lost = isinstance((await _answer(self.ref, GetWeights()))[1], WorkerStateLost)
        if self.lost:
            assert poisoned and not self.subject.startswith("data"), what
            assert got[0] == "error", what
        elif got[0] == "ok":
            _same_answers(got, await _answer(self.one, message), what)
        else:  # the Trainer fails a step too: an accumulation window is abandoned alike
            assert (await _answer(self.one, Step(*_bad("huge"))))[0] == "error"


async def _drive(
    subject: str, config: TrainerConfig, worker: int, ops: list[tuple[Any, ...]], tmp: Path
) -> None:
    trainer_class, field, worker_class, phases, options, n = SUBJECTS[subject]
    plan = Plan()
    k = worker % n if hasattr(worker_class, "worker_index") else None  # a server shard: any
    faulty = inject_faults(worker_class, plan, phases, worker=k)
    options = dataclasses.replace(options, **{field: faulty})
    async with ActorSystem("fuzz") as system:
        run = Run(system, config, subject, tmp, plan, (trainer_class, options, n))
        await run.start()
        await run.check("spawn")
        for i, (op, *args) in enumerate(ops):
            await getattr(run, op.replace("-", "_"))(*args)
            await run.check(f"after op {i}: {op}{tuple(args)}")


@pytest.mark.parametrize("subject", list(SUBJECTS))
@FUZZ
@given(config=CONFIGS, worker=st.integers(0, 2), ops=st.lists(OPS, min_size=1, max_size=10))
def test_a_random_sequence_leaves_every_trainer_where_it_leaves_the_trainer(
    subject: str, tmp_path_factory: pytest.TempPathFactory, config: TrainerConfig, worker: int,
    ops: list[tuple[Any, ...]],
) -> None:  # fmt: skip
    if not subject.startswith("data"):  # only data parallel accumulates (docs)
        config = dataclasses.replace(config, accumulation_steps=1)
    if subject.startswith("ps-sync"):  # clipping needs the global norm: one shard (docs)
        config = dataclasses.replace(config, gradient_clip=None)
    tmp = tmp_path_factory.mktemp("fuzz")
    asyncio.run(_drive(subject, config, worker, ops, tmp))
