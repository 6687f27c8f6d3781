"""Nothing in atomr unpickles data from outside its own process.

An AST scan of every module under `atomr/`: no pickle-family imports
(pickle, marshal, shelve, dill, cloudpickle, joblib), no `allow_pickle=True`,
no `read_pickle` / `torch.load`; and the MPI path uses only mpi4py's
uppercase buffer API (raw numeric buffers), never the lowercase object API,
which pickles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ATOMR = Path(__file__).resolve().parents[2] / "atomr"
BANNED_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "joblib",
    "copyreg",
}
BANNED_CALLS = {"read_pickle", "loads_pickle"}
# mpi4py's lowercase (pickle-based) communication methods
MPI_OBJECT_API = {
    "send",
    "recv",
    "isend",
    "irecv",
    "ssend",
    "issend",
    "bsend",
    "ibsend",
    "rsend",
    "sendrecv",
    "bcast",
    "ibcast",
    "gather",
    "igather",
    "allgather",
    "iallgather",
    "scatter",
    "iscatter",
    "alltoall",
    "ialltoall",
    "reduce",
    "ireduce",
    "allreduce",
    "iallreduce",
    "scan",
    "exscan",
    "mrecv",
    "imrecv",
    "improbe",
    "mprobe",
}
# what the MPI modules may call on MPI objects: the buffer API and bookkeeping
MPI_ALLOWED = {
    "Allgather",
    "Allreduce",
    "Bcast",
    "Barrier",
    "Iallgather",
    "Iallreduce",
    "Ireduce_scatter",
    "Iallgatherv",
    "Ibcast",
    "Ibarrier",
    "Isend",
    "Irecv",
    "Waitall",
    "Testall",
    "Test",
    "Wait",
    "Cancel",
    "Abort",
    "Get_rank",
    "Get_size",
    "Set_errhandler",
    "Dup",
    "Free",
    "Query_thread",
    "Is_initialized",
    "Is_finalized",
    "Init_thread",
    "Finalize",
    "Get_processor_name",
}


def _modules() -> list[Path]:
    return sorted(p for p in ATOMR.rglob("*.py") if "__pycache__" not in p.parts)


def _imports_mpi(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.startswith("mpi4py") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpi4py"):
            return True
        if isinstance(node, ast.Constant) and node.value == "mpi4py":  # importlib.import_module
            return True
    return False


def _mpi_receiver(node: ast.Attribute) -> bool:
    """True when the attribute is looked up on something MPI-ish (comm, ctl, mpi, MPI, Request)."""
    text = ast.unparse(node.value).lower()
    return any(word in text for word in ("comm", "_ctl", "mpi", "request"))


def test_the_scan_sees_the_whole_package() -> None:
    names = {p.name for p in _modules()}
    assert {"checkpoint.py", "cell.py", "backend.py"} <= names
    assert len(names) > 40


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ATOMR)))
def test_no_unpickling(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [a.name for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES
        ):
            problems.append(f"from {node.module}")
        elif isinstance(node, ast.keyword) and node.arg == "allow_pickle":
            if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                problems.append(
                    f"allow_pickle={ast.unparse(node.value)} at line {node.value.lineno}"
                )
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in BANNED_CALLS:
                problems.append(f"{node.func.attr} at line {node.lineno}")
            if node.func.attr == "load" and ast.unparse(node.func.value) == "torch":
                problems.append(f"torch.load at line {node.lineno}")
    assert problems == [], f"{path}: {problems}"


def test_mpi_modules_use_only_the_buffer_api() -> None:
    mpi_modules = [
        p
        for p in _modules()
        if p.parent.name == "mpi" or _imports_mpi(ast.parse(p.read_text(encoding="utf-8")))
    ]
    names = {p.name for p in mpi_modules}
    assert {"collective.py", "_notes.py"} <= names, names
    used: dict[str, set[str]] = {}
    for path in mpi_modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                attr = node.func.attr
                if _mpi_receiver(node.func):
                    assert attr not in MPI_OBJECT_API, (
                        f"{path.name}:{node.lineno} calls {ast.unparse(node.func)} (pickles objects)"
                    )
                    if attr[:1].isupper():
                        used.setdefault(path.name, set()).add(attr)
    collective_calls = used.get("collective.py", set())
    assert {"Iallreduce", "Ireduce_scatter", "Iallgatherv", "Ibcast"} <= collective_calls
    for name, calls in used.items():
        assert calls <= MPI_ALLOWED, (
            f"{name} uses MPI calls outside the buffer API: {calls - MPI_ALLOWED}"
        )
