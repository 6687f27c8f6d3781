"""Test helpers: ``TestProbe``, ``ManualClock``, ``expect_log``, and the
``actor_system`` pytest fixture (plugin)."""

from .clock import ManualClock
from .logs import expect_log
from .probe import ChildFailed, TestProbe

__all__ = ["ChildFailed", "ManualClock", "TestProbe", "expect_log"]
