"""Test helpers: ``TestProbe`` and the ``actor_system`` pytest fixture (plugin)."""

from .probe import TestProbe

__all__ = ["TestProbe"]
