"""Shared helpers of the fault-injection tests: the data, a plan armed with
device failures, an optimizer that dies mid-update, the "faulted run
equals the unfaulted run" comparisons, and the check that a worker late
past its timeout trains nothing from a batch refilled after its `Step`
answered. The injection itself is `atomr.testkit` (`Plan`, `inject_faults`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem, testkit
from atomr.accel import ContextPoisoned
from atomr.actor import AskTimeoutError
from atomr.train import (
    CheckpointError,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TrainerConfig,
    WorkerStateLost,
    load_checkpoint,
)
from atomr.train.core import save_checkpoint, synthetic_classification

T = 30.0
"""Ask timeout of these tests (never reached unless something hangs)."""

IN, CLASSES = 6, 3
BATCH = 24
STEPS = 8
FAULT_AT = 2
"""The fault is injected into this step; the steps after it must still train."""


class Plan(testkit.Plan):
    """`atomr.testkit.Plan` armed with `ContextPoisoned` (a lost device
    context) unless told otherwise: the fault most of these tests inject.
    (tests/train/parameter_server/test_faults.py imports it by this name.)"""

    def arm(
        self,
        phase: str,
        error: type[BaseException] | BaseException | None = ContextPoisoned,
        **how: Any,
    ) -> None:
        """`atomr.testkit.Plan.arm` (`how`: its keywords), `ContextPoisoned` by default."""
        super().arm(phase, error, **how)


class _DyingOptimizer:
    """A worker's optimizer for one update, dying in it: its out-of-place
    step (`step_into_unchecked`, what every worker's apply runs) writes half
    of the new weights (all of them with `whole`), then raises the error
    `phase` is armed with. Everything else is the real optimizer's."""

    def __init__(self, real: Any, plan: testkit.Plan, phase: str, whole: bool) -> None:
        self.real, self.plan, self.phase, self.whole = real, plan, phase, whole

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def step_into_unchecked(self, params: Any, grads: Any, params_out: Any, spare: Any) -> Any:
        if self.whole:
            self.real.step_into_unchecked(params, grads, params_out, spare)
        else:
            params_out[: params_out.shape[0] // 2] -= 0.5
        self.plan.fire(self.phase)
        raise AssertionError(f"{self.phase} was not armed")


W = TypeVar("W", bound=type)


def dying_optimizer(
    worker_class: W,
    plan: testkit.Plan,
    phase: str = "mid_optimizer",
    *,
    worker: int | None = None,
    whole: bool = False,
) -> W:
    """A subclass of a worker class (any with the public `apply_gradients`
    hook and an `optimizer`: `ReplicaActor`, `ShardActor`, `StageActor`,
    `ServerShard`) whose optimizer dies in the middle of an update when
    `phase` is armed: for that update the hook's worker holds a
    `_DyingOptimizer` (half the new weights written, all with `whole`, then
    the armed error). The update is out of place, so no weight may change.

    `worker`: only the worker with that `worker_index` (None: every one).
    """
    plan.declare(phase)

    def apply_gradients(self: Any, *args: Any) -> Any:
        mine = worker is None or self.worker_index == worker
        real = self.optimizer
        if not (mine and plan.armed(phase) and real is not None):
            return worker_class.apply_gradients(self, *args)
        self.optimizer = _DyingOptimizer(real, plan, phase, whole)
        try:
            return worker_class.apply_gradients(self, *args)
        finally:
            self.optimizer = real

    return type(
        f"Dying{worker_class.__name__}", (worker_class,), {"apply_gradients": apply_gradients}
    )  # type: ignore[return-value]


def batches(n: int = STEPS, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """`n` training batches of a learnable synthetic problem."""
    x, y = synthetic_classification(n * BATCH, IN, CLASSES, seed=seed)
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(n)]


def held_out() -> tuple[np.ndarray, np.ndarray]:
    """An evaluation set of the same problem."""
    return synthetic_classification(200, IN, CLASSES, seed=0)


async def faulted_run(
    trainer: ActorRef,
    data: list[tuple[np.ndarray, np.ndarray]],
    plan: testkit.Plan,
    phase: str,
    weights_of: Callable[[], Any],
    error: type[BaseException] | None = ContextPoisoned,
    **fault: Any,
) -> tuple[BaseException, list[np.ndarray]]:
    """Train on `data`, arming `phase` with `error` (and `fault`: `delay`,
    `after`, as `Plan.arm` takes them) for step `FAULT_AT`.

    Returns:
        The exception the asker got, and the weight views before/after the
        failed step (from `weights_of`, e.g. every replica's or shard's).
    """
    raised: BaseException | None = None
    before = after = None
    for i, (x, y) in enumerate(data):
        if i == FAULT_AT:
            before = await weights_of()
            plan.arm(phase, error, **fault)
            try:
                await trainer.ask(Step(x, y), timeout=T)
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                raised = exc
            after = await weights_of()
        else:
            await trainer.ask(Step(x, y), timeout=T)
    assert raised is not None, f"injecting {phase!r} did not fail the step ({plan.fired})"
    return raised, [before, after]


async def clean_run(trainer: ActorRef, data: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Train on `data` without the step `FAULT_AT` (the one the faulted run lost)."""
    for i, (x, y) in enumerate(data):
        if i != FAULT_AT:
            await trainer.ask(Step(x, y), timeout=T)


async def assert_same_training(faulted: ActorRef, clean: ActorRef, atol: float = 2e-5) -> float:
    """The faulted trainer ends where the unfaulted one does: weights and accuracy.

    Returns:
        The accuracy on the held-out set.
    """
    wf = await faulted.ask(GetWeights(), timeout=T)
    wc = await clean.ask(GetWeights(), timeout=T)
    np.testing.assert_allclose(wf, wc, atol=atol)
    x, y = held_out()
    ef = await faulted.ask(Evaluate(x, y), timeout=T)
    ec = await clean.ask(Evaluate(x, y), timeout=T)
    assert ef.accuracy == ec.accuracy
    assert ef.loss == np.float64(ec.loss) or abs(ef.loss - ec.loss) < 1e-4
    return float(ef.accuracy)


def assert_unchanged(views: list[Any]) -> None:
    """Every array in `views[0]` equals the matching one in `views[1]`."""
    before, after = views
    if isinstance(before, np.ndarray):
        before, after = [before], [after]
    assert len(before) == len(after)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def assert_same_optimizer_state(after: dict[str, Any], before: dict[str, Any]) -> None:
    """Two optimizer `state_dict()`s hold the same keys and exactly equal values."""
    assert after.keys() == before.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[key], value)
        else:
            assert after[key] == value


async def lost_until_reloaded(
    trainer: ActorRef,
    reference: ActorRef,
    data: list[tuple[np.ndarray, np.ndarray]],
    plan: testkit.Plan,
    phase: str,
    kind: str,
    worker: int,
    tmp_path: Path,
    trigger: Any = None,
    grad_norm: bool = True,
) -> None:
    """A worker whose device context is poisoned loses its state: train to
    `FAULT_AT`, save a checkpoint, train one more step, then fail the next
    step (or the request `trigger`) through `phase` (a `ContextPoisoned`
    raised in the worker actor).
    That request and every later one are answered with `WorkerStateLost`
    naming the worker; a bad checkpoint is refused (still lost); loading the
    saved one brings the trainer back, and its next steps equal those of
    `reference` (a single-device `Trainer`) loaded from the same checkpoint
    (their gradient norms too unless `grad_norm` is False: a parameter
    server of several workers reports an upper bound).
    """
    for x, y in data[:FAULT_AT]:
        await trainer.ask(Step(x, y), timeout=T)
    ckpt = tmp_path / "before.ckpt"
    await trainer.ask(SaveCheckpoint(ckpt), timeout=T)
    await trainer.ask(Step(*data[FAULT_AT]), timeout=T)
    plan.arm(phase, ContextPoisoned)
    with pytest.raises(WorkerStateLost) as info:
        await trainer.ask(trigger or Step(*data[FAULT_AT + 1]), timeout=T)
    assert plan.fired == [phase]
    error = info.value
    assert error.kind == kind and error.worker == worker, repr(error)
    assert f"{kind} {worker} lost its weights" in str(error) and "LoadCheckpoint" in str(error)
    assert isinstance(error.__cause__, ContextPoisoned)
    x, y = held_out()
    for message in (Step(*data[FAULT_AT + 1]), GetWeights(), Evaluate(x, y)):
        with pytest.raises(WorkerStateLost, match=f"{kind} {worker} lost"):
            await trainer.ask(message, timeout=T)
    with pytest.raises(WorkerStateLost):
        await trainer.ask(SaveCheckpoint(tmp_path / "lost.ckpt"), timeout=T)
    assert not (tmp_path / "lost.ckpt").exists()
    for junk in _hostile_files(ckpt, tmp_path):
        with pytest.raises(CheckpointError):
            await trainer.ask(LoadCheckpoint(junk), timeout=T)
        with pytest.raises(WorkerStateLost):  # a failed load leaves it refusing
            await trainer.ask(GetWeights(), timeout=T)

    await trainer.ask(LoadCheckpoint(ckpt), timeout=T)
    await reference.ask(LoadCheckpoint(ckpt), timeout=T)
    np.testing.assert_allclose(
        await trainer.ask(GetWeights(), timeout=T), await reference.ask(GetWeights(), timeout=T)
    )
    for bx, by in data[FAULT_AT:]:
        a = await trainer.ask(Step(bx, by), timeout=T)
        b = await reference.ask(Step(bx, by), timeout=T)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
        assert not grad_norm or a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    await assert_same_training(trainer, reference)


def _hostile_files(saved: Path, folder: Path) -> list[Path]:
    """Files a trainer that lost a worker's state must refuse: one that is
    no checkpoint, and valid ones (the file checks pass) that do not fit
    it: weights one short, an optimizer state of no kind, a window of
    micro-steps no trainer's accumulation takes."""
    (folder / "junk.ckpt").write_bytes(b"not a checkpoint")
    good = load_checkpoint(saved)
    changes: list[dict[str, Any]] = [
        {"weights": good.weights[:-1]},
        {"optimizer": {**good.optimizer, "kind": 5}},
        {"extra": {**good.extra, "micro": 10**6}},
    ]
    paths = [folder / "junk.ckpt"]
    for i, change in enumerate(changes):
        paths.append(folder / f"hostile{i}.ckpt")
        save_checkpoint(paths[-1], dataclasses.replace(good, **change))
    return paths


LATE_TIMEOUT = 0.5
"""`worker_timeout` of `assert_a_late_read_is_not_trained` (its held worker
wakes `LATE_HOLD` seconds later, past the `Step`'s answer)."""
LATE_HOLD = 2.5


def noting(worker_class: W, message: type, worker: int, notes: list[Any]) -> W:
    """A subclass of an actor class whose instance `worker` (its
    `worker_index`) appends to `notes` every `message` it handled."""

    async def receive(self: Any, msg: Any) -> Any:
        answer = await worker_class.receive(self, msg)  # type: ignore[attr-defined]
        if isinstance(msg, message) and self.worker_index == worker:
            notes.append(msg)
        return answer

    return type(f"Noting{worker_class.__name__}", (worker_class,), {"receive": receive})  # type: ignore[return-value]


async def assert_a_late_read_is_not_trained(
    spawn: Callable[[ActorSystem, TrainerConfig], Awaitable[ActorRef]],
    plan: testkit.Plan,
    notes: list[Any],
    data: list[tuple[np.ndarray, np.ndarray]],
) -> None:
    """A trainer (`spawn(system, config)`) whose worker, held by `plan`'s
    "held" phase past its `worker_timeout` on the message that reads its part
    of a `Step`'s batch (a view of the caller's arrays), answers that `Step`
    with `AskTimeoutError` before the worker read it; the caller refills its
    arrays then (a loader's reused buffer). Once the worker handled it
    (noted in `notes`: `noting`) and one more `Step` trained, the weights
    must equal those of the same run without the refill: what the late
    worker read is never applied (its step applied nothing anywhere). A
    first trainer with a long `worker_timeout` takes one step first, so
    that compiling the kernels meets no deadline."""
    config = TrainerConfig(
        OptimizerKind.sgd(0.3), LossKind.CROSS_ENTROPY, worker_timeout=LATE_TIMEOUT
    )

    async def trained(refill: bool) -> np.ndarray:
        async with ActorSystem("late-read") as system:
            warm = await spawn(system, dataclasses.replace(config, worker_timeout=T))
            await warm.ask(Step(*data[0]), timeout=T)
            trainer = await spawn(system, config)
            x, y = data[1][0].copy(), data[1][1].copy()
            handled = len(notes)
            plan.arm("held", None, delay=LATE_HOLD)
            with pytest.raises(AskTimeoutError):
                await trainer.ask(Step(x, y), timeout=T)
            if refill:
                x[...], y[...] = 0, 0
            await testkit.await_condition(lambda: len(notes) > handled, timeout=T)
            await trainer.ask(Step(*data[2]), timeout=T)
            return np.asarray(await trainer.ask(GetWeights(), timeout=T))

    np.testing.assert_array_equal(await trained(refill=True), await trained(refill=False))
