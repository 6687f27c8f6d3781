"""`fit` checks its callbacks before any step: a hook it cannot call (the
wrong arity) is a TypeError naming it, not a failure after the first
epoch's training (`atomr/train/_fit_callbacks.py`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import GetWeights, LossKind, Mlp, OptimizerKind, Trainer, TrainerConfig
from atomr.train.core import synthetic_classification
from atomr.train.fit import FitCallback, fit

CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
X, Y = synthetic_classification(40, 6, 3, seed=1)


class _OldEvaluate(FitCallback):
    """An `on_evaluate` written without the position `fit` passes."""

    def on_evaluate(self, split: str, loss: float, accuracy: float) -> None:  # type: ignore[override]
        pass


class _CallableHook:
    def __call__(self, record: Any) -> None:
        pass


class _ObjectHook(FitCallback):
    """An `on_epoch_end` that is a callable object taking one argument."""

    def __init__(self) -> None:
        self.on_epoch_end = _CallableHook()  # type: ignore[assignment,method-assign]


class _AsyncHook(FitCallback):
    """An `on_epoch_end` written as an async function: fit does not await it."""

    async def on_epoch_end(self, record: Any, epochs: int) -> None:  # type: ignore[override]
        pass


@pytest.mark.parametrize(
    ("callback", "needle"),
    [
        (_OldEvaluate(), r"_OldEvaluate.on_evaluate cannot take the 4 arguments fit passes it "
                         r"\(split, loss, accuracy, position\)"),
        (_ObjectHook(), r"_ObjectHook.on_epoch_end cannot take the 2 arguments fit passes it "
                        r"\(record, epochs\)"),
        (_AsyncHook(), r"_AsyncHook.on_epoch_end is an async function, but fit calls its "
                       r"hooks without awaiting them"),
    ],
    ids=["method", "callable", "async"],
)  # fmt: skip
async def test_a_callback_hook_fit_cannot_call_is_refused_before_any_step(
    callback: FitCallback, needle: str
) -> None:
    """It raised TypeError only when first called: after the first epoch's
    training, which was lost without a checkpoint."""
    async with ActorSystem("fit-run") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await trainer.ask(GetWeights())
        with pytest.raises(TypeError, match=needle):
            await fit(trainer, (X, Y), epochs=1, batch_size=16, callbacks=[callback])
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


class _AwaitableHook(FitCallback):
    """An `on_step` that is a callable object returning a coroutine: only
    its call tells that it is async."""

    def __init__(self) -> None:
        self.on_step = self._Call()  # type: ignore[assignment,method-assign]

    class _Call:
        def __call__(self, *args: Any) -> Any:
            async def work() -> None:
                pass

            return work()


@pytest.mark.filterwarnings("error::RuntimeWarning")  # its coroutine is closed, not left unrun
async def test_a_hook_that_returns_an_awaitable_stops_the_run_after_its_step() -> None:
    """Its work was dropped, the run going on as if it had been done."""
    async with ActorSystem("fit-run") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        with pytest.raises(TypeError, match="_AwaitableHook.on_step is an async function") as e:
            await fit(trainer, (X, Y), epochs=1, batch_size=16, callbacks=[_AwaitableHook()])
    assert "raised after step 1; the run stopped" in "".join(e.value.__notes__)
