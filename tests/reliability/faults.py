"""Shared helpers of the fault-injection tests: a shared fault plan, the
data, and the "faulted run equals the unfaulted run" comparison."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef
from atomr.accel import ContextPoisoned
from atomr.train import (
    CheckpointError,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    Step,
    WorkerStateLost,
    synthetic_classification,
)

T = 30.0
"""Ask timeout of these tests (never reached unless something hangs)."""

IN, CLASSES = 6, 3
BATCH = 24
STEPS = 8
FAULT_AT = 2
"""The fault is injected into this step; the steps after it must still train."""


class Plan:
    """Which phase fails, and how often: shared by a test and its fault hooks
    (actors are built from Props, so the plan is passed by reference)."""

    def __init__(self) -> None:
        self.armed: dict[str, int] = {}
        self.fired: list[str] = []

    def arm(self, phase: str, times: int = 1) -> None:
        """Fail the next `times` passes through `phase`."""
        self.armed[phase] = times

    def fire(self, phase: str, error: type[Exception] = ContextPoisoned) -> None:
        """Raise `error` if `phase` is armed (once per arming)."""
        if self.armed.get(phase, 0) > 0:
            self.armed[phase] -= 1
            self.fired.append(phase)
            raise error(f"injected failure: {phase}")

    def due(self, phase: str) -> bool:
        """True (and disarm once) if `phase` is armed: for hooks that corrupt
        state before raising."""
        if self.armed.get(phase, 0) > 0:
            self.armed[phase] -= 1
            self.fired.append(phase)
            return True
        return False


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
    plan: Plan,
    phase: str,
    weights_of: Callable[[], Any],
) -> tuple[BaseException, list[np.ndarray]]:
    """Train on `data`, arming `phase` for step `FAULT_AT`.

    Returns:
        The exception the asker got, and the weight views before/after the
        failed step (from `weights_of`, e.g. every replica's or shard's).
    """
    error: BaseException | None = None
    before = after = None
    for i, (x, y) in enumerate(data):
        if i == FAULT_AT:
            before = await weights_of()
            plan.arm(phase)
            try:
                await trainer.ask(Step(x, y), timeout=T)
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                error = exc
            after = await weights_of()
        else:
            await trainer.ask(Step(x, y), timeout=T)
    assert error is not None, f"injecting {phase!r} did not fail the step ({plan.fired})"
    return error, [before, after]


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
    plan: Plan,
    phase: str,
    kind: str,
    worker: int,
    tmp_path: Path,
) -> None:
    """A worker whose device context is poisoned loses its state: train to
    `FAULT_AT`, save a checkpoint, train one more step, then fail the next
    step through `phase` (a `ContextPoisoned` raised in the worker actor).
    That step and every later request are answered with `WorkerStateLost`
    naming the worker; a bad checkpoint is refused (still lost); loading the
    saved one brings the trainer back, and its next steps equal those of
    `reference` (a single-device `Trainer`) loaded from the same checkpoint.
    """
    for x, y in data[:FAULT_AT]:
        await trainer.ask(Step(x, y), timeout=T)
    ckpt = tmp_path / "before.ckpt"
    await trainer.ask(SaveCheckpoint(ckpt), timeout=T)
    await trainer.ask(Step(*data[FAULT_AT]), timeout=T)
    plan.arm(phase)
    with pytest.raises(WorkerStateLost) as info:
        await trainer.ask(Step(*data[FAULT_AT + 1]), timeout=T)
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
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        await trainer.ask(LoadCheckpoint(tmp_path / "junk.ckpt"), timeout=T)
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
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    await assert_same_training(trainer, reference)
