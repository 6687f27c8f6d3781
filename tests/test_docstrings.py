"""Every public name of atomr has a docstring.

The public names are those listed in the `__all__` of every atomr package
(`atomr`, `atomr.actor`, `atomr.accel`, `atomr.train`, ...: what users import);
for a public class, its public methods and properties count too. Every
module (packages and plain modules) must also have a docstring.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

import atomr

# Modules that run something when imported.
_SKIP_MODULES = {"atomr.__main__", "atomr.cli.__main__"}


def _modules() -> Iterator[ModuleType]:
    yield atomr
    for info in pkgutil.walk_packages(atomr.__path__, prefix="atomr."):
        if info.name in _SKIP_MODULES:
            continue
        yield importlib.import_module(info.name)


def _own_doc(obj: Any) -> bool:
    """A docstring written for this object itself.

    Not one inherited from a base class (`inspect.getdoc` would return the
    base's docstring for an undocumented subclass, e.g. of an exception), and
    not the `ClassName(field: type, ...)` signature that `@dataclass` writes
    into `__doc__` when the class has none.
    """
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__")
        if isinstance(doc, str) and _is_dataclass_signature(obj, doc):
            return False
    else:
        doc = getattr(obj, "__doc__", None)
    return isinstance(doc, str) and bool(doc.strip())


def _is_dataclass_signature(cls: type, doc: str) -> bool:
    """`doc` is the one `dataclasses` generates: the class name and its signature."""
    if not dataclasses.is_dataclass(cls):
        return False
    return re.fullmatch(rf"{re.escape(cls.__name__)}(\(.*\))?", doc.strip(), re.DOTALL) is not None


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public functions of `cls` and of its atomr bases (a mixin's methods are
    the class's public surface, wherever the code lives)."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("atomr"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            value = _unwrap(value)
            if inspect.isfunction(value):
                yield name, value


def _unwrap(value: Any) -> Any:
    """The function behind a static method, class method or property."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    return value


def _public_objects() -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for module in _modules():
        if not _own_doc(module):
            yield module.__name__, module
        if not hasattr(module, "__path__"):
            continue  # a plain module: its names are public through its package
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue  # constants, enum members, type aliases
            if not getattr(obj, "__module__", "").startswith("atomr") or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{obj.__module__}.{obj.__qualname__}", obj
            if inspect.isclass(obj):
                for member_name, member in _members(obj):
                    if member_name in vars(obj) and _inherits_doc(obj, member_name):
                        continue  # an override that its base documents
                    yield f"{obj.__module__}.{obj.__qualname__}.{member_name}", member


def _inherits_doc(cls: type, name: str) -> bool:
    """An override documented by the base class it overrides is documented."""
    return any(
        name in vars(base) and _own_doc(_unwrap(vars(base)[name])) for base in cls.__mro__[1:]
    )


def test_every_public_name_has_a_docstring() -> None:
    missing = sorted({name for name, obj in _public_objects() if not _own_doc(obj)})
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)


def test_the_walk_sees_the_main_names() -> None:
    names = {name for name, _ in _public_objects()}
    for expected in (
        "atomr.actor.ref.ActorRef",
        "atomr.accel.device.Device",
        "atomr.train.trainer.Trainer",
        "atomr.cli.app.main",
        # methods a class gets from an atomr base or mixin (another module)
        "atomr.accel.backend.Backend.matmul",
        "atomr.train.tensor_parallel.shard.ShardActor.forward_stage",
    ):
        assert expected in names


@pytest.mark.parametrize("package", ["atomr", "atomr.actor", "atomr.accel", "atomr.train"])
def test_package_all_names_exist(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ lists {name!r}, which is missing"


def test_the_check_sees_through_generated_and_inherited_docstrings() -> None:
    """An undocumented dataclass or subclass of a documented class counts as missing."""

    @dataclasses.dataclass
    class Bare:
        x: int
        y: str = "a"

    @dataclasses.dataclass(frozen=True, slots=True)
    class Empty:
        pass

    @dataclasses.dataclass
    class Written:
        """What a `Written` is for."""

        x: int

    class Failure(ValueError):
        pass

    class Child(Written):
        pass

    assert Bare.__doc__ and inspect.getdoc(Failure)  # what the check must not trust
    assert not _own_doc(Bare)
    assert not _own_doc(Empty)
    assert not _own_doc(Failure)
    assert not _own_doc(Child)
    assert _own_doc(Written)
