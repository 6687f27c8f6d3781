"""Benchmark: a GPT step (d_model 128, 4 layers, 4 heads, context 64, batch 32,
AdamW, vocabulary 96) on one CPU device against the same step in plain NumPy
(`gpt_numpy.py`, batched BLAS) and, where installed, PyTorch CPU; and the
activations pipeline stages hold under GPipe and 1F1B. Prints JSON.

Step figures: median seconds of `--repeat` steps per round, `--rounds`
interleaved rounds, min and median over the rounds, and the ratio atomr /
reference (goal: at most 1.0 against NumPy, 1.5 against PyTorch). Before
timing, the first step's loss is checked against NumPy's from the same
weights.

    python benchmarks/gpt.py [--repeat 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _args import count

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt_numpy import NumpyGpt, adamw  # noqa: E402

from atomr import ActorSystem  # noqa: E402
from atomr.accel import cpu_devices  # noqa: E402
from atomr.train import (  # noqa: E402
    LossKind,
    OptimizerKind,
    PipelineOptions,
    PipelineParallelTrainer,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.model import gpt  # noqa: E402
from atomr.train.pipeline import GetTimeline, Schedule  # noqa: E402

VOCAB, CONTEXT, LAYERS, HEADS, D, BATCH, LR = 96, 64, 4, 4, 128, 32, 1e-3
CONFIG = TrainerConfig(OptimizerKind.adamw(LR), LossKind.CROSS_ENTROPY)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(BATCH, CONTEXT + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()


class _NumpyStep:
    def __init__(self, flat: np.ndarray) -> None:
        self.model = NumpyGpt(flat.copy(), VOCAB, CONTEXT, LAYERS, HEADS, D)
        self.grads = np.zeros_like(flat)
        self.m, self.v, self.step = np.zeros_like(flat), np.zeros_like(flat), 0

    def __call__(self, x: np.ndarray, y: np.ndarray) -> float:
        loss = self.model.loss_and_grad(x, y, self.grads)
        self.step += 1
        adamw(self.model.flat, self.grads, self.m, self.v, self.step, LR)
        return loss


async def _median(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        if asyncio.iscoroutine(result):
            await result
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _torch_step() -> Any:
    """A PyTorch CPU step of the same architecture, or None without torch."""
    try:
        import torch  # noqa: PLC0415 - optional
    except ImportError:
        return None
    layer = torch.nn.TransformerEncoderLayer(
        D, HEADS, 4 * D, 0.0, "gelu", batch_first=True, norm_first=True
    )
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, D),
        torch.nn.TransformerEncoder(layer, LAYERS),
        torch.nn.Linear(D, VOCAB),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = (torch.from_numpy(a) for a in _batch())
    mask = torch.nn.Transformer.generate_square_subsequent_mask(CONTEXT)

    def step() -> None:
        h = model[0](x)
        out = model[2](model[1](h, mask=mask, is_causal=True))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


async def steps(repeat: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of the atomr, NumPy (and PyTorch) steps."""
    x, y = _batch()
    model = gpt(VOCAB, CONTEXT, n_layer=LAYERS, n_head=HEADS, d_model=D, seed=0)
    numpy_step = _NumpyStep(model.get_params())
    torch_step = _torch_step()
    samples: dict[str, list[float]] = {"atomr": [], "numpy": [], "torch": []}
    async with ActorSystem("gpt-bench") as system:
        trainer = await Trainer.spawn(system, model, ["cpu:0"], CONFIG)
        first = (await trainer.ask(Step(x, y), timeout=600)).loss
        reference = numpy_step(x, y)
        assert abs(first - reference) < 1e-4 * abs(reference), (first, reference)
        for _ in range(rounds):
            samples["atomr"].append(
                await _median(lambda: trainer.ask(Step(x, y), timeout=600), repeat)
            )
            samples["numpy"].append(await _median(lambda: numpy_step(x, y), repeat))
            if torch_step is not None:
                samples["torch"].append(await _median(torch_step, repeat))
    out: dict[str, Any] = {"first_loss": first, "numpy_first_loss": reference}
    for name, values in samples.items():
        if values:
            out[f"{name}_step_s"] = {"min": min(values), "median": statistics.median(values)}
    for ref in ("numpy", "torch"):
        if samples[ref]:
            out[f"atomr_vs_{ref}"] = {
                "min": min(samples["atomr"]) / min(samples[ref]),
                "median": statistics.median(samples["atomr"]) / statistics.median(samples[ref]),
            }
    if not samples["torch"]:
        out["torch"] = "not installed"
    return out


async def held_activations() -> dict[str, Any]:
    """Micro-batches whose activations each of 4 stages held at most, per schedule (8 micro-batches)."""
    x, y = _batch()
    out = {}
    async with ActorSystem("gpt-pipe") as system:
        for schedule in ("gpipe", "1f1b"):
            model = gpt(VOCAB, CONTEXT, n_layer=LAYERS, n_head=HEADS, d_model=D, seed=0)
            options = PipelineOptions(micro_batch_size=4, schedule=Schedule.parse(schedule))
            pipe = await PipelineParallelTrainer.spawn(
                system, model, cpu_devices(4), CONFIG, options
            )
            await pipe.ask(Step(x, y), timeout=600)
            timeline = await pipe.ask(GetTimeline(), timeout=600)
            out[schedule] = {
                "peak_held": list(timeline.peak_held),
                "bubble": timeline.bubble_fraction,
            }
            await pipe.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=count, default=5)
    parser.add_argument("--rounds", type=count, default=3)
    args = parser.parse_args()
    report = {"step": asyncio.run(steps(args.repeat, args.rounds))}
    report["pipeline"] = asyncio.run(held_activations())
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
