"""Opt-in inline runs of short CPU jobs (`DeviceActor.inline_below_s`)."""

from __future__ import annotations

import functools
import gc
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import atomr.train.trainer
from atomr import ActorSystem, Props
from atomr.accel import DeviceActor
from atomr.accel.job_timing import INLINE_BELOW_S, JobTiming
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
)


def _slow() -> int:
    time.sleep(0.01)  # the job's own work: long enough to be sent to the worker thread
    return threading.get_ident()


class _Probe(DeviceActor):
    inline_below_s = 2e-3

    async def receive(self, message: str) -> int:
        return await self.on_device(threading.get_ident if message == "short" else _slow)


class _Default(_Probe):
    inline_below_s = 0.0


async def test_a_short_job_runs_inline_once_timed_and_a_long_one_never() -> None:
    loop_thread = threading.get_ident()
    async with ActorSystem("inline") as system:
        probe = system.spawn(Props(_Probe, "cpu:0"))
        threads = [await probe.ask("short") for _ in range(20)]
        assert all(t != loop_thread for t in threads[:3])  # timed on the worker first
        # inline once its average is short (a preempted first run only delays it)
        assert all(t == loop_thread for t in threads[-5:])
        slow = [await probe.ask("long") for _ in range(6)]
        assert all(t != loop_thread for t in slow)
        default = system.spawn(Props(_Default, "cpu:0"))
        assert all([await default.ask("short") != loop_thread for _ in range(6)])


class _FastTrainer(Trainer):
    inline_below_s = INLINE_BELOW_S


async def test_an_inline_trainer_computes_the_same_bits() -> None:
    x = np.random.default_rng(0).random((32, 8), dtype=np.float32)
    y = np.arange(32) % 3
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("inline") as system:
        fast = await _FastTrainer.spawn(system, Mlp([8, 16, 3]), "cpu:0", config)
        plain = await Trainer.spawn(system, Mlp([8, 16, 3]), "cpu:0", config)
        for _ in range(10):
            a = await fast.ask(Step(x, y))
            b = await plain.ask(Step(x, y))
            assert a.loss == b.loss
        np.testing.assert_array_equal(await fast.ask(GetWeights()), await plain.ask(GetWeights()))


def _wrapper(work: Callable[[], int]) -> int:
    """Stands for `guarded`: one function that runs every kind of work."""
    return work()


class _Wrapping(DeviceActor):
    inline_below_s = 2e-3

    async def receive(self, message: str) -> int:
        return await self.on_device(_wrapper, threading.get_ident if message == "short" else _slow)


async def test_work_behind_one_wrapper_is_timed_apart() -> None:
    # the wrapper was the key: after short steps, a checkpoint save through
    # the same `guarded` ran on the event loop's thread
    loop_thread = threading.get_ident()
    async with ActorSystem("inline") as system:
        probe = system.spawn(Props(_Wrapping, "cpu:0"))
        threads = [await probe.ask("short") for _ in range(20)]
        assert all(t == loop_thread for t in threads[-5:])
        assert await probe.ask("long") != loop_thread


async def test_an_inline_trainer_saves_on_its_worker_thread(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((32, 8), dtype=np.float32)
    y = np.arange(32) % 3
    config = TrainerConfig(OptimizerKind.sgd(0.01), LossKind.CROSS_ENTROPY)
    saving: list[int] = []
    real_save = atomr.train.trainer.save_checkpoint

    def save(path: Any, checkpoint: Any) -> None:
        saving.append(threading.get_ident())
        real_save(path, checkpoint)

    async with ActorSystem("inline") as system:
        fast = await _FastTrainer.spawn(system, Mlp([8, 16, 3]), "cpu:0", config)
        for _ in range(20):
            await fast.ask(Step(x, y))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(atomr.train.trainer, "save_checkpoint", save)
            await fast.ask(SaveCheckpoint(tmp_path / "c.ckpt"))
    assert saving and saving[0] != threading.get_ident()


def _job_over(data: np.ndarray) -> Callable[[], float]:
    return lambda: float(data.sum())  # a closure made afresh for each job


def test_jobs_made_afresh_share_one_timing_and_keep_nothing_alive() -> None:
    """A lambda made for each job (as in `on_device(lambda: ...)`) was a new
    key each time: it never ran inline, and the table kept every closure, and
    the buffers it captured, for the actor's life."""
    timing = JobTiming(threshold=1.0)
    captured = []
    for _ in range(5):
        data = np.ones(1000)
        captured.append(weakref.ref(data))
        timing.timed(_job_over(data))()
        del data
    gc.collect()
    assert [ref() for ref in captured] == [None] * 5
    assert timing.inline(_job_over(np.ones(3)))


def test_run_times_a_job_on_this_thread_even_when_it_raises() -> None:
    """`on_device` runs an inline job with `run`: no wrapper made per job."""
    timing = JobTiming(threshold=1.0)
    for _ in range(3):
        assert not timing.inline(threading.get_ident)  # not yet timed three times
        assert timing.run(threading.get_ident) == threading.get_ident()
    assert timing.inline(threading.get_ident)

    def fails() -> None:
        raise KeyError("job")

    for _ in range(3):
        with pytest.raises(KeyError):
            timing.run(fails)
    assert timing.inline(fails)  # timed all the same
    assert timing.timed(threading.get_ident)() == threading.get_ident()


def test_a_key_derived_once_serves_the_decision_and_the_record() -> None:
    """`on_device` derives a job's key once and hands it to `inline`, `run`
    and `timed`; it is the key `inline` would derive from the job."""
    timing = JobTiming(threshold=1.0)
    job = functools.partial(_wrapper, threading.get_ident)
    key = JobTiming.key(job)
    assert key == JobTiming.key(functools.partial(_wrapper, threading.get_ident))
    for _ in range(2):
        timing.run(job, key)
    timing.timed(job, key)()
    assert timing.inline(job, key) and timing.inline(job)  # one entry, either way
    other = functools.partial(_wrapper, _slow)
    assert not timing.inline(other, JobTiming.key(other))
