"""`TrainerConfig`: its arguments checked by the shared rules (a timeout:
`atomr.actor.ref.check_timeout`; a number: `atomr._arguments`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.train import LossKind, OptimizerKind, TrainerConfig


def _config(**fields: Any) -> TrainerConfig:
    return TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, **fields)


@pytest.mark.parametrize("timeout", [None, 5, 2.5, np.float32(5), np.int64(5)])
def test_worker_timeout_takes_none_and_positive_numbers(timeout: Any) -> None:
    assert _config(worker_timeout=timeout).worker_timeout == timeout


@pytest.mark.parametrize(
    ("timeout", "error", "match"),
    [
        ("1", TypeError, "worker_timeout must be a number of seconds or None, got str"),
        (True, TypeError, "worker_timeout must be a number of seconds or None, got bool"),
        (0, ValueError, "worker_timeout must be > 0 seconds or None, got 0"),
        (float("nan"), ValueError, "worker_timeout must be > 0 seconds or None, got nan"),
        (float("inf"), ValueError, "worker_timeout must be a finite number of seconds"),
        (10**400, ValueError, r"worker_timeout is too large: 1000\d*\.\.\.0+ seconds"),
    ],
    ids=["str", "bool", "zero", "nan", "inf", "huge"],
)
def test_worker_timeout_is_checked_as_every_timeout_is(
    timeout: Any, error: type[Exception], match: str
) -> None:
    """The same rule and words as an ask's timeout (`check_timeout`), and
    finite: None is how a trainer waits without a deadline."""
    with pytest.raises(error, match=match):
        _config(worker_timeout=timeout)


@pytest.mark.parametrize(
    ("clip", "error", "match"),
    [
        ("1", TypeError, "gradient_clip must be a real number, got '1'"),
        (True, TypeError, "gradient_clip must be a real number, got True"),
        (0.0, ValueError, "gradient_clip must be positive and finite, got 0.0"),
        (float("inf"), ValueError, "gradient_clip must be positive and finite"),
        (10**400, ValueError, "gradient_clip must be positive and finite"),
    ],
    ids=["str", "bool", "zero", "inf", "huge"],
)
def test_gradient_clip_is_a_positive_finite_real_number(
    clip: Any, error: type[Exception], match: str
) -> None:
    """Checked by `_arguments.real_number`: an int beyond float's range is a
    ValueError like any infinite clip (it was an OverflowError)."""
    with pytest.raises(error, match=match):
        _config(gradient_clip=clip)
    assert _config(gradient_clip=np.float32(0.5)).gradient_clip == 0.5
