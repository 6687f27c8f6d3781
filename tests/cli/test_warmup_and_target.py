"""`atomr warmup` and the CUDA target `atomr devices` reports."""

from __future__ import annotations

import json

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
    assert ("atomr[cuda]" in found.note) == (installed is None)


def test_devices_prints_the_cuda_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    assert "CUDA: " in capsys.readouterr().out.splitlines()[-1]
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["cuda"]) == {"target", "driver", "note"}
