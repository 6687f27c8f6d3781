"""`ParameterServerWorker`: a parameter-server worker on one device.

For every `TrainBatch` it pulls the weights of every server range, computes
the mean gradient of its batch on its device's worker thread (never on the
event loop) and pushes it with the versions it pulled. When the batch allows
it (`TrainBatch.reuse_generation`), the push answers with the weights it left
and the next batch of the same generation starts from them instead of a
pull. A push refused as stale is retried with fresh weights. A batch
without a usable gradient (non-finite loss or gradient) sends `AbortPush`
instead, so that a synchronous round fails for every worker rather than
waiting for this one, and answers the error; so does a batch whose
asynchronous push was rolled back (its range failed on a follower shard).
A server shard that refuses to serve (its state lost, or a push it could
not undo), or fails (its device context lost, its device gone, stopped,
timed out), is answered with its error, as a `Failure`: the worker has not
failed, so its supervisor neither restarts nor stops it. Between
batches the worker keeps its model buffers, at most the weights its last
push returned, and its last `BatchResult` with its round: a part sent again
after the worker failed once it was done (its answer lost) is answered with
that result, as computed from the weights before its round, instead of
being recomputed from the weights the round left. A restarted worker keeps
none of them but that result, which its supervisor holds for it
(`LastResult`, in its `Props`): it pulls fresh weights on its next batch
(the shards do not apply a push twice).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from atomr.accel import Device, DeviceActor
from atomr.actor import ActorRef, Failure, Props
from atomr.train.core._step_checks import check_gradient, check_loss, check_normaliser, evaluation
from atomr.train.core.clip import global_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.errors import InvalidBatchError, NonFiniteError, WorkerStateLost
from atomr.train.core.messages import Evaluate
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.models import batch_spec
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.parameter_server._client import ShardedClient
from atomr.train.parameter_server._last_result import LastResult
from atomr.train.parameter_server._round import RoundFailedError
from atomr.train.parameter_server.messages import BatchResult, StaleGradientError, TrainBatch

__all__ = ["ParameterServerWorker"]

# a server shard refusing to serve: it lost its state (restarted), or holds a
# push it could not undo, or a round is over; the worker answers them itself
_REFUSALS: tuple[type[Exception], ...] = (RoundFailedError, WorkerStateLost)
# a round's outcomes, answered where a push raises them
_ROUND_OUTCOMES: tuple[type[Exception], ...] = (
    StaleGradientError,
    RoundFailedError,
    NonFiniteError,
)


class _ShardFailure(Exception):
    """A server shard's failure (`error`) on its way to the worker's answer."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


@contextlib.contextmanager
def _from_shards() -> Iterator[None]:
    """Around the worker's requests to the server shards: their failure
    other than a round's outcome (`_ROUND_OUTCOMES`) is not the worker's own
    (a shard's `ContextPoisoned` must not restart the worker), so it comes
    out as a `_ShardFailure`, which `receive` answers with the error.

    Raises:
        _ShardFailure: a shard failed (or the request could not be made).
    """
    try:
        yield
    except _ROUND_OUTCOMES:
        raise
    except Exception as exc:
        raise _ShardFailure(exc) from None


class ParameterServerWorker(DeviceActor):
    """Answers `TrainBatch -> BatchResult` and `Evaluate -> EvalResult`
    (with freshly pulled weights); other messages go to `DeviceActor`.

    Its gradient is computed on the device's worker thread in a hook that
    subclasses may override (an instrumented worker, a fault-injected one:
    `atomr.testkit.inject_faults`, given to
    `ParameterServerOptions.worker_class`): `compute_gradients`.

    Args:
        worker_id: this worker's id on the server shards.
        model: the model (copied onto `device` when first needed).
        device: the worker's device.
        config: the loss and `worker_timeout` (the ask timeout of its pulls
            and pushes); the optimizer is the shards' business.
        servers: one server shard per range.
        ranges: `(start, stop)` per server shard.
        synchronous: the shards run the synchronous model.
        stale_retries: how many times a stale push is recomputed.
        last_result: where it keeps its last part's result (None: a new
            `LastResult`); the trainer gives one, which outlives a restart.

    Raises:
        ValueError: a bad device name, or ranges that do not tile the vector.
    """

    def __init__(
        self,
        worker_id: int,
        model: Sequential,
        device: Device | str,
        config: TrainerConfig,
        servers: Sequence[ActorRef],
        ranges: Sequence[tuple[int, int]],
        synchronous: bool = False,
        stale_retries: int = 100,
        last_result: LastResult | None = None,
    ) -> None:
        super().__init__(device)
        self.worker_id = int(worker_id)
        self._template = model
        self.config = config
        self.client = ShardedClient(
            servers, ranges, synchronous, config.worker_timeout, model.dtype
        )
        self.stale_retries = stale_retries
        self.model: Sequential | None = None
        self._spec = batch_spec(model.config())  # the shapes never change: built once
        self.stale_pushes = 0
        # the weights and versions the last push returned, and its batch's generation
        self._pushed: tuple[np.ndarray, list[int], int] | None = None
        self._done = LastResult() if last_result is None else last_result

    @classmethod
    def props(cls, *args: Any, **kwargs: Any) -> Props:
        """The `Props` of a worker (see the class docstring for the arguments).

        Returns:
            The Props.
        """
        return Props(cls, *args, **kwargs)

    @property
    def worker_index(self) -> int:
        """This worker's id: how `atomr.testkit.inject_faults(worker=k)` finds it."""
        return self.worker_id

    async def _ready(self) -> Sequential:
        if self.model is None:
            self.model = await self.on_device(self._template.to, self.device)
        return self.model

    async def receive(self, message: Any) -> Any:
        """Dispatch `TrainBatch` / `Evaluate`; anything else to `DeviceActor.receive`.
        A server shard refusing to serve (`_REFUSALS`) or failing
        (`_from_shards`) is answered with its error: the worker itself has
        not failed."""
        try:
            if isinstance(message, TrainBatch):
                return await self._train_once(message)
            if isinstance(message, Evaluate):
                return await self._evaluate(message)
        except _REFUSALS as exc:
            return Failure(exc)
        except _ShardFailure as failure:
            return Failure(failure.error)
        return await super().receive(message)

    def _validate(self, features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._spec.validate(features, labels, self.config.loss)

    async def _train_once(self, msg: TrainBatch) -> Any:
        """`_train`, unless `msg` names the round of the last part this
        worker trained: sent again because the worker failed after it was
        done, it is answered with that part's result (its push landed)."""
        try:  # before anything: a push it could not roll back is never made
            msg = replace(msg, round_id=self.client.check_round(msg.round_id))
        except ValueError as exc:
            return Failure(exc)
        done = self._done.take(msg.round_id)
        if done is not None:
            return done
        result = await self._train(msg)
        self._done.keep(msg.round_id, result)
        return result

    async def _train(self, msg: TrainBatch) -> Any:
        """Train the part `msg` (its round checked by `_train_once`)."""
        model = await self._ready()
        t0 = time.perf_counter_ns()
        features = msg.features
        # an empty part of a batch the trainer validated whole: a weight-0 push
        if isinstance(features, np.ndarray) and features.ndim >= 1 and features.shape[0] == 0:
            return await self._push_empty(msg, model.dtype, t0)
        try:
            x, y = self._validate(features, msg.labels)
        except InvalidBatchError as exc:
            return Failure(exc)
        reuse = msg.reuse_generation
        for attempt in range(self.stale_retries + 1):
            weights, versions = await self._weights_for(reuse if attempt == 0 else None)
            try:
                self.client.check_versions(versions)
            except RoundFailedError as exc:  # a round applied on some shards only
                await self._abort(versions, exc, msg.round_id)
                return Failure(exc)
            ctx = ForwardContext(True, min(versions, default=0), msg.sample_offset)
            result = await self.on_device(guarded, self.compute_gradients, weights, x, y, ctx)
            if isinstance(result, Rejected):
                await self._abort(versions, result.error, msg.round_id)
                return Failure(result.error)
            grad, norm, loss, grad_norm = result
            try:
                await self._push(msg, versions, grad, norm)
            except StaleGradientError:
                self.stale_pushes += 1
                continue
            except RoundFailedError as exc:  # the round, or the push, failed on a shard
                if not self.client.synchronous:  # rolled back: the batch counts as aborted
                    await self._abort(versions, exc, msg.round_id)
                return Failure(exc)
            except NonFiniteError as exc:  # the round was dropped (or its sum overflowed)
                return Failure(exc)
            micros = (time.perf_counter_ns() - t0) // 1000
            return BatchResult(StepStats(loss, grad_norm, int(micros), int(x.shape[0])), norm)
        return Failure(
            StaleGradientError(-1, -1, f"still stale after {self.stale_retries} retries")
        )

    async def _push_empty(self, msg: TrainBatch, dtype: np.dtype, t0: int) -> Any:
        """An empty part (started at `t0`): a weight-0 push at the pulled
        versions. A round's outcome (`_ROUND_OUTCOMES`: the round dropped by
        another worker's abort, the push stale) is answered as a `Failure`, as
        for any part, not raised: it is not the worker's own failure.

        Raises:
            _ShardFailure: a shard failed (`_from_shards`).
        """
        self._pushed = None
        zeros = np.zeros(self.client.n, dtype=dtype)
        try:
            with _from_shards():
                _, versions = await self.client.pull(self.worker_id)
                await self.client.push(self.worker_id, versions, zeros, 0.0, msg.round_id)
        except _ROUND_OUTCOMES as exc:
            return Failure(exc)
        micros = (time.perf_counter_ns() - t0) // 1000
        return BatchResult(StepStats(0.0, 0.0, micros, 0, applied=False), 0.0)

    async def _push(
        self, msg: TrainBatch, versions: list[int], grad: np.ndarray, norm: float
    ) -> None:
        """Push the part's gradient; with `reuse_generation`, keep the weights
        the push returns for the next batch of that generation.

        Raises:
            StaleGradientError, RoundFailedError, NonFiniteError: as
                `ShardedClient.push` (the round's outcomes).
            _ShardFailure: any other failure (`_from_shards`).
        """
        reuse, me = msg.reuse_generation, self.worker_id
        with _from_shards():
            if reuse is None:
                await self.client.push(me, versions, grad, norm, msg.round_id)
            else:
                pushed = await self.client.push_and_pull(me, versions, grad, norm, msg.round_id)
                self._pushed = (*pushed, reuse)

    async def _weights_for(self, generation: int | None) -> tuple[np.ndarray, list[int]]:
        """The weights to compute from: those the last push returned when it
        was made for a batch of `generation`, else freshly pulled.

        Raises:
            _ShardFailure: a pull failed (`_from_shards`).
        """
        pushed, self._pushed = self._pushed, None
        if pushed is not None and generation is not None and pushed[2] == generation:
            return pushed[0], pushed[1]
        with _from_shards():
            return await self.client.pull(self.worker_id)

    async def _abort(self, versions: list[int], error: Exception, round_id: int | None) -> None:
        """Take part in the round without a gradient (`AbortPush`): a synchronous
        round is dropped (its other pushes fail too instead of waiting for this
        worker), a bounded-staleness clock ticks. The round's answer is not
        needed, nor a shard's failure: this worker reports its own error."""
        with contextlib.suppress(*_ROUND_OUTCOMES, _ShardFailure), _from_shards():
            await self.client.abort(self.worker_id, versions, str(error), round_id)

    def compute_gradients(
        self, weights: np.ndarray, x: np.ndarray, y: np.ndarray, ctx: ForwardContext
    ) -> tuple[np.ndarray, float, float, float]:
        """On the device thread: the mean gradient of the batch at `weights`
        (`ctx`: the server's version as the step, the batch's offset). In
        synchronous mode a batch whose targets all have class weight 0 gives
        a zero gradient of normaliser 0 (it adds nothing to the round's mean,
        like an empty batch) instead of an error.

        Returns:
            `(gradient, normaliser, mean loss, gradient norm)`.

        Raises:
            NonFiniteError: a non-finite loss or gradient (the batch sends
                `AbortPush` and answers the error).
            InvalidBatchError: an undefined loss (answered likewise).
        """
        model = self.model
        assert model is not None
        be = model.backend
        with np.errstate(over="ignore", invalid="ignore"):
            model.set_params(weights, checked=False)  # pulled: the server keeps them finite
            tape = model.forward_train(be.to_device(x), ctx)
            d_out = be.empty(tape.output.shape, dtype=model.dtype)
            loss_sum, norm = self.config.loss.sums(be, tape.output, be.to_device(y), d_out)
            check_loss(loss_sum)
            if self.client.synchronous and norm <= 0.0:
                # no mean of its own, but the round's is defined: a weight-0 push
                return np.zeros(self.client.n, dtype=model.dtype), 0.0, 0.0, 0.0
            check_normaliser(norm)
            be.scale(d_out, 1.0 / norm)
            model.backward(tape, d_out)
            grad_norm = global_norm(be, model.grads)
            check_gradient(grad_norm)
            grad = np.asarray(be.to_host(model.grads))
        return grad, float(norm), float(loss_sum / norm), float(grad_norm)

    async def _evaluate(self, msg: Evaluate) -> Any:
        """`Evaluate` on freshly pulled weights; in synchronous mode, only
        from shards at one version (`ShardedClient.check_versions`), as a
        batch is trained.

        Returns:
            The `EvalResult`, or a `Failure` of `InvalidBatchError` (a set that
            does not fit the model), `RoundFailedError` (the shards are at
            different versions) or the device's error.

        Raises:
            _ShardFailure: a pull failed (`_from_shards`; `receive` answers it).
        """
        await self._ready()
        try:
            x, y = self._validate(msg.features, msg.labels)
        except InvalidBatchError as exc:
            return Failure(exc)
        with _from_shards():
            weights, versions = await self.client.pull(self.worker_id)
        try:
            self.client.check_versions(versions)
        except RoundFailedError as exc:  # a round applied on some shards only
            return Failure(exc)
        result = await self.on_device(guarded, self._eval, weights, x, y)
        return Failure(result.error) if isinstance(result, Rejected) else result

    def _eval(self, weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> EvalResult:
        model = self.model
        assert model is not None
        be = model.backend
        model.set_params(weights, checked=False)
        out = model.forward(be.to_device(x))
        d_out = be.empty(out.shape, dtype=model.dtype)
        loss_sum, norm = self.config.loss.sums(be, out, be.to_device(y), d_out)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = float(np.mean(np.argmax(be.to_host(out), axis=-1) == y))
        return evaluation(loss_sum, norm, accuracy, x.shape[0])
