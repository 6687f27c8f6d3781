"""`atomr --version`, `atomr devices`, `atomr bench` and `atomr launch`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import atomr
from atomr.cli import main
from atomr.train.comm.mpi.launch import find_mpiexec

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests/cli/ is two levels down


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"atomr {atomr.__version__}"


def test_devices_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("atomr devices\n")
    assert re.search(r"^cpu:0 +host CPU", out, re.MULTILINE)
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"][-1]["device"] == "cpu:0"
    assert report["cuda_devices"] == sum(d["kind"] == "cuda" for d in report["devices"])


def _fake_benchmarks(folder: Path) -> None:
    folder.mkdir()
    (folder / "messaging.py").write_text(
        "import json, sys\n"
        "print(json.dumps({'benchmark': 'messaging', 'args': sys.argv[1:],"
        " 'tell_ratio': 0.9, 'check': {'ok': True}}))\n"
    )
    (folder / "train_step.py").write_text("import sys\nsys.exit('boom: no BLAS')\n")


def test_bench_prints_tables_and_passes_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_benchmarks(tmp_path / "benchmarks")
    code = main(
        [
            "bench",
            "messaging",
            "--benchmarks-dir",
            str(tmp_path / "benchmarks"),
            "--",
            "--tells",
            "10",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "benchmark: messaging" in out
    assert re.search(r"^tell_ratio +0\.9$", out, re.MULTILINE)
    assert re.search(r"^check\.ok +true$", out, re.MULTILINE)
    assert re.search(r'^args +\["--tells", "10"\]$', out, re.MULTILINE)


def test_bench_reports_a_failing_script_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_benchmarks(tmp_path / "benchmarks")
    code = main(["bench", "train", "--benchmarks-dir", str(tmp_path / "benchmarks")])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "atomr: error: train_step.py failed (exit 1): boom: no BLAS"


def test_bench_without_a_checkout_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    import atomr.cli.bench as bench

    monkeypatch.setattr(bench, "__file__", str(tmp_path / "site" / "atomr" / "cli" / "bench.py"))
    assert main(["bench", "all"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("atomr: error: no benchmarks/ folder found")


def test_bench_runs_the_real_messaging_script(capsys: pytest.CaptureFixture[str]) -> None:
    if not (ROOT / "benchmarks" / "messaging.py").is_file():
        pytest.skip("benchmarks/messaging.py is not in this checkout")
    code = main(
        [
            "bench",
            "messaging",
            "--benchmarks-dir",
            str(ROOT / "benchmarks"),
            "--json",
            "--",
            "--tells",
            "2000",
            "--asks",
            "200",
            "--repeat",
            "1",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["messaging"]["tells"] == 2000
    assert report["messaging"]["tell_ratio"] > 0


@pytest.mark.mpi
def test_launch_runs_distributed_training(tmp_path: Path) -> None:
    try:
        find_mpiexec()
    except FileNotFoundError:
        pytest.skip("no mpiexec")
    code = main(
        [
            "launch",
            "-n",
            "2",
            "--timeout",
            "240",
            "--",
            "--epochs",
            "3",
            "--run-dir",
            str(tmp_path / "run"),
            "--checkpoint",
            str(tmp_path / "c.ckpt"),
        ]
    )
    assert code == 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["config"]["dist"] == {"world_size": 2, "rank": 0}
    assert [r["epoch"] for r in history["epochs"]] == [1, 2, 3]
    assert history["epochs"][-1]["test_accuracy"] > 0.85
    assert (tmp_path / "c.ckpt").is_file()


def test_python_dash_m_atomr_is_the_atomr_command(tmp_path: Path) -> None:
    """`python -m atomr` (a scripts folder not on the PATH) was "No module
    named atomr.__main__"; it runs `main`, exit status and all."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    version = subprocess.run(
        [sys.executable, "-m", "atomr", "--version"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert (version.returncode, version.stdout) == (0, f"atomr {atomr.__version__}\n")
    bad = subprocess.run(
        [sys.executable, "-m", "atomr", "train", "--epochs", "0"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith("atomr: error: --epochs"), bad.stderr
    assert list(tmp_path.iterdir()) == []
