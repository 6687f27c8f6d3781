"""`expect_log`: the level it counts from is the level the logger lets through."""

from __future__ import annotations

import logging

import pytest

from atomr.testkit import expect_log


@pytest.mark.parametrize("level", [0, "NOTSET"])
async def test_expect_log_at_notset_counts_debug_records(level: int | str) -> None:
    atomr_logger = logging.getLogger("atomr")
    saved = atomr_logger.level
    async with expect_log("hello", level=level, timeout=0.05):
        logging.getLogger("atomr.testkit.test").debug("hello")  # was: dropped, "got 0"
    assert atomr_logger.level == saved
