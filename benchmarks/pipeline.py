"""Pipeline-parallel benchmark; prints JSON.

1. Schedule fidelity: p = 4 stages whose every forward and backward takes a
   fixed device time (a GIL-releasing `time.sleep` on the stage's device
   thread, in a `StageActor` subclass speaking PipelineStageProtocol),
   m = 8 micro-batches. The measured step time is compared with the ideal
   `(m + p - 1) x stage time` and the measured bubble fraction with
   `(p - 1) / (m + p - 1)`, for GPipe and 1F1B.
2. The real Mlp 784-1024-1024-10, batch 512, split over 2 CPU devices, against
   the single-device Trainer measured in the same run.

Usage: .venv/bin/python benchmarks/pipeline.py [--op-ms 20] [--steps 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import numpy as np
from _args import count, positive_real

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import LossKind, Mlp, OptimizerKind, Step, Trainer, TrainerConfig
from atomr.train.pipeline import (
    GetTimeline,
    PipelineOptions,
    PipelineParallelTrainer,
    StageActor,
    Timeline,
)
from atomr.train.pipeline.schedule import Schedule, ideal_bubble_fraction, ideal_step_time

OP_SECONDS = 0.020  # overwritten by --op-ms


class SleepStage(StageActor):
    """A stage whose forward and backward each take a fixed device time."""

    def forward_micro(self, micro, x, target, normaliser, train):  # type: ignore[no-untyped-def]
        time.sleep(OP_SECONDS)
        return super().forward_micro(micro, x, target, normaliser, train)

    def backward_micro(self, micro, dy, accumulate):  # type: ignore[no-untyped-def]
        time.sleep(OP_SECONDS)
        return super().backward_micro(micro, dy, accumulate)


async def _timed_steps(
    ref: Any, batch: tuple[np.ndarray, np.ndarray], warmup: int, steps: int
) -> list[float]:
    for _ in range(warmup):
        await ref.ask(Step(*batch), timeout=600)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        await ref.ask(Step(*batch), timeout=600)
        times.append(time.perf_counter() - t0)
    return times


async def schedule_fidelity(p: int, m: int, steps: int) -> list[dict[str, Any]]:
    """Sleep stages: measured step time and bubble against the ideal."""
    rng = np.random.default_rng(0)
    model = Mlp([8] * (p + 1), seed=0)
    x = rng.normal(size=(2 * m, 8)).astype(np.float32)
    y = rng.integers(0, 8, size=2 * m)
    stage_time = 2 * OP_SECONDS
    rows = []
    for schedule in ("gpipe", "1f1b"):
        async with ActorSystem("bench") as system:
            config = TrainerConfig(OptimizerKind.sgd(0.01), LossKind.CROSS_ENTROPY)
            options = PipelineOptions(2, Schedule.parse(schedule), stage_class=SleepStage)
            ref = await PipelineParallelTrainer.spawn(
                system, model, cpu_devices(p), config, options
            )
            times = await _timed_steps(ref, (x, y), 1, steps)
            timeline: Timeline = await ref.ask(GetTimeline())
        ideal = ideal_step_time(p, m, stage_time)
        measured = statistics.median(times)
        rows.append(
            {
                "schedule": schedule,
                "p": p,
                "m": m,
                "op_ms": OP_SECONDS * 1e3,
                "step_ms": round(measured * 1e3, 2),
                "ideal_step_ms": round(ideal * 1e3, 2),
                "step_ratio": round(measured / ideal, 4),
                "bubble": round(timeline.bubble_fraction, 4),
                "ideal_bubble": round(ideal_bubble_fraction(p, m), 4),
                "bubble_ratio": round(timeline.bubble_fraction / ideal_bubble_fraction(p, m), 4),
                "peak_held": list(timeline.peak_held),
            }
        )
    return rows


async def real_mlp(sizes: list[int], batch: int, micro: int, steps: int) -> list[dict[str, Any]]:
    """The real Mlp on 2 CPU devices against the single-device Trainer."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], size=batch)
    model = Mlp(sizes, seed=0)
    opt, loss = OptimizerKind.sgd(0.01), LossKind.CROSS_ENTROPY
    async with ActorSystem("bench") as system:
        single = await Trainer.spawn(system, model, "cpu:0", TrainerConfig(opt, loss))
        ref_times = await _timed_steps(single, (x, y), 2, steps)
    reference = statistics.median(ref_times)
    rows = [
        {
            "case": "single-device Trainer",
            "sizes": sizes,
            "batch": batch,
            "step_ms": round(reference * 1e3, 2),
            "ratio_vs_single": 1.0,
        }
    ]
    for schedule in ("gpipe", "1f1b"):
        async with ActorSystem("bench") as system:
            options = PipelineOptions(micro, Schedule.parse(schedule))
            ref = await PipelineParallelTrainer.spawn(
                system, model, cpu_devices(2), TrainerConfig(opt, loss), options
            )
            times = await _timed_steps(ref, (x, y), 2, steps)
            timeline: Timeline = await ref.ask(GetTimeline())
        measured = statistics.median(times)
        rows.append(
            {
                "case": f"pipeline {schedule}, 2 CPU devices, m={batch // micro}",
                "sizes": sizes,
                "batch": batch,
                "step_ms": round(measured * 1e3, 2),
                "ratio_vs_single": round(measured / reference, 3),
                "bubble": round(timeline.bubble_fraction, 4),
            }
        )
    return rows


async def main() -> None:
    global OP_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--op-ms", type=positive_real, default=20.0, help="device time of each F and B"
    )
    parser.add_argument("--steps", type=count, default=5, help="timed steps per case")
    parser.add_argument("--quick", action="store_true", help="smaller real model (smoke run)")
    args = parser.parse_args()
    OP_SECONDS = args.op_ms / 1e3
    sizes = [64, 128, 128, 10] if args.quick else [784, 1024, 1024, 10]
    batch = 64 if args.quick else 512
    result = {
        "benchmark": "pipeline",
        "schedule_fidelity": await schedule_fidelity(4, 8, args.steps),
        "real_mlp": await real_mlp(sizes, batch, batch // 4, args.steps),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
