"""Stress suite: every test here carries the `stress` marker."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder `stress`."""
    for item in items:
        if "tests/stress/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.stress)
