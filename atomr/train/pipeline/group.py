"""`StageGroup`: a pipeline trainer's view of its stages (their layers'
widths and parameter offsets) and the fan-out of each phase of a step over
them: the pipelined pass, the all-or-none apply, and the all-or-none load."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train._recovery import ResumedCrashWatch
from atomr.train.comm._fanout import (
    ask_all,
    ask_all_or_abort,
    ask_all_settled,
    failed_indices,
    load_all_or_none,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.core.models import batch_spec
from atomr.train.core.validation import BatchSpec
from atomr.train.pipeline._checkpoint import check_one_model, merge_stage_states, model_config
from atomr.train.pipeline.messages import (
    AbortStep,
    ApplyStageGradients,
    ConnectStage,
    GetStageState,
    RollbackStep,
    RunMicroBatches,
    SetStageState,
    StageInfo,
    StageReport,
    StageState,
)

__all__ = ["StageGroup"]


class StageGroup:
    """The connected stages of a pipeline (build one with `connect`).

    Attributes:
        refs: the stages, in pipeline order.
        infos: their `StageInfo`s.
        offsets: where each stage's parameters start in the flat vector, the
            total last.
        timeout: seconds each request to a stage may take (None: forever).
        spec: what the whole pipeline takes and gives: the first stage's
            input, the last one's output (built once with the group).
    """

    def __init__(
        self, refs: Sequence[ActorRef], infos: Sequence[StageInfo], timeout: float | None
    ) -> None:
        self.refs = list(refs)
        self.infos = list(infos)
        self.timeout = timeout
        self.offsets = [0]
        for info in self.infos:
            self.offsets.append(self.offsets[-1] + info.n_params)
        first, last = self.infos[0], self.infos[-1]
        takes = batch_spec(first.model)
        self.spec = BatchSpec(
            takes.in_shape, tuple(last.out_shape), takes.input_kind, takes.vocab, first.dtype
        )

    @classmethod
    async def connect(cls, refs: Sequence[ActorRef], config: TrainerConfig) -> StageGroup:
        """Tell every stage its place, neighbours and optimizer (`ConnectStage`).

        Args:
            refs: the stages, in pipeline order.
            config: the trainer's config (its optimizer is sent on; its
                `worker_timeout` bounds every request).

        Returns:
            The group.

        Raises:
            TypeError: a stage does not answer with a `StageInfo`.
            ValueError: a stage's output width differs from the next one's
                input, or the stages do not make one model (`check_one_model`:
                another dtype, or not the slices of one `Mlp`).
        """
        p = len(refs)
        msgs = [
            ConnectStage(
                i,
                p,
                refs[i - 1] if i > 0 else None,
                refs[i + 1] if i + 1 < p else None,
                config.optimizer,
            )
            for i in range(p)
        ]
        infos = await ask_all(refs, msgs, config.worker_timeout)
        for i, info in enumerate(infos):
            if not isinstance(info, StageInfo):
                raise TypeError(f"stage {i} answered ConnectStage with {type(info).__name__}")
        check_one_model(infos)
        for i in range(p - 1):
            if tuple(infos[i].out_shape) != tuple(infos[i + 1].in_shape):
                raise ValueError(
                    f"stage {i} outputs {tuple(infos[i].out_shape)} per sample, stage {i + 1} "
                    f"takes {tuple(infos[i + 1].in_shape)}"
                )
        return cls(refs, infos, config.worker_timeout)

    @property
    def model_config(self) -> dict[str, Any]:
        """The whole model's config (`Mlp.config()` shape)."""
        return model_config(self.infos)

    async def all(self, message: Any) -> list[Any]:
        """Ask every stage `message`.

        Returns:
            The replies, in pipeline order.

        Raises:
            Exception: the first failing stage's, after every reply settled.
        """
        return await ask_all(self.refs, message, self.timeout, per_worker=False)

    async def _settled(self, message: Any) -> list[Any]:
        return await ask_all_settled(self.refs, message, self.timeout, per_worker=False)

    async def run(self, msgs: list[RunMicroBatches], resumed: ResumedCrashWatch) -> list[Any]:
        """One pipelined pass: every stage's `RunMicroBatches`; at the first
        failure, `AbortStep` to every stage.

        Args:
            msgs: one per stage, all of one step.
            resumed: the trainer's watch of stages resumed after raising: a
                stage that crashed on a told message (`Activations`,
                `Gradients`) leaves its `RunMicroBatches` unanswered, so its
                crash ends the pass.

        Returns:
            Every stage's `StageReport`.

        Raises:
            Exception: the failing stage's own, after every stage aborted.
        """
        sid = msgs[0].step_id

        async def abort() -> None:
            await self._settled(AbortStep(sid))

        crashed = resumed.begin()
        run = asyncio.ensure_future(ask_all_or_abort(self.refs, msgs, abort, self.timeout))
        try:
            await asyncio.wait((run, crashed), return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                reports: list[StageReport] = run.result()
                return reports
            error = crashed.result()
            await abort()
            await asyncio.gather(run, return_exceptions=True)
            error.add_note(f"raised by a stage actor during step {sid}; aborted on every stage")
            raise error
        finally:
            resumed.end()
            if not run.done():
                run.cancel()

    async def apply(self, step_id: int, coef: float) -> None:
        """Every stage applies its gradient of `step_id` scaled by `coef`; all or none.

        Raises:
            Exception: the first failing stage's (`worker_index` set), after
                every stage rolled back.
        """
        results = await self._settled(ApplyStageGradients(step_id, coef))
        failed = failed_indices(results)
        if failed:
            await self._settled(RollbackStep(step_id))
            error = results[failed[0]]
            error.worker_index = failed[0]
            error.add_note(
                f"ApplyStageGradients failed on stage {failed[0]}; every stage rolled back"
            )
            raise error

    async def state(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The full flat weights and full-vector optimizer state of the stages."""
        states: list[StageState] = await self.all(GetStageState())
        return merge_stage_states(states)

    async def load(self, states: Sequence[StageState]) -> None:
        """Give every stage its new state; all or none (`load_all_or_none`).

        Raises:
            Exception: the first failing stage's (`worker_index` set, a note
                naming it), after every stage was given its old state back.
        """
        old = await self.all(GetStageState())
        new = [SetStageState(s) for s in states]
        restore = [SetStageState(s) for s in old]
        await load_all_or_none(self.refs, new, restore, self.timeout, "stage")
