"""A data set that cannot be loaded on this machine (its package is
missing) is one line naming what to install, not a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from atomr.cli import main


@pytest.mark.parametrize(
    ("argv", "hidden", "line"),
    [
        (
            ["--model", "gpt"],
            ["pydoc_data", "pydoc_data.topics"],
            "atomr: error: --dataset pydoc: this Python ships without its documentation "
            "(pydoc_data): install a full Python, or train another --dataset",
        ),
        (
            [],
            ["sklearn", "sklearn.datasets"],
            "atomr: error: the digits data set needs scikit-learn: pip install -e '.[train]'",
        ),
    ],
    ids=["pydoc", "digits"],
)
def test_a_data_set_whose_package_is_missing_is_one_line(
    argv: list[str],
    hidden: list[str],
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """pydoc's text comes from the standard library's pydoc_data, which some
    Pythons leave out (Debian's python3-minimal): that was a traceback."""
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)
    code = main(["train", "--quiet", "--epochs", "1", "--run-dir", str(tmp_path), *argv])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", line + "\n")
    assert list(tmp_path.iterdir()) == []
