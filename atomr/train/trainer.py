"""`Trainer`: the single-device trainer actor, the reference every parallel
trainer must equal.

The actor owns one device (it is a `DeviceActor`); every piece of math runs
on that device's worker thread through `on_device`, never on the event loop.
A `Step` is atomic: validate the batch, compute loss and gradient, check that
both are finite, and only then apply the optimizer. Bad input is answered
with `Failure(exc)`, so the actor is not restarted and keeps its weights.

With `accumulation_steps = K`, micro-steps 1..K-1 only add their gradient
*sums* (and loss sums and normalisers) into an accumulator; the K-th divides
the total by the total normaliser and applies once, exactly as one step on
the concatenated batch. A micro-step that fails after validation abandons
the window, as in data parallel.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.accel import ContextPoisoned, CpuBackend, Device, DeviceActor, Unrecoverable
from atomr.actor import ActorRef, Failure, Props
from atomr.train._contract import (
    check_config,
    check_model,
    check_name,
    check_system,
    parse_devices,
    refuse_message,
    refuse_options,
    spawn_ready,
)
from atomr.train._recovery import DoubleBuffer
from atomr.train.core._step_checks import (
    check_gradient,
    check_loss,
    check_normaliser,
    check_step_limit,
    evaluation,
)
from atomr.train.core.accumulation import (
    AccumulationWindow,
    accumulation_extra,
    read_pending,
)
from atomr.train.core.checkpoint import (
    Checkpoint,
    check_model_matches,
    restored_optimizer,
    save_checkpoint,
)
from atomr.train.core.clip import clip_grad_norm, global_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.messages import (
    Evaluate,
    GetTrainingState,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetLearningRate,
    Step,
)
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.models import batch_spec
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.core.sharded_index import merge_shards
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.core.validation import detached

__all__ = ["Trainer"]


class Trainer(DeviceActor):
    """Trains one model (an `Mlp`, a `gpt(...)`, any `Sequential`) on one device.

    Answers `Step -> StepStats`, `GetWeights -> ndarray`,
    `Evaluate -> EvalResult`, `SaveCheckpoint -> None`,
    `LoadCheckpoint -> None`. Bad input (wrong width, dtype, labels out of
    range, NaN/Inf in inputs or gradients), unreadable checkpoints and
    checkpoints of another model are answered with a `Failure` and change
    nothing. So is any other exception the work raises (a custom layer's
    bug, a driver error): a step's update is atomic, so the trainer keeps
    its weights and its step count. Only a device whose state is gone
    (`ContextPoisoned`, `Unrecoverable`) fails the actor.

    Args:
        model: the model to train; it is copied onto `device` when the actor
            starts (the given object is never modified), so a restarted actor
            starts again from these weights.
        device: the device (a `Device` or its name, e.g. "cpu:0").
        config: optimizer, loss, clipping and accumulation.

    Raises:
        TypeError: `model` is not a `Sequential` or `config` not a `TrainerConfig`.
        ValueError: a bad device name.
    """

    def __init__(self, model: Sequential, device: Device | str, config: TrainerConfig) -> None:
        super().__init__(device)
        self._device = self.device
        self._template = check_model(model)
        self.config = check_config(config)
        self.model: Sequential | None = None
        self.optimizer: Optimizer | None = None
        self._updates = DoubleBuffer()  # out of place: a refused update changes nothing
        self.steps = 0
        self._window = AccumulationWindow()
        self._reset_accumulation()

    # -- construction -------------------------------------------------------

    @classmethod
    def props(
        cls,
        model: Sequential,
        devices: Device | str | Sequence[Device | str],
        config: TrainerConfig,
        options: None = None,
    ) -> Props:
        """The `Props` of a trainer, its arguments checked.

        Args:
            model, config: as for the class.
            devices: one device, or a sequence of exactly one.
            options: must be None: this trainer has no settings of its own.

        Returns:
            The Props.

        Raises:
            TypeError: an argument has the wrong type (`options` not None
                included); the message names it.
            ValueError: no device, more than one, a bad device name, or an
                optimizer hyperparameter or class weight out of range in the model's dtype
                (`TrainerConfig.check_dtype`).
        """
        check_model(model)
        (device,) = parse_devices(devices, single=True)
        check_config(config).check_dtype(model.dtype)
        refuse_options(options, cls.__name__)
        return Props(cls, model, device, config)

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Sequential,
        devices: Device | str | Sequence[Device | str],
        config: TrainerConfig,
        options: None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer in `system` and wait until its model is on the device.

        Every argument is checked before anything is spawned.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model, devices, config, options: as for `props`.
            name: the actor's name (unique among its siblings), or None.

        Returns:
            The trainer's `ActorRef`, once it holds the model (waiting up to
            `config.worker_timeout`).

        Raises:
            TypeError: an argument has the wrong type; the message names it.
            ValueError: as `props`; raised before anything is spawned.
            Exception: what building the model on the device raised (the
                actor is stopped then).
        """
        check_system(system)
        props = cls.props(model, devices, config, options)
        check_name(name)
        return await spawn_ready(system, props, name, GetWeights(), config.worker_timeout)

    def _reset_accumulation(self) -> None:
        self._accum: Any = None  # the window's gradient sums, on the device
        self._window.reset()

    def _build(self) -> None:
        """On the device thread: the model and optimizer state on this device."""
        model = self._template.to(self._device)
        self._spec = batch_spec(model.config())
        self.optimizer = self.config.optimizer.create(model.n_params, model.backend, model.dtype)
        self.model = model

    async def _ready(self) -> Sequential:
        if self.model is None:
            await self.on_device(self._build)
        assert self.model is not None
        return self.model

    # -- messages -----------------------------------------------------------

    def refuse(self, message: Any) -> Failure:
        """The answer to a message this trainer does not handle: a
        `TypeError` hinting at the messages a trainer takes."""
        return refuse_message("Trainer", message)

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring)."""
        model = self.model
        if model is None:  # no coroutine per message once built
            model = await self._ready()
        try:
            if isinstance(message, Step):  # the hot path: tested first
                check_step_limit(self.steps, self.config.max_steps)
                x, y = self._spec.validate(message.features, message.labels, self.config.loss)
                # the caller may change its arrays once it stops waiting: the
                # step trains on what was validated (copied only if validation did not)
                x, y = detached(x, message.features), detached(y, message.labels)
                result = await self.on_device(guarded, self._step, x, y)
            elif isinstance(message, GetTrainingState):
                return TrainingState(self.steps, self.config.max_steps)
            elif isinstance(message, Evaluate):
                x, y = self._spec.validate(message.features, message.labels, self.config.loss)
                result = await self.on_device(guarded, self._evaluate, x, y)
            elif isinstance(message, GetWeights):
                result = await self.on_device(model.get_params)
            elif isinstance(message, SetLearningRate):
                assert self.optimizer is not None
                await self.on_device(self.optimizer.set_lr, message.lr)
                result = None
            elif isinstance(message, SaveCheckpoint):
                result = await self.on_device(guarded, self._save, message.path)
            elif isinstance(message, LoadCheckpoint):
                result = await self.on_device(guarded, self._load, message.path)
            else:
                return self.refuse(message)
        except (ContextPoisoned, Unrecoverable):
            raise  # the device's state is gone: the actor fails, its parent decides
        except Exception as exc:  # a bad request, a layer's bug, a driver error
            return Failure(exc)  # nothing changed: the update is atomic
        if isinstance(result, Rejected):
            return Failure(result.error)
        return result

    # -- device-side work (runs on the device's worker thread) ---------------

    def _step(self, x: np.ndarray, y: np.ndarray) -> StepStats:
        """One validated `Step`. One that fails (a non-finite loss, gradient
        or update, a device error) abandons an open accumulation window, as
        in `DataParallelTrainer`: the next `Step` opens a new one.

        Raises:
            NonFiniteError: the loss, gradient or update is not finite.
            Exception: what the device raised; nothing was applied.
        """
        try:
            return self._micro_step(x, y)
        except BaseException:
            self._reset_accumulation()
            raise

    def _micro_step(self, x: np.ndarray, y: np.ndarray) -> StepStats:
        model, opt, cfg = self.model, self.optimizer, self.config
        assert model is not None and opt is not None
        be = model.backend
        t0 = time.perf_counter_ns()
        # the batch is the step's own (`receive`): on a CPU device, used as it is
        xd, yd = (x, y) if isinstance(be, CpuBackend) else (be.to_device(x), be.to_device(y))
        # a window's micro-batches are rows of one batch (their dropout masks differ)
        ctx = ForwardContext(True, self.steps, self._window.samples)
        tape = model.forward_train_unchecked(xd, ctx)  # `receive` validated x as forward_train does
        d_out = be.empty(tape.output.shape, dtype=model.dtype)
        loss_sum, norm = cfg.loss.sums(be, tape.output, yd, d_out)
        check_loss(loss_sum)
        k = cfg.accumulation_steps
        if k == 1:
            check_normaliser(norm)
            # its own buffers: the unchecked kernels (flat, scalar in their dtype)
            be.scale_unchecked(d_out.reshape(-1), d_out.dtype.type(1.0 / norm))
            model.backward(tape, d_out)
            grad_norm = math.sqrt(be.squared_norm_unchecked(model.grads))
            check_gradient(grad_norm)
            return self._apply(grad_norm, loss_sum / norm, x.shape[0], t0)
        # accumulation: gradients of the *sum*, divided once on the K-th step
        model.backward(tape, d_out)
        check_gradient(be.squared_norm(model.grads), "micro-step")
        if self._window.micro + 1 < k:
            if self._accum is None:
                self._accum = be.zeros((model.n_params,), dtype=model.dtype)
            be.axpy(1.0, model.grads, self._accum)
            self._window.add(loss_sum, norm, int(x.shape[0]))
            micro_loss = loss_sum / norm if norm > 0 else 0.0
            micros = (time.perf_counter_ns() - t0) // 1000
            return StepStats(micro_loss, 0.0, micros, x.shape[0], applied=False)
        total_loss = self._window.loss_sum + loss_sum
        total_norm = self._window.normaliser + norm
        check_normaliser(total_norm)
        if self._accum is not None:
            be.axpy(1.0, self._accum, model.grads)
        be.scale(model.grads, 1.0 / total_norm)
        grad_norm = global_norm(be, model.grads)
        check_gradient(grad_norm)
        stats = self._apply(grad_norm, total_loss / total_norm, x.shape[0], t0)
        self._reset_accumulation()
        return stats

    def _apply(self, grad_norm: float, loss: float, samples: int, t0: int) -> StepStats:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        if self.config.gradient_clip is not None:
            clip_grad_norm(model.backend, model.grads, self.config.gradient_clip, grad_norm)
        self._updates.apply(model.backend, model, "params", opt, model.grads, keep=True)
        self.steps += 1
        micros = (time.perf_counter_ns() - t0) // 1000
        return StepStats(float(loss), float(grad_norm), int(micros), int(samples))

    def _evaluate(self, x: np.ndarray, y: np.ndarray) -> EvalResult:
        model = self.model
        assert model is not None
        be = model.backend
        out = model.forward(be.to_device(x))
        d_out = be.empty(out.shape, dtype=model.dtype)
        loss_sum, norm = self.config.loss.sums(be, out, be.to_device(y), d_out)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = float(np.mean(np.argmax(be.to_host(out), axis=-1) == y))
        return evaluation(loss_sum, norm, accuracy, x.shape[0])

    def _save(self, path: Any) -> None:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        pending = None
        if self._accum is not None:
            pending = self._window.saved(np.asarray(model.backend.to_host(self._accum)))
        ckpt = Checkpoint(
            model=model.config(),
            weights=model.get_params(),
            step=self.steps,
            optimizer=opt.state_dict(),
            extra={"trainer": "Trainer", **accumulation_extra(pending)},
        )
        save_checkpoint(path, ckpt)

    def _load(self, path: Any) -> None:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        ckpt = merge_shards(path)
        check_model_matches(ckpt, model.config(), model.n_params, model.dtype)
        fresh = restored_optimizer(
            self.config.optimizer, model.n_params, ckpt.optimizer, model.backend, model.dtype
        )
        accumulation = self.config.accumulation_steps
        pending = read_pending(ckpt, model.n_params, accumulation, model.dtype, "Trainer")
        # everything checked: now commit
        model.set_params(ckpt.weights)
        self.optimizer = fresh
        self.steps = int(ckpt.step)
        self._reset_accumulation()
        if pending is not None:
            self._accum = model.backend.to_device(pending.grads)
            self._window.reopen(pending)
