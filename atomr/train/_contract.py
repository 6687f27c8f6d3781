"""The argument checks of the trainer contract, shared by every trainer:
`X.spawn(system, model, devices, config, options=None, name=None)` and
`X.props(...)`, and `spawn_ready`, the one way a trainer's `spawn` starts it
(in a multi-process job, agreeing with the other processes that every one
started before their first collective).

Each check raises before anything is spawned: `TypeError` naming the
argument for a wrong type, `ValueError` for a value out of range.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from atomr.accel import Device
from atomr.actor import ActorRef, ActorSystem, Context, Failure, Props, not_handled
from atomr.train.comm.agreement import agree_on_failure
from atomr.train.comm.collective import Collective
from atomr.train.comm.purpose import purpose
from atomr.train.core.config import TrainerConfig
from atomr.train.core.errors import OtherProcessFailed
from atomr.train.core.model.sequential import Sequential

__all__ = [
    "JobPlace",
    "check_config",
    "check_model",
    "check_name",
    "check_options",
    "check_spawn_args",
    "check_system",
    "check_workers",
    "parse_devices",
    "refuse_accumulation",
    "refuse_message",
    "refuse_options",
    "spawn_ready",
]

STOP_WAIT_S = 10.0
"""How long a failed `spawn_ready` waits for the trainer it started to stop."""

OptionsT = TypeVar("OptionsT")


def check_system(system: object) -> None:
    """Raises: TypeError: `system` is neither an `ActorSystem` nor a `Context`."""
    if not isinstance(system, ActorSystem | Context):
        raise TypeError(f"system must be an ActorSystem or a Context, got {type(system).__name__}")


def check_model(model: object) -> Sequential:
    """Returns: `model`. Raises: TypeError: it is not a model (a `Sequential`,
    such as an `Mlp`)."""
    if not isinstance(model, Sequential):
        raise TypeError(
            f"model must be a Sequential (an Mlp, a gpt(...), ...), got {type(model).__name__}"
        )
    return model


def check_config(config: object) -> TrainerConfig:
    """Returns: `config`. Raises: TypeError: it is not a `TrainerConfig`."""
    if not isinstance(config, TrainerConfig):
        raise TypeError(f"config must be a TrainerConfig, got {type(config).__name__}")
    return config


def check_options(options: Any, expected: type[OptionsT], trainer: str) -> OptionsT:
    """Check a trainer's `options` argument.

    Args:
        options: what the caller passed.
        expected: the trainer's options class.
        trainer: the trainer's name, for the message.

    Returns:
        `options`, or `expected()` (its defaults) when it is None.

    Raises:
        TypeError: `options` is neither None nor an instance of `expected`.
    """
    if options is None:
        return expected()
    if not isinstance(options, expected):
        raise TypeError(
            f"{trainer}: options must be a {expected.__name__} or None, got {type(options).__name__}"
        )
    return options


def refuse_options(options: Any, trainer: str) -> None:
    """For a trainer with no options of its own: only None is accepted.

    Raises:
        TypeError: `options` is not None.
    """
    if options is not None:
        raise TypeError(
            f"{trainer} has no options of its own (everything it takes is in "
            f"TrainerConfig): pass options=None, got {type(options).__name__}"
        )


def check_name(name: object) -> None:
    """Raises: TypeError: `name` is neither None nor a str."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")


def parse_devices(devices: Any, *, single: bool = False, name: str = "devices") -> list[Device]:
    """The devices a trainer was given, parsed.

    Args:
        devices: a sequence of `Device`s or device names; with `single`,
            also one `Device` or name.
        single: the trainer runs on exactly one device.
        name: the argument's name, for the messages ("server_devices").

    Returns:
        The devices, in order (exactly one with `single`).

    Raises:
        TypeError: `devices` is not a sequence (a lone name or `Device`
            where a sequence is needed included), or an entry is neither a
            `Device` nor a str.
        ValueError: no devices, more than one with `single`, or a bad
            device name.
    """
    if single and isinstance(devices, Device | str):
        devices = [devices]
    if isinstance(devices, str | Device) or not isinstance(devices, Sequence):
        raise TypeError(
            f"{name} must be a sequence of Device or device names (e.g. cpu_devices(2)), "
            f"got {type(devices).__name__}"
        )
    for k, device in enumerate(devices):
        if not isinstance(device, Device | str):
            raise TypeError(
                f"{name}[{k}] must be a Device or a device name, got {type(device).__name__}"
            )
    if not devices:
        raise ValueError(f"{name} is empty: give at least one device")
    if single and len(devices) != 1:
        raise ValueError(
            f"this trainer runs on one device, got {len(devices)}: use a parallel "
            "trainer (e.g. DataParallelTrainer) for several"
        )
    return [Device.parse(d) for d in devices]


def check_spawn_args(
    system: Any, model: Any, devices: Any, config: Any, name: Any
) -> tuple[Sequential, list[Device], TrainerConfig]:
    """Check the arguments every parallel trainer's `spawn` shares.

    Returns:
        `(model, parsed devices, config)`.

    Raises:
        TypeError: an argument has the wrong type (the message names it).
        ValueError: no devices, a device name that does not parse, or an
            optimizer hyperparameter or class weight out of range in the model's dtype
            (`TrainerConfig.check_dtype`).
    """
    check_system(system)
    checked = check_model(model)
    parsed = parse_devices(devices)
    check_name(name)
    config = check_config(config)
    config.check_dtype(checked.dtype)
    return checked, parsed, config


def check_workers(config: Any, workers: Any, what: str) -> tuple[TrainerConfig, list[Any]]:
    """Check the arguments of a trainer's `props`: its config and the workers
    the user built.

    Args:
        config: must be a `TrainerConfig`.
        workers: a non-empty sequence of `ActorRef`s, or one of `Props` (the
            trainer spawns those as its children); not a mix.
        what: the workers' name in messages ("shards", "stages").

    Returns:
        `(config, the workers as a list)`.

    Raises:
        TypeError: `config` is not a `TrainerConfig`, `workers` is not a
            sequence, or it holds something other than all `ActorRef`s or all
            `Props`.
        ValueError: `workers` is empty, or names one actor twice.
    """
    config = check_config(config)
    if not isinstance(workers, Sequence) or isinstance(workers, str):
        raise TypeError(f"{what} must be a sequence, got {type(workers).__name__}")
    items = list(workers)
    if not items:
        raise ValueError(f"{what} is empty: give at least one")
    if all(isinstance(w, Props) for w in items):
        return config, items
    if all(isinstance(w, ActorRef) for w in items):
        _refuse_repeats(items, what)
        return config, items
    kinds = sorted({type(w).__name__ for w in items})
    raise TypeError(f"{what} must all be ActorRefs or all be Props, got {', '.join(kinds)}")


def _refuse_repeats(refs: list[ActorRef], what: str) -> None:
    """Raises: ValueError: one actor at two places (its path named twice):
    it would take both places' messages, as two workers."""
    first: dict[str, int] = {}
    for k, ref in enumerate(refs):
        at = first.setdefault(str(ref.path), k)
        if at != k:
            raise ValueError(
                f"{what}[{k}] is {what}[{at}] again ({ref.path}): each must be an actor of its own"
            )


def refuse_accumulation(config: TrainerConfig, strategy: str) -> None:
    """Refuse `config.accumulation_steps > 1` for a strategy that cannot accumulate.

    Args:
        config: the trainer's config.
        strategy: the strategy's name, for the message ("tensor-parallel").

    Raises:
        ValueError: `config.accumulation_steps` is above 1.
    """
    if config.accumulation_steps > 1:
        raise ValueError(
            f"the {strategy} trainer does not accumulate gradients across Steps, but "
            f"config.accumulation_steps is {config.accumulation_steps}: use 1 and a larger batch"
        )


TRAINER_MESSAGES = (
    "send Step(features, labels) to train on a batch; a trainer also takes "
    "Evaluate(features, labels), GetWeights(), SaveCheckpoint(path), LoadCheckpoint(path) "
    "and its strategy's own messages (all from atomr.train)"
)
"""The hint every trainer's refusal of an unknown message ends with."""


def refuse_message(trainer: str, message: Any) -> Failure:
    """The answer of every trainer to a message it does not handle: the
    actor's `not_handled` refusal, with a hint at the messages a trainer
    takes (`TRAINER_MESSAGES`: a `(features, labels)` tuple is one batch's
    `Step`). Only an unknown message comes here: nothing is added to the
    path of a handled one.

    Args:
        trainer: the trainer's class name, for the message.
        message: what it was sent.

    Returns:
        `Failure(TypeError)`, to answer the ask with.
    """
    refused = not_handled(trainer, message)
    if isinstance(message, type):  # a class sent without its (): that is the hint
        return refused
    return Failure(TypeError(f"{refused.exception}: {TRAINER_MESSAGES}"))


class JobPlace(Protocol):
    """Where a trainer sits in a multi-process job: the fields its options
    (`DataParallelOptions`, `ShardedOptions`) say it with."""

    @property
    def process_collective(self) -> Collective | None:
        """Joins the job's processes (None: a job of one)."""

    @property
    def process_rank(self) -> int:
        """This process's rank."""

    @property
    def process_count(self) -> int:
        """The job's processes."""


async def spawn_ready(
    system: ActorSystem | Context,
    props: Props | Callable[[], Props],
    name: str | None,
    ready: Any,
    timeout: float | None,
    *,
    job: JobPlace | None = None,
    then: Any = None,
) -> ActorRef:
    """Spawn a trainer and ask it `ready` (a message it answers once its
    workers hold their state); if that fails, stop the trainer and wait (at
    most `STOP_WAIT_S`) until it and its workers are gone, so that a failed
    `spawn` leaves nothing running.

    In a job (`job` with a process collective) the processes then agree
    whether any failed so far (`agree_on_failure`: one small all-reduce),
    before `then`, the first message every process takes part in (the
    initial weight broadcast): a failure on one process fails every
    process's spawn at once, instead of leaving the others in that
    broadcast until the collective's timeout.

    Args:
        system: where to spawn.
        props: the trainer's `Props`, or what makes them, checking the
            arguments (in a job, its error is agreed on as a failed start).
        name: the trainer's actor name, or None.
        ready: the message answered once this process's workers started
            (nothing collective), within `timeout` (None: no deadline of its
            own, each wait inside has one).
        timeout: see `ready`.
        job: the trainer's options, which say its place in a job; None or
            without a process collective: a process of its own.
        then: asked last, or None; with no deadline of its own (each of its
            waits has one: the collective's, the workers').

    Raises:
        Exception: what making the props or the asks raised (a worker's
            error while starting, or a timeout), after the trainer stopped;
            in a job, on the failing process with a note naming its rank.
        OtherProcessFailed: in a job, another process failed to start (its
            rank named); this one's trainer was stopped.
        CollectiveError: a process never joined the agreement.
    """
    processes = None if job is None else job.process_collective
    ref: ActorRef | None = None
    error: Exception | None = None
    try:
        try:
            made = props if isinstance(props, Props) else props()  # checks `system` too
            ref = system.spawn(made, name=name)
            await ref.ask(ready, timeout=timeout)
        except Exception as exc:  # in a job, every process hears of it first
            error = exc
        if job is not None and processes is not None:
            place = (job.process_rank, job.process_count)
            with purpose("start"):  # not the spawn: the actor's task would inherit it
                await agree_on_failure(
                    processes, error, "start its trainer", others=_not_started, place=place
                )
        elif error is not None:
            raise error
        if then is not None:
            assert ref is not None  # an error was raised above
            await ref.ask(then, timeout=None)
    except Exception:
        if ref is not None:
            stopped = ref.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(stopped), STOP_WAIT_S)
        raise
    except BaseException:  # cancelled: stop it, but do not hold the cancellation up
        if ref is not None:
            ref.stop()
        raise
    assert ref is not None
    return ref


def _not_started(who: str, what: str) -> Exception:
    """The error of a process whose trainer started where others' (`who`) did not."""
    return OtherProcessFailed(
        f"{who} failed to {what}, so this process's trainer was stopped too "
        "(every process of the job stops together)"
    )
