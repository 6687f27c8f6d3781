"""Every count flag of `atomr` refuses a value no array could index with
one line naming the flag, the value and the limit (`cli.errors.count_flag`,
on `atomr._arguments.int_at_least`), and a MemoryError is one line too."""

from __future__ import annotations

import pytest

from atomr._arguments import INDEX_MAX, building
from atomr.cli import main
from atomr.cli.errors import reported_as

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


@pytest.mark.parametrize("argv", FLAGS, ids=["-n" if a[0] == "launch" else a[-2] for a in FLAGS])
def test_a_count_beyond_the_index_type_is_one_line_naming_the_flag_and_limit(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """`--epochs 10**20` was a traceback (fit's ValueError), `--batch-size`
    named `batch_size`, and the sizes a memory estimate in GiB."""
    flag = "-n" if argv[0] == "launch" else argv[-2]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be <= {INDEX_MAX}, got {HUGE}" in err
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
