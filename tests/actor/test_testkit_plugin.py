"""A plain install never changes the behaviour of a user's pytest.

atomr's ``pytest11`` entry point loads ``atomr.testkit.plugin`` in every
pytest run of an environment where atomr is installed. This builds such an
environment: a fresh venv holding atomr (``pip install --no-deps`` of this
checkout, so the entry point is the real one) plus pytest and atomr's runtime
dependencies, linked from the installed ones, and no pytest-asyncio; then
runs pytest there on a small project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``names`` need, themselves included (no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        dist = metadata.distribution(name)
        found[key] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def _link(dist: metadata.Distribution, site: Path) -> None:
    """Make ``dist`` importable in ``site`` by linking its top-level entries."""
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    for top in tops - {"__pycache__"}:
        source = Path(str(dist.locate_file(top)))
        if source.exists() and not (site / top).exists():
            (site / top).symlink_to(source)


@pytest.fixture(scope="module")
def plain_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with atomr, its runtime dependencies and pytest; its python."""
    base = tmp_path_factory.mktemp("plain")
    source = base / "src"  # pip builds in the tree: build from a copy
    shutil.copytree(ROOT / "atomr", source / "atomr", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv.create(base / "venv", with_pip=False)
    python = base / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--target", site, source],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    atomr_dist = next(metadata.distributions(path=[str(site)]))
    runtime = [
        Requirement(line).name
        for line in atomr_dist.requires or []
        if Requirement(line).marker is None or Requirement(line).marker.evaluate({"extra": ""})
    ]
    for dist in _closure(["pytest", *runtime]).values():
        _link(dist, site)
    return python


def _pytest(python: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_pytest_runs_a_project_with_plain_atomr_and_no_pytest_asyncio(
    plain_env: Path, tmp_path: Path
) -> None:
    (tmp_path / "test_plain.py").write_text(
        "import importlib.util\n"
        "def test_the_environment(pytestconfig):\n"
        "    assert pytestconfig.pluginmanager.has_plugin('atomr.testkit.plugin')  # the entry point\n"
        "    assert importlib.util.find_spec('pytest_asyncio') is None\n"
        "def test_something():\n"
        "    assert 1 + 1 == 2\n"
    )
    result = _pytest(plain_env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr  # was: 3, pytest broken
    assert "2 passed" in result.stdout


def test_the_fixture_says_what_it_needs(plain_env: Path, tmp_path: Path) -> None:
    (tmp_path / "test_fixture.py").write_text("def test_it(actor_system):\n    pass\n")
    result = _pytest(plain_env, tmp_path)
    assert result.returncode == 1
    assert "the actor_system fixture needs pytest-asyncio" in result.stdout


LOADED_ONCE = (
    "import atomr.testkit.plugin as plugin\n"
    "def test_loaded_once(pytestconfig):\n"
    "    names = [n for n, p in pytestconfig.pluginmanager.list_name_plugin() if p is plugin]\n"
    "    assert names == ['atomr.testkit.plugin']\n"
)


@pytest.mark.parametrize("how", ["-p", "pytest_plugins", "-p without autoload"])
def test_naming_the_plugin_as_well_loads_it_once(plain_env: Path, tmp_path: Path, how: str) -> None:
    (tmp_path / "test_once.py").write_text(LOADED_ONCE)
    args = ["-p", "atomr.testkit.plugin"] if how.startswith("-p") else []
    if how == "pytest_plugins":
        (tmp_path / "conftest.py").write_text("pytest_plugins = ['atomr.testkit.plugin']\n")
    if how == "-p without autoload":
        args.insert(0, "--disable-plugin-autoload")
    result = _pytest(plain_env, tmp_path, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    # was: 1, "Plugin already registered under a different name" for "-p" and "pytest_plugins"
    assert "1 passed" in result.stdout


def test_the_plugin_can_be_turned_off_by_its_name(plain_env: Path, tmp_path: Path) -> None:
    (tmp_path / "test_off.py").write_text(
        "def test_off(pytestconfig):\n"
        "    assert not pytestconfig.pluginmanager.has_plugin('atomr.testkit.plugin')\n"
    )
    result = _pytest(plain_env, tmp_path, "-p", "no:atomr.testkit.plugin")
    assert result.returncode == 0, result.stdout + result.stderr
