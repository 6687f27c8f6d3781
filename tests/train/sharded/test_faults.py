"""Faults in `ShardedDataParallelTrainer`, injected through public seams
(`atomr.testkit.inject_faults` on the replica's hooks and messages,
`ShardedOptions.replica_class`): a failure in any phase changes no piece
anywhere, the asker gets the replica's own error, and training goes on to
end where a run without that step ends; a replica whose device context is
poisoned loses its piece, and the trainer answers `WorkerStateLost` until a
checkpoint is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import inject_faults
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    Trainer,
    TrainerConfig,
    WorkerStateLost,
)
from atomr.train.sharded import ShardedReplica
from atomr.train.sharded.messages import (
    CommitShard,
    ComputeShardGradients,
    ForwardLayer,
    RollbackShard,
    ShardLayerParams,
)
from tests.reliability.faults import (
    CLASSES,
    IN,
    Plan,
    T,
    assert_a_late_read_is_not_trained,
    assert_same_training,
    assert_unchanged,
    batches,
    clean_run,
    faulted_run,
    lost_until_reloaded,
    noting,
)

CONFIG = TrainerConfig(OptimizerKind.adamw(0.05), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
FAULTY = 1
PHASES: dict[str, str | type] = {
    "compute": "compute_gradients",  # stages 1 and 2: forward and backward
    "gather": ShardLayerParams,  # stage 3: a layer's gather
    "forward": ForwardLayer,  # stage 3: a layer's forward
    "apply": "apply_shard",  # every stage: the piece's update
    "commit": CommitShard,  # every stage: keeping the update (asked again if it fails)
    "rollback": RollbackShard,  # every stage: undoing the update of a failed step
}


async def _spawn(system: ActorSystem, stage: int, plan: Plan) -> Any:
    faulty = inject_faults(ShardedReplica, plan, PHASES, worker=FAULTY)
    options = ShardedOptions(stage=stage, replica_class=faulty)
    model = Mlp([IN, 9, CLASSES], seed=0)
    return await ShardedDataParallelTrainer.spawn(system, model, cpu_devices(3), CONFIG, options)


@pytest.mark.parametrize(
    ("stage", "phase", "after"),
    [
        (1, "compute", False),
        (2, "apply", False),
        (2, "apply", True),  # the update was written, then the replica failed
        (3, "gather", False),
        (3, "forward", False),
        (3, "apply", True),
    ],
)
async def test_a_failure_changes_no_piece_and_training_goes_on(
    stage: int, phase: str, after: bool
) -> None:
    plan = Plan()
    data = batches()
    async with ActorSystem("zero-faults") as system:
        trainer = await _spawn(system, stage, plan)
        clean = await Trainer.spawn(system, Mlp([IN, 9, CLASSES], seed=0), ["cpu:0"], CONFIG)

        async def weights() -> Any:
            return await trainer.ask(GetWeights(), timeout=T)

        error, views = await faulted_run(
            trainer, data, plan, phase, weights, RuntimeError, after=after
        )
        assert plan.fired == [phase]
        assert "injected failure" in str(error)
        assert_unchanged(views)
        await clean_run(clean, data)
        await assert_same_training(trainer, clean)


@pytest.mark.parametrize(("stage", "phase"), [(2, "compute"), (3, "forward"), (1, "commit")])
async def test_a_poisoned_replica_is_lost_until_a_checkpoint_is_loaded(
    stage: int, phase: str, tmp_path: Path
) -> None:
    plan = Plan()
    async with ActorSystem("zero-faults") as system:
        trainer = await _spawn(system, stage, plan)
        reference = await Trainer.spawn(system, Mlp([IN, 9, CLASSES], seed=0), ["cpu:0"], CONFIG)
        await lost_until_reloaded(
            trainer, reference, batches(), plan, phase, "replica", FAULTY, tmp_path
        )


async def test_a_replica_poisoned_while_rolling_back_is_named() -> None:
    plan = Plan()
    async with ActorSystem("zero-faults") as system:
        trainer = await _spawn(system, 1, plan)
        plan.arm("apply", RuntimeError)  # the step fails, every replica rolls back
        plan.arm("rollback", ContextPoisoned)  # and the failing one loses its piece there
        with pytest.raises(WorkerStateLost) as info:
            await trainer.ask(Step(*batches()[0]), timeout=T)
        assert sorted(plan.fired) == ["apply", "rollback"]
        assert info.value.worker == FAULTY and f"replica {FAULTY} lost" in str(info.value)


@pytest.mark.parametrize(
    ("stage", "reads"), [(1, ComputeShardGradients), (3, ForwardLayer)], ids=["stage1", "stage3"]
)
async def test_a_batch_refilled_after_its_timed_out_step_answers_is_not_trained(
    stage: int, reads: type
) -> None:
    """The replicas get views of the `Step`'s arrays. A replica held past
    `worker_timeout` on the message that reads its rows (the whole gradient,
    or stage 3's first layer forward) reads them after the `Step` answered
    `AskTimeoutError` and the sender refilled them, but nothing it computes
    from them is applied (phase 2 runs only once every replica answered
    phase 1, and the next step's phase 1 overwrites it), so no copy is needed."""
    plan, notes = Plan(), list[Any]()
    replica = inject_faults(
        noting(ShardedReplica, reads, 1, notes), plan, {"held": reads}, worker=1
    )
    options = ShardedOptions(stage=stage, replica_class=replica)

    async def spawn(system: ActorSystem, config: TrainerConfig) -> ActorRef:
        model = Mlp([IN, 8, CLASSES], seed=2)
        return await ShardedDataParallelTrainer.spawn(
            system, model, cpu_devices(2), config, options
        )

    await assert_a_late_read_is_not_trained(spawn, plan, notes, batches(3))
