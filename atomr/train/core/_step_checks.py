"""What makes a computed step unusable, checked before any weight changes.

Every trainer computes a loss sum, its normaliser (internals.md section 3)
and a gradient norm, and passes each to one of these checks before it
applies anything. On a device thread under `device_guard.guarded`, the
errors they raise come back as a `Rejected`; in an actor, as a `Failure`.
"""

from __future__ import annotations

import math

from atomr.train.core.errors import InvalidBatchError, NonFiniteError, StepLimitError
from atomr.train.core.stats import EvalResult

__all__ = [
    "check_gradient",
    "check_loss",
    "check_normaliser",
    "check_step_limit",
    "evaluation",
]


def check_loss(loss_sum: float) -> None:
    """Refuse a loss that is NaN or infinite.

    Args:
        loss_sum: the loss sum of the step (or of a part of it).

    Raises:
        NonFiniteError: `loss_sum` is not finite (the message shows it).
    """
    if not math.isfinite(loss_sum):
        raise NonFiniteError(f"loss is not finite ({loss_sum}); step not applied")


def check_normaliser(normaliser: float) -> None:
    """Refuse a loss whose mean is undefined.

    Args:
        normaliser: the loss's normaliser (the element count, the batch
            size, or the sum of the targets' class weights).

    Raises:
        InvalidBatchError: `normaliser <= 0`: every target has class weight 0.
    """
    if normaliser <= 0.0:
        raise InvalidBatchError("every target has class weight 0; the loss is undefined")


def check_gradient(grad_norm: float, what: str = "step") -> None:
    """Refuse a gradient that holds NaN or infinity.

    Args:
        grad_norm: the gradient's global L2 norm, or its square (either is
            finite exactly when every element is).
        what: what is then not applied, for the message ("step", "micro-step").

    Raises:
        NonFiniteError: `grad_norm` is not finite.
    """
    if not math.isfinite(grad_norm):
        raise NonFiniteError(f"gradient is not finite; {what} not applied")


def evaluation(loss_sum: float, normaliser: float, accuracy: float, samples: int) -> EvalResult:
    """The answer to an `Evaluate`: a finite loss, or NaN for a batch whose
    targets all have class weight 0 (torch's 0/0, where a step is refused:
    `check_normaliser`), which `fit` then weights by its normaliser, 0, so
    that a set evaluated batch by batch is not refused for one such batch.

    Args:
        loss_sum: the batch's loss sum.
        normaliser: its normaliser (see `check_normaliser`).
        accuracy: the fraction of correct arg-maxes (NaN without class labels).
        samples: the batch size.

    Returns:
        `EvalResult(loss_sum / normaliser, accuracy, samples, normaliser)`;
        with a normaliser of 0, the loss is NaN.

    Raises:
        InvalidBatchError: `normaliser < 0`.
        NonFiniteError: the mean loss is NaN or infinite (the message shows it).
    """
    if normaliser == 0.0:
        return EvalResult(math.nan, float(accuracy), int(samples), 0.0)
    check_normaliser(normaliser)
    loss = float(loss_sum) / float(normaliser)
    if not math.isfinite(loss):
        raise NonFiniteError(f"evaluation loss is not finite ({loss}); the weights overflow it")
    return EvalResult(loss, float(accuracy), int(samples), float(normaliser))


def check_step_limit(steps: int, max_steps: int | None) -> None:
    """Refuse a `Step` once `steps` applied steps reached `max_steps`.

    Raises:
        StepLimitError: the limit is reached (nothing is changed).
    """
    if max_steps is not None and steps >= max_steps:
        raise StepLimitError(
            f"the trainer reached max_steps ({max_steps}); raise TrainerConfig.max_steps "
            "to train further"
        )
