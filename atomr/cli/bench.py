"""`run_bench`: `atomr bench` runs the checkout's benchmark scripts and
prints their JSON reports as tables.

The scripts live in the repository's `benchmarks/` folder (not in the
installed package); each prints one JSON object. They run as subprocesses
with this interpreter, one after the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from atomr.cli.errors import CliError, check_seconds
from atomr.cli.summary import format_table

__all__ = ["SUITES", "find_benchmarks_dir", "flatten", "run_bench"]

SUITES: dict[str, tuple[str, ...]] = {
    "messaging": ("messaging.py",),
    "kernels": ("kernels.py",),
    "train": (
        "train_step.py",
        "data_parallel.py",
        "tensor_parallel.py",
        "pipeline.py",
        "parameter_server.py",
        "mpi_allreduce.py",
    ),
}
SUITES["all"] = SUITES["messaging"] + SUITES["kernels"] + SUITES["train"]


def find_benchmarks_dir(explicit: str | None) -> Path:
    """The benchmarks folder: `explicit`, else ./benchmarks, else the one
    next to the package of a source checkout.

    Raises:
        CliError: no such folder (atomr installed without its checkout).
    """
    if explicit is not None:
        path = Path(explicit)
        if not path.is_dir():
            raise CliError(f"--benchmarks-dir: no such folder {explicit!r}")
        return path
    candidates = [Path.cwd() / "benchmarks", Path(__file__).resolve().parents[2] / "benchmarks"]
    for path in candidates:
        if path.is_dir():
            return path
    raise CliError(
        "no benchmarks/ folder found: the benchmark scripts live in the atomr source "
        "checkout; run 'atomr bench' from it or pass --benchmarks-dir",
        1,
    )


def flatten(report: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A JSON report as (dotted key, value) rows, nested objects flattened."""
    if isinstance(report, dict):
        rows: list[tuple[str, str]] = []
        for key, value in report.items():
            rows += flatten(value, f"{prefix}{key}.")
        return rows
    return [(prefix.rstrip("."), json.dumps(report) if not isinstance(report, str) else report)]


def _run_script(path: Path, args: list[str], timeout: float) -> Any:
    env = dict(os.environ)
    root = str(path.parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        done = subprocess.run(
            [sys.executable, str(path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=root,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise CliError(f"{path.name} did not finish within {timeout:g} s", 1) from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CliError(f"{path.name} failed (exit {done.returncode}): {tail}", 1)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise CliError(f"{path.name} did not print a JSON report", 1) from None


def run_bench(
    suite: str,
    benchmarks_dir: str | None = None,
    script_args: list[str] | None = None,
    as_json: bool = False,
    timeout: float = 600.0,
) -> int:
    """Run the scripts of `suite` and print their reports.

    Scripts of the suite that the folder does not (yet) hold are listed as
    missing; the command fails only when none of them exists or one fails.

    Args:
        suite: "messaging", "kernels", "train" or "all".
        benchmarks_dir: the folder of the scripts (see `find_benchmarks_dir`).
        script_args: extra arguments passed to every script.
        as_json: print the raw JSON reports instead of tables.
        timeout: seconds per script.

    Returns:
        0 when every present script succeeded.

    Raises:
        CliError: a `timeout` that is not positive and finite, no folder, no
            script of the suite, a script failing or printing something that
            is not JSON.
    """
    check_seconds("--timeout", timeout)
    folder = find_benchmarks_dir(benchmarks_dir)
    args = list(script_args or [])
    present = [folder / name for name in SUITES[suite] if (folder / name).is_file()]
    missing = [name for name in SUITES[suite] if not (folder / name).is_file()]
    if not present:
        raise CliError(f"{folder} holds none of the {suite} benchmarks ({', '.join(missing)})", 1)
    reports = {}
    for path in present:
        print(f"running {path.name} ...", file=sys.stderr, flush=True)
        reports[path.stem] = _run_script(path, args, timeout)
    if as_json:
        print(json.dumps(reports, indent=2))
    else:
        for name, report in reports.items():
            print(format_table(flatten(report), title=f"benchmark: {name}"))
            print()
    if missing:
        print(f"not present in {folder}: {', '.join(missing)}", file=sys.stderr)
    return 0
