"""Benchmark: TensorParallelTrainer on N = 1, 2, 4 CPU shards against the
single-device Trainer, same model, same batches, same run. Prints JSON.

Figures, per configuration (median seconds per `ask(Step)` over `--repeat`
steps after one warm-up step, best of `--rounds` rounds, each configuration
in a fresh ActorSystem so it has the BLAS threads to itself):

- `step_s` and `step_ratio` (tensor parallel / single device; lower is better);
- `max_shard_param_bytes`: the largest shard's weights, measured from the
  shard's own buffers, and `param_ratio` to the single device's weights
  (ideal 1/N: every weight is split except the row-parallel bias);
- `max_shard_state_bytes`: weights + gradients + optimizer state + the apply
  snapshot (the persistent per-shard memory; activations excluded), and
  `state_ratio` to the single device's weights + gradients + optimizer state;
- `max_weight_diff`: after the timed steps, the largest difference between
  the tensor-parallel and single-device weights (the same math, so ~1e-7).

    python benchmarks/tensor_parallel.py [--repeat 5] [--rounds 2] [--batch 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from typing import Any

import numpy as np
from _args import count

from atomr import ActorSystem
from atomr.accel.threads import available_cores
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.tensor_parallel import ShardActor

SIZES = [256, 1024, 1024, 256]


class MeasuredShard(ShardActor):
    """A ShardActor that also reports the bytes of its persistent buffers."""

    async def receive(self, message: Any) -> Any:
        """Answer "memory" with its byte counts, else as a ShardActor."""
        if message == "memory":
            return await self.on_device(self._memory)
        return await super().receive(message)

    def _memory(self) -> dict[str, int]:
        opt = self.optimizer
        assert opt is not None
        bufs = [self.params, self.grads, *opt.buffers().values()]
        return {
            "param_bytes": int(self.params.nbytes),
            "state_bytes": sum(int(b.nbytes) for b in bufs if b is not None) + self._undo.nbytes,
        }


class MeasuredTrainer(Trainer):
    """A Trainer that also reports the bytes of its persistent buffers."""

    async def receive(self, message: Any) -> Any:
        """Answer "memory" with its byte counts, else as a Trainer."""
        if message == "memory":
            model, opt = self.model, self.optimizer
            assert model is not None and opt is not None
            bufs = [model.params, model.grads] + [getattr(opt, n) for n in opt._buffers]
            return {
                "param_bytes": int(model.params.nbytes),
                "state_bytes": sum(int(b.nbytes) for b in bufs if b is not None),
            }
        return await super().receive(message)


async def _time_steps(ref: Any, batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
    await ref.ask(Step(*batches[0]), timeout=600)  # warm-up
    times = []
    for x, y in batches[1:]:
        t0 = time.perf_counter()
        await ref.ask(Step(x, y), timeout=600)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _single(model: Mlp, config: TrainerConfig, batches: list) -> dict[str, Any]:
    async with ActorSystem("bench-single") as system:
        props = MeasuredTrainer.props(model, "cpu:0", config)
        ref = system.spawn(props)
        step = await _time_steps(ref, batches)
        mem = await ref.ask("memory")
        weights = await ref.ask(GetWeights())
    return {"step_s": step, **mem, "weights": weights}


async def _sharded(model: Mlp, n: int, config: TrainerConfig, batches: list) -> dict:
    async with ActorSystem(f"bench-tp{n}") as system:
        shards = [system.spawn(MeasuredShard.props(model, r, n, f"cpu:{r}")) for r in range(n)]
        tp = system.spawn(TensorParallelTrainer.props(config, shards))
        step = await _time_steps(tp, batches)
        mems = [await s.ask("memory") for s in shards]
        weights = await tp.ask(GetWeights())
    return {
        "step_s": step,
        "param_bytes": max(m["param_bytes"] for m in mems),
        "state_bytes": max(m["state_bytes"] for m in mems),
        "weights": weights,
    }


async def run(repeat: int, rounds: int, batch: int, shard_counts: list[int]) -> dict[str, Any]:
    """Measure every configuration `rounds` times; keep each one's best median."""
    model = Mlp(SIZES, activation="relu", seed=0)
    config = TrainerConfig(OptimizerKind.adamw(1e-3), LossKind.CROSS_ENTROPY)
    batches = [
        synthetic_classification(batch, SIZES[0], SIZES[-1], seed=i) for i in range(repeat + 1)
    ]
    best: dict[Any, dict[str, Any]] = {}
    for _ in range(rounds):
        results = {"single": await _single(model, config, batches)}
        for n in shard_counts:
            results[n] = await _sharded(model, n, config, batches)
        for key, res in results.items():
            if key not in best or res["step_s"] < best[key]["step_s"]:
                best[key] = res
    ref = best["single"]
    rows = []
    for n in shard_counts:
        res = best[n]
        rows.append(
            {
                "shards": n,
                "step_s": round(res["step_s"], 5),
                "step_ratio": round(res["step_s"] / ref["step_s"], 3),
                "max_shard_param_bytes": res["param_bytes"],
                "param_ratio": round(res["param_bytes"] / ref["param_bytes"], 4),
                "ideal_param_ratio": round(1 / n, 4),
                "max_shard_state_bytes": res["state_bytes"],
                "state_ratio": round(res["state_bytes"] / ref["state_bytes"], 4),
                "max_weight_diff": float(np.max(np.abs(res["weights"] - ref["weights"]))),
            }
        )
    return {
        "benchmark": "tensor_parallel",
        "sizes": SIZES,
        "batch": batch,
        "optimizer": "adamw",
        "loss": "cross_entropy",
        "repeat": repeat,
        "rounds": rounds,
        "cores": available_cores(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "single_device": {
            "step_s": round(ref["step_s"], 5),
            "param_bytes": ref["param_bytes"],
            "state_bytes": ref["state_bytes"],
        },
        "tensor_parallel": rows,
    }


def main() -> None:
    """Parse the arguments, run, print JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=count, default=5)
    parser.add_argument("--rounds", type=count, default=2)
    parser.add_argument("--batch", type=count, default=128)
    parser.add_argument("--shards", type=count, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    result = asyncio.run(run(args.repeat, args.rounds, args.batch, args.shards))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
