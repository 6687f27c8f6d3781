"""`save_curves`: the loss and accuracy curves of a run as a PNG (matplotlib, Agg)."""

from __future__ import annotations

import io
import os
from pathlib import Path

from atomr.cli.errors import CliError
from atomr.cli.history import History
from atomr.train.core._atomic_write import write_atomically

__all__ = ["check_matplotlib", "save_curves"]


def check_matplotlib() -> None:
    """Check that plots can be drawn (matplotlib imports, on its Agg backend).

    Raises:
        CliError: matplotlib is not installed (exit status 1).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        raise CliError("plots need matplotlib: pip install -e '.[train]'", 1) from None


def save_curves(history: History, path: str | os.PathLike[str]) -> Path:
    """Plot train/test loss and train/test accuracy per epoch, side by side.

    Uses matplotlib's Agg backend (no display needed); parent folders are
    created. The PNG is drawn in memory, then replaces `path` atomically, so
    a run stopped while drawing leaves the previous file (or none), never a
    torn one.

    Args:
        history: the run's history (an empty one gives empty axes).
        path: the PNG file to write.

    Returns:
        The path written.

    Raises:
        CliError: matplotlib is not installed.
        OSError: the file cannot be written.
        CheckpointError: `path` exists and is not a regular file.
    """
    check_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    epochs = [r.epoch for r in history.epochs]
    fig = Figure(figsize=(10, 4), dpi=100)
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r.train_loss for r in history.epochs], "o-", label="train")
    ax_loss.plot(epochs, [r.test_loss for r in history.epochs], "s--", label="test")
    ax_loss.set(title="loss", xlabel="epoch", ylabel="loss")
    ax_acc.plot(epochs, [r.train_accuracy for r in history.epochs], "o-", label="train")
    ax_acc.plot(epochs, [r.test_accuracy for r in history.epochs], "s--", label="test")
    ax_acc.set(title="accuracy", xlabel="epoch", ylabel="accuracy", ylim=(0.0, 1.02))
    for ax in (ax_loss, ax_acc):
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    cfg = history.config
    fig.suptitle(
        f"atomr train: {cfg.get('dataset')}, strategy {cfg.get('strategy')} "
        f"on {', '.join(cfg.get('devices', []))}"
    )
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    write_atomically(target, png.getvalue())  # a run stopped while writing leaves no torn PNG
    return target
