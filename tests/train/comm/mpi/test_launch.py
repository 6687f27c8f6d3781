"""`DistributedTrainConfig`, `shard_for_rank` and the `mpiexec` launcher
helpers (`atomr launch`, `atomr train --distributed`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atomr.testkit import wait_until
from atomr.train.comm.mpi import job as distributed
from atomr.train.comm.mpi import launch
from atomr.train.comm.mpi.job import DistributedTrainConfig, NotLaunchedError, shard_for_rank
from atomr.train.comm.mpi.startup import STARTUP_TIMEOUT_EXIT_CODE
from tests.train.mpi_scripts.harness import HERE, require_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 24, 25, 101])
def test_shards_tile_the_batch_evenly(n: int, world: int) -> None:
    shards = [shard_for_rank(n, r, world) for r in range(world)]
    covered = [i for s in shards for i in range(n)[s]]
    assert covered == list(range(n))
    sizes = [s.stop - s.start for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    ("args", "match"), [((5, 2, 2), "rank"), ((5, 0, 0), "world_size"), ((-1, 0, 1), "n_samples")]
)
def test_shard_rejects_bad_arguments(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        shard_for_rank(*args)


def test_config_from_mpich_and_openmpi_environments() -> None:
    mpich = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    cfg = DistributedTrainConfig.from_environment(mpich, collective_timeout=5.0)
    assert (cfg.world_size, cfg.rank, cfg.local_rank, cfg.local_world_size) == (4, 2, 0, 2)
    assert cfg.backend == "mpi" and cfg.collective_timeout == 5.0
    assert cfg.is_distributed and not cfg.is_root
    assert cfg.shard(10) == shard_for_rank(10, 2, 4)
    ompi = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
    }
    cfg = DistributedTrainConfig.from_environment(ompi)
    assert (cfg.world_size, cfg.rank, cfg.local_world_size, cfg.is_root) == (3, 0, 3, True)


def test_config_takes_the_local_rank_from_slurm_under_srun_pmi2() -> None:
    """`srun --mpi=pmi2` sets PMI_RANK / PMI_SIZE but not hydra's
    MPI_LOCALRANKID: the node-local rank must come from SLURM_LOCALID
    (it used to be 0 on every rank, so every rank of a node took cuda:0)."""
    srun = {
        "PMI_RANK": "5",
        "PMI_SIZE": "8",
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "4",
    }
    cfg = DistributedTrainConfig.from_environment(srun)
    assert (cfg.world_size, cfg.rank, cfg.local_rank, cfg.local_world_size) == (8, 5, 1, 4)
    # another launcher's variables for another job (rank/size disagree) are ignored
    stale = {
        "PMI_RANK": "1",
        "PMI_SIZE": "2",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "3",
    }
    cfg = DistributedTrainConfig.from_environment(stale)
    assert (cfg.world_size, cfg.rank, cfg.local_rank, cfg.local_world_size) == (2, 1, 0, 1)


def test_config_outside_a_launcher() -> None:
    cfg = DistributedTrainConfig.from_environment({})
    assert cfg == DistributedTrainConfig()
    assert cfg.backend == "none" and not cfg.is_distributed
    with pytest.raises(NotLaunchedError, match="atomr launch"):
        DistributedTrainConfig.from_environment({}, require=True)
    with pytest.raises(ValueError, match="malformed"):
        DistributedTrainConfig.from_environment({"PMI_RANK": "x", "PMI_SIZE": "2"})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"world_size": 2, "rank": 2},
        {"world_size": 0},
        {"local_rank": 1},
        {"world_size": 2, "local_world_size": 3},
        {"backend": "nccl"},
        {"collective_timeout": 0.0},
    ],
)
def test_config_validates(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        DistributedTrainConfig(**kwargs)  # type: ignore[arg-type]


def test_importing_atomr_train_does_not_import_mpi4py() -> None:
    code = "import sys, atomr.train, atomr.train.comm.mpi.collective, atomr.train.data_parallel.options; print('mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_missing_mpi4py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from atomr.train.comm.mpi import collective as mpi_collective

    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[mpi\]'"):
        mpi_collective.MpiCollective()


def test_launch_runs_atomr_train_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, list[str], float | None]] = []

    def fake(
        n: int, program: list[str], timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        seen.append((n, list(program), timeout))
        return subprocess.CompletedProcess(program, 7)

    monkeypatch.setattr(launch, "run_mpiexec", fake)
    assert launch.launch(3, ["--", "--epochs", "2"], timeout=9.0) == 7
    assert launch.launch(2, ["--distributed", "--epochs", "1"]) == 7
    assert seen[0] == (
        3,
        [sys.executable, "-m", "atomr.cli", "train", "--distributed", "--epochs", "2"],
        9.0,
    )
    assert seen[1][1][-3:] == ["--distributed", "--epochs", "1"]
    assert seen[1][1].count("--distributed") == 1


def test_mpiexec_command_and_exit_codes(tmp_path) -> None:
    require_mpi()
    exe = launch.find_mpiexec()
    cmd = launch.mpiexec_command(2, ["prog", "arg"])
    assert cmd[0] == exe and cmd[-4:] == ["-n", "2", "prog", "arg"]
    with pytest.raises(ValueError):
        launch.mpiexec_command(0, ["prog"])
    script = tmp_path / "rank_exit.py"
    # rank 1 fails only after rank 0 has printed (a marker file says so):
    # mpiexec ends the whole job once a rank exits non-zero.
    marker = tmp_path / "rank0_printed"
    script.write_text(
        "import os, sys, time\n"
        "rank = int(os.environ['PMI_RANK'])\n"
        # one write per line: mpiexec forwards each rank's pipe as it comes
        "sys.stdout.write(f'rank {rank} of {os.environ[\"PMI_SIZE\"]}\\n')\n"
        "sys.stdout.flush()\n"
        f"marker = {str(marker)!r}\n"
        "if rank == 0:\n"
        "    open(marker, 'w').close()\n"
        "deadline = time.monotonic() + 30\n"
        "while rank == 1 and not os.path.exists(marker) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "sys.exit(5 if rank == 1 else 0)\n"
    )
    done = launch.run_mpiexec(2, [sys.executable, str(script)], timeout=60, capture=True)
    assert done.returncode == 5
    assert "rank 0 of 2" in done.stdout and "rank 1 of 2" in done.stdout
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    done = launch.run_mpiexec(2, [sys.executable, str(hang)], timeout=3, capture=True)
    assert done.returncode == launch.TIMEOUT_EXIT_CODE
    assert "timeout" in done.stderr


def _launcher_interrupted(
    out: Path, mode: str, interrupts: int, signum: int = signal.SIGINT
) -> int:
    """Run `interrupted.py` on 2 ranks through `run_mpiexec` in a child
    process, send `signum` (Ctrl-C by default) to that launcher `interrupts`
    times once both ranks are up; returns the launcher's exit code."""
    code = (
        "import sys\n"
        "from atomr.train.comm.mpi.launch import run_mpiexec\n"
        f"done = run_mpiexec(2, [sys.executable, {str(HERE / 'interrupted.py')!r}, "
        f"{str(out)!r}, {mode!r}], timeout=90)\n"
        "sys.exit(done.returncode)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code])
    try:
        _wait_for(out, "up", "1", launcher, "the ranks never started")
        for k in range(1, interrupts + 1):
            launcher.send_signal(signum)  # SIGINT: what the terminal does on Ctrl-C
            if k < interrupts:  # passed on before the next press: every rank saw it
                _wait_for(out, "got", str(k), launcher, f"Ctrl-C {k} never reached the ranks")
        return launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _wait_for(
    out: Path, name: str, text: str, launcher: subprocess.Popen[bytes], what: str
) -> None:
    """Poll (under a 60 s deadline) until both ranks wrote `{name}{rank}`
    (for "got": holding `text`, the number of Ctrl-C seen)."""
    files = [out / f"{name}{r}" for r in (0, 1)]

    def written(f: Path) -> bool:
        return f.exists() and (name == "up" or f.read_text() == text)

    def both_written() -> bool:
        if all(written(f) for f in files):
            return True
        assert name != "up" or launcher.poll() is None, "the launcher ended early"
        return False

    wait_until(both_written, timeout=60, interval=0.05, message=what)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _survivors(pids: list[int], timeout: float) -> list[int]:
    """The processes of `pids` still alive after waiting up to `timeout` s
    for all of them to end."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(_alive(p) for p in pids), timeout=timeout, interval=0.05)
    return [p for p in pids if _alive(p)]


def test_ctrl_c_on_the_launcher_reaches_every_rank(tmp_path: Path) -> None:
    """The job runs in its own session, so the terminal's Ctrl-C reaches the
    launcher only: it must pass it on (not leave the ranks running) and
    return the job's exit code; a second Ctrl-C ends the job at once."""
    require_mpi()
    stop = tmp_path / "stop"
    stop.mkdir()
    assert _launcher_interrupted(stop, "stop", 1) == 130
    assert (stop / "got0").exists() and (stop / "got1").exists()

    stuck = tmp_path / "stuck"
    stuck.mkdir()
    assert _launcher_interrupted(stuck, "ignore", 2) == 130
    pids = [int((stuck / f"up{r}").read_text()) for r in (0, 1)]
    assert not _survivors(pids, 10), "a rank outlived the job"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_on_the_launcher_ends_every_rank(tmp_path: Path, signum: int) -> None:
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP) reaches only the
    launcher (the job has its own session): it must end the whole job, not
    leave the ranks running, and exit 128 + signum."""
    require_mpi()
    assert _launcher_interrupted(tmp_path, "ignore", 1, signum) == 128 + signum
    pids = [int((tmp_path / f"up{r}").read_text()) for r in (0, 1)]
    assert not _survivors(pids, 30), "a rank outlived the job"


def test_ranks_exit_when_the_launcher_is_sigkilled(tmp_path: Path) -> None:
    """SIGKILL cannot be caught, so the launcher cannot end the job: each
    rank's watchdog must notice its launcher is gone and exit."""
    require_mpi()
    code = (
        "import sys\n"
        "from atomr.train.comm.mpi.launch import run_mpiexec\n"
        f"run_mpiexec(2, [sys.executable, {str(HERE / 'orphaned.py')!r}, {str(tmp_path)!r}], "
        "timeout=150)\n"
    )
    # the killed launcher cannot remove its start-up directory: keep it in tmp_path
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    launcher = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        _wait_for(tmp_path, "up", "1", launcher, "the ranks never started")
    finally:
        launcher.kill()
        launcher.wait(timeout=60)
    pids = [int((tmp_path / f"up{r}").read_text()) for r in (0, 1)]
    leaked = _survivors(pids, 60)
    for p in leaked:  # do not leave them to the next test
        os.kill(p, signal.SIGKILL)
    assert not leaked, "a rank outlived its SIGKILLed launcher"


def test_module_exports() -> None:
    assert {"DistributedTrainConfig", "shard_for_rank", "NotLaunchedError"} <= set(
        distributed.__all__
    )
    assert "launch" in launch.__all__


@pytest.mark.mpi
def test_a_rank_frozen_before_mpi_start_up_is_named_and_the_job_ends(tmp_path: Path) -> None:
    # Rank 1 freezes before MPI's init; rank 0 would wait inside MPI_Init for
    # ever. Its start-up deadline (the collective's timeout) must end the job
    # and name rank 1, long before the launcher's own timeout.
    require_mpi()
    script = tmp_path / "frozen.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['PMI_RANK'] == '1':\n"
        "    time.sleep(600)\n"
        "from atomr.train.comm.mpi.collective import MpiCollective\n"
        "MpiCollective(timeout=3)\n"
        "print('started', flush=True)\n"
    )
    started = time.monotonic()
    done = launch.run_mpiexec(2, [sys.executable, str(script)], timeout=120, capture=True)
    assert done.returncode == STARTUP_TIMEOUT_EXIT_CODE
    assert time.monotonic() - started < 60
    assert "rank 0: MPI start-up did not finish within 3 s" in done.stderr
    assert "rank 1 never reached it" in done.stderr
    assert "started" not in done.stdout


@pytest.mark.mpi
def test_start_up_within_the_deadline_leaves_the_job_alone(tmp_path: Path) -> None:
    require_mpi()
    script = tmp_path / "fine.py"
    script.write_text(
        "import asyncio, sys, numpy as np\n"
        "from atomr.train.comm.mpi.collective import MpiCollective\n"
        "coll = MpiCollective(timeout=30)\n"
        "out = asyncio.run(coll.all_reduce(np.ones(4, dtype=np.float32)))\n"
        "sys.stdout.write(f'sum {out[0]}\\n')  # one write: ranks' lines interleave\n"
    )
    done = launch.run_mpiexec(2, [sys.executable, str(script)], timeout=120, capture=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("sum 2.0") == 2
