"""Exceptions raised by the training layer."""

from __future__ import annotations

__all__ = ["CheckpointError", "InvalidBatchError", "NonFiniteError"]


class InvalidBatchError(ValueError):
    """A batch was rejected before any math ran: wrong shape, dtype, label
    range, or non-finite values. The model's weights are untouched."""


class NonFiniteError(FloatingPointError):
    """A loss or gradient came out NaN or infinite; the step was not applied
    and the model's weights are untouched."""


class CheckpointError(Exception):
    """A checkpoint could not be written or read: corrupted, truncated, of an
    unknown format, or made for a model of another shape."""
