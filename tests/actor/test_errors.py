"""bounded_repr: the one way error texts and log lines show a user's object."""

from __future__ import annotations

import dataclasses

import numpy as np

from atomr.actor.errors import REPR_LIMIT, bounded_repr


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class HugeRepr:
    def __repr__(self) -> str:
        return "x" * 100_000


@dataclasses.dataclass
class Batch:
    features: np.ndarray
    labels: list[int]


def test_short_values_are_plain_reprs() -> None:
    assert bounded_repr("ping") == "'ping'"
    assert bounded_repr(("get", 1)) == "('get', 1)"
    assert bounded_repr(None) == "None"


def test_big_values_are_abbreviated_without_building_their_repr() -> None:
    assert bounded_repr(list(range(5_000_000))) == "[0, 1, 2, 3, 4, 5, ...]"
    batch = Batch(np.zeros((5000, 1000), dtype=np.float32), list(range(10**6)))
    text = bounded_repr(batch)
    assert text.startswith("Batch(features=array(shape=(5000, 1000), dtype=float32), labels=[0,")
    assert len(text) <= REPR_LIMIT


def test_a_repr_that_raises_or_rambles_is_contained() -> None:
    assert "RaisingRepr" in bounded_repr(RaisingRepr())
    text = bounded_repr(HugeRepr())
    assert len(text) <= REPR_LIMIT and "..." in text
    assert len(bounded_repr("y" * 10_000, limit=50)) <= 50
