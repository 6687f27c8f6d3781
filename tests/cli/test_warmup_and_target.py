"""`atomr warmup` and the CUDA target `atomr devices` reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atomr.accel import cuda_target as target_module
from atomr.cli import main
from atomr.train.core import warmup as warmup_module


def test_warmup_reports_each_part_and_compiles_nothing_twice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["warmup"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("atomr warmup: compiling")
    assert any("cpu:0 float32 training steps" in line for line in out)
    assert any("cpu:0 float32 sequence layers" in line for line in out)  # a GPT's kernels
    assert out[-1].startswith("atomr warmup: done")
    parts = warmup_module.warm_up()  # everything is in numba's cache now
    assert [p.name for p in parts][:2] == ["cpu:0 float32 training steps",
                                           "cpu:0 float32 host reductions"]  # fmt: skip
    assert parts[0].compiled == 0


@pytest.mark.parametrize(
    "installed, available, driver, expected",
    [
        ("0.30.4", True, "12.4", ("numba-cuda 0.30.4", True, "12.4", "ready")),
        (None, True, "12.2", ("numba's built-in target (deprecated)", False, "12.2", "ready;")),
        ("0.30.4", False, None, ("numba-cuda 0.30.4", True, None, "no CUDA driver")),
    ],
)
def test_the_cuda_target_and_driver_are_reported(
    monkeypatch: pytest.MonkeyPatch,
    installed: str | None,
    available: bool,
    driver: str | None,
    expected: tuple[str, bool, str | None, str],
) -> None:
    monkeypatch.setattr(target_module, "_numba_cuda_version", lambda: installed)
    monkeypatch.setattr(target_module, "cuda_is_simulated", lambda: False)
    monkeypatch.setattr(target_module, "cuda_available", lambda: available)
    monkeypatch.setattr(target_module, "_driver_version", lambda: driver)
    found = target_module.cuda_target()
    assert (found.target, found.maintained, found.driver) == expected[:3]
    assert found.note.startswith(expected[3])
    assert ("pip install -e '.[cuda]'" in found.note) == (installed is None)


def test_devices_prints_the_cuda_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    assert "CUDA: " in capsys.readouterr().out.splitlines()[-1]
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["cuda"]) == {"target", "driver", "note"}


def _warmup(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`atomr warmup` in a fresh process whose NUMBA_CACHE_DIR cannot be
    written (a folder under a regular file: not even root can create it)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(blocker / "numba-cache"), **env}
    return subprocess.run(
        [sys.executable, "-m", "atomr.cli", "warmup"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )


def test_warmup_says_where_numba_cached_when_the_cache_dir_cannot_be_written(
    tmp_path: Path,
) -> None:
    """numba then caches beside the kernels (`__pycache__`): warmup says so."""
    done = _warmup(tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"NUMBA_CACHE_DIR={tmp_path / 'a-file' / 'numba-cache'} cannot be written" in (
        done.stderr
    )
    assert "__pycache__" in done.stderr


def test_warmup_warns_when_nothing_can_be_cached(tmp_path: Path) -> None:
    """With no folder numba may write its cache to, atomr still imports and
    warms up (exit 0: `atomr warmup && atomr train` goes on), and says that
    the next run compiles again."""
    done = _warmup(
        tmp_path, NUMBA_CACHE_LOCATOR_CLASSES="numba.core.caching.UserProvidedCacheLocator"
    )
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1, done.stderr
    assert str(tmp_path / "a-file" / "numba-cache") in warning[0]
    assert "the next run will compile them again" in warning[0]
