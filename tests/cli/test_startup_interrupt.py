"""A Ctrl-C while `atomr` starts (loading the training layer, numba with it,
takes a second or more) ends in one line and exit status 130, as one during
a run does: no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CTRL_C_WHILE_LOADING = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    class CtrlC(MetaPathFinder):  # the Ctrl-C comes as the parser is being loaded
        def find_spec(self, name, path, target=None):
            if name == "atomr.cli.parser":
                raise KeyboardInterrupt
            return None

    sys.meta_path.insert(0, CtrlC())
    from atomr.cli import main

    sys.exit(main(["train", "--quiet"]))
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_ctrl_c_while_the_command_loads_is_one_line() -> None:
    done = _run(_CTRL_C_WHILE_LOADING)
    assert (done.returncode, done.stderr) == (130, "atomr: interrupted\n")


def test_importing_the_command_loads_neither_numba_nor_the_training_layer() -> None:
    done = _run("import sys, atomr.cli; print(' '.join(sorted(sys.modules)))")
    loaded = set(done.stdout.split())
    assert "atomr.cli" in loaded
    assert not {"numba", "numpy", "atomr.train", "atomr.cli.parser"} & loaded
