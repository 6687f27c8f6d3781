"""`purpose`: the purpose in effect follows the code that issues the
operations (innermost block wins, tasks inherit it, nothing leaks out), is
checked before it takes effect, and travels in an MPI signature."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from atomr.train.comm.mpi._order import describe_signature, signature_of
from atomr.train.comm.purpose import NO_PURPOSE, Purpose, current_purpose, purpose


def test_the_innermost_block_wins_and_nothing_leaks_out() -> None:
    assert current_purpose() is NO_PURPOSE
    with purpose("step"):
        assert current_purpose().text == "step"
        with purpose("complete step"):
            assert current_purpose().text == "complete step"
        assert current_purpose().text == "step"
    assert current_purpose() is NO_PURPOSE


async def test_tasks_inherit_the_purpose_and_concurrent_ones_keep_their_own() -> None:
    seen: dict[str, str] = {}

    async def issue(text: str) -> None:
        with purpose(text):
            await asyncio.sleep(0)  # the other task runs meanwhile
            seen[text] = current_purpose().text
            seen[f"child of {text}"] = await asyncio.create_task(_read())

    async def _read() -> str:
        return current_purpose().text

    await asyncio.gather(issue("step"), issue("save checkpoint"))
    assert seen == {
        "step": "step",
        "save checkpoint": "save checkpoint",
        "child of step": "step",
        "child of save checkpoint": "save checkpoint",
    }


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        (b"step", TypeError, "a purpose must be a str, got bytes"),
        (None, TypeError, "a purpose must be a str, got NoneType"),
        ("", ValueError, "a purpose must not be empty"),
    ],
)
def test_bad_purposes_are_refused_and_change_nothing(text, error, match) -> None:
    with purpose("step"):
        with pytest.raises(error, match=match), purpose(text):
            pass
        assert current_purpose().text == "step"


def test_a_signature_carries_a_stable_hash_and_the_name() -> None:
    buf = np.zeros(1024, np.float32)
    plain = signature_of(buf)
    assert plain[4:] == (0, b"")
    with purpose("save checkpoint"):
        tagged = signature_of(buf)
    assert tagged[:4] == plain[:4]
    # blake2b, not `hash()` (salted per process): every rank computes the same
    assert tagged[4] == Purpose("save checkpoint").code == 1360360041558274870
    assert describe_signature((7, 0, *tagged)) == (
        "all_reduce #7 (1024 float32, for 'save checkpoint')"
    )
    with purpose("sync"):
        assert describe_signature((2, 4, *signature_of(None))) == "barrier #2 (for 'sync')"
    long = "write the checkpoint /some/long/path.ckpt"
    assert Purpose(long).name == b"write the checkpoint ..."
    assert Purpose(long).code != Purpose(long + "2").code  # the whole text is hashed


def test_any_str_is_a_purpose_even_one_utf8_cannot_encode() -> None:
    """A lone surrogate (a file name decoded with `surrogateescape`, say) is
    a str like any other: it failed with a bare UnicodeEncodeError when the
    block was entered; its bytes are hashed as Python's `surrogatepass`
    writes them, the same on every process."""
    text = "save /tmp/\udcff.ckpt"
    with purpose(text):
        tagged = signature_of(np.zeros(2))
    assert tagged[4] == Purpose(text).code != Purpose("save /tmp/\udcfe.ckpt").code
    assert (
        describe_signature((3, 0, *tagged))
        == "all_reduce #3 (2 float64, for 'save /tmp/\ufffd\ufffd\ufffd.ckpt')"
    )
