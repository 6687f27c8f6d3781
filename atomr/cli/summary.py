"""`summary_table`: the final table `atomr train` prints."""

from __future__ import annotations

import math
from typing import Any

from atomr.cli.history import History

__all__ = ["format_table", "summary_table"]


def format_table(rows: list[tuple[str, str]], title: str | None = None) -> str:
    """Two aligned columns, with an optional title line and rules.

    Args:
        rows: (label, value) pairs.
        title: printed above the table.

    Returns:
        The table as text (no trailing newline).
    """
    width = max((len(k) for k, _ in rows), default=0)
    vwidth = max((len(v) for _, v in rows), default=0)
    rule = "-" * (width + 3 + vwidth)
    lines = [title] if title else []
    lines.append(rule)
    lines += [f"{k.ljust(width)}   {v}" for k, v in rows]
    lines.append(rule)
    return "\n".join(lines)


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100.0 * value:.2f} %"


def _devices(cfg: dict[str, Any]) -> str:
    text = ", ".join(cfg.get("devices", []))
    dist = cfg.get("dist")
    if dist:
        text += f" per rank, {dist['world_size']} MPI ranks"
    return text


def _steps(history: History) -> int:
    if history.position is not None:
        return int(history.position["step"])
    return history.last.step if history.last else 0


def _model(cfg: dict[str, Any]) -> str:
    """The model in a few words: the MLP's widths, or the GPT's shape."""
    gpt = cfg.get("gpt")
    if isinstance(gpt, dict):
        return (f"gpt: {gpt.get('n_layer')} blocks of width {gpt.get('d_model')}, "
                f"{gpt.get('n_head')} heads, context {gpt.get('context')}")  # fmt: skip
    return "-".join(str(w) for w in cfg.get("sizes", []))


def summary_table(history: History, outputs: dict[str, str]) -> str:
    """The run's summary: setup, final figures and where the files went.

    Args:
        history: the run's history.
        outputs: file kind ("plot", "history", "checkpoint") -> path.

    Returns:
        The table as text.
    """
    cfg = history.config
    last = history.last
    rows = [
        ("status", history.status),
        ("strategy", str(cfg.get("strategy"))),
        ("devices", _devices(cfg)),
        ("dataset", str(cfg.get("dataset"))),
        ("model", _model(cfg)),
        ("optimizer", f"{cfg.get('optimizer')} (lr {cfg.get('lr')})"),
        ("epochs", str(last.epoch if last else 0)),
        ("steps", str(_steps(history))),
    ]
    if last is not None:
        mean_rate = sum(r.samples_per_s for r in history.epochs) / len(history.epochs)
        rows += [
            ("train loss", f"{last.train_loss:.4f}"),
            ("test loss", f"{last.test_loss:.4f}"),
            ("train accuracy", _pct(last.train_accuracy)),
            ("test accuracy", _pct(last.test_accuracy)),
            ("samples/s (mean)", f"{mean_rate:,.0f}"),
        ]
    rows.append(("wall time", f"{history.wall_seconds:.1f} s"))
    rows += [(kind, path) for kind, path in outputs.items()]
    return format_table(rows, title="atomr train: summary")
