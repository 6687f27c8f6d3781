"""Fixtures shared by the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import atomr.cli
from tests.cli.test_distributed_agreement import TINY


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of one epoch of `TINY`, without its history file (a
    run resuming from it starts a history of its own)."""
    folder = tmp_path_factory.mktemp("ckpt")
    path = folder / "one.ckpt"
    assert (
        atomr.cli.main(["train", *TINY, "--checkpoint", str(path), "--run-dir", str(folder)]) == 0
    )
    (folder / "one.ckpt.history.json").unlink()
    return path
