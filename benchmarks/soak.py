"""Full-size soak of the actor runtime (issue 11), printing JSON.

Runs the scenarios of `tests/stress/scenarios.py` at full size: 1,000
actors exchanging 10 M messages (nothing lost, duplicated or reordered),
100,000 concurrent asks with timeouts mixed in, and a supervision storm
with tracemalloc before/after. Exits non-zero if an invariant broke.

    python benchmarks/soak.py            # full size
    python benchmarks/soak.py --scale 0.1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from _args import positive_real

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import atomr  # noqa: E402
from atomr import ActorSystem  # noqa: E402
from tests.stress.scenarios import (  # noqa: E402
    concurrent_asks,
    message_exchange,
    quiet_runtime_logs,
    supervision_storm,
)


async def _main(scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {"scale": scale, "loop": None}
    async with ActorSystem("soak") as system:
        import asyncio

        out["loop"] = type(asyncio.get_running_loop()).__module__.split(".")[0]
        reports = [
            await message_exchange(system, 1_000, int(10_000_000 * scale)),
            await concurrent_asks(system, int(100_000 * scale)),
        ]
        with quiet_runtime_logs():
            reports.append(await supervision_storm(system, 200, int(100_000 * scale), 10))
    for r in reports:
        out[r.name] = {**r.figures, "errors": r.errors}
    return out


def main() -> int:
    """Run the soak and print its figures as JSON; 1 if an invariant broke."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=positive_real, default=1.0, help="fraction of the full size"
    )
    args = parser.parse_args()
    result = atomr.run(_main(args.scale))
    print(json.dumps(result, indent=2))
    broken = any(v.get("errors") for v in result.values() if isinstance(v, dict))
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
