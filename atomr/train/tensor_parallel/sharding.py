"""Tensor-parallel partition math: which slice of each `Mlp` layer a shard owns.

Layers alternate column-parallel and row-parallel, as Megatron-LM pairs them
(layer `l` counts from 0):

- even `l`, **column-parallel**: shard `s` owns the columns `lo:hi` of `W_l`
  (`(in, out)`) and the same entries of `b_l`; it computes its slice of the
  layer's output features. Its input is replicated.
- odd `l`, **row-parallel**: shard `s` owns the rows `lo:hi` of `W_l`, the
  input features the preceding column-parallel layer produced on that shard,
  so the activation between the pair stays local. Each shard yields a partial
  output; the partial outputs are summed (all-reduced). The bias `b_l` is
  owned by shard 0 alone, which adds it into its partial: it is added once,
  stored once and stepped once.
- an odd number of layers leaves a last, unpaired layer: it is
  column-parallel and its output slices are gathered (concatenated).

A *stage* is one round of forward messages: layers `2k` and `2k + 1`
(or the lone last column layer). A width `w` split over `n` shards gives
the first `w % n` shards `w // n + 1` features and the others `w // n`; every
sharded width must be at least `n`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr._arguments import int_at_least
from atomr.train.core.partition import split_bounds

__all__ = [
    "COLUMN",
    "ROW",
    "LayerShard",
    "ShardLayout",
    "check_shardable",
    "scatter_pieces",
    "shard_layout",
    "slice_state",
    "split_range",
    "stage_count",
]

COLUMN = "column"
ROW = "row"


def split_range(width: int, shard_count: int, rank: int) -> tuple[int, int]:
    """The features `lo:hi` of a width that shard `rank` owns.

    Args:
        width: the width to split (>= shard_count).
        shard_count: number of shards (>= 1).
        rank: the shard, `0 <= rank < shard_count`.

    Returns:
        `(lo, hi)`; the first `width % shard_count` shards get one feature more.

    Raises:
        ValueError: `width < shard_count`, or `rank` out of range.
    """
    if shard_count < 1:
        raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    if not 0 <= rank < shard_count:
        raise ValueError(f"rank must be in [0, {shard_count}), got {rank}")
    if width < shard_count:
        raise ValueError(f"width {width} is smaller than the shard count {shard_count}")
    return split_bounds(width, shard_count)[rank]


def stage_count(n_layers: int) -> int:
    """Forward rounds of a step: one per column/row pair, plus one for a lone last layer."""
    return (n_layers + 1) // 2


def check_shardable(sizes: Sequence[int], shard_count: int) -> None:
    """Check that a model with these sizes can be split over `shard_count` shards.

    Every column-parallel layer's output width (`sizes[1]`, `sizes[3]`, ...)
    is split, so each must be at least `shard_count`.

    Raises:
        TypeError: `shard_count` is no int (NumPy's are ints: `int_at_least`).
        ValueError: `shard_count < 1`, or a sharded width is smaller than it.
    """
    shard_count = int_at_least("shard_count", shard_count, 1)
    for layer in range(0, len(sizes) - 1, 2):
        width = int(sizes[layer + 1])
        if width < shard_count:
            raise ValueError(
                f"layer {layer} is column-parallel and has {width} output features, fewer "
                f"than the {shard_count} shards: every shard needs at least one "
                f"(sizes {list(sizes)})"
            )


@dataclass(frozen=True, slots=True)
class LayerShard:
    """One shard's part of one layer.

    Attributes:
        layer: the layer index in the model.
        kind: `COLUMN` or `ROW`.
        lo, hi: the owned columns (COLUMN) or rows (ROW) of `W`.
        w_shape: the local `W` block's shape.
        w_offset: where the local `W` block starts in the shard's flat vector.
        b_offset: where the local bias starts in the shard's flat vector.
        b_size: the local bias length (0 for a row layer on a shard other than 0).
        gathered: a column layer whose output slices are concatenated (the
            last layer of a model with an odd number of layers).
    """

    layer: int
    kind: str
    lo: int
    hi: int
    w_shape: tuple[int, int]
    w_offset: int
    b_offset: int
    b_size: int
    gathered: bool

    @property
    def stop(self) -> int:
        """One past the layer's last local parameter."""
        return self.b_offset + self.b_size


@dataclass(frozen=True)
class ShardLayout:
    """What shard `rank` of `shard_count` owns of an `Mlp` with `sizes`.

    Attributes:
        sizes: the model's widths.
        shard_count: number of shards.
        rank: this shard.
        layers: one `LayerShard` per model layer, in order.
        n_params: the number of parameters this shard owns.
        total_params: the model's parameter count.
    """

    sizes: tuple[int, ...]
    shard_count: int
    rank: int
    layers: tuple[LayerShard, ...]
    n_params: int
    total_params: int

    @property
    def stages(self) -> int:
        """Forward rounds of a step (`stage_count(len(layers))`)."""
        return stage_count(len(self.layers))

    def stage_layers(self, stage: int) -> tuple[LayerShard, ...]:
        """The layers of a stage: `(column, row)`, or `(column,)` for a lone last layer."""
        return self.layers[2 * stage : 2 * stage + 2]

    @property
    def in_range(self) -> tuple[int, int]:
        """The input features this shard reads: all of them (the input is replicated)."""
        return 0, self.sizes[0]

    @property
    def output_range(self) -> tuple[int, int]:
        """The output columns this shard's last-stage reply covers: all of them
        (a partial sum) after a row layer, its slice after a gathered column layer."""
        last = self.layers[-1]
        if last.gathered:
            return last.lo, last.hi
        return 0, self.sizes[-1]

    def global_index(self) -> np.ndarray:
        """Where each local parameter sits in the model's flat `params` vector.

        Returns:
            int64 array of `n_params` positions, in the shard's local order
            (layer by layer, the local `W` block row-major, then the local bias).
        """
        parts: list[np.ndarray] = []
        pos = 0
        for fan_in, fan_out, ls in zip(self.sizes[:-1], self.sizes[1:], self.layers, strict=True):
            w0 = pos
            b0 = pos + fan_in * fan_out
            if ls.kind == COLUMN:
                rows = np.arange(fan_in, dtype=np.int64)[:, None] * fan_out
                parts.append((w0 + rows + np.arange(ls.lo, ls.hi, dtype=np.int64)).ravel())
                parts.append(b0 + np.arange(ls.lo, ls.hi, dtype=np.int64))
            else:
                parts.append(np.arange(w0 + ls.lo * fan_out, w0 + ls.hi * fan_out, dtype=np.int64))
                if ls.b_size:
                    parts.append(np.arange(b0, b0 + fan_out, dtype=np.int64))
            pos = b0 + fan_out
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def shard_layout(sizes: Sequence[int], shard_count: int, rank: int) -> ShardLayout:
    """The layout of shard `rank` for an `Mlp` with `sizes` (see the module docstring).

    Args:
        sizes: the model's widths, input first (>= 2 entries, each >= 1).
        shard_count: number of shards (>= 1).
        rank: the shard, `0 <= rank < shard_count`.

    Returns:
        The `ShardLayout`.

    Raises:
        TypeError: `shard_count` or `rank` is no int (a bool is none).
        ValueError: bad sizes, a sharded width smaller than `shard_count`, or
            `rank` out of range.
    """
    widths = tuple(int(s) for s in sizes)
    if len(widths) < 2 or any(s < 1 for s in widths):
        raise ValueError(f"sizes must have >= 2 entries, each >= 1; got {list(widths)}")
    check_shardable(widths, shard_count)
    if not 0 <= int_at_least("rank", rank, 0) < shard_count:
        raise ValueError(f"rank must be in [0, {shard_count}), got {rank}")
    n_layers = len(widths) - 1
    layers = []
    pos = 0
    for layer in range(n_layers):
        fan_in, fan_out = widths[layer], widths[layer + 1]
        if layer % 2 == 0:
            lo, hi = split_range(fan_out, shard_count, rank)
            w_shape = (fan_in, hi - lo)
            b_size = hi - lo
            kind = COLUMN
        else:
            lo, hi = split_range(fan_in, shard_count, rank)
            w_shape = (hi - lo, fan_out)
            b_size = fan_out if rank == 0 else 0
            kind = ROW
        w_offset = pos
        pos += w_shape[0] * w_shape[1]
        gathered = kind == COLUMN and layer == n_layers - 1
        layers.append(LayerShard(layer, kind, lo, hi, w_shape, w_offset, pos, b_size, gathered))
        pos += b_size
    total = sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    return ShardLayout(widths, shard_count, rank, tuple(layers), pos, total)


def scatter_pieces(total: int, pieces: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Assemble a full flat vector from the shards' `(index, values)` pieces.

    Args:
        total: the full vector's length.
        pieces: per shard, the positions (`ShardLayout.global_index()`) and
            the values there.

    Returns:
        The full vector (dtype of the first piece's values).

    Raises:
        ValueError: the pieces do not cover every position exactly once, or an
            index and its values differ in length.
    """
    if not pieces:
        raise ValueError("no pieces to assemble")
    count = np.zeros(total, dtype=np.int64)
    out = np.empty(total, dtype=np.asarray(pieces[0][1]).dtype)
    for index, values in pieces:
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        vals = np.asarray(values).reshape(-1)
        if idx.shape != vals.shape:
            raise ValueError(f"{idx.size} positions for {vals.size} values")
        if idx.size and (idx.min() < 0 or idx.max() >= total):
            raise ValueError(f"a position lies outside [0, {total})")
        out[idx] = vals
        count += np.bincount(idx, minlength=total)
    if not np.all(count == 1):
        missing = int(np.sum(count == 0))
        doubled = int(np.sum(count > 1))
        raise ValueError(
            f"the shards' pieces do not partition the vector: {missing} positions missing, "
            f"{doubled} held more than once"
        )
    return out


def slice_state(state: dict[str, Any], index: np.ndarray, total: int) -> dict[str, Any]:
    """A shard's part of full-vector state (an optimizer `state_dict()`).

    Args:
        state: the full state; each 1-D array of length `total` is a
            full-vector buffer, anything else (the kind, the step) is kept.
        index: the shard's positions (`ShardLayout.global_index()`).
        total: the full vector's length.

    Returns:
        A new dict: every full-vector buffer taken at `index`, the rest as is.
    """
    return {
        key: value[index]
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.shape[0] == total
        else value
        for key, value in state.items()
    }
