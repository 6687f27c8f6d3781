"""Sizes that cannot fit are refused up front, in one line, from a memory
estimate: no `MemoryError` traceback, no OOM kill after minutes."""

from __future__ import annotations

import pytest

from atomr.cli import main, train_command
from atomr.cli.memory import available_memory, check_memory, estimate_memory
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig


def _run_config(*argv: str) -> RunConfig:
    return RunConfig.from_args(build_parser("test").parse_args(["train", "--quiet", *argv]))


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the data set was loaded before the memory was checked")

    monkeypatch.setattr(train_command, "load_dataset", refuse)


@pytest.mark.parametrize(
    "argv",
    [
        ["--hidden", "1000000,1000000", "--devices", "cpu:0"],  # 10^12 parameters: terabytes
        ["--dataset", "synthetic", "--samples", "100000000000"],  # 10^11 samples
        ["--dataset", "synthetic", "--features", "100000000000"],
        ["--model", "gpt", "--d-model", "65536", "--n-head", "1"],  # 10^11 parameters
    ],
    ids=["hidden", "samples", "features", "gpt"],
)
def test_sizes_that_cannot_fit_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: object,
    no_training: None,
    argv: list[str],
) -> None:
    code = main(["train", "--quiet", "--epochs", "1", "--run-dir", f"{tmp_path}/run", *argv])
    out, err = capsys.readouterr()
    assert code == 1
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("atomr: error: this run needs about ")
    for part in ("parameters", "optimizer state", "activations", "data", "is available"):
        assert part in lines[0]


def test_the_estimate_counts_each_part() -> None:
    """A 10-4-3 model, Adam, two data-parallel replicas, 100 synthetic samples."""
    run = _run_config(
        "--strategy", "data", "--devices", "cpu:0,cpu:1", "--hidden", "4",
        "--dataset", "synthetic", "--samples", "100", "--features", "10", "--classes", "3",
        "--batch-size", "8", "--optimizer", "adam",
    )  # fmt: skip
    est = estimate_memory(run)
    params = 10 * 4 + 4 + 4 * 3 + 3
    assert est.parameters == 4 * params * (2 * 2 + 1)  # weights + grads per replica, host model
    assert est.optimizer == 2 * 4 * params * 2  # two Adam moments per replica
    assert est.activations == 2 * 4 * (4 + 3) * (8 + 100)
    assert est.data == 100 * (10 * 28 + 8)
    assert est.total == est.parameters + est.optimizer + est.activations + est.data


@pytest.mark.parametrize(
    ("argv", "copies"),
    [
        (["--strategy", "data"], 2),
        (["--strategy", "tensor"], 1),
        (["--strategy", "pipeline"], 1),
        (["--strategy", "ps"], 3),  # a worker per device and the server's own
        (["--strategy", "ps", "--workers", "3"], 4),
    ],
)
def test_the_estimate_counts_the_model_copies_of_the_strategy(argv: list[str], copies: int) -> None:
    run = _run_config("--devices", "cpu:0,cpu:1", "--hidden", "4", "--optimizer", "adam", *argv)
    params = 64 * 4 + 4 + 4 * 10 + 10  # the digits: 64 features, 10 classes
    assert estimate_memory(run).optimizer == 2 * 4 * params * copies


def test_a_batch_larger_than_the_data_counts_only_the_data() -> None:
    """`--batch-size 99999999999` on 200 samples trains on 200 a step: it
    was refused as needing 8,195 GiB."""
    argv = ["--dataset", "synthetic", "--samples", "200", "--features", "10", "--hidden", "4"]
    huge = _run_config(*argv, "--batch-size", "99999999999")
    whole = _run_config(*argv, "--batch-size", "200")
    assert estimate_memory(huge) == estimate_memory(whole)
    check_memory(huge, available=2**30)


def test_a_run_that_fits_passes() -> None:
    run = _run_config("--strategy", "single")
    check_memory(run, available=estimate_memory(run).total)
    with pytest.raises(Exception, match="needs about"):
        check_memory(run, available=estimate_memory(run).total - 1)
    free = available_memory()
    assert free is None or free > 0


@pytest.mark.parametrize(("n_layer", "n_head", "d_model", "context"), [(2, 4, 16, 8), (1, 1, 4, 3)])
def test_a_gpts_estimate_counts_its_parameters_but_the_vocabularys(
    n_layer: int, n_head: int, d_model: int, context: int
) -> None:
    """The text (and so the vocabulary) is read after the check: the
    estimate is the model's parameters less the vocabulary's rows."""
    from atomr.train.core.model import gpt

    run = _run_config(
        "--model", "gpt", "--n-layer", str(n_layer), "--n-head", str(n_head),
        "--d-model", str(d_model), "--context", str(context), "--optimizer", "adam",
        "--strategy", "single",
    )  # fmt: skip
    vocab = 7
    model = gpt(vocab, context, n_layer=n_layer, n_head=n_head, d_model=d_model)
    without_vocabulary = model.n_params - (2 * vocab * d_model + vocab)
    est = estimate_memory(run)
    assert est.parameters == 4 * without_vocabulary * 3  # weights, grads, the built model
    assert est.optimizer == 2 * 4 * without_vocabulary
