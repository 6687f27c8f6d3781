"""`ShardPlan`: how `n` tensor-parallel shards hold a `Sequential`.

Each layer gets a rule from its class and its neighbours (`_splits`; the
shard-local layers are in `_layer_rules`): a built-in column `Linear`
followed, past element-wise layers, by a row `Linear` keeps its output
split; any other column `Linear` gathers it; the built-in attention is split
by heads; the rest, subclasses of those included, is replicated. A rule builds shard
`k`'s local layer and moves its parameter arrays between the whole model
and the shards (`split` / `merge`), which serves the parameters and every
optimizer buffer alike (they share the layout).

Raises (`plan_shards`): `ValueError` for a row `Linear` without its column
one, heads that `n` does not divide, or a width smaller than `n`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard, TypeVar

import numpy as np

from atomr.train.core.model.layer import Layer
from atomr.train.core.model.linear import Activation, Linear
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.model.structure import Residual, param_counts
from atomr.train.core.model.transformer import CausalSelfAttention
from atomr.train.core.partition import split_bounds
from atomr.train.tensor_parallel._layer_rules import HeadAttention, Meeting, ShardedLinear

__all__ = ["ShardPlan", "plan_shards"]

Arrays = list[np.ndarray]


class Rule:
    """One layer's sharding (module docstring); this base replicates it."""

    def __init__(self, layer: Layer) -> None:
        self.layer = layer

    def local(self, k: int, meeting: Meeting) -> Layer:
        """Shard `k`'s layer."""
        return self.layer

    def split(self, arrays: Arrays, k: int) -> Arrays:
        """Shard `k`'s part of the layer's arrays."""
        return [np.array(a, copy=True) for a in arrays]

    def merge(self, parts: list[Arrays]) -> Arrays:
        """The layer's arrays from every shard's part."""
        return parts[0]

    def replicated(self, k: int) -> list[bool]:
        """Per local array: the same on every shard."""
        return [True] * len(self.layer.param_shapes())


class ColumnRule(Rule):
    """Output features split; `gather`: the output is joined again."""

    def __init__(self, layer: Linear, n: int, gather: bool) -> None:
        super().__init__(layer)
        self.bounds, self.gather = split_bounds(layer.out_features, n), gather

    def local(self, k: int, meeting: Meeting) -> Layer:
        lo, hi = self.bounds[k]
        inner = Linear(self.layer.in_features, hi - lo)  # type: ignore[attr-defined]
        full = self.layer.out_features  # type: ignore[attr-defined]
        return ShardedLinear(inner, "gather" if self.gather else "column", meeting, lo, full)

    def split(self, arrays: Arrays, k: int) -> Arrays:
        lo, hi = self.bounds[k]
        return [np.ascontiguousarray(arrays[0][:, lo:hi]), arrays[1][lo:hi].copy()]

    def merge(self, parts: list[Arrays]) -> Arrays:
        return [
            np.concatenate([p[0] for p in parts], axis=1),
            np.concatenate([p[1] for p in parts]),
        ]

    def replicated(self, k: int) -> list[bool]:
        return [False, False]


class RowRule(Rule):
    """Input features split as the column layer before it split its output."""

    def __init__(self, layer: Linear, bounds: list[tuple[int, int]]) -> None:
        super().__init__(layer)
        self.bounds = bounds

    def local(self, k: int, meeting: Meeting) -> Layer:
        lo, hi = self.bounds[k]
        return ShardedLinear(Linear(hi - lo, self.layer.out_features), "row", meeting)  # type: ignore[attr-defined]

    def split(self, arrays: Arrays, k: int) -> Arrays:
        lo, hi = self.bounds[k]
        return [arrays[0][lo:hi].copy(), arrays[1].copy()]

    def merge(self, parts: list[Arrays]) -> Arrays:
        return [np.concatenate([p[0] for p in parts], axis=0), parts[0][1]]

    def replicated(self, k: int) -> list[bool]:
        return [False, k != 0]  # the bias: added and trained by shard 0 only


class HeadsRule(Rule):
    """Attention heads split, whole heads to each shard."""

    def __init__(self, layer: CausalSelfAttention, n: int) -> None:
        super().__init__(layer)
        if layer.n_head % n:
            raise ValueError(
                f"{n} shards cannot split {layer.n_head} attention heads evenly: use a shard "
                "count that divides n_head"
            )
        self.n, self.dh = n, layer.d_model // layer.n_head
        self.heads = layer.n_head // n

    def _cols(self, k: int) -> np.ndarray:
        d, lo, hi = self.layer.d_model, k * self.heads * self.dh, (k + 1) * self.heads * self.dh  # type: ignore[attr-defined]
        return np.concatenate([np.arange(lo, hi) + part * d for part in range(3)])

    def local(self, k: int, meeting: Meeting) -> Layer:
        inner = CausalSelfAttention(self.heads * self.dh, self.heads)
        return HeadAttention(inner, meeting, self.layer.d_model)  # type: ignore[attr-defined]

    def split(self, arrays: Arrays, k: int) -> Arrays:
        w_qkv, b_qkv, w_o, b_o = arrays
        cols, lo = self._cols(k), k * self.heads * self.dh
        rows = slice(lo, lo + self.heads * self.dh)
        return [
            np.ascontiguousarray(w_qkv[:, cols]),
            b_qkv[cols].copy(),
            w_o[rows].copy(),
            b_o.copy(),
        ]

    def merge(self, parts: list[Arrays]) -> Arrays:
        d = self.layer.d_model  # type: ignore[attr-defined]
        w_qkv = np.empty((d, 3 * d), dtype=parts[0][0].dtype)
        b_qkv = np.empty(3 * d, dtype=parts[0][1].dtype)
        for k, p in enumerate(parts):
            cols = self._cols(k)
            w_qkv[:, cols], b_qkv[cols] = p[0], p[1]
        return [w_qkv, b_qkv, np.concatenate([p[2] for p in parts], axis=0), parts[0][3]]

    def replicated(self, k: int) -> list[bool]:
        return [False, False, False, k != 0]


class ResidualRule(Rule):
    """A residual block: its inner layers' rules."""

    def __init__(self, layer: Residual, n: int) -> None:
        super().__init__(layer)
        self.rules = rules_for(layer.layers, n)
        self.counts = param_counts(layer.layers)

    def _parts(self, arrays: Arrays) -> list[Arrays]:
        out, at = [], 0
        for c in self.counts:
            out.append(arrays[at : at + c])
            at += c
        return out

    def local(self, k: int, meeting: Meeting) -> Layer:
        return Residual([r.local(k, meeting) for r in self.rules])

    def split(self, arrays: Arrays, k: int) -> Arrays:
        return [
            a for r, p in zip(self.rules, self._parts(arrays), strict=True) for a in r.split(p, k)
        ]

    def merge(self, parts: list[Arrays]) -> Arrays:
        per_shard = [self._parts(p) for p in parts]
        merged: Arrays = []
        for i, rule in enumerate(self.rules):
            merged += rule.merge([shard[i] for shard in per_shard])
        return merged

    def replicated(self, k: int) -> list[bool]:
        return [flag for r in self.rules for flag in r.replicated(k)]


_L = TypeVar("_L", bound=Layer)


def _splits(layer: Layer, built_in: type[_L]) -> TypeGuard[_L]:
    """Whether `layer` is exactly the built-in class whose split this plan
    knows. A subclass keeps its own math, which shards rebuilt as the
    built-in class would drop, so it is replicated instead."""
    return type(layer) is built_in


def _paired_row(layers: Sequence[Layer], i: int) -> int | None:
    """The index of the row `Linear` that takes column `Linear` i's split output."""
    for j in range(i + 1, len(layers)):
        layer = layers[j]
        if isinstance(layer, Activation):
            continue
        if _splits(layer, Linear) and layer.tp == "row":
            return j
        return None
    return None


def _unpaired_row_message(layers: Sequence[Layer], i: int) -> str:
    """Why row `Linear` i has no column `Linear` to take its input from."""
    between: list[int] = []
    for j in range(i - 1, -1, -1):
        layer = layers[j]
        if _splits(layer, Linear) and layer.tp == "row":
            return (
                f"layer {i}: a row-parallel Linear needs a column-parallel Linear of its own "
                f"before it; the nearest one before it feeds row-parallel layer {j}: put a "
                f"column-parallel Linear before layer {i}, or make layer {i} replicated"
            )
        if _splits(layer, Linear) and layer.tp == "column":
            blockers = [k for k in between if not isinstance(layers[k], Activation)]
            names = ", ".join(f"{k} ({type(layers[k]).__name__})" for k in sorted(blockers))
            return (
                f"layer {i}: a row-parallel Linear takes a column-parallel Linear's split "
                f"output with only activations between; layer(s) {names} stand between it "
                f"and the column-parallel layer {j}: move them after layer {i}"
            )
        between.append(j)
    return f"layer {i}: a row-parallel Linear must follow a column-parallel one"


def rules_for(layers: Sequence[Layer], n: int) -> list[Rule]:
    """The rule of every layer of one container (module docstring).

    Raises:
        ValueError: as `plan_shards`.
    """
    rules: list[Rule | None] = [None] * len(layers)
    for i, layer in enumerate(layers):
        if rules[i] is not None:
            continue
        if _splits(layer, Linear) and layer.tp == "column":
            if layer.out_features < n:
                raise ValueError(
                    f"{n} shards cannot split a Linear of {layer.out_features} outputs"
                )
            j = _paired_row(layers, i)
            column = ColumnRule(layer, n, gather=j is None)
            rules[i] = column
            if j is not None:
                rules[j] = RowRule(layers[j], column.bounds)  # type: ignore[arg-type]
        elif _splits(layer, Linear) and layer.tp == "row":
            raise ValueError(_unpaired_row_message(layers, i))
        elif _splits(layer, CausalSelfAttention):
            rules[i] = HeadsRule(layer, n)
        elif _splits(layer, Residual):
            rules[i] = ResidualRule(layer, n)
        else:
            rules[i] = Rule(layer)
    return [r for r in rules if r is not None]


class ShardPlan:
    """How `n` shards hold `model` (module docstring).

    Args:
        model: the whole model.
        n: the shards.
    """

    def __init__(self, model: Sequential, n: int) -> None:
        self.model, self.n = model, n
        self.rules = rules_for(model.layers, n)

    def _layer_arrays(self, vector: np.ndarray) -> list[Arrays]:
        return [
            [np.asarray(a) for a in self.model.views(vector, i)] for i in range(len(self.rules))
        ]

    def split(self, vector: np.ndarray) -> list[np.ndarray]:
        """Every shard's flat vector of a whole-model flat vector."""
        layers = self._layer_arrays(np.asarray(vector))
        shards = []
        for k in range(self.n):
            parts = [
                a.reshape(-1)
                for r, arrays in zip(self.rules, layers, strict=True)
                for a in r.split(arrays, k)
            ]
            shards.append(np.concatenate(parts) if parts else np.zeros(0, vector.dtype))
        return shards

    def merge(self, vectors: Sequence[np.ndarray]) -> np.ndarray:
        """The whole-model flat vector of every shard's."""
        per_shard = [self._local_arrays(k, v) for k, v in enumerate(vectors)]
        out: list[np.ndarray] = []
        for i, rule in enumerate(self.rules):
            out += [a.reshape(-1) for a in rule.merge([shard[i] for shard in per_shard])]
        return np.concatenate(out)

    def _local_arrays(self, k: int, vector: np.ndarray) -> list[Arrays]:
        local = self.local_model(k, None)
        return [[np.asarray(a) for a in local.views(vector, i)] for i in range(len(self.rules))]

    def local_model(self, k: int, meeting: Meeting | None, device: Any = None) -> Sequential:
        """Shard `k`'s model (its parameters 0 until loaded)."""
        m = self.model
        layers = [r.local(k, meeting) for r in self.rules]  # type: ignore[arg-type]
        n_params = sum(layer.n_params for layer in layers)
        return Sequential.from_layers(
            layers, m.in_shape, np.zeros(n_params, m.dtype), input_kind=m.input_kind, device=device
        )

    def replicated_mask(self, k: int) -> np.ndarray:
        """Shard `k`'s flat positions that every shard holds alike (not counted
        twice in the gradient norm)."""
        local = self.local_model(k, None)
        mask = np.zeros(local.n_params, dtype=bool)
        pos = 0
        for rule, layer in zip(self.rules, local.layers, strict=True):
            for flag, shape in zip(rule.replicated(k), layer.param_shapes(), strict=True):
                size = int(np.prod(shape))
                mask[pos : pos + size] = flag
                pos += size
        return mask


def plan_shards(model: Sequential, n: int) -> ShardPlan:
    """The plan of `n` shards for `model`.

    Raises:
        ValueError: a row `Linear` without its column one, heads that `n`
            does not divide, or a `Linear` narrower than `n`.
    """
    return ShardPlan(model, n)
