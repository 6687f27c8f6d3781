"""Layer kinds by name, so a config (a checkpoint's) rebuilds its layers."""

from __future__ import annotations

import inspect
from contextvars import ContextVar
from typing import Any, TypeVar

from atomr.actor.errors import bounded_repr
from atomr.train.core.model.inputs import known_keys
from atomr.train.core.model.layer import Layer

__all__ = ["LAYERS", "MAX_NESTING", "layer_from_config", "register_layer"]

LAYERS: dict[str, type[Layer]] = {}
"""`Layer.kind` -> the class."""

L = TypeVar("L", bound=type[Layer])

MAX_NESTING = 32
"""How deep `layer_from_config` builds layers inside layers (a `Residual`'s)."""

# A container's from_config calls back into layer_from_config; the depth
# travels in the context, so a user's own container needs no depth argument.
_nesting: ContextVar[int] = ContextVar("layer_config_nesting", default=0)


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_layer(cls: L) -> L:
    """Class decorator: make `cls` buildable from its config by its `kind`.

    A kind belongs to one class, by its module and qualified name:
    registering the same class again changes nothing, and a class of the
    same module and qualified name as the holder replaces it (a notebook
    cell or a module re-run with `importlib.reload` redefines its class;
    configs then build the new one, while layers already built keep theirs).

    Raises:
        ValueError: no `kind`, or a class of another module or qualified name
            holds it.
    """
    kind = cls.kind
    if not kind:
        raise ValueError(f"{cls.__name__} has no kind")
    holder = LAYERS.get(kind, cls)
    if _full_name(holder) != _full_name(cls):
        raise ValueError(
            f"layer kind {kind!r} is taken by {_full_name(holder)}; {_full_name(cls)} "
            "needs another kind (only a redefinition of the same class replaces it)"
        )
    LAYERS[kind] = cls
    return cls


def layer_from_config(config: Any) -> Layer:
    """The layer a `Layer.config()` describes.

    Raises:
        ValueError: not a dict, an unknown kind, a key that is neither `kind`
            nor an argument of the layer's class (a class with `from_config`
            checks its own keys), arguments the layer refuses,
            or layers nested more than `MAX_NESTING` deep (a hostile
            checkpoint's config would otherwise end in a RecursionError).
    """
    depth = _nesting.get()
    if depth >= MAX_NESTING:
        raise ValueError(f"layer configs are nested more than {MAX_NESTING} deep")
    token = _nesting.set(depth + 1)
    try:
        return _build(config)
    finally:
        _nesting.reset(token)


def _build(config: Any) -> Layer:
    if not isinstance(config, dict) or not isinstance(config.get("kind"), str):
        raise ValueError(f"a layer config is a dict with a 'kind', got {bounded_repr(config)}")
    kind = config["kind"]
    cls = LAYERS.get(kind)
    if cls is None:
        raise ValueError(f"unknown layer kind {bounded_repr(kind)}; known: {sorted(LAYERS)}")
    from_config = getattr(cls, "from_config", None)
    try:
        if from_config is not None:
            layer: Layer = from_config(config)
            return layer
        arguments = _arguments(cls)
        if arguments is not None:
            known_keys(f"layer {kind!r}", config, ("kind", *arguments))
        return cls(**{k: v for k, v in config.items() if k != "kind"})
    except (TypeError, KeyError) as exc:
        raise ValueError(f"layer {kind!r}: {type(exc).__name__}: {exc}") from exc


def _arguments(cls: type[Layer]) -> tuple[str, ...] | None:
    """The names `cls(...)` takes by keyword; None when it takes any (`**kwargs`)."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
