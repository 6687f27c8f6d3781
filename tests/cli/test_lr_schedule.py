"""`--lr-schedule` and `--warmup-epochs`: the schedule reaches the trainer
(and its checkpoint), bad values are one line, and a resume with another
schedule is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomr.cli import main
from atomr.cli.dataset import load_dataset
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.cli.training_run import _steps_per_epoch, _updates_per_epoch
from atomr.train import load_checkpoint
from atomr.train.core.schedule import CosineAnnealingLR, LinearLR, SequentialLR, StepLR


def _run(*argv: str) -> RunConfig:
    return RunConfig.from_args(build_parser("test").parse_args(["train", "--quiet", *argv]))


def test_the_flags_build_torch_like_schedules_over_the_whole_run() -> None:
    assert _run("--epochs", "4").trainer_config(10).optimizer.schedule is None
    cosine = _run("--epochs", "4", "--lr-schedule", "cosine").trainer_config(10)
    assert cosine.optimizer.schedule == CosineAnnealingLR(40)
    warm = _run("--epochs", "4", "--lr-schedule", "step", "--warmup-epochs", "1")
    assert warm.trainer_config(10).optimizer.schedule == SequentialLR(
        (LinearLR(0.1, 1.0, 10), StepLR(10, 0.1)), (10,)
    )
    only_warm = _run("--epochs", "4", "--warmup-epochs", "2").trainer_config(5)
    assert only_warm.optimizer.schedule == LinearLR(0.1, 1.0, 10)


@pytest.mark.parametrize("warmup", ["-1", "4"])
def test_bad_warmup_is_one_line(warmup: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--epochs", "4", "--warmup-epochs", warmup]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--warmup-epochs" in err


def test_the_checkpoint_carries_the_schedule_and_a_resume_must_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "run.ckpt"
    common = ["train", "--quiet", "--strategy", "single", "--run-dir", str(tmp_path / "r")]
    argv = [*common, "--epochs", "2", "--lr-schedule", "cosine", "--checkpoint", str(ckpt)]
    assert main(argv) == 0
    schedule = load_checkpoint(ckpt).optimizer["kind"]["schedule"]
    assert schedule["kind"] == "cosine" and schedule["t_max"] > 0
    code = main([*common, "--epochs", "3", "--lr-schedule", "cosine", "--resume", str(ckpt)])
    assert code != 0  # --epochs changes the cosine's length
    err = capsys.readouterr().err
    assert "--lr-schedule" in err and "schedule" in err
    assert "cannot be extended past its end" in err and "{'" not in err
    code = main([*common, "--epochs", "2", "--lr-schedule", "cosine", "--resume", str(ckpt)])
    assert code == 2
    assert "(the end of its --lr-schedule)" in capsys.readouterr().err


def test_policy_flags_reach_the_data_parallel_options() -> None:
    from atomr.cli.strategies import STRATEGIES
    from atomr.train.data_parallel import ApplyPolicy

    run = _run("--strategy", "data", "--policy", "async", "--average-every", "3")
    options = STRATEGIES["data"].options(run)
    assert (options.policy, options.average_every) == (ApplyPolicy.ASYNC, 3)
    assert STRATEGIES["data"].options(_run("--strategy", "data")).policy is ApplyPolicy.SYNC


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--strategy", "tensor", "--policy", "async"], "--policy only applies to --strategy data"),
        (["--policy", "async", "--average-every", "0"], "--average-every must be >= 1"),
    ],
)
def test_bad_policy_flags_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--epochs", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_a_parameter_server_schedule_counts_every_workers_update() -> None:
    """The server steps the schedule once per worker's push: a cosine sized in
    batches reached 0 halfway through and climbed back to the full rate."""
    run = _run("--strategy", "ps", "--workers", "2", "--epochs", "2", "--lr-schedule", "cosine")
    data = load_dataset(run)
    batches = _steps_per_epoch(run, data)
    assert _updates_per_epoch(run, _steps_per_epoch(run, data)) == 2 * batches
    kind = run.trainer_config(_updates_per_epoch(run, _steps_per_epoch(run, data))).optimizer
    rates = [kind.lr_at(update) for update in range(2 * 2 * batches)]
    assert rates == sorted(rates, reverse=True)  # it only decays
    assert rates[-1] < 1e-3 * run.lr


@pytest.mark.parametrize("policy", ["async", "cadence"])
def test_a_schedule_under_a_policy_of_varying_updates_is_refused(
    policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--quiet", "--policy", policy, "--lr-schedule", "cosine", "--epochs", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("atomr: error: --lr-schedule and --warmup-epochs need --policy sync")


def test_the_step_schedule_cuts_twice() -> None:
    """Over 860 updates it cut at 287, 573 and 859: the last updates ran at 0.001 x lr."""
    kind = _run("--epochs", "20", "--lr-schedule", "step").trainer_config(43).optimizer
    cuts = [u for u in range(1, 860) if kind.lr_at(u) < kind.lr_at(u - 1)]
    assert len(cuts) == 2


@pytest.mark.parametrize("schedule", [["--lr-schedule", "cosine"], ["--warmup-epochs", "1"]])
def test_a_scheduled_parameter_server_run_resumes_with_its_own_flags(
    tmp_path: Path, schedule: list[str]
) -> None:
    """The resume check sized this run's schedule in batches, the run in
    updates (one per worker's part): every such resume was refused."""
    ckpt = tmp_path / "c.ckpt"
    argv = [
        "train", "--quiet", "--strategy", "ps", "--workers", "2", "--dataset", "synthetic",
        "--samples", "256", "--features", "8", "--classes", "3", "--epochs", "2",
        "--batch-size", "32", *schedule, "--checkpoint", str(ckpt),
    ]  # fmt: skip
    assert main([*argv, "--run-dir", str(tmp_path / "a"), "--max-steps", "8"]) == 0
    assert load_checkpoint(ckpt).step == 8
    assert main([*argv, "--run-dir", str(tmp_path / "b"), "--resume", str(ckpt)]) == 0
    run = _run(*argv[2:])
    assert load_checkpoint(ckpt).step == 2 * _steps_per_epoch(run, load_dataset(run)) * 2


def _cuts(schedule: StepLR, updates: int) -> int:
    rates = [schedule.lr(1.0, t) for t in range(updates)]  # update t + 1 uses epoch t
    return sum(b < a for a, b in zip(rates, rates[1:], strict=False))


def test_the_help_and_the_docs_say_what_the_schedules_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The help said cosine goes "to 0 at the last step" and step cuts "at
    each third of the epochs": like torch's CosineAnnealingLR the cosine's
    last update is above 0 (0 comes one update later), and like torch's
    StepLR the step schedule cuts every ceil(n/3) of the n updates after
    warm-up, so n = 1, 2 or 4 gets fewer than two cuts."""
    for n in range(1, 13):
        cosine = _run("--epochs", str(n), "--lr-schedule", "cosine").lr_schedule_for(1)
        assert isinstance(cosine, CosineAnnealingLR)
        assert cosine.lr(1.0, n - 1) > 0.0 and cosine.lr(1.0, n) == 0.0
        step = _run("--epochs", str(n), "--lr-schedule", "step").lr_schedule_for(1)
        assert isinstance(step, StepLR)
        assert _cuts(step, n) == {1: 0, 2: 1, 4: 1}.get(n, 2)
    assert main(["train", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    docs = Path(__file__).resolve().parents[2] / "docs" / "getting_started.md"
    row = " ".join(docs.read_text(encoding="utf-8").split())
    for said in ("0 one update after the last", "every ceil(n/3) of the n updates after warm-up",
                 "fewer when n is 1, 2 or 4"):  # fmt: skip
        assert said in help_text and said in row
