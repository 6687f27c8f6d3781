"""How a stage runs one step: `StageRunner` holds the step in flight on a
stage (its `RunMicroBatches`), buffers the `Activations` and `Gradients`
that arrive before it, runs each op strictly in plan order as soon as its
input is there (the math in the stage's device-side hooks), and answers the
step with a `StageReport`, or with the exception that stopped it.

It runs on the event loop, inside the stage actor's message handling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from atomr.actor import ActorRef, Context, Failure, Reply
from atomr.train.core.loss import LossKind
from atomr.train.pipeline.messages import (
    Activations,
    BusyInterval,
    Gradients,
    RunMicroBatches,
    StageAborted,
    StageReport,
)
from atomr.train.pipeline.schedule import Op, OpKind


class RunnableStage(Protocol):
    """What a `StageRunner` needs of its stage (`StageActor` is one): its
    place in the pipeline, its device thread and its device-side hooks."""

    index: int
    previous: ActorRef | None
    next: ActorRef | None

    @property
    def context(self) -> Context: ...

    @property
    def is_first(self) -> bool: ...

    @property
    def is_last(self) -> bool: ...

    async def on_device(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def forward_micro(
        self, micro: int, x: np.ndarray, target: np.ndarray | None, normaliser: float, train: bool
    ) -> tuple[np.ndarray | None, float, int]: ...

    def backward_micro(
        self, micro: int, dy: np.ndarray | None, accumulate: bool
    ) -> np.ndarray | None: ...

    def held_activations(self) -> int: ...

    def drop_activations(self) -> None: ...

    def gradient_sq_norm(self) -> float: ...


__all__ = ["StageRunner"]


@dataclass
class _Run:
    """The state of one step on a stage."""

    step_id: int
    ops: tuple[Op, ...]
    train: bool
    loss: LossKind
    normaliser: float
    reply: Reply
    targets: tuple[np.ndarray, ...] | None
    inputs: dict[int, np.ndarray] = field(default_factory=dict)
    grads: dict[int, np.ndarray] = field(default_factory=dict)
    pos: int = 0
    backwards: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    intervals: list[BusyInterval] = field(default_factory=list)
    peak_held: int = 0


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """Run `fn(*args)` and return its result with its start and end times."""
    start = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore"):
        result = fn(*args)
    return result, start, time.perf_counter()


class StageRunner:
    """Runs a stage's steps, one at a time (see the module docstring).

    Args:
        stage: the stage whose hooks do the math and whose neighbours
            (`previous`, `next`) receive its outputs.
    """

    def __init__(self, stage: RunnableStage) -> None:
        self.stage = stage
        self._run: _Run | None = None
        self._closed = 0  # every step_id <= this is finished or aborted
        self._early: dict[int, list[Activations | Gradients]] = {}

    def arrived(self, message: Activations | Gradients) -> None:
        """Take an input of the step in flight; buffer one of a later step;
        drop one of a finished or aborted step."""
        if message.step_id <= self._closed:
            return
        run = self._run
        if run is None or run.step_id != message.step_id:
            self._early.setdefault(message.step_id, []).append(message)
            return
        box = run.inputs if isinstance(message, Activations) else run.grads
        box[message.micro] = message.data

    async def start(self, msg: RunMicroBatches) -> Failure | None:
        """Begin `msg`'s step; its answer comes later, through a deferred reply.

        Returns:
            None, or a `Failure` when the step cannot start: another step is
            in flight or this one is over, or the first (last) stage got no
            inputs (targets).
        """
        stage = self.stage
        if self._run is not None or msg.step_id <= self._closed:
            return Failure(
                ValueError(f"stage {stage.index}: step {msg.step_id} overlaps another step")
            )
        if stage.is_first and msg.inputs is None:
            return Failure(ValueError("the first stage needs the micro-batch inputs"))
        if stage.is_last and msg.targets is None:
            return Failure(ValueError("the last stage needs the micro-batch targets"))
        reply = stage.context.defer()
        run = _Run(
            msg.step_id,
            tuple(msg.ops),
            msg.train,
            msg.loss,
            float(msg.normaliser),
            reply,
            msg.targets,
        )
        if msg.inputs is not None and stage.is_first:
            run.inputs.update(enumerate(msg.inputs))
        self._run = run
        for early in self._early.pop(msg.step_id, []):
            self.arrived(early)
        await self.pump()
        return None

    def abort(self, step_id: int) -> None:
        """Drop step `step_id`: its pending answer fails with `StageAborted`."""
        run = self._run
        if run is not None and run.step_id == step_id:
            aborted = StageAborted(f"stage {self.stage.index}: step {step_id} aborted")
            self._finish(run, aborted, None)
        else:
            self._closed = max(self._closed, step_id)
            self._early.pop(step_id, None)

    def _finish(self, run: _Run, error: BaseException | None, report: StageReport | None) -> None:
        self._run = None
        self._closed = max(self._closed, run.step_id)
        for sid in [s for s in self._early if s <= self._closed]:
            del self._early[sid]
        if error is not None:
            self.stage.drop_activations()
            run.reply.set_exception(error)
        else:
            run.reply.set_result(report)

    async def pump(self) -> None:
        """Run the step's next ops while their inputs are there; answer the
        step once its last op ran."""
        run = self._run
        while run is not None and self._run is run and run.pos < len(run.ops):
            op = run.ops[run.pos]
            try:
                if op.kind is OpKind.FORWARD:
                    span = await self._forward(run, op.micro)
                else:
                    span = await self._backward(run, op.micro)
            except Exception as exc:  # the stage's own failure: report it, keep the actor
                if self._run is run:
                    self._finish(run, exc, None)
                return
            if span is None or self._run is not run:
                return  # its input is not there yet, or the step was aborted meanwhile
            held = self.stage.held_activations() + (op.kind is OpKind.BACKWARD)
            run.peak_held = max(run.peak_held, held)
            run.intervals.append(BusyInterval(self.stage.index, op.kind.value, op.micro, *span))
            run.pos += 1
        if run is not None and self._run is run:
            await self._report(run)

    async def _forward(self, run: _Run, k: int) -> tuple[float, float] | None:
        """Forward of micro-batch `k`, told on to the next stage; its start and
        end, or None while its input has not arrived."""
        if k not in run.inputs:
            return None
        stage = self.stage
        x = run.inputs.pop(k)
        target = run.targets[k] if stage.is_last and run.targets is not None else None
        (out, loss_sum, correct), t0, t1 = await stage.on_device(
            _timed, stage.forward_micro, k, x, target, run.normaliser, run.train
        )
        run.loss_sum += loss_sum
        run.correct += correct
        if out is not None and stage.next is not None:
            stage.next.tell(Activations(run.step_id, k, out))
        return t0, t1

    async def _backward(self, run: _Run, k: int) -> tuple[float, float] | None:
        """Backward of micro-batch `k`, its input gradient told to the previous
        stage; its start and end, or None while its gradient has not arrived."""
        if not run.train:
            raise ValueError("an evaluation run has no backward ops")
        stage = self.stage
        dy = None
        if not stage.is_last:
            if k not in run.grads:
                return None
            dy = run.grads.pop(k)
        dx, t0, t1 = await stage.on_device(_timed, stage.backward_micro, k, dy, run.backwards > 0)
        run.backwards += 1
        if dx is not None and stage.previous is not None:
            stage.previous.tell(Gradients(run.step_id, k, dx))
        return t0, t1

    async def _report(self, run: _Run) -> None:
        """Answer the step: loss, correct count, squared gradient norm, busy
        intervals (or the failure of the norm's computation)."""
        grad_sq = 0.0
        if run.train:
            try:
                grad_sq = await self.stage.on_device(self.stage.gradient_sq_norm)
            except Exception as exc:
                self._finish(run, exc, None)
                return
            if not math.isfinite(grad_sq):
                grad_sq = float("inf")
        report = StageReport(
            run.step_id, run.loss_sum, run.correct, grad_sq, tuple(run.intervals), run.peak_held
        )
        self._finish(run, None, report)
