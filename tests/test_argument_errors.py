"""The argument checks of `atomr._arguments` name a bad value with
`bounded_repr`: a huge value does not make a huge message, and a value whose
`__repr__` raises is still refused with the check's own error (not the repr's)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from atomr._arguments import bool_flag, int_at_least, real_number


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
