"""The worker protocols' messages as the docs write them are the messages'
own: every `Name(field, ...)` of a data-parallel replica's, a pipeline
stage's, a shard's, a sharded replica's or a parameter server's message in
docs/ or the README names that dataclass's fields, in order (trailing
defaults may be left out), so a worker written from the docs speaks the
protocol. (The trainer messages, `Step(x, y)`,
are written with values, not fields.)"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import atomr.train.data_parallel.messages
import atomr.train.parameter_server.messages
import atomr.train.pipeline.messages
import atomr.train.sharded.messages
import atomr.train.tensor_parallel.layer_messages
import atomr.train.tensor_parallel.messages

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
MODULES = [
    atomr.train.data_parallel.messages,
    atomr.train.parameter_server.messages,
    atomr.train.pipeline.messages,
    atomr.train.sharded.messages,
    atomr.train.tensor_parallel.layer_messages,
    atomr.train.tensor_parallel.messages,
]
CALL = re.compile(r"`([A-Z]\w*)\(([a-z_][\w, ]*)\)")


def _messages() -> dict[str, list[str]]:
    """Every message dataclass of the protocols, by name: its field names."""
    found: dict[str, list[str]] = {}
    for module in MODULES:
        for name, value in vars(module).items():
            if isinstance(value, type) and dataclasses.is_dataclass(value):
                found[name] = [f.name for f in dataclasses.fields(value)]
    return found


def _written() -> list[tuple[str, str, list[str]]]:
    """`(page, message, the fields written)` for every message call in the docs."""
    known = _messages()
    out = []
    for page in PAGES:
        for name, args in CALL.findall(page.read_text(encoding="utf-8")):
            if name in known:
                out.append((page.name, name, [a.strip() for a in args.split(",")]))
    return out


@pytest.mark.parametrize(("page", "name", "args"), _written())
def test_a_message_the_docs_write_has_those_fields(page: str, name: str, args: list[str]) -> None:
    fields = _messages()[name]
    assert args == fields[: len(args)], f"{page}: {name}({', '.join(args)}) has fields {fields}"
