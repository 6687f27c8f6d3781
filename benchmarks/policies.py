"""Data-parallel averaging policies on heterogeneous devices: wall time to a
test accuracy on digits, with one of two logical CPU devices slowed down.

`cpu:1` is made `--slow` times slower (`atomr.testkit.slow_device`), then
a `DataParallelTrainer` over `cpu:0, cpu:1` trains a 64-64-10 MLP (Adam) epoch
by epoch until its test accuracy reaches `--target`, under each policy:
SYNC (every batch split evenly: the fast replica waits), CADENCE (El Che: the
fast replica takes more batches per round, anchor auto-tuned) and ASYNC
(local SGD: each batch whole to the first free replica, averaged every 4
batches). Prints JSON: seconds to the target (min and median over `--repeat`
interleaved runs), the ratio SYNC / policy (higher is faster), and the
all-reduce share of CADENCE's rounds.

    python benchmarks/policies.py [--slow 3] [--target 0.95] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from _args import count, factor

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.testkit import slow_device
from atomr.train import LossKind, Mlp, OptimizerKind, StepStats, TrainerConfig, fit
from atomr.train.core import load_digits_split
from atomr.train.data_parallel import ApplyPolicy, DataParallelOptions, DataParallelTrainer
from atomr.train.data_parallel.replica import ReplicaActor
from atomr.train.fit import FitCallback, FitPosition

POLICIES: dict[str, dict[str, Any]] = {
    "sync": {},
    "cadence": {"policy": ApplyPolicy.CADENCE},
    "async": {"policy": ApplyPolicy.ASYNC, "average_every": 4},
}


class _Shares(FitCallback):
    """The all-reduce share of every applied step."""

    def __init__(self) -> None:
        self.shares: list[float] = []

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        if stats.applied and stats.step_micros:
            self.shares.append(stats.comm_micros / stats.step_micros)


async def time_to_target(
    policy: str, slow: float, target: float, max_epochs: int
) -> tuple[float, list[float]]:
    """Seconds until the test accuracy reaches `target` (inf if never), and the shares."""
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    shares = _Shares()
    replica = slow_device(ReplicaActor, "cpu:1", slow)
    options = DataParallelOptions(replica_class=replica, **POLICIES[policy])
    async with ActorSystem("policies") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([64, 64, 10], seed=0), cpu_devices(2), config, options
        )
        started = time.perf_counter()
        position = FitPosition()
        for epoch in range(1, max_epochs + 1):
            result = await fit(
                dp, (x_tr, y_tr), validation=(x_te, y_te), epochs=epoch, batch_size=32,
                start=position, callbacks=[shares],
            )  # fmt: skip
            position = result.position
            if result.epochs[-1].test_accuracy >= target:
                return time.perf_counter() - started, shares.shares
    return float("inf"), shares.shares


async def main(args: argparse.Namespace) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {p: [] for p in POLICIES}
    cadence_shares: list[float] = []
    for _ in range(args.repeat):
        for policy in POLICIES:
            took, shares = await time_to_target(policy, args.slow, args.target, args.max_epochs)
            seconds[policy].append(took)
            if policy == "cadence":
                cadence_shares += shares
    report: dict[str, Any] = {
        "benchmark": "policies",
        "slow_device": "cpu:1",
        "slow_factor": args.slow,
        "target_test_accuracy": args.target,
        "repeat": args.repeat,
    }
    sync_min, sync_med = min(seconds["sync"]), statistics.median(seconds["sync"])
    for policy, values in seconds.items():
        low, mid = min(values), statistics.median(values)
        report[f"{policy}_seconds"] = [round(low, 3), round(mid, 3)]
        report[f"{policy}_speedup_vs_sync"] = [round(sync_min / low, 3), round(sync_med / mid, 3)]
    if cadence_shares:
        report["cadence_allreduce_share_median"] = round(statistics.median(cadence_shares), 4)
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--slow", type=factor, default=3.0, help="cpu:1 takes this many times as long (>= 1)"
    )
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--repeat", type=count, default=3, help="interleaved runs of each policy")
    parser.add_argument("--max-epochs", type=count, default=30)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(atomr.run(main(parse())), indent=2))
