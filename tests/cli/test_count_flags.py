"""Every count flag of `atomr` refuses a value no array could index with
one line naming the flag, the value and the limit (`cli.errors.count_flag`,
on `atomr._arguments.int_at_least`), and a MemoryError is one line too.
Counts with a tighter limit of their own: `atomr launch -n` (MPI's ranks
are C ints) and `--devices N` on CPU (`MAX_CPU_DEVICES`)."""

from __future__ import annotations

import pytest

from atomr._arguments import INDEX_MAX, building
from atomr.cli import device_option, main
from atomr.cli.device_option import MAX_CPU_DEVICES
from atomr.cli.errors import reported_as
from atomr.train.comm.mpi import launch
from atomr.train.comm.mpi.launch import MAX_PROCESSES, mpiexec_command

HUGE = str(10**20)

FLAGS = [
    ["train", "--epochs", HUGE],
    ["train", "--batch-size", HUGE],
    ["train", "--max-steps", HUGE],
    ["train", "--strategy", "pipeline", "--micro-batch-size", HUGE],
    ["train", "--strategy", "ps", "--workers", HUGE],
    ["train", "--strategy", "data", "--policy", "async", "--average-every", HUGE],
    ["train", "--dataset", "synthetic", "--samples", HUGE],
    ["train", "--dataset", "synthetic", "--features", HUGE],
    ["train", "--dataset", "synthetic", "--classes", HUGE],
    ["train", "--model", "gpt", "--context", HUGE],
    ["train", "--model", "gpt", "--n-layer", HUGE],
    ["train", "--model", "gpt", "--n-head", HUGE],
    ["train", "--model", "gpt", "--d-model", HUGE],
    ["launch", "-n", HUGE, "--", "--epochs", "1"],
]
LIMITS = {"-n": MAX_PROCESSES}
"""The flags whose limit is not `INDEX_MAX`."""


@pytest.mark.parametrize("argv", FLAGS, ids=["-n" if a[0] == "launch" else a[-2] for a in FLAGS])
def test_a_count_beyond_the_index_type_is_one_line_naming_the_flag_and_limit(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """`--epochs 10**20` was a traceback (fit's ValueError), `--batch-size`
    named `batch_size`, and the sizes a memory estimate in GiB."""
    flag = "-n" if argv[0] == "launch" else argv[-2]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be <= {LIMITS.get(flag, INDEX_MAX)}, got {HUGE}" in err
    assert "Traceback" not in err


def test_a_hidden_width_beyond_the_index_type_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "--hidden", f"64,{HUGE}"]) == 2
    assert f"--hidden width must be <= {INDEX_MAX}, got {HUGE}" in capsys.readouterr().err


def test_a_memory_error_is_reported_as_one_line_with_its_message() -> None:
    """A MemoryError (which `building` makes name what was built) was a
    traceback."""
    with pytest.raises(MemoryError) as caught, building("an Mlp", 8):
        raise MemoryError
    error = reported_as(caught.value)
    assert error is not None and error.exit_code == 1
    assert str(error) == "out of memory building an Mlp (8 bytes needed)"
    bare = reported_as(MemoryError())
    assert bare is not None and str(bare) == "out of memory"


@pytest.mark.parametrize("count", [MAX_PROCESSES + 1, 2**32 + 2, 10**20])
def test_a_process_count_mpi_cannot_number_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """hydra's `mpiexec -n 4294967298` ran a job of 2 processes (it takes
    the count modulo 2**32): refused before anything is launched."""
    launched: list[int] = []
    monkeypatch.setattr(launch, "launch", lambda n, *args, **kwargs: launched.append(n) or 0)
    assert main(["launch", "-n", str(count), "--", "--epochs", "1"]) == 2
    assert f"-n must be <= {MAX_PROCESSES}, got {count}" in capsys.readouterr().err
    assert launched == []
    with pytest.raises(ValueError, match=f"processes must be <= {MAX_PROCESSES}, got {count}"):
        mpiexec_command(count, ["x"], mpiexec="mpiexec")
    assert mpiexec_command(MAX_PROCESSES, ["x"], mpiexec="mpiexec")[-2] == str(MAX_PROCESSES)


def test_more_logical_cpu_devices_than_the_limit_are_refused_before_any_is_made(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--devices 1000000000000` made the devices one by one and never
    started (on a machine without GPUs; with them, the GPU count is the
    limit)."""
    monkeypatch.setattr(device_option, "_real_cuda_count", lambda: 0)
    assert len(device_option.parse_devices(str(MAX_CPU_DEVICES), "data")) == MAX_CPU_DEVICES
    assert main(["train", "--devices", str(10**12)]) == 2
    expected = f"--devices {10**12}: at most {MAX_CPU_DEVICES} logical CPU devices"
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("1" * 5000, "--devices 111111111111... (5000 digits): at most"),
        ("²", "--devices: "),  # a digit, but no number: read as a device name
        ("0", "--devices needs N >= 1, got '0'"),
    ],
)
def test_a_devices_count_int_cannot_read_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, spec: str, expected: str
) -> None:
    """Both were tracebacks: int() reads at most 4300 digits, and "²" is a
    digit (`str.isdigit`) that it does not read."""
    monkeypatch.setattr(device_option, "_real_cuda_count", lambda: 0)
    assert main(["train", "--devices", spec]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert len(device_option.parse_devices("0" * 5000 + "3", "data")) == 3
