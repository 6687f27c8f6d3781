"""`atomr train --resume`: where a checkpoint stands and whether this run
may go on from it.

The checkpoint is the truth; its history file (`<checkpoint>.history.json`)
gives the fit loop's position and the earlier epoch records only when it
was written with that very save (the checkpoint's digest). The run's
options are checked against the checkpoint's (and the data options and
`--loss` against its history file's): another model, optimizer, schedule,
data or loss, or nothing left to train, is a `CliError` that names the
option to change.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NamedTuple

from atomr._arguments import int_at_least
from atomr._repr import bounded_repr
from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.model_options import flag_of
from atomr.cli.run_config import RunConfig
from atomr.cli.strategies import saved_steps_per_batch
from atomr.train import CheckpointError, load_checkpoint
from atomr.train.core import Checkpoint
from atomr.train.core.checkpoint import checkpoint_digest
from atomr.train.core.sharded_index import merge_shards, save_digest
from atomr.train.fit import FitPosition

__all__ = ["ResumePoint", "check_something_left", "check_unchanged", "resume_position"]


class ResumePoint(NamedTuple):
    """Where a run resumes: the fit loop's `position`, the trainer's own
    `trainer_step` count, and the `checkpoint`'s digest (which save it is,
    a sharded index's shard files included: `save_digest`)."""

    position: FitPosition
    trainer_step: int
    checkpoint: str


def resume_position(
    run: RunConfig, path: Path, steps: int, updates: int, history: History
) -> ResumePoint:
    """Where the checkpoint stands (the fit loop's position, the trainer's
    own step count and the save's digest), and the earlier epoch
    records and run id (`history` continues that run): from its history file when that file was written with this
    very checkpoint (its digest says so), else from the checkpoint's own
    step where the strategy takes a fixed number of steps per batch (with a
    warning on stderr).
    `steps` is the batches of an epoch, `updates` the optimizer updates it
    makes (the run's schedule is sized in them).

    Raises:
        CliError: an unusable checkpoint (a sharded index whose shard
            files are missing or do not fit it), one saved over while it
            was read (`check_unchanged`), another model or optimizer
            (a sharded save's, from its shard files), a history file of
            other data options or another loss, or a strategy whose steps per batch vary
            with no history file of this checkpoint.
    """
    try:
        digest = checkpoint_digest(path)  # what its history file was written with
        index = load_checkpoint(path)
        save = save_digest(path, index)  # with its shard files' where it is an index
        ckpt = merge_shards(path, index)  # an index holds no optimizer settings to check
        unchanged = checkpoint_digest(path) == digest  # all of it read from one save
    except (CheckpointError, OSError) as exc:
        raise CliError(f"--resume: {exc}") from None
    if not unchanged:
        raise _changed(path)
    _check_model_kind(run, ckpt)
    if run.gpt is None:  # a GPT's layers are checked by the trainer's LoadCheckpoint
        _check_model_options(run, ckpt, list(history.config["sizes"]))
    _check_optimizer_options(run, ckpt, updates)
    earlier = _history_of(path, digest, ckpt.step)
    if earlier is None:
        return ResumePoint(_position_from_step(run, path, ckpt, steps), ckpt.step, save)
    saved = earlier.position or {}
    _check_data_options(saved.get("data"), run.data_options())
    _check_loss(_trained_loss(earlier), run.loss)
    position = _saved_position(saved, steps)
    if position is None:
        _warn(
            f"--resume: ignoring the position in {history_path_for(path)} ({bounded_repr(saved)}): "
            "not whole numbers within the run; taking it from the checkpoint's step"
        )
        return ResumePoint(_position_from_step(run, path, ckpt, steps), ckpt.step, save)
    history.epochs = [r for r in earlier.epochs if r.epoch <= position.epoch]
    history.run_id = earlier.run_id or history.run_id  # the run it continues
    return ResumePoint(position, ckpt.step, save)


def check_unchanged(path: Path, save: str) -> None:
    """Refuse a `--resume` checkpoint that is no longer the save `save` (its
    `save_digest`, `ResumePoint.checkpoint`) planned from: another run
    saved over it since, and a trainer that loaded it then may hold that
    save's state, at this save's position (and the ranks of a
    `--distributed` run, which agreed on this save, each another). Reads
    the file's last 32 bytes, and an index (small) with its shard files'.

    Raises:
        CliError: it changed, or can no longer be read.
    """
    try:
        if checkpoint_digest(path) == save:  # a full checkpoint, as it was
            return
        if save_digest(path, load_checkpoint(path)) == save:  # an index and its shard files
            return
    except (CheckpointError, OSError):
        pass
    raise _changed(path)


def _changed(path: Path) -> CliError:
    """The error of a `--resume` checkpoint saved over while this run read it."""
    return CliError(
        f"--resume: {path} changed while this run read it (another run saving to it?); "
        "resume once nothing writes to it, or from a copy"
    )


def _saved_position(saved: dict[str, Any], steps: int) -> FitPosition | None:
    """A history file's position, or None unless its epoch, batch and step
    are integers >= 0 and its batch is within an epoch of `steps` batches."""
    try:
        epoch, batch, step = (int_at_least(n, saved.get(n), 0) for n in ("epoch", "batch", "step"))
    except (TypeError, ValueError):
        return None
    return FitPosition(epoch, batch, step) if batch < steps else None


def _history_of(path: Path, digest: str, step: int) -> History | None:
    """The history file written with the checkpoint at `path`, or None (with
    a warning when there is one of another save)."""
    side = history_path_for(path)
    try:
        earlier = History.load(side)
        saved = earlier.position or {}
        sidecar_step = int(saved["step"])
    except FileNotFoundError:  # a checkpoint saved by a script: nothing more to restore
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _warn(f"--resume: ignoring {side} ({exc}); earlier epochs are not restored")
        return None
    # history files from before digests were kept match by step alone
    same = saved["checkpoint"] == digest if "checkpoint" in saved else sidecar_step == step
    if not same:
        _warn(
            f"--resume: ignoring {side}: it was written with another save of the checkpoint "
            f"(step {sidecar_step}, the checkpoint's {step}); earlier epochs are not restored"
        )
        return None
    return earlier


def _position_from_step(run: RunConfig, path: Path, ckpt: Checkpoint, steps: int) -> FitPosition:
    """The position a checkpoint's step gives, where each batch is a fixed
    number of steps of the strategy that saved it.

    Raises:
        CliError: the strategy's steps per batch vary (or do not divide it).
    """
    step = ckpt.step
    per_batch = saved_steps_per_batch(run, ckpt)
    if per_batch is None or step % per_batch:
        raise CliError(
            "--resume: the run that saved it did not take a fixed number of steps per "
            f"batch, so the checkpoint's step {step} does not say where in the data it stands; "
            f"resume with the history file written beside it ({history_path_for(path).name})"
        )
    batches = step // per_batch
    return FitPosition(batches // steps, batches % steps, step)


def check_something_left(run: RunConfig, start: FitPosition, trainer_step: int) -> None:
    """Refuse a resume with nothing left to train (no epoch, or no step
    under `--max-steps`, which counts the trainer's own steps)."""
    if start.epoch >= run.epochs:
        scheduled = run.lr_schedule != "constant" or run.warmup_epochs > 0
        schedule = " (the end of its --lr-schedule)" if scheduled else ""
        raise CliError(
            f"--resume: the checkpoint has finished {start.epoch} epoch(s){schedule}; "
            f"pass --epochs greater than {start.epoch} to train further"
            + ("" if not schedule else ", without a schedule or with a new one from the start")
        )
    if run.max_steps is not None and trainer_step >= run.max_steps:
        raise CliError(
            f"--resume: the checkpoint is at step {trainer_step}, at or past --max-steps "
            f"{run.max_steps}; pass a larger --max-steps to train further"
        )


def _warn(message: str) -> None:
    """One warning line on stderr (the run goes on)."""
    print(f"atomr: warning: {message}", file=sys.stderr)


def _check_model_kind(run: RunConfig, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint of the other `--model` (an Mlp's config has its
    `sizes`; a GPT's is a `Sequential` of layers)."""
    is_mlp = "sizes" in ckpt.model
    if is_mlp == (run.gpt is None):
        return
    saved, mine = ("mlp", "gpt") if is_mlp else ("gpt", "mlp")
    raise CliError(
        f"--resume: the checkpoint is of a --model {saved} model, not --model {mine}; "
        f"resume with --model {saved} and the options it was trained with"
    )


def _check_model_options(run: RunConfig, ckpt: Checkpoint, sizes: list[int]) -> None:
    """Refuse a checkpoint of another model, naming the options that rebuild it."""
    saved = ckpt.model.get("sizes")
    activation = ckpt.model.get("activation")
    if not isinstance(saved, list) or len(saved) < 2:
        return  # malformed config: the trainer's LoadCheckpoint reports it
    if saved == sizes and activation == run.activation:
        return
    if saved[0] != sizes[0] or saved[-1] != sizes[-1]:
        fix = "the same data set (--dataset, --features, --classes)"
    elif len(saved) == 2:
        fix = "the library: the command line always builds a hidden layer"
    else:
        fix = f"--hidden {','.join(map(str, saved[1:-1]))} --activation {activation}"
    shape = "-".join(map(str, saved))
    mine = "-".join(map(str, sizes))
    raise CliError(
        f"--resume: the checkpoint is of a {shape} {activation} model, not {mine} "
        f"{run.activation}; resume with {fix}"
    )


def _check_data_options(saved: Any, mine: dict[str, Any]) -> None:
    """Refuse to resume with other data options (`RunConfig.data_options`)
    than those in the checkpoint's history file: other data, or another
    order of it, would not continue the run at its batch.

    Raises:
        CliError: naming each option that differs (only `--dataset` when it
            does: the others follow from it) and its saved value.
    """
    if saved == mine:
        return
    differing = []
    if isinstance(saved, dict):
        keys = ["dataset"] if saved.get("dataset") != mine["dataset"] else list(mine)
        differing = [k for k in keys if k in saved and saved[k] != mine[k]]
    if not differing:
        raise CliError(
            f"--resume: the checkpoint was made with {bounded_repr(saved)}; "
            f"resume with the same data options (got {mine})"
        )
    made = " and ".join(f"{flag_of(k)} {_shown(saved[k])} (not {mine[k]})" for k in differing)
    fix = " ".join(f"{flag_of(k)} {_shown(saved[k])}" for k in differing)
    raise CliError(
        f"--resume: the checkpoint was made with {made}; resume with {fix} "
        "(the data and its order must be the checkpoint's)"
    )


def _trained_loss(earlier: History) -> Any:
    """The loss the checkpoint's run trained with, as its history file
    says: its position's (written with every save), else, in a file from
    before the position recorded it, the run's `--loss` among its options
    (`config`); None when it has neither (a library run's file)."""
    saved = earlier.position or {}
    return saved["loss"] if "loss" in saved else earlier.config.get("loss")


def _check_loss(saved: Any, mine: str) -> None:
    """Refuse to resume with another `--loss` than the one the checkpoint's
    run trained with (`_trained_loss`: a checkpoint does not keep its loss,
    and one file may be fine-tuned under another by a script, not by
    `--resume`). None (not recorded) checks nothing.

    Raises:
        CliError: naming the saved loss.
    """
    if saved is None or saved == mine:
        return
    raise CliError(
        f"--resume: the checkpoint was trained with --loss {_shown(saved)}, not {mine}; "
        f"resume with --loss {_shown(saved)} (the loss is part of the run it continues)"
    )


def _shown(value: Any) -> str:
    """An option's value read from a file, as a flag would take it (bounded)."""
    return (
        str(value)
        if isinstance(value, int | str) and len(str(value)) <= 80
        else bounded_repr(value)
    )


def _check_optimizer_options(run: RunConfig, ckpt: Checkpoint, updates: int) -> None:
    """Refuse to resume with other `--optimizer`, `--lr`, (SGD) `--momentum`
    or learning-rate schedule than the checkpoint's: loading a checkpoint
    restores its optimizer's hyper-parameters and schedule, so different
    values would be silently ignored."""
    saved = ckpt.optimizer.get("kind")
    if not isinstance(saved, dict):
        return  # malformed state: the trainer's LoadCheckpoint reports it
    mine = run.trainer_config(updates).optimizer
    schedule = None if mine.schedule is None else mine.schedule.to_config()
    flags = {
        "--optimizer": ("name", mine.name),
        "--lr": ("lr", mine.lr),
        "--lr-schedule, --warmup-epochs and --epochs": ("schedule", schedule),
    }
    if mine.name == "sgd":
        flags["--momentum"] = ("momentum", mine.momentum)
    for flag, (key, value) in flags.items():
        if saved.get(key) == value:
            continue
        if key == "schedule":
            raise CliError(
                f"--resume: the checkpoint's learning-rate schedule is "
                f"{_described(saved.get(key))[:300]}, this run's {_described(value)}; resume with "
                f"the same {flag} (a schedule's length comes from --epochs, so a run with "
                "one cannot be extended past its end)"
            )
        raise CliError(
            f"--resume: the checkpoint was trained with {flag} {_shown(saved.get(key))}, not "
            f"{value}; resume with {flag} {_shown(saved.get(key))} (a checkpoint keeps its "
            "optimizer's hyper-parameters)"
        )


def _described(schedule: Any) -> str:
    """A schedule's config in words: `cosine (eta_min=0.0, t_max=86)`, or "none"."""
    if schedule is None:
        return "none"
    if isinstance(schedule, list):
        return ", then ".join(_described(s) for s in schedule)
    if not isinstance(schedule, dict):
        return str(schedule)
    settings = ", ".join(
        f"{k}={_described(v) if isinstance(v, dict | list) else v}"
        for k, v in sorted(schedule.items())
        if k != "kind"
    )
    return f"{schedule.get('kind', 'schedule')} ({settings})"
