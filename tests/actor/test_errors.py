"""bounded_repr: the one way error texts and log lines show a user's object."""

from __future__ import annotations

import collections
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


class _Numbers(list):  # type: ignore[type-arg]
    """A list subclass: reprlib knows it by its own name only."""


class ExitingRepr:
    def __repr__(self) -> str:
        raise SystemExit(3)


def test_bytes_and_container_subclasses_are_abbreviated_too() -> None:
    """Their full repr is never built: a 50 MB bytes would be 200 MB of text."""
    text = bounded_repr(b"x" * 50_000_000)
    assert text.startswith("bytes(len=50000000, b'xxx") and len(text) <= REPR_LIMIT
    assert bounded_repr(bytearray(3)) == "bytearray(len=3, b'\\x00\\x00\\x00')"
    assert bounded_repr(_Numbers(range(5_000_000))) == "_Numbers([0, 1, 2, 3, 4, 5, ...])"
    counts = collections.Counter(range(100_000))
    assert bounded_repr(counts).startswith("Counter({0: 1, 1: 1,")
    assert bounded_repr(collections.OrderedDict(a=1)) == "OrderedDict({'a': 1})"


def test_a_repr_that_exits_is_contained() -> None:
    assert bounded_repr(ExitingRepr()) == "<ExitingRepr (repr raised SystemExit)>"
