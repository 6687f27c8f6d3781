"""The argument checks of `atomr._arguments` name a bad value with
`bounded_repr`: a huge value does not make a huge message, and a value whose
`__repr__` raises is still refused with the check's own error (not the repr's)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from atomr._arguments import bool_flag, int_at_least, real_number, sequence_entries


class _HostileRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr of a hostile argument")


CHECKS: dict[str, Callable[[str, object], object]] = {
    "int_at_least": int_at_least,
    "real_number": real_number,
    "bool_flag": bool_flag,
}


@pytest.mark.parametrize("check", CHECKS.values(), ids=list(CHECKS))
def test_a_value_whose_repr_raises_is_refused_with_the_checks_own_error(
    check: Callable[[str, object], object],
) -> None:
    with pytest.raises(TypeError, match=r"size must .*_HostileRepr"):
        check("size", _HostileRepr())


@pytest.mark.parametrize("check", CHECKS.values(), ids=list(CHECKS))
def test_a_huge_value_gives_a_short_message(check: Callable[[str, object], object]) -> None:
    with pytest.raises(TypeError) as caught:
        check("size", ["x" * 1000] * 10_000)
    assert len(str(caught.value)) < 300


def test_sequence_entries_takes_lists_tuples_and_1d_arrays_alike() -> None:
    """`PipelineOptions(split=np.array([2, 1]))` was refused: an array is no
    `Sequence`. A 1-D array gives its entries as NumPy scalars, for the
    caller's per-entry check to take (np.int64) or refuse (np.float64)."""
    for given in ([2, 1], (2, 1), np.array([2, 1]), np.array([2, 1], dtype=np.int32)):
        assert sequence_entries("split", given, "ints") == [2, 1]
    entries = sequence_entries("split", np.array([2.0, 1.0]), "ints")
    assert all(isinstance(e, np.float64) for e in entries)
    assert sequence_entries("split", np.array([], dtype=np.int64), "ints") == []


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        (np.array([[2, 1]]), "got an array of shape (1, 2)"),
        (np.array(3), "got an array of shape ()"),
        ("21", "got '21'"),
        (b"21", "got bytes(len=2, b'21')"),
        (bytearray(b"\x02\x01"), "got bytearray("),
        (memoryview(b"\x02\x01"), "got <memory at"),
        ((n for n in (2, 1)), "got <generator object"),
        ({2: 1}, "got {2: 1}"),
        (frozenset({2}), "got frozenset({2})"),
        (3, "got 3"),
        ({2, 1}, "got {1, 2}"),
        (_HostileRepr(), "_HostileRepr"),
    ],
)
def test_sequence_entries_refuses_what_is_no_list(given: object, needle: str) -> None:
    with pytest.raises(TypeError) as caught:
        sequence_entries("split", given, "ints")
    assert "split must be a list, tuple or 1-D array of ints" in str(caught.value)
    assert needle in str(caught.value)
