"""``import atomr``: cheap, and every public name still importable from it."""

import re
import subprocess
import sys

import pytest

import atomr
import atomr.actor


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(out.stdout.split())


def test_import_atomr_loads_neither_asyncio_nor_numba_nor_the_training_layer() -> None:
    loaded = _modules_after("import atomr")
    assert not {"asyncio", "numba", "numpy", "atomr.actor", "atomr.accel", "atomr.train"} & loaded


def test_the_first_use_of_a_runtime_name_loads_the_runtime() -> None:
    loaded = _modules_after("from atomr import ActorSystem")
    assert {"asyncio", "atomr.actor"} <= loaded
    assert not {"numba", "numpy", "atomr.train", "aiohttp"} & loaded


def test_aiohttp_is_for_the_examples_and_tests_only() -> None:
    """examples/web_service.py needs aiohttp: the `examples` extra (and so
    `test`) installs it; the runtime itself does not depend on it."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    project = project["project"]
    assert not [dep for dep in project["dependencies"] if dep.startswith("aiohttp")]
    extras = project["optional-dependencies"]
    assert any(dep.startswith("aiohttp") for dep in extras["examples"])
    assert any(dep.startswith("atomr[") and "examples" in dep for dep in extras["test"])


def test_every_public_name_is_the_runtime_s_own() -> None:
    for name in atomr.__all__:
        if name != "__version__":
            assert getattr(atomr, name) is getattr(atomr.actor, name)
    assert set(atomr.__all__) <= set(dir(atomr))


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        atomr.Nope  # noqa: B018
    assert not hasattr(atomr, "_private")


def test_the_readme_s_from_atomr_import_names_are_atomr_s() -> None:
    """The README's "Actors (`from atomr import ...`)" bullet names what
    `atomr` exports (it once listed `TestProbe`, which is `atomr.testkit`'s)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    bullet = readme[readme.index("(`from atomr import ...`)") :].split("\n- ", 1)[0]
    bullet = bullet.split("atomr.testkit", 1)[0]  # what follows is the test kit's
    names = {name.split(".")[0] for name in re.findall(r"`([A-Z]\w*(?:\.\w+)?)`", bullet)}
    assert names and names <= set(atomr.__all__), names - set(atomr.__all__)
