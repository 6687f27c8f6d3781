"""The fused rounds of a tensor-parallel step (issue 22): the loss goes with
the last backward stage (`ShardLoss.backward`), and without clipping each
shard applies at the end of its stage-0 backward, unconfirmed
(`ShardBackward.apply`), so that `ShardApply(1.0)` needs no device work;
and a CPU shard replies with its own buffers, read-only, not copies. Every
result equals the unfused path's, bit for bit; an unconfirmed update that is
not confirmed is undone by the shard's next message; shards that do not know
the fields still train."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import OutOfMemory
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    NonFiniteError,
    OptimizerKind,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.tensor_parallel import ShardActor, TensorParallelOptions, TensorParallelTrainer
from atomr.train.tensor_parallel.group import ShardGroup
from atomr.train.tensor_parallel.messages import (
    ShardApply,
    ShardBackward,
    ShardForward,
    ShardGrad,
    ShardLoss,
    ShardRollback,
)

CE = LossKind.CROSS_ENTROPY
EVEN = [6, 11, 5]  # one stage (its last layer row-parallel)
ODD = [6, 11, 9, 5]  # two stages (the last layer gathered)
ADAM = TrainerConfig(OptimizerKind.adamw(0.02, weight_decay=0.05), CE)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _batch(sizes: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(12, sizes[0], sizes[-1], seed=seed)


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


class HopCountingShard(ShardActor):
    """Counts the jobs each shard runs on its device thread."""

    jobs: ClassVar[dict[int, int]] = {}

    async def on_device(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        rank = self.worker_index
        HopCountingShard.jobs[rank] = HopCountingShard.jobs.get(rank, 0) + 1
        return await super().on_device(fn, *args, **kwargs)


@pytest.mark.parametrize(("sizes", "stages", "n"), [(EVEN, 1, 3), (ODD, 2, 2)])
@pytest.mark.parametrize("clip", [None, 0.01])
async def test_a_step_runs_two_device_jobs_per_stage_on_each_shard(
    actor_system: ActorSystem, sizes: list[int], stages: int, n: int, clip: float | None
) -> None:
    """Forward: one per stage; the loss with the last backward; the other
    backward stages, stage 0 applying. Clipped, the apply is one more (it
    needs the global norm). Before: loss, apply and every stage apart."""
    model = Mlp(sizes, activation="tanh", seed=3)
    config = dataclasses.replace(ADAM, gradient_clip=clip)
    options = TensorParallelOptions(shard_class=HopCountingShard)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(n), config, options)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    for i in range(3):
        HopCountingShard.jobs = {}
        a = await tp.ask(Step(*_batch(sizes, seed=i)), timeout=10)
        b = await ref.ask(Step(*_batch(sizes, seed=i)), timeout=10)
        assert HopCountingShard.jobs == {r: 2 * stages + (clip is not None) for r in range(n)}
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    np.testing.assert_allclose(await tp.ask(GetWeights()), await ref.ask(GetWeights()), **TOL)


async def _group(system: ActorSystem, sizes: list[int], n: int) -> ShardGroup:
    model = Mlp(sizes, activation="tanh", seed=5)
    refs = [system.spawn(ShardActor.props(model, r, n, f"cpu:{r}")) for r in range(n)]
    return await ShardGroup.connect(refs, ADAM)


async def _fused(group: ShardGroup, sizes: list[int], then: Any) -> np.ndarray:
    """A step whose stage 0 applies unconfirmed, then `then` (a message to
    every shard, or None), then the shards' weights (gathered)."""
    x, y = _batch(sizes, seed=1)
    outs = await group.forward(x, train=True)
    await group.loss_and_backward(outs, y, apply=True)
    if then is not None:
        await group._all(then)
    return await group.gather("params")


@pytest.mark.parametrize(("sizes", "n"), [(EVEN, 3), (ODD, 2)])
async def test_an_unconfirmed_update_equals_a_plain_apply_and_is_undone_unless_confirmed(
    actor_system: ActorSystem, sizes: list[int], n: int
) -> None:
    plain: dict[float, np.ndarray] = {}
    x, y = _batch(sizes, seed=1)
    for scale in (1.0, 0.5):
        group = await _group(actor_system, sizes, n)
        outs = await group.forward(x, train=True)
        await group.loss(outs, y, train=True)
        await group.backward()
        await group.apply(scale)
        plain[scale] = await group.gather("params")
    group = await _group(actor_system, sizes, n)
    before = await group.gather("params")
    assert not np.array_equal(plain[1.0], before)
    for scale in (1.0, 0.5):  # confirmed; a smaller scale undoes it and applies scaled
        got = await _fused(await _group(actor_system, sizes, n), sizes, ShardApply(scale))
        np.testing.assert_array_equal(got, plain[scale])
    # undone by a rollback, and by any other message (here the gather)
    np.testing.assert_array_equal(await _fused(group, sizes, ShardRollback()), before)
    np.testing.assert_array_equal(await _fused(group, sizes, None), before)
    await group.apply(1.0)  # the undone step's gradients are still there
    np.testing.assert_array_equal(await group.gather("params"), plain[1.0])


class NonFiniteShard(ShardActor):
    """Shard 1 reports a non-finite gradient norm at stage 0 of step `BAD`."""

    steps: ClassVar[int] = 0
    BAD = 2

    def backward_stage(self, stage: int, grads: Any, input_grad: bool) -> ShardGrad:
        reply = super().backward_stage(stage, grads, input_grad)
        if stage == 0 and self.worker_index == 1:
            NonFiniteShard.steps += 1
            if NonFiniteShard.steps == self.BAD:
                return ShardGrad(reply.partial, float("inf"))
        return reply


class LateFailingShard(ShardActor):
    """Shard 1's apply hook raises once after its update was swapped in."""

    fail = False

    def apply_gradients(self, scale: float) -> None:
        super().apply_gradients(scale)
        if self.worker_index == 1 and LateFailingShard.fail:
            LateFailingShard.fail = False
            raise OutOfMemory("injected after the swap")


@pytest.mark.parametrize(
    ("shard", "error"), [(NonFiniteShard, NonFiniteError), (LateFailingShard, OutOfMemory)]
)
async def test_a_step_failing_after_some_shards_applied_changes_no_weight(
    actor_system: ActorSystem, shard: type[ShardActor], error: type[Exception]
) -> None:
    """The other shards applied unconfirmed; their next message undoes it,
    and training goes on as a `Trainer` that skipped the failed step."""
    NonFiniteShard.steps, LateFailingShard.fail = 0, False
    model = Mlp(ODD, activation="tanh", seed=6)
    options = TensorParallelOptions(shard_class=shard)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), ADAM, options)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", ADAM)
    for i in range(4):
        x, y = _batch(ODD, seed=i)
        if i == 1:
            LateFailingShard.fail = True
            before = await tp.ask(GetWeights())
            with pytest.raises(error):
                await tp.ask(Step(x, y), timeout=10)
            np.testing.assert_array_equal(await tp.ask(GetWeights()), before)
            continue
        await tp.ask(Step(x, y), timeout=10)
        await ref.ask(Step(x, y), timeout=10)
    np.testing.assert_allclose(await tp.ask(GetWeights()), await ref.ask(GetWeights()), **TOL)


class OlderShard(ShardActor):
    """A shard (of rank in `OLDER`) that does not know the fused fields."""

    OLDER: ClassVar[set[int]] = set()

    async def receive(self, message: Any) -> Any:
        if self.worker_index in self.OLDER and isinstance(message, ShardLoss | ShardBackward):
            fields = {"backward": None} if isinstance(message, ShardLoss) else {"apply": False}
            message = dataclasses.replace(message, **fields)  # type: ignore[arg-type]
        return await super().receive(message)


@pytest.mark.parametrize("older", [{0, 1}, {1}])
async def test_shards_that_do_not_know_the_fused_fields_train_alike(
    actor_system: ActorSystem, older: set[int]
) -> None:
    OlderShard.OLDER = older
    model = Mlp(ODD, activation="tanh", seed=7)
    options = TensorParallelOptions(shard_class=OlderShard)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(2), ADAM, options)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", ADAM)
    for i in range(3):
        a = await tp.ask(Step(*_batch(ODD, seed=i)), timeout=10)
        b = await ref.ask(Step(*_batch(ODD, seed=i)), timeout=10)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    np.testing.assert_allclose(await tp.ask(GetWeights()), await ref.ask(GetWeights()), **TOL)


async def test_a_cpu_shard_replies_with_its_own_buffers_read_only(
    actor_system: ActorSystem,
) -> None:
    """No copy per reply; nothing may write what the shards then read."""
    group = await _group(actor_system, ODD, 2)
    x, y = _batch(ODD)
    stage0 = await group._all(ShardForward(0, (x,), True))
    outs = await group._all(ShardForward(1, tuple(stage0), True))
    replies = await group._all(ShardLoss(tuple(outs), y, True, ShardBackward(1)))
    for array in [*stage0, *outs, *(r.partial for r in replies)]:
        assert isinstance(array, np.ndarray) and not array.flags.writeable


async def test_the_fused_fields_are_checked(actor_system: ActorSystem) -> None:
    group = await _group(actor_system, ODD, 2)
    x, y = _batch(ODD)
    outs = await group.forward(x, train=True)
    with pytest.raises(ValueError, match="apply is for stage 0, not stage 1"):
        await group._all(ShardLoss(tuple(outs), y, True, ShardBackward(1, apply=True)))
    with pytest.raises(ValueError, match="stage 1 backward"):
        await group._all(ShardLoss(tuple(outs), y, True, ShardBackward(0)))
    with pytest.raises(ValueError, match="stage 1 backward"):
        await group._all(ShardLoss(tuple(outs), y, False, ShardBackward(1)))
    with pytest.raises(TypeError, match="must be a ShardBackward, got str"):
        await group._all(ShardLoss(tuple(outs), y, True, "backward"))  # type: ignore[arg-type]
