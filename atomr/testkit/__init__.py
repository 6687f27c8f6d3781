"""Test helpers: ``TestProbe``, fault injection (``Plan``, ``inject_faults``)
and the ``actor_system`` pytest fixture (plugin)."""

from .faults import Plan, inject_faults
from .probe import TestProbe

__all__ = ["Plan", "TestProbe", "inject_faults"]
