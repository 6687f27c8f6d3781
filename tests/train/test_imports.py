"""`atomr.train` imports what it uses at the top of each module, and its
modules import each other without a cycle: no import inside a function or
under `TYPE_CHECKING` hides one."""

from __future__ import annotations

import ast
from pathlib import Path

import atomr.train as train
from atomr.train import core
from atomr.train.core import errors

TRAIN = Path(train.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(TRAIN.parent.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _atomr_imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""] if (node.module or "").startswith("atomr") else []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("atomr")]
    return []


def _hidden_atomr_imports(path: Path) -> list[str]:
    """The `atomr` imports of `path` that are not statements of the module body."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    return [
        f"{path.relative_to(TRAIN)}:{node.lineno} {name}"  # type: ignore[attr-defined]
        for node in ast.walk(tree)
        if id(node) not in top
        for name in _atomr_imports(node)
    ]


def _graph() -> dict[str, set[str]]:
    """module -> the atomr.train modules it imports at the top."""
    modules = {_module_name(p): p for p in TRAIN.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = (t for node in ast.parse(path.read_text()).body for t in _atomr_imports(node))
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_no_hidden_imports() -> None:
    hidden = [h for path in sorted(TRAIN.rglob("*.py")) for h in _hidden_atomr_imports(path)]
    assert hidden == []


def test_no_import_cycles_between_modules() -> None:
    """A package's `__init__` re-exporting its modules is an edge like any other."""
    assert _cycle(_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def _reaches_outside(package: str, allowed: tuple[str, ...]) -> list[str]:
    """Imports by modules of `package` of atomr.train modules outside it and `allowed`."""
    inside = (package, *allowed)
    return sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if module.startswith(package)
        for target in targets
        if not target.startswith(inside)
    )


def test_the_layers_import_only_downwards() -> None:
    """core imports nothing else of atomr.train; comm only core (docs/internals.md)."""
    assert _reaches_outside("atomr.train.core", ()) == []
    assert _reaches_outside("atomr.train.comm", ("atomr.train.core",)) == []


def test_the_public_surface_is_the_contract() -> None:
    """`atomr.train` keeps about 30 names: the six trainers and their options,
    the contract's messages and replies, `fit`, the config and its
    vocabulary, the errors a caller catches; each is a re-export of a
    subpackage, where everything else lives."""
    names = set(train.__all__)
    assert len(names) <= 31, sorted(names)
    contract = {
        "Trainer",
        "DataParallelTrainer",
        "TensorParallelTrainer",
        "PipelineParallelTrainer",
        "AsyncParameterServer",
        "ShardedDataParallelTrainer",
        "DataParallelOptions",
        "TensorParallelOptions",
        "PipelineOptions",
        "ParameterServerOptions",
        "ShardedOptions",
        "TrainerConfig",
        "Step",
        "Evaluate",
        "GetWeights",
        "SaveCheckpoint",
        "LoadCheckpoint",
        "StepStats",
        "EvalResult",
        "fit",
    }
    assert contract <= names, sorted(contract - names)
    for name in names:
        defined_in = getattr(train, name).__module__
        assert defined_in.startswith("atomr.train."), (name, defined_in)


def test_every_training_error_is_exported_by_core() -> None:
    """A caller catches the training layer's errors from `atomr.train.core`
    (`atomr.train` re-exports the commonest): `StepLimitError` was missing."""
    assert set(errors.__all__) <= set(core.__all__), sorted(set(errors.__all__) - set(core.__all__))
