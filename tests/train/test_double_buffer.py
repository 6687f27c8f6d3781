"""`DoubleBuffer.apply(keep=True)`: an update kept at once ends in the state
`apply` then `commit` ends in (the same weights, optimizer state and spare
buffers), with nothing pending."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from atomr.accel import backend_for, cpu_devices
from atomr.train import OptimizerKind
from atomr.train._recovery import DoubleBuffer

KINDS = [
    OptimizerKind.sgd(0.1),
    OptimizerKind.sgd(0.1, momentum=0.9),
    OptimizerKind.adam(0.01),
]


def _run(kind: OptimizerKind, keep: bool, steps: int) -> tuple[Any, Any, DoubleBuffer, list[Any]]:
    """`steps` updates of a fixed start, applied with `keep` or apply + commit;
    also the parameter buffers each step made current."""
    be = backend_for(cpu_devices(1)[0])
    owner = SimpleNamespace(params=np.linspace(-1.0, 1.0, 6, dtype=np.float32))
    opt = kind.create(6, be, np.float32)
    buffers, current = DoubleBuffer(), []
    for k in range(steps):
        grads = np.full(6, 0.5 - k, dtype=np.float32)
        buffers.apply(be, owner, "params", opt, grads, keep=keep)
        if not keep:
            buffers.commit()
        current.append(owner.params)
    return owner, opt, buffers, current


@pytest.mark.parametrize("kind", KINDS, ids=["sgd", "sgd-momentum", "adam"])
def test_keep_ends_as_apply_then_commit(kind: OptimizerKind) -> None:
    for steps in (1, 3):
        kept_owner, kept_opt, kept, kept_current = _run(kind, True, steps)
        owner, opt, committed, current = _run(kind, False, steps)
        assert not kept.pending and kept.previous is None
        np.testing.assert_array_equal(kept_owner.params, owner.params)
        assert kept_opt.step_count == opt.step_count == steps
        assert kept_opt.buffers().keys() == opt.buffers().keys()
        for name, buf in opt.buffers().items():
            if buf is None:
                assert kept_opt.buffers()[name] is None
            else:
                np.testing.assert_array_equal(kept_opt.buffers()[name], buf)
        assert kept.nbytes == committed.nbytes
        # the old set became the spare: the steps alternate between two buffers
        if steps == 3:
            assert kept_current[2] is kept_current[0] and kept_current[1] is not kept_current[0]
            assert current[2] is current[0]
        spare = kept._spare
        assert spare.keys() == committed._spare.keys()
        assert all(b is not c for b in spare.values() for c in kept_opt.buffers().values())


def test_a_kept_update_cannot_be_rolled_back() -> None:
    _owner, _opt, kept, _current = _run(OptimizerKind.sgd(0.1, momentum=0.9), True, 1)
    with pytest.raises(ValueError, match="no pending update"):
        kept.rollback()
