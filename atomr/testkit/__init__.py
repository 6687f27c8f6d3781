"""Test helpers: ``TestProbe``, ``ManualClock``, ``expect_log``, fault
injection (``Plan``, ``inject_faults``), and the ``actor_system`` pytest
fixture (plugin)."""

from .clock import ManualClock
from .faults import Plan, inject_faults
from .logs import expect_log
from .probe import ChildFailed, TestProbe

__all__ = ["ChildFailed", "ManualClock", "Plan", "TestProbe", "expect_log", "inject_faults"]
