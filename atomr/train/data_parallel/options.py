"""`DataParallelOptions`: the settings of `DataParallelTrainer` that no other
strategy has (what every trainer shares is in `TrainerConfig`)."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from atomr._arguments import bool_flag, int_at_least, real_as_float, real_number
from atomr.actor.errors import bounded_repr
from atomr.train.comm.collective import Collective
from atomr.train.comm.mpi.collective import MpiCollective
from atomr.train.comm.mpi.job import MAX_PROCESSES, DistributedTrainConfig
from atomr.train.data_parallel.replica import ReplicaActor
from atomr.train.data_parallel.speed_balancer import (
    check_balance_settings,
    initial_seconds_per_sample,
    round_quotas,
)

__all__ = ["ApplyPolicy", "COLLECTIVES", "DataParallelOptions"]

COLLECTIVES = ("host", "ring")
"""The collectives `DataParallelOptions.collective` names."""


class ApplyPolicy(enum.Enum):
    """When replicas average (flodl's policies).

    SYNC: every step, the gradients of all replicas are reduced and applied
    once (the replicas stay identical; equals one device).
    CADENCE: El Che. A round spans several `Step`s; each batch goes whole to
    one replica, a replica k times faster taking k times as many (the slowest
    takes `cadence_anchor`), all computing side by side; once every quota is
    met the gradients are reduced, weighted by what each replica saw, and
    applied once: the round equals one single-device step on the union of
    its batches. The anchor is auto-tuned to keep the reduction's share of a
    round near `cadence_target`.
    ASYNC: local SGD. Each batch goes whole to one replica, which applies its
    mean gradient with its own optimizer; the replicas train side by side,
    each at its own pace (a replica k times faster takes about k times as
    many batches), and none waits for another. Every `average_every`
    batches, or once `average_seconds` have passed since the last round
    (whichever comes first), the round closes: the replicas' weights are
    averaged (each keeps its optimizer state), after which they are
    identical again. It is not the single-device step: with plain SGD and
    one batch per replica in a round, it is the synchronous step on the
    round's batches.
    """

    SYNC = "sync"
    CADENCE = "cadence"
    ASYNC = "async"


@dataclass(frozen=True)
class DataParallelOptions:
    """How a `DataParallelTrainer` shares its work among its replicas (and,
    in a multi-process job, among the processes). Checked once, when built.

    Attributes:
        collective: how the replicas' gradients are summed: "host" (a
            `HostCollective`: the replicas hand the trainer their gradient
            buffers, summed into one host array), "ring" (a `RingCollective`:
            the replicas reduce among themselves with actor messages), or a
            `Collective` instance; its `members_hold_buffers` says which of
            the two ways it works.
        balance: with SYNC, split batches by measured replica speed
            (`SpeedBalancer`); off: as evenly as possible.
        speed_hint: initial relative speed of each replica (SYNC with
            `balance`, CADENCE or ASYNC), one per replica: a list, tuple or
            1-D array of positive numbers, stored as a tuple of floats.
        recalibrate_every: with SYNC and `balance`, steps between
            re-computations of the split.
        min_share: with SYNC and `balance`, smallest fraction of a batch
            given to any replica.
        check_every: with SYNC or CADENCE, every K applied steps, check
            that all replicas hold bit-identical weights (a
            `ReplicaDivergenceError` if not); None: never.
        process_collective: joins the processes of a multi-process job (an
            `MpiCollective`), or None for one process. With it, `Step` takes
            the global batch and this process trains on its
            `shard_for_rank` share; the reduced gradient, loss sum and
            normaliser are summed across processes; the initial weights come
            from process 0; only process 0 writes checkpoints. It must take
            host arrays (`members_hold_buffers` False).
        process_rank: this process's rank in the job, in `[0, process_count)`.
        process_count: the number of processes in the job (> 1 needs a
            `process_collective`), at most `MAX_PROCESSES` (MPI's ranks are
            C ints).
        policy: `ApplyPolicy.SYNC` (default) or `ApplyPolicy.ASYNC` (local
            SGD: one process, no divergence checks, no gradient accumulation).
        average_every: with ASYNC, the batches (`Step`s) between two
            averaging rounds (>= 1).
        average_seconds: with ASYNC, also average at the first `Step` that
            comes this many seconds (> 0) after the last round; None: by
            batches only.
        cadence_anchor: with CADENCE, the slowest replica's batches per round
            (>= 1; the start value when auto-tuned). Speeds start from
            `speed_hint` (equal without one) and are measured every round.
        cadence_target: with CADENCE, the reduction's share of a round the
            tuner aims at (in (0, 1); 0.10 as in flodl).
        cadence_auto_tune: with CADENCE, tune the anchor to the target.
        cadence_measure_speeds: with CADENCE, measure the replicas' speeds
            every round; off, the quotas keep `speed_hint`'s ratio (equal
            without one). Off, with `cadence_auto_tune` off too, the rounds
            do not depend on timing: a run is reproducible.
        replica_class: the replica actor `spawn` starts on each device:
            `ReplicaActor` or a subclass (an instrumented or fault-injected
            one, `atomr.testkit.inject_faults`). `props` takes replicas
            already built, so there it must stay `ReplicaActor`.
        clock: with CADENCE or ASYNC, what the trainer times its replicas'
            batches by to measure their speeds: a function of no argument
            returning seconds that never go back (`time.perf_counter`). For
            tests and benchmarks, which pass a clock they move themselves
            (`atomr.testkit.ManualClock().time`) to make speeds exact.

    Raises:
        TypeError: a setting has the wrong type.
        ValueError: an unknown collective name, a value out of range, or a
            setting other than its default where it has no effect: under a
            policy that does not read it (`_POLICY_SETTINGS`: ASYNC's
            `average_*`, CADENCE's `cadence_*`, SYNC's `balance`,
            `recalibrate_every`, `min_share`, CADENCE's and ASYNC's `clock`,
            SYNC's and CADENCE's `check_every`), or a speed-balancer setting
            (`speed_hint`, `recalibrate_every`, `min_share`) under SYNC
            without `balance`; under CADENCE, a `cadence_anchor` and a
            `speed_hint` that give the fastest replica no finite number of
            batches per round.
    """

    collective: str | Collective = "host"
    balance: bool = False
    speed_hint: tuple[float, ...] | None = None
    recalibrate_every: int = 10
    min_share: float = 0.05
    check_every: int | None = None
    process_collective: Collective | None = None
    process_rank: int = 0
    process_count: int = 1
    policy: ApplyPolicy = ApplyPolicy.SYNC
    average_every: int = 4
    average_seconds: float | None = None
    cadence_anchor: int = 1
    cadence_target: float = 0.10
    cadence_auto_tune: bool = True
    cadence_measure_speeds: bool = True
    replica_class: type[ReplicaActor] = ReplicaActor
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        if isinstance(self.collective, str):
            if self.collective not in COLLECTIVES:
                raise ValueError(
                    f"collective must be one of {COLLECTIVES} or a Collective, "
                    f"got {self.collective!r}"
                )
        elif not isinstance(self.collective, Collective):
            raise TypeError(
                f"collective must be one of {COLLECTIVES} or a Collective, "
                f"got {type(self.collective).__name__}"
            )
        object.__setattr__(self, "balance", bool_flag("balance", self.balance))
        check_balance_settings(self.speed_hint, self.recalibrate_every, self.min_share)
        if self.speed_hint is not None:
            object.__setattr__(self, "speed_hint", tuple(float(s) for s in self.speed_hint))
        if self.check_every is not None:
            int_at_least("check_every", self.check_every, 1)
        self._check_processes()
        rc = self.replica_class
        if not (isinstance(rc, type) and issubclass(rc, ReplicaActor)):
            raise TypeError(f"replica_class must be ReplicaActor or a subclass, got {rc!r}")
        if not callable(self.clock):
            raise TypeError(f"clock must be a function returning seconds, got {self.clock!r}")
        self._check_policy()

    def _check_policy(self) -> None:
        if not isinstance(self.policy, ApplyPolicy):
            raise TypeError(
                "policy must be an ApplyPolicy (ApplyPolicy.SYNC, .CADENCE or .ASYNC, from "
                f"atomr.train.data_parallel), got {self.policy!r}"
            )
        int_at_least("average_every", self.average_every, 1)
        seconds = self.average_seconds
        if seconds is not None and not 0 < real_number("average_seconds", seconds) < math.inf:
            raise ValueError(f"average_seconds must be a positive number or None, got {seconds!r}")
        int_at_least("cadence_anchor", self.cadence_anchor, 1)
        for name in ("cadence_auto_tune", "cadence_measure_speeds"):
            object.__setattr__(self, name, bool_flag(name, getattr(self, name)))
        target = self.cadence_target
        if not 0 < real_number("cadence_target", target) < 1:
            raise ValueError(f"cadence_target must be in (0, 1), got {target!r}")
        if self.policy is ApplyPolicy.CADENCE:
            self._check_first_quota()
        if self.policy is not ApplyPolicy.SYNC and self.process_count > 1:
            raise ValueError(
                f"ApplyPolicy.{self.policy.name} runs within one process; use SYNC in a job"
            )
        self._refuse_other_policy_settings()

    def _check_first_quota(self) -> None:
        """CADENCE's first round gives each replica `round_quotas` of
        `cadence_anchor` and the hinted speeds, as `_cadence` computes them.

        Raises:
            ValueError: one of them is no finite number.
        """
        hint = self.speed_hint
        seconds = initial_seconds_per_sample(hint, len(hint) if hint else 1)
        quotas = round_quotas(real_as_float(self.cadence_anchor), seconds)
        if not all(math.isfinite(q) for q in quotas):
            raise ValueError(
                f"cadence_anchor {bounded_repr(self.cadence_anchor)} with speed_hint "
                f"{bounded_repr(self.speed_hint)} gives a replica no finite number of "
                "batches per round: give a smaller anchor, or speeds closer together "
                "(relative speeds, such as 1 and 2.5)"
            )

    def _refuse_other_policy_settings(self) -> None:
        """Refuse a setting given (not its default) where it has no effect:
        under a policy it is not read by (`_POLICY_SETTINGS`), or, under
        SYNC, a setting of the speed balancer without `balance`.

        Raises:
            ValueError: such a setting; the message names it and the
                policies (or `balance`) it belongs to.
        """
        for name, applies in _POLICY_SETTINGS.items():
            if getattr(self, name) == _DEFAULTS[name]:
                continue
            if self.policy not in applies:
                owners = " and ".join(f"ApplyPolicy.{p.name}" for p in applies)
                raise ValueError(
                    f"{name} does not apply to ApplyPolicy.{self.policy.name}: it is a "
                    f"setting of {owners} (leave it {_DEFAULTS[name]!r})"
                )
            if self.policy is ApplyPolicy.SYNC and name in _BALANCER_SETTINGS and not self.balance:
                raise ValueError(
                    f"{name} does not apply to ApplyPolicy.SYNC without balance=True: it is a "
                    f"setting of the speed balancer (set balance=True, or leave it "
                    f"{_DEFAULTS[name]!r})"
                )

    def _check_processes(self) -> None:
        pc = self.process_collective
        if pc is not None and not isinstance(pc, Collective):
            raise TypeError(f"process_collective must be a Collective, got {type(pc).__name__}")
        if pc is not None and pc.members_hold_buffers:
            raise ValueError(
                f"process_collective {type(pc).__name__} keeps its buffers on its members; "
                "the processes exchange host arrays: use a collective that takes them "
                "(e.g. MpiCollective)"
            )
        int_at_least("process_count", self.process_count, 1, high=MAX_PROCESSES)
        int_at_least("process_rank", self.process_rank, 0)
        if self.process_rank >= self.process_count:
            raise ValueError(
                f"process_rank must be in [0, {self.process_count}), got {self.process_rank}"
            )
        if self.process_count > 1 and pc is None:
            raise ValueError(
                f"process_count is {self.process_count}: a multi-process job needs a "
                "process_collective (see DataParallelOptions.for_job)"
            )

    def replica_count_fits(self, replicas: int) -> None:
        """Check the settings that depend on the number of replicas.

        Args:
            replicas: how many replicas the trainer has.

        Raises:
            ValueError: `speed_hint` has another length.
        """
        if self.speed_hint is not None and len(self.speed_hint) != replicas:
            raise ValueError(
                f"speed_hint has {len(self.speed_hint)} entries for {replicas} replicas: "
                "give one per replica"
            )

    @classmethod
    def for_job(
        cls,
        job: DistributedTrainConfig,
        *,
        process_collective: Collective | None = None,
        **settings: Any,
    ) -> DataParallelOptions:
        """The options of this process in a multi-process job.

        Collective when it builds an `MpiCollective`: every rank calls it at
        the same point.

        Args:
            job: this process's place in the job (rank, world size, backend).
            process_collective: the collective joining the processes;
                default: a new `MpiCollective` from `job` when
                `job.backend == "mpi"`, none for a single process.
            settings: the other fields (`collective`, `balance`, ...).

        Returns:
            The options; a `DataParallelTrainer` spawned with them is this
            process's part of the job.

        Raises:
            TypeError: `job` is not a `DistributedTrainConfig`, or a setting
                has the wrong type.
            ImportError: an MPI backend without mpi4py
                (`pip install -e '.[mpi]'`).
            ValueError: `job` disagrees with MPI, or a setting is out of range.
        """
        if not isinstance(job, DistributedTrainConfig):
            raise TypeError(f"job must be a DistributedTrainConfig, got {type(job).__name__}")
        if process_collective is None and job.backend == "mpi":
            process_collective = MpiCollective.from_config(job)
        return cls(
            process_collective=process_collective,
            process_rank=job.rank,
            process_count=job.world_size,
            **settings,
        )


_POLICY_SETTINGS: dict[str, tuple[ApplyPolicy, ...]] = {
    "average_every": (ApplyPolicy.ASYNC,),
    "average_seconds": (ApplyPolicy.ASYNC,),
    "cadence_anchor": (ApplyPolicy.CADENCE,),
    "cadence_target": (ApplyPolicy.CADENCE,),
    "cadence_auto_tune": (ApplyPolicy.CADENCE,),
    "cadence_measure_speeds": (ApplyPolicy.CADENCE,),
    # SYNC's speed balancer (`_step.StepRunner.balancer`); CADENCE and ASYNC
    # measure speeds their own way (`ReplicaSpeeds`, from `speed_hint` and `clock`)
    "balance": (ApplyPolicy.SYNC,),
    "recalibrate_every": (ApplyPolicy.SYNC,),
    "min_share": (ApplyPolicy.SYNC,),
    "speed_hint": (ApplyPolicy.SYNC, ApplyPolicy.CADENCE, ApplyPolicy.ASYNC),
    "clock": (ApplyPolicy.CADENCE, ApplyPolicy.ASYNC),
    # checked after each apply of the reduced gradient; ASYNC replicas differ
    # between averaging rounds
    "check_every": (ApplyPolicy.SYNC, ApplyPolicy.CADENCE),
}
"""Each setting that only some policies read, and those policies: given
(not its default) under another, it is refused."""

_BALANCER_SETTINGS = ("speed_hint", "recalibrate_every", "min_share")
"""The settings SYNC reads only with `balance=True` (a disabled balancer
splits evenly)."""

_DEFAULTS = {f.name: f.default for f in fields(DataParallelOptions)}
