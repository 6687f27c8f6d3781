"""Fault injection for `ServerShard`: the server side, which test_server.py
and test_training.py do not cover (they cover bad pushes and a worker
crashing in its gradient computation).

Here: the server's device failing in the gradient aggregation (before the
update) and its optimizer dying with half the weight vector written, in the
asynchronous and synchronous models. The pusher must get the typed error;
the server's weights and version must be unchanged; the server must keep
serving; and the pushes after the fault must end exactly where a server
that never saw the failed push ends.

The faults go in through the server's public hook `apply_gradients`
(`atomr.testkit.inject_faults`, `tests.reliability.faults.dying_optimizer`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import ContextPoisoned
from atomr.testkit import inject_faults
from atomr.train import GetWeights, OptimizerKind
from atomr.train.parameter_server import Consistency, ServerShard
from atomr.train.parameter_server.messages import PullWeights, PushGradient
from tests.reliability.faults import FAULT_AT, Plan, T, dying_optimizer

N = 64
PUSHES = 8


def faulty_server(plan: Plan) -> type[ServerShard]:
    """A server whose update fails when `plan` says: "aggregate" before it
    sums the pushed gradients, "mid_optimizer" with half the new weights
    written (`dying_optimizer`)."""
    return dying_optimizer(inject_faults(ServerShard, plan, {"aggregate": "apply_gradients"}), plan)


def _grads(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(PUSHES)]


def _server(system: ActorSystem, plan: Plan, consistency: Consistency) -> Any:
    init = np.linspace(-1, 1, N, dtype=np.float32)
    return system.spawn(
        Props(
            faulty_server(plan),
            init,
            OptimizerKind.adam(0.01),
            consistency=consistency,
            workers=1,
        )
    )


async def _push(server: Any, grad: np.ndarray) -> int:
    _weights, version = await server.ask(PullWeights(0), timeout=T)
    return await server.ask(PushGradient(0, version, grad), timeout=T)


@pytest.mark.parametrize(
    "consistency", [Consistency.asynchronous(), Consistency.synchronous()], ids=["async", "sync"]
)
@pytest.mark.parametrize("phase", ["aggregate", "mid_optimizer"])
async def test_a_server_fault_changes_nothing_and_serving_continues(
    actor_system: ActorSystem, phase: str, consistency: Consistency
) -> None:
    plan = Plan()
    server = _server(actor_system, plan, consistency)
    grads = _grads()
    error: BaseException | None = None
    for i, g in enumerate(grads):
        if i == FAULT_AT:
            before = await server.ask(GetWeights(), timeout=T)
            _w, version_before = await server.ask(PullWeights(0), timeout=T)
            plan.arm(phase)
            with pytest.raises(ContextPoisoned, match="injected") as info:
                await _push(server, g)
            error = info.value
            np.testing.assert_array_equal(await server.ask(GetWeights(), timeout=T), before)
            _w, version_after = await server.ask(PullWeights(0), timeout=T)
            assert version_after == version_before
        else:
            await _push(server, g)
    assert error is not None and plan.fired == [phase]
    clean = _server(actor_system, Plan(), consistency)
    for i, g in enumerate(grads):
        if i != FAULT_AT:
            await _push(clean, g)
    np.testing.assert_allclose(
        await server.ask(GetWeights(), timeout=T),
        await clean.ask(GetWeights(), timeout=T),
        atol=1e-6,
    )
