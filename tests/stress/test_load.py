"""Load and soak: nothing lost or duplicated under load, asks always end,
and a supervision storm leaves the system responsive with flat memory.

CI runs the bounded form; `ATOMR_STRESS_FULL=1` runs the sizes of issue 11
(1,000 actors x 10 M messages, 100,000 asks). Figures are printed (`-s`),
never asserted; the invariants are.
"""

from __future__ import annotations

import json

from atomr import ActorSystem
from tests.stress.scenarios import (
    FULL,
    Report,
    concurrent_asks,
    message_exchange,
    quiet_runtime_logs,
    supervision_storm,
)

MESSAGES = 10_000_000 if FULL else 1_000_000
ASKS = 100_000 if FULL else 20_000
STORM_MESSAGES = 100_000 if FULL else 20_000
STORM_ROUNDS = 10 if FULL else 4
MEMORY_SLACK = 1_000_000
"""Bytes the traced heap may grow between the warm-up and the last storm
round (pytest, asyncio and allocator noise; a leak of one restarted actor
per failure would be tens of MB)."""


def _show(report: Report) -> None:
    print(json.dumps({report.name: report.figures, "full": FULL}))


async def test_thousand_actors_exchange_without_loss_or_duplication(
    actor_system: ActorSystem,
) -> None:
    report = await message_exchange(actor_system, 1_000, MESSAGES)
    _show(report)
    assert report.errors == []
    assert report.figures["messages"] >= MESSAGES * 0.99
    assert report.figures["dead_letters"] == 0


async def test_concurrent_asks_with_timeouts_each_end_once(actor_system: ActorSystem) -> None:
    report = await concurrent_asks(actor_system, ASKS)
    _show(report)
    assert report.errors == []
    assert report.figures["answered"] + report.figures["timed_out"] == ASKS
    assert report.figures["timed_out"] > 0


async def test_supervision_storm_stays_responsive_with_flat_memory(
    actor_system: ActorSystem,
) -> None:
    with quiet_runtime_logs():
        report = await supervision_storm(actor_system, 200, STORM_MESSAGES, STORM_ROUNDS)
    _show(report)
    assert report.errors == []
    assert report.figures["restarts"] > 0.02 * report.figures["messages"]
    assert report.figures["growth_bytes"] < MEMORY_SLACK
