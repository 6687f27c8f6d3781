"""How a model's layers are cut into pipeline stages: `balanced_split` (the
cut with the smallest largest stage) and `stage_layer_counts` (the cut
`PipelineParallelTrainer.spawn` uses)."""

from __future__ import annotations

from collections.abc import Sequence

from atomr._arguments import int_at_least
from atomr.train.core.model.sequential import Sequential

__all__ = ["balanced_split", "stage_layer_counts"]


def balanced_split(
    layer_params: Sequence[float], n_stages: int, holds: Sequence[bool] | None = None
) -> list[int]:
    """Cut consecutive layers into stages with the smallest largest stage.

    Args:
        layer_params: the parameter count of each layer, in order.
        n_stages: number of stages, `1 <= n_stages <= len(layer_params)`.
        holds: whether each layer has parameters; when given, every stage
            gets at least one layer that has (a stage without any would have
            nothing to train).

    Returns:
        The number of layers of each stage (each >= 1, summing to the layer
        count); among the splits minimising the largest stage's parameter
        count, the one whose stages are filled front first.

    Raises:
        TypeError: `n_stages` is no int (NumPy's are ints: `int_at_least`).
        ValueError: `n_stages` below 1 or above the number of layers (or,
            with `holds`, of layers with parameters).
    """
    n = len(layer_params)
    n_stages = int_at_least("the number of stages", n_stages, 1)
    if n_stages > n:
        raise ValueError(
            f"{n_stages} stages for a model of {n} layers: every stage needs at least one "
            "layer; use at most as many devices as layers"
        )
    held = [1] * n if holds is None else [int(bool(h)) for h in holds]
    if sum(held) < n_stages:
        raise ValueError(
            f"{n_stages} stages for a model with parameters in {sum(held)} of its {n} layers: "
            "every stage needs a layer with parameters; use at most that many devices"
        )
    prefix: list[float] = [0.0]
    holding = [0]
    for c, h in zip(layer_params, held, strict=True):
        prefix.append(prefix[-1] + c)
        holding.append(holding[-1] + h)
    inf = float("inf")
    # best[k][i]: smallest max stage cost of the first i layers in k stages
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                if holding[i] == holding[j]:
                    continue  # layers j..i-1 would be a stage without parameters
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    counts = []
    i = n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def stage_layer_counts(model: Sequential, n_stages: int, split: Sequence[int] | None) -> list[int]:
    """The number of layers of each stage.

    Args:
        model: the model to cut.
        n_stages: the number of stages (devices), >= 1.
        split: layers per stage, or None for `balanced_split` over the
            layers' costs (`stage_costs`: an `Mlp`'s parameter counts, any
            other model's `Layer.cost`; a `Residual` block is one layer).

    Returns:
        One count per stage, each >= 1, summing to `model.n_layers`.

    Raises:
        ValueError: more stages than layers with parameters, or a `split`
            that does not give each of the `n_stages` stages at least one
            layer with parameters and cover the model.
    """
    holds = model.stage_has_params()
    if split is None:
        return balanced_split(model.stage_costs(), n_stages, holds)
    counts = [int(c) for c in split]
    if len(counts) != n_stages or any(c < 1 for c in counts) or sum(counts) != model.n_layers:
        raise ValueError(
            f"split {list(split)} must give each of the {n_stages} stages >= 1 layer "
            f"and cover the model's {model.n_layers} layers"
        )
    start = 0
    for stage, count in enumerate(counts):
        if not any(holds[start : start + count]):
            raise ValueError(
                f"split {list(split)}: stage {stage} (layers {start}..{start + count - 1}) "
                "has no parameters; give it a layer that has"
            )
        start += count
    return counts
