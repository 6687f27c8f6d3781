"""The accumulation window one trainer keeps open, and its saved form."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train.core.accumulation import (
    AccumulationWindow,
    accumulation_extra,
    read_pending,
)
from atomr.train.core.checkpoint import Checkpoint, CheckpointError


def _checkpoint(extra: dict) -> Checkpoint:
    return Checkpoint(model={}, weights=np.zeros(3, np.float32), step=0, optimizer={}, extra=extra)


def test_window_counts_micro_steps_and_closes_with_the_last_step() -> None:
    window = AccumulationWindow()
    window.add(2.0, 4.0, 8)
    window.add(1.0, 2.0, 8)
    assert (window.micro, window.loss_sum, window.normaliser, window.samples) == (2, 3.0, 6.0, 16)
    assert window.close(0.5, 1.0) == (3.5, 7.0)
    assert window == AccumulationWindow()


def test_a_closed_window_saves_as_none_and_an_open_one_round_trips() -> None:
    grads = np.array([1.0, -2.0, 3.0], np.float32)
    assert AccumulationWindow().saved(grads) is None
    assert accumulation_extra(None)["micro"] == 0
    window = AccumulationWindow()
    window.add(2.0, 4.0, 8)
    saved = window.saved(grads)
    assert saved is not None
    back = read_pending(_checkpoint(accumulation_extra(saved)), 3, 4, np.float32, "Trainer")
    assert back is not None
    reopened = AccumulationWindow()
    reopened.reopen(back)
    assert reopened == window
    np.testing.assert_array_equal(back.grads, grads)


def test_reopen_without_totals_counts_only_steps_and_rows() -> None:
    window = AccumulationWindow()
    window.add(2.0, 4.0, 8)
    saved = window.saved(np.zeros(3, np.float32))
    assert saved is not None
    other = AccumulationWindow(3, 9.0, 9.0, 99)
    other.reopen(saved, totals=False)
    assert (other.micro, other.loss_sum, other.normaliser, other.samples) == (1, 0.0, 0.0, 8)


def test_a_window_at_or_beyond_the_loaders_accumulation_is_refused() -> None:
    window = AccumulationWindow()
    window.add(1.0, 1.0, 1)
    window.add(1.0, 1.0, 1)
    extra = accumulation_extra(window.saved(np.zeros(3, np.float32)))
    with pytest.raises(
        CheckpointError, match="2 micro-steps .*; Trainer with accumulation_steps=2"
    ):
        read_pending(_checkpoint(extra), 3, 2, np.float32, "Trainer")


def test_pending_gradients_are_checked_finite_in_the_loader_s_dtype() -> None:
    """1e300 (float64) is refused for a float32 model (`cast_finite`, the
    rule of every array used in a dtype) and taken for a float64 one."""
    window = AccumulationWindow()
    window.add(1.0, 1.0, 1)
    extra = accumulation_extra(window.saved(np.full(3, 1e300)))
    with pytest.raises(CheckpointError) as info:
        read_pending(_checkpoint(extra), 3, 2, np.float32, "Trainer")
    assert str(info.value) == (
        "checkpoint's pending gradients hold values too large for float32 (NaN or Inf after "
        "the cast)"
    )
    back = read_pending(_checkpoint(extra), 3, 2, np.float64, "Trainer")
    assert back is not None
    np.testing.assert_array_equal(back.grads, np.full(3, 1e300))
