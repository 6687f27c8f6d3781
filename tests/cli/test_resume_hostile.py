"""`atomr train --resume` of a damaged or hostile checkpoint or history
file, fuzzed (the files' mutations: `tests/reliability/checkpoint_mutations.py`).

The command must resume (the file still says something valid) or refuse
with one error line and exit status 2 (1 for a file it cannot read): never
a traceback, whatever the file holds."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import atomr
import atomr.cli
import atomr.cli.resume
from atomr.cli.dataset import load_dataset
from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.cli.training_run import plan_start, train_epochs
from atomr.train import load_checkpoint
from atomr.train.core import save_checkpoint
from atomr.train.fit import StopFlag
from tests.cli.test_distributed_agreement import TINY
from tests.cli.test_distributed_failures import _save_in_shards
from tests.reliability.checkpoint_mutations import (
    HOSTILE,
    SPECIAL,
    Saved,
    _fuzz,
    _paths,
    _write,
    damaged_save,
)

_AT = TINY.index("--epochs")
TWO_EPOCHS = [*TINY[:_AT], "--epochs", "2", *TINY[_AT + 2 :]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """A checkpoint of one epoch of `TINY` and its history file."""
    folder = tmp_path_factory.mktemp("run")
    path = folder / "one.ckpt"
    argv = ["train", *TINY, "--checkpoint", str(path), "--run-dir", str(folder / "run")]
    assert atomr.cli.main(argv) == 0
    names = ["one.ckpt", "one.ckpt.history.json"]
    return Saved({name: (folder / name).read_bytes() for name in names}, None)  # type: ignore[arg-type]


@st.composite
def hostile_history(draw: st.DrawFn, raw: bytes) -> bytes:
    """A history file with one field set to a hostile value, deleted, or
    nested too deep; or cut short."""
    data = json.loads(raw)
    kind = draw(st.sampled_from(["set", "delete", "deep", "truncate"]))
    if kind == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if kind == "deep":
        return b'{"format": ' + b"[" * 100_000
    *outer, key = draw(st.sampled_from(list(_paths(data))))
    holder: Any = data
    for step in outer:
        holder = holder[step]
    if kind == "delete":
        del holder[key]
    else:
        holder[key] = draw(HOSTILE)
    return json.dumps(data).encode()


@pytest.fixture(scope="module")
def sharded(saved: Saved, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """The same checkpoint saved one file per replica of two: its index,
    shard files and (of the full save: ignored, with a warning) history file."""
    folder = tmp_path_factory.mktemp("sharded")
    _write(folder, saved, "", b"")
    (folder / "full.ckpt").write_bytes(saved.files["one.ckpt"])
    (folder / "one.ckpt").unlink()
    _save_in_shards(folder / "full.ckpt", folder / "one.ckpt", 0.0)
    (folder / "full.ckpt").unlink()
    names = ["one.ckpt", *sorted(p.name for p in folder.iterdir() if p.name != "one.ckpt")]
    return Saved({name: (folder / name).read_bytes() for name in names}, saved.ckpt)


@pytest.mark.parametrize("layout", ["full", "sharded"])
def test_the_files_untouched_resume(
    layout: str, saved: Saved, sharded: Saved, tmp_path: Path
) -> None:
    _write(tmp_path, saved if layout == "full" else sharded, "", b"")
    strategy = ["--strategy", "single" if layout == "full" else "zero"]
    argv = ["train", *TWO_EPOCHS, *strategy, "--resume", str(tmp_path / "one.ckpt")]
    assert atomr.cli.main([*argv, "--run-dir", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize("layout", ["full", "sharded"])
def test_a_resume_of_a_hostile_file_resumes_or_is_refused_in_one_line(
    layout: str,
    saved: Saved,
    sharded: Saved,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    save = saved if layout == "full" else sharded
    strategy = ["--strategy", "single" if layout == "full" else "zero"]
    files = tmp_path / "files"
    files.mkdir()

    @_fuzz(6)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        if data.draw(st.booleans()):
            checkpoints = {n: v for n, v in save.files.items() if not n.endswith(".json")}
            only = Saved(checkpoints, save.ckpt)
            name, how, damaged = data.draw(damaged_save(only, [save.files["one.ckpt"]]))
        else:
            name, how = "one.ckpt.history.json", "history"
            damaged = data.draw(hostile_history(save.files[name]))
        _write(files, save, name, damaged, how)
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        capsys.readouterr()
        argv = ["train", *TWO_EPOCHS, *strategy, "--resume", str(files / "one.ckpt")]
        code = atomr.cli.main([*argv, "--run-dir", str(tmp_path / "run")])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("atomr: error")]
        if code == 0:
            assert not errors and how != "raw" and (how not in SPECIAL or how == "good link")
        else:
            assert code in (1, 2) and len(errors) == 1, err

    check()


def _save_over(path: Path) -> None:
    """Another run's save at `path`: other weights, a later step."""
    first = load_checkpoint(path)
    save_checkpoint(
        path, dataclasses.replace(first, weights=first.weights + 1, step=first.step + 3)
    )


def test_a_checkpoint_saved_over_once_the_resume_is_planned_is_refused(
    saved: Saved, tmp_path: Path
) -> None:
    """The trainer would load the other save at the first one's position
    (and the ranks of a --distributed run, which agreed on the first, could
    each load another): it trained on before."""
    _write(tmp_path, saved, "", b"")
    path = tmp_path / "one.ckpt"
    argv = ["train", *TWO_EPOCHS, "--resume", str(path), "--run-dir", str(tmp_path / "run")]
    run = RunConfig.from_args(build_parser("test").parse_args(argv))
    data, history = load_dataset(run), History(config={})
    planned = plan_start(run, data, history)
    _save_over(path)
    with pytest.raises(CliError, match="changed while this run read it"):
        atomr.run(train_epochs(run, data, history, StopFlag(), start=planned))


def test_a_checkpoint_saved_over_while_the_resume_is_planned_is_refused(
    saved: Saved,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Saved over between the read of its digest (which picks its history
    file) and of its content: it resumed before, at one save's position with
    another's step."""
    _write(tmp_path, saved, "", b"")
    path = tmp_path / "one.ckpt"
    merge = atomr.cli.resume.merge_shards

    def merge_then_save_over(*args: Any) -> Any:
        merged = merge(*args)
        _save_over(path)
        return merged

    monkeypatch.setattr(atomr.cli.resume, "merge_shards", merge_then_save_over)
    argv = ["train", *TWO_EPOCHS, "--resume", str(path), "--run-dir", str(tmp_path / "run")]
    assert atomr.cli.main(argv) == 2
    assert "changed while this run read it" in capsys.readouterr().err


def _with_optimizer_kind(path: Path, **changes: Any) -> Path:
    """A copy of the checkpoint at `path` whose optimizer settings have `changes`."""
    ckpt = load_checkpoint(path)
    kind = {**ckpt.optimizer["kind"], **changes}
    copy = path.with_name("changed.ckpt")
    save_checkpoint(copy, dataclasses.replace(ckpt, optimizer={**ckpt.optimizer, "kind": kind}))
    return copy


def test_a_checkpoint_whose_settings_nest_deep_is_refused_in_one_line(
    saved: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A RecursionError traceback before (comparing it with the run's schedule)."""
    _write(tmp_path, saved, "", b"")
    deep: dict[str, Any] = {"kind": "cosine"}
    for _ in range(400):
        deep = {"kind": "sequential", "schedules": [deep]}
    path = _with_optimizer_kind(tmp_path / "one.ckpt", schedule=deep)
    argv = ["train", *TWO_EPOCHS, "--resume", str(path), "--run-dir", str(tmp_path / "run")]
    assert atomr.cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("atomr: error: --resume: ") and err.count("\n") == 1, err[:500]
    assert "header.optimizer.kind.schedule.schedules[0]" in err
    assert "nests deeper than 32 levels" in err


def test_a_long_setting_is_shown_bounded(
    saved: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An lr of a million characters was printed whole."""
    _write(tmp_path, saved, "", b"")
    path = _with_optimizer_kind(tmp_path / "one.ckpt", lr="x" * 10**6)
    argv = ["train", *TWO_EPOCHS, "--resume", str(path), "--run-dir", str(tmp_path / "run")]
    assert atomr.cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "was trained with --lr 'xxx" in err and len(err) < 1000


def _resume_ignoring_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`--resume` of `one.ckpt` in `tmp_path`, which must succeed; the warning it printed."""
    argv = ["train", *TWO_EPOCHS, "--resume", str(tmp_path / "one.ckpt")]
    assert atomr.cli.main([*argv, "--run-dir", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "earlier epochs are not restored" in err
    return err


def test_a_history_file_swapped_for_a_fifo_is_ignored_without_blocking(
    saved: Saved,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Swapped in once the history file was seen to be a regular file: the
    read blocked, waiting for a writer."""
    _write(tmp_path, saved, "one.ckpt.history.json", b"", "fifo")
    side, is_file = history_path_for(tmp_path / "one.ckpt"), Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda self: self == side or is_file(self))
    assert "not a regular file" in _resume_ignoring_history(tmp_path, capsys)


def test_a_history_file_linked_to_a_huge_file_is_ignored_unread(
    saved: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was read whole: a MemoryError traceback, or memory exhausted."""
    _write(tmp_path, saved, "one.ckpt.history.json", b"", "missing")
    with open(tmp_path / "huge", "wb") as file:
        file.truncate(10**12)  # sparse: no disk used
    side = history_path_for(tmp_path / "one.ckpt")
    side.symlink_to(tmp_path / "huge")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="more than a history file's"):
            History.load(side)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert "more than a history file's" in _resume_ignoring_history(tmp_path, capsys)
