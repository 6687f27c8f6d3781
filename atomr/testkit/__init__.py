"""Test helpers: ``TestProbe``, ``ManualClock``, ``expect_log``, waits under
a deadline (``await_condition``, ``wait_until``), fault injection (``Plan``,
``inject_faults``), a slowed device (``slow_device``), and the ``actor_system`` pytest fixture (plugin)."""

from .clock import ManualClock
from .conditions import await_condition, wait_until
from .faults import Plan, inject_faults
from .logs import expect_log
from .probe import ChildFailed, TestProbe
from .slow_device import slow_device

__all__ = [
    "ChildFailed",
    "ManualClock",
    "Plan",
    "TestProbe",
    "await_condition",
    "expect_log",
    "inject_faults",
    "slow_device",
    "wait_until",
]
