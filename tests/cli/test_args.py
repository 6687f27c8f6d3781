"""Bad arguments to `atomr` give one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from atomr.accel import ACTIVATIONS
from atomr.cli import device_option, main, train_command
from atomr.cli.errors import CliError
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "required: COMMAND"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["train", "--strategy", "magic"], "invalid choice: 'magic'"),
        (["train", "--epochs", "ten"], "invalid int value: 'ten'"),
        (
            ["train", "--epochs", "1", "extra"],
            "unrecognized arguments: extra (see 'atomr train --help')",
        ),
        (["train", "--epochs", "0"], "--epochs must be >= 1"),
        (["train", "--batch-size", "-4"], "--batch-size must be >= 1"),
        (["train", "--lr", "-0.1"], "--lr: lr must be >= 0, got lr=-0.1"),
        (["train", "--lr", "nan"], "--lr: lr must be finite in float64, got nan"),
        (["train", "--lr", "1e39"], "--lr: adam cannot compute in float32: lr must be finite"),
        (["train", "--optimizer", "sgd", "--lr", "3.5e38"], "finite in float32, got 3.5e+38"),
        (["train", "--lr", "1e-50"], "--lr: adam cannot compute in float32: lr=1e-50 rounds to 0"),
        (
            ["train", "--optimizer", "sgd", "--momentum", "-0.5"],
            "--momentum: momentum must be >= 0",
        ),
        (["train", "--clip", "0"], "--clip: gradient_clip must be positive and finite, got 0.0"),
        (["train", "--momentum", "0.5"], "--momentum only applies to --optimizer sgd"),
        (["train", "--name", "a", "--run-dir", "b"], "with --run-dir it is unused"),
        (
            ["train", "--name", "a", "--plot", "p.png", "--history", "h.json"],
            "--name is unused when --plot and --history are both given",
        ),
        (
            ["train", "--run-dir", "r", "--plot", "p.png", "--history", "h.json"],
            "--run-dir is unused when --plot and --history are both given",
        ),
        (["train", "--schedule", "gpipe"], "--schedule only applies to --strategy pipeline"),
        (
            ["train", "--strategy", "ps", "--micro-batch-size", "4"],
            "--micro-batch-size only applies to --strategy pipeline",
        ),
        (
            ["train", "--strategy", "pipeline", "--batch-size", "32", "--micro-batch-size", "100"],
            "--micro-batch-size 100 is larger than --batch-size 32",
        ),
        (["train", "--features", "3"], "--features only applies to --dataset synthetic"),
        (["train", "--samples", "100"], "--samples only applies to --dataset synthetic"),
        (["train", "--hidden", "64,abc"], "--hidden must be comma-separated integers"),
        (["train", "--hidden", "0"], "each >= 1"),
        (["train", "--hidden", "64,,32"], "--hidden has an empty width"),
        (["train", "--hidden", ",64"], "--hidden has an empty width"),
        (["train", "--hidden", "64,"], "--hidden has an empty width"),
        (["train", "--hidden", ""], "--hidden has an empty width"),
        (["train", "--devices", "gpu:0"], "unknown device 'gpu:0'"),
        (["train", "--devices", "cpu:0,cpu:0"], "names cpu:0 twice"),
        (["train", "--devices", "cuda:7"], "no such device cuda:7"),
        (["train", "--devices", "0"], "--devices needs N >= 1"),
        (["train", "--strategy", "single", "--devices", "2"], "trains on one device, got 2"),
        (["train", "--workers", "3"], "--workers only applies to --strategy ps"),
        (["train", "--resume", "/nonexistent/ckpt.bin"], "no such checkpoint file"),
        (["train", "--classes", "1", "--dataset", "synthetic"], "--classes must be >= 2"),
        (  # it said >= 1; then 1 was refused as below 10
            ["train", "--dataset", "synthetic", "--samples", "0"],
            "--samples must be >= 10 to hold out a test set, got 0",
        ),
        (["train", "--seed", "-1"], "--seed must be >= 0"),
        (["train", "--optimizer", "lion"], "invalid choice: 'lion'"),
        (["train", "--distributed", "--strategy", "pipeline"], "cannot be combined"),
        (["train", "--model", "gpt", "--hidden", "256"], "--hidden only applies to --model mlp"),
        (
            ["train", "--model", "gpt", "--activation", "tanh"],
            "--activation only applies to --model mlp",
        ),
        (["train", "--average-every", "3"], "--average-every only applies to --policy async"),
        (
            ["train", "--policy", "sync", "--average-every", "3"],
            "--average-every only applies to --policy async",
        ),
        (
            ["train", "--policy", "cadence", "--average-every", "3"],
            "--average-every only applies to --policy async",
        ),
        (
            ["train", "--strategy", "zero", "--average-every", "3"],
            "--average-every only applies to --strategy data",
        ),
        (["train", "--distributed"], "--distributed runs under MPI: start it with 'atomr launch"),
        (["bench", "gpu"], "invalid choice: 'gpu'"),
        (["bench", "all", "--benchmarks-dir", "/nonexistent"], "no such folder"),
        (["launch"], "required: -n/--nprocs"),
        (["launch", "-n", "0", "--", "--epochs", "1"], "-n must be >= 1"),
        (
            ["launch", "-n", "2", "--epochs", "1"],
            "unrecognized arguments: --epochs 1 (see 'atomr launch --help'; the arguments"
            " of atomr train go after '--': atomr launch -n N -- --epochs 5)",
        ),
        (
            ["bench", "messaging", "--tells", "10"],
            "(see 'atomr bench --help'; the scripts' arguments go after '--'",
        ),
        (["launch", "-n", "1", "--timeout", "0"], "--timeout must be positive"),
        (["launch", "-n", "1", "--timeout", "-5"], "--timeout must be positive"),
        (["train", "--checkpoint", ""], "--checkpoint '' names a folder, not a file"),
        (["train", "--checkpoint", "."], "--checkpoint '.' names a folder, not a file"),
        (["train", "--metrics", ".."], "--metrics '..' names a folder, not a file"),
        (["train", "--run-dir", ""], "--run-dir '' is empty: give a folder's path"),
        (["train", "--run-dir", " "], "--run-dir ' ' is empty: give a folder's path"),
        (["train", "--tensorboard", ""], "--tensorboard '' is empty: give a folder's path"),
        (["bench", "kernels", "--timeout", "0"], "--timeout must be positive and finite, got 0.0"),
        (["bench", "kernels", "--timeout", "-1"], "--timeout must be positive and finite"),
        (
            ["bench", "kernels", "--timeout", "nan"],
            "--timeout must be positive and finite, got nan",
        ),
        (["devices", "--", "x"], "takes no arguments after '--'"),
    ],
)
def test_bad_arguments_give_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("atomr: error: ")
    assert needle in lines[0]
    assert "Traceback" not in err


def test_batch_too_small_for_the_devices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _run(
        capsys,
        "train",
        "--strategy",
        "data",
        "--devices",
        "3",
        "--batch-size",
        "2",
        "--run-dir",
        str(tmp_path),
    )
    assert code == 2
    assert err.strip() == (
        "atomr: error: --batch-size 2 is too small for --strategy data on 3 device(s): "
        "use at least 3"
    )


def test_trainer_refusal_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # three pipeline stages for a two-layer model: the trainer refuses, the CLI says why
    code, _, err = _run(
        capsys,
        "train",
        "--strategy",
        "pipeline",
        "--devices",
        "3",
        "--epochs",
        "1",
        "--run-dir",
        str(tmp_path),
    )
    assert code == 2
    assert err.startswith("atomr: error: --strategy pipeline: ")
    assert len(err.strip().splitlines()) == 1


def test_resume_of_a_file_that_is_not_a_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bogus = tmp_path / "bogus.ckpt"
    bogus.write_bytes(b"not a checkpoint")
    code, _, err = _run(capsys, "train", "--resume", str(bogus), "--run-dir", str(tmp_path))
    assert code == 2
    assert err.startswith("atomr: error: --resume: ")
    assert "not an atomr checkpoint" in err


def test_unwritable_checkpoint_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    code, _, err = _run(
        capsys,
        "train",
        "--strategy",
        "single",
        "--epochs",
        "1",
        "--quiet",
        "--checkpoint",
        str(blocker / "c.ckpt"),
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert code == 1
    assert err.startswith("atomr: error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("flag", ["--run-dir", "--checkpoint", "--plot", "--history", "--metrics"])
def test_unwritable_output_fails_before_training(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flag: str,
) -> None:
    """An output path that cannot be written is refused before any training,
    in one line naming the option to change."""

    def no_training(*_: object) -> None:
        raise AssertionError("training started before the outputs were checked")

    monkeypatch.setattr(train_command, "load_dataset", no_training)
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    target = blocker / {"--run-dir": "run", "--plot": "out.png"}.get(flag, "out")
    argv = ["train", "--quiet", "--epochs", "1", "--run-dir", str(tmp_path / "run")]
    code, out, err = _run(capsys, *argv, flag, str(target))
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"atomr: error: {flag}: cannot write "), err
    assert f"choose another {flag}" in lines[0]


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "train", "--help")
    assert code == 0
    for option in (
        "--strategy",
        "--devices",
        "--epochs",
        "--batch-size",
        "--optimizer",
        "--lr",
        "--loss",
        "--hidden",
        "--schedule",
        "--workers",
        "--checkpoint",
        "--resume",
        "--seed",
        "--dataset",
        "--plot",
        "--quiet",
        "--distributed",
    ):
        assert option in out


def test_the_help_says_a_checkpoint_is_saved_on_sigterm_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said "on Ctrl-C" only, while SIGTERM stops and saves as well
    (tests/cli/test_interrupt.py)."""
    code, out, _ = _run(capsys, "train", "--help")
    assert code == 0
    text = " ".join(out.split())
    entry = text.rsplit("--checkpoint PATH", 1)[1].split("--resume PATH", 1)[0]  # not the usage
    assert "on Ctrl-C or SIGTERM" in entry, entry


def test_the_installed_command_prints_no_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "atomr.cli", "train", "--epochs", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "atomr: error: --epochs must be >= 1, got -1\n"


def test_more_devices_than_gpus_says_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_option, "_real_cuda_count", lambda: 1)
    code, out, err = _run(capsys, "train", "--devices", "4")
    assert code == 2 and out == ""
    assert err == (
        "atomr: error: --devices 4: this machine has 1 GPU(s); use --devices 1 or fewer, "
        "or a list of CPU devices such as cpu:0,cpu:1 (see 'atomr devices')\n"
    )


def _run_config(*argv: str) -> RunConfig:
    return RunConfig.from_args(build_parser("test").parse_args(["train", "--quiet", *argv]))


def test_the_mlp_flags_parse_with_the_mlp_and_default_without_them() -> None:
    run = _run_config("--hidden", "256,64", "--activation", "tanh")
    assert (run.hidden, run.activation) == ((256, 64), "tanh")
    default = _run_config()
    assert (default.hidden, default.activation) == ((128,), "relu")
    gpt = _run_config("--model", "gpt", "--context", "32")
    assert gpt.gpt is not None and gpt.gpt.context == 32
    assert (gpt.hidden, gpt.activation) == ((128,), "relu")


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_the_activations_are_the_kernels_table_but_the_identity(activation: str) -> None:
    argv = ["train", "--activation", activation]
    if activation == "identity":
        with pytest.raises(CliError, match="invalid choice: 'identity'"):
            build_parser("test").parse_args(argv)
    else:
        assert _run_config("--activation", activation).activation == activation


@pytest.mark.parametrize(
    ("strategy", "across_ranks"),
    [("single", True), ("data", True), ("zero", True), ("tensor", False),
     ("pipeline", False), ("ps", False)],
)  # fmt: skip
def test_distributed_takes_the_strategies_that_run_across_ranks(
    capsys: pytest.CaptureFixture[str], strategy: str, across_ranks: bool
) -> None:
    # outside mpiexec: a strategy that can run across ranks gets as far as the launcher check
    code, _, err = _run(capsys, "train", "--distributed", "--strategy", strategy)
    assert code == 2
    if across_ranks:
        assert "--distributed runs under MPI" in err
    else:
        assert f"cannot be combined with --strategy {strategy}" in err
