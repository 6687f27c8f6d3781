"""How `fit` evaluates a data set after an epoch: one request for arrays,
else batch by batch, each batch's figures weighted so that the result
equals one evaluation of the whole set (`evaluate_set`); the request is the
trainer's `Evaluate` or the user's `Evaluator` hook (`measure`)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from atomr._repr import bounded_repr
from atomr.actor import ActorRef
from atomr.train._fit_callbacks import awaited
from atomr.train.core.messages import Evaluate
from atomr.train.core.sources import BatchSource
from atomr.train.core.stats import EvalResult
from atomr.train.fit_events import Evaluator

__all__ = ["Measure", "contract_reply", "evaluate_set", "measure"]

ReplyT = TypeVar("ReplyT")

Measure = Callable[[Any, Any], Awaitable[EvalResult]]
"""How `fit` evaluates `(features, labels)`: the trainer's `EvalResult`, or
a user's `Evaluator` hook's `(loss, accuracy)` without a normaliser."""


def _loss_and_accuracy(result: object) -> tuple[float, float]:
    """The `(loss, accuracy)` an `evaluate` hook returned, as floats.

    Raises:
        TypeError: not a pair of numbers (the message names the hook).
    """
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"evaluate must return (loss, accuracy), got {bounded_repr(result)}")
    try:
        return float(result[0]), float(result[1])
    except (TypeError, ValueError):
        raise TypeError(
            f"evaluate must return two numbers (loss, accuracy), got {bounded_repr(result)}"
        ) from None


def contract_reply(reply: object, expected: type[ReplyT], message: str) -> ReplyT:
    """`reply`, what the trainer answered `message` with, checked to be the
    contract's `expected` reply.

    Raises:
        TypeError: another answer (None, or the message itself from an
            actor that does not speak the trainer contract), which `fit`
            would otherwise take as a step limit or fail on later.
    """
    if not isinstance(reply, expected):
        raise TypeError(
            f"the trainer answered {message} with {bounded_repr(reply)}, not {expected.__name__}: "
            "fit trains an actor that answers the trainer contract (docs/training.md)"
        )
    return reply


def measure(trainer: ActorRef, hook: Evaluator | None, timeout: float | None) -> Measure:
    """How `fit` evaluates a batch: the trainer's `EvalResult`, or the
    hook's `(loss, accuracy)` (no normaliser: weighted by the label count).
    The `Measure` raises TypeError for a hook that is no async function or
    returns no pair of numbers, or a trainer that answers no `EvalResult`,
    and what the trainer answered `Evaluate` with."""

    async def ask(x: np.ndarray, y: np.ndarray) -> EvalResult:
        result = await trainer.ask(Evaluate(x, y), timeout=timeout)
        return contract_reply(result, EvalResult, "Evaluate")

    if hook is None:
        return ask
    evaluate: Evaluator = hook

    async def call(x: np.ndarray, y: np.ndarray) -> EvalResult:
        loss, accuracy = _loss_and_accuracy(await awaited("evaluate", evaluate(x, y)))
        return EvalResult(loss, accuracy, len(x))

    return call


@dataclass
class _Weighted:
    """A set's evaluation from its batches': each loss weighted by its
    normaliser (the label count when a trainer or hook does not give one),
    each accuracy by its label count (rows, or tokens)."""

    loss_sum: float = 0.0
    normaliser: float = 0.0
    correct: float = 0.0
    labels: int = 0

    def add(self, result: EvalResult, labels: int) -> None:
        weight = labels if result.normaliser is None else result.normaliser
        if weight > 0:  # a batch of weight 0 has a NaN loss (`evaluation`)
            self.loss_sum += result.loss * weight
        self.normaliser += weight
        self.correct += result.accuracy * labels
        self.labels += labels

    def means(self) -> tuple[float, float]:
        """`(loss, accuracy)` of the batches added; NaN for none."""
        loss = self.loss_sum / self.normaliser if self.normaliser > 0 else math.nan
        return loss, self.correct / self.labels if self.labels else math.nan


async def evaluate_set(
    evaluate: Measure,
    source: BatchSource,
    batch_size: int,
    *,
    first_only: bool = False,
) -> tuple[float, float]:
    """Loss and accuracy over a whole data set (or its first batch): one
    request for arrays, else batch by batch (`_Weighted`), in the set's own
    order (epoch 0's for a source without one).

    Raises:
        Exception: what `evaluate` raised (an `InvalidBatchError`, a
            `TypeError` of a misused hook), or the data.
    """
    if source.arrays is not None and not first_only:
        whole = await evaluate(*source.arrays)
        return float(whole.loss), float(whole.accuracy)
    total = _Weighted()
    for x, y in _in_order(source, batch_size):
        total.add(await evaluate(x, y), int(y.size))
        if first_only:
            break
    return total.means()


def _in_order(source: BatchSource, batch_size: int) -> Iterator[Any]:
    """A data set's batches for evaluation: its own order, or epoch 0's."""
    in_order = getattr(source, "in_order", None)
    return in_order(batch_size) if in_order is not None else source.batches(0, 0)
