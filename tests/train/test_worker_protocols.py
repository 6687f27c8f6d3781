"""The worker protocols of the sharded, layer-sharded tensor-parallel and
parameter-server trainers (those written last; the data-parallel, tensor-parallel
and pipeline protocols dispatch through inherited or split handlers this
static reading does not follow): each lists exactly the messages its built-in
actor dispatches on, documents every one of them, and is exported by its
package."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap

import pytest

from atomr.train.parameter_server import (
    ParameterServerWorker,
    ParameterServerWorkerProtocol,
    ServerShard,
    ServerShardProtocol,
)
from atomr.train.sharded import ShardedReplica, ShardedReplicaProtocol
from atomr.train.tensor_parallel import LayerShardActor, LayerShardProtocol

# (protocol, built-in actor, the methods that hold its dispatch, package)
CASES = [
    (ShardedReplicaProtocol, ShardedReplica, ("__init__", "receive"), "atomr.train.sharded"),
    (LayerShardProtocol, LayerShardActor, ("receive",), "atomr.train.tensor_parallel"),
    (ServerShardProtocol, ServerShard, ("receive",), "atomr.train.parameter_server"),
    (
        ParameterServerWorkerProtocol,
        ParameterServerWorker,
        ("receive",),
        "atomr.train.parameter_server",
    ),
]
IDS = [case[0].__name__ for case in CASES]


def _dispatched(actor: type, methods: tuple[str, ...]) -> set[type]:
    """The message classes (of an `atomr.train` messages module) that the
    given methods of `actor` name: its dispatch table or `isinstance` chain."""
    scope = vars(sys.modules[actor.__module__])
    found: set[type] = set()
    for method in methods:
        tree = ast.parse(textwrap.dedent(inspect.getsource(vars(actor)[method])))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Name):
                continue
            obj = scope.get(node.id)
            module = getattr(obj, "__module__", "")
            if inspect.isclass(obj) and module.startswith("atomr.train") and "messages" in module:
                found.add(obj)
    return found


def _names(types: set[type]) -> list[str]:
    return sorted(t.__name__ for t in types)


@pytest.mark.parametrize(("protocol", "actor", "methods", "package"), CASES, ids=IDS)
def test_protocol_lists_what_the_builtin_actor_handles(
    protocol: type, actor: type, methods: tuple[str, ...], package: str
) -> None:
    listed = protocol.messages  # type: ignore[attr-defined]
    assert len(set(listed)) == len(listed), "a message is listed twice"
    handled = _dispatched(actor, methods)
    assert handled, f"found no dispatch in {actor.__name__}"
    assert _names(set(listed) - handled) == [], f"listed but not handled by {actor.__name__}"
    assert _names(handled - set(listed)) == [], f"handled by {actor.__name__} but not listed"


@pytest.mark.parametrize(("protocol", "actor", "methods", "package"), CASES, ids=IDS)
def test_protocol_documents_every_message(
    protocol: type, actor: type, methods: tuple[str, ...], package: str
) -> None:
    doc = inspect.getdoc(protocol) or ""
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    for message in protocol.messages:  # type: ignore[attr-defined]
        assert any(f"`{message.__name__}(" in row for row in rows), message.__name__
    assert actor.__name__ in doc


@pytest.mark.parametrize(("protocol", "actor", "methods", "package"), CASES, ids=IDS)
def test_protocol_and_actor_are_exported(
    protocol: type, actor: type, methods: tuple[str, ...], package: str
) -> None:
    module = importlib.import_module(package)
    for cls in (protocol, actor):
        assert cls.__name__ in module.__all__
        assert getattr(module, cls.__name__) is cls
    messages_module = sys.modules[protocol.__module__]
    assert protocol.__name__ in messages_module.__all__


def test_the_dispatch_scan_sees_a_missing_message() -> None:
    """The check above would catch a message dropped from a protocol."""
    handled = _dispatched(ServerShard, ("receive",))
    assert set(ServerShardProtocol.messages) - {ServerShardProtocol.messages[0]} != handled
