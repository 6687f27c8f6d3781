"""Layer kinds by name, so a config (a checkpoint's) rebuilds its layers."""

from __future__ import annotations

from typing import Any, TypeVar

from atomr.train.core.model.layer import Layer

__all__ = ["LAYERS", "layer_from_config", "register_layer"]

LAYERS: dict[str, type[Layer]] = {}
"""`Layer.kind` -> the class."""

L = TypeVar("L", bound=type[Layer])


def register_layer(cls: L) -> L:
    """Class decorator: make `cls` buildable from its config by its `kind`.

    Raises:
        ValueError: no `kind`, or another class holds it.
    """
    kind = cls.kind
    if not kind:
        raise ValueError(f"{cls.__name__} has no kind")
    if LAYERS.get(kind, cls) is not cls:
        raise ValueError(f"layer kind {kind!r} is taken by {LAYERS[kind].__name__}")
    LAYERS[kind] = cls
    return cls


def layer_from_config(config: Any) -> Layer:
    """The layer a `Layer.config()` describes.

    Raises:
        ValueError: not a dict, an unknown kind, or arguments the layer refuses.
    """
    if not isinstance(config, dict) or not isinstance(config.get("kind"), str):
        raise ValueError(f"a layer config is a dict with a 'kind', got {config!r}"[:200])
    cls = LAYERS.get(config["kind"])
    if cls is None:
        raise ValueError(f"unknown layer kind {config['kind']!r}; known: {sorted(LAYERS)}")
    from_config = getattr(cls, "from_config", None)
    if from_config is not None:
        layer: Layer = from_config(config)
        return layer
    args = {k: v for k, v in config.items() if k != "kind"}
    try:
        return cls(**args)
    except TypeError as exc:
        raise ValueError(f"layer {config['kind']!r}: {exc}") from exc
