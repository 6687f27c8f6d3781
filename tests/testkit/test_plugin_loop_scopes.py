"""The ``actor_system`` fixture under every pytest-asyncio loop scope, and
``actor_system_fixture``'s shared systems: small test projects run by pytester."""

from __future__ import annotations

import textwrap

import pytest

from atomr.testkit import plugin
from atomr.testkit.plugin import actor_system_fixture

pytest_plugins = ["pytester"]

ECHO = """
import asyncio

import pytest

from atomr import Actor, Props


class Echo(Actor):
    def receive(self, message):
        return message


SEEN = []


async def check(system):
    assert system.loop is asyncio.get_running_loop()
    assert await system.spawn(Props(Echo)).ask("ping", timeout=5) == "ping"
    assert system not in SEEN  # a fresh system for each test
    SEEN.append(system)
"""

IN_A_CLASS = """
class TestTwo:
    async def test_one(self, actor_system):
        await check(actor_system)

    async def test_two(self, actor_system):
        await check(actor_system)
"""


def _project(pytester: pytest.Pytester, fixture_loop_scope: str, test_loop_scope: str) -> None:
    pytester.makeini(
        f"""
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = {fixture_loop_scope}
        asyncio_default_test_loop_scope = {test_loop_scope}
        """
    )


@pytest.mark.parametrize("loop_scope", ["function", "class", "module", "package", "session"])
def test_the_fixture_runs_on_the_loop_of_the_test_s_mark(
    pytester: pytest.Pytester, loop_scope: str
) -> None:
    _project(pytester, "function", "function")
    mark = f"pytestmark = pytest.mark.asyncio(loop_scope={loop_scope!r})\n"
    pytester.makepyfile(test_marked=ECHO + mark + IN_A_CLASS)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)
    # was: for all but "function", 2 failed ("runs on another event loop")


@pytest.mark.parametrize(
    ("fixture_loop_scope", "test_loop_scope"),
    [("module", "function"), ("function", "module"), ("session", "class"), ("class", "session")],
)
def test_the_fixture_runs_on_the_loop_of_the_configured_test_scope(
    pytester: pytest.Pytester, fixture_loop_scope: str, test_loop_scope: str
) -> None:
    _project(pytester, fixture_loop_scope, test_loop_scope)
    pytester.makepyfile(test_configured=ECHO + IN_A_CLASS)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)  # was: 2 failed


SHARED = """
import asyncio
import threading

import pytest

from atomr import Actor, ActorSystem, Props
from atomr.accel import DeviceActor
from atomr.accel.device_actor import OnDevice
from atomr.testkit.plugin import actor_system_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")
shared = actor_system_fixture("shared", scope="module")

RECORD = {"terminated": [], "threads": set(threading.enumerate())}


@pytest.fixture(scope="module", autouse=True)
def record_terminate():  # autouse: set up first, so undone after the shared system's teardown
    terminate = ActorSystem.terminate

    async def recording(self, *args, **kwargs):
        await terminate(self, *args, **kwargs)
        left = asyncio.all_tasks() - {asyncio.current_task()}
        RECORD["terminated"].append((self, left, set(threading.enumerate())))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ActorSystem, "terminate", recording)
        yield


class Counter(Actor):
    def __init__(self):
        super().__init__()
        self.count = 0

    def receive(self, by):
        self.count += by
        return self.count


async def test_one(shared):
    assert shared.loop is asyncio.get_running_loop()
    RECORD["system"] = shared
    RECORD["counter"] = shared.spawn(Props(Counter), name="counter")
    assert await RECORD["counter"].ask(1, timeout=5) == 1
    RECORD["device"] = shared.spawn(Props(DeviceActor, "cpu:0"))  # a worker thread
    assert await RECORD["device"].ask(OnDevice(sum, [1, 2]), timeout=30) == 3


async def test_two(shared):
    assert shared is RECORD["system"] and not RECORD["terminated"]
    assert await RECORD["counter"].ask(1, timeout=5) == 2


async def test_three(shared):
    assert shared is RECORD["system"] and not RECORD["terminated"]
    assert await RECORD["counter"].ask(1, timeout=5) == 3
    assert await RECORD["device"].ask(OnDevice(sum, [3, 4]), timeout=30) == 7
    assert set(threading.enumerate()) - RECORD["threads"]  # its thread still runs
"""

AFTER = """
import test_a_shared as shared


def test_the_shared_system_was_terminated_once_and_left_nothing():
    [(system, tasks, threads)] = shared.RECORD["terminated"]
    assert system is shared.RECORD["system"] and system.is_terminated
    assert not shared.RECORD["counter"].is_alive and not shared.RECORD["device"].is_alive
    assert tasks == set()
    assert threads <= shared.RECORD["threads"]
"""


def test_a_module_scoped_system_is_shared_and_terminated_once(pytester: pytest.Pytester) -> None:
    _project(pytester, "function", "function")
    pytester.makepyfile(test_a_shared=SHARED, test_b_after=AFTER)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=4)


def test_a_session_scoped_system_serves_several_modules(pytester: pytest.Pytester) -> None:
    _project(pytester, "function", "session")
    pytester.makeconftest(
        "from atomr.testkit.plugin import actor_system_fixture\n"
        "actor_system = actor_system_fixture(scope='session')\n"
    )
    test = textwrap.dedent(
        """
        import asyncio
        SEEN = set()
        async def test_it(actor_system):
            assert actor_system.loop is asyncio.get_running_loop()
            assert not actor_system.is_terminated
            SEEN.add(id(actor_system))
        """
    )
    check = "import test_a, test_b\ndef test_one_system():\n    assert test_a.SEEN == test_b.SEEN\n"
    pytester.makepyfile(test_a=test, test_b=test, test_c=check)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"scope": "modul"}, ValueError, "scope must be one of function, class, module"),
        ({"scope": "module", "loop_scope": "function"}, ValueError, "narrower than scope"),
        ({"loop_scope": "loop"}, ValueError, "loop_scope must be one of"),
        ({"scope": None}, ValueError, "scope must be one of"),
        ({"name": "my system"}, ValueError, "name must be an identifier"),
        ({"name": 3}, TypeError, "name must be a str"),
    ],
)
def test_actor_system_fixture_refuses_bad_arguments(
    arguments: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        actor_system_fixture(**arguments)  # type: ignore[arg-type]


def test_without_loop_scopes_a_declared_fixture_fails_the_test_saying_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest-asyncio before 0.24 has no loop_scope: the plugin still loads
    (it raised TypeError at import, breaking every pytest run)."""
    monkeypatch.setattr(plugin, "_HAVE_LOOP_SCOPES", False)
    _project(pytester, "function", "function")
    pytester.makepyfile(
        "from atomr.testkit.plugin import actor_system_fixture\n"
        "shared = actor_system_fixture('shared', scope='module')\n"
        "async def test_it(shared):\n"
        "    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*actor_system_fixture needs pytest-asyncio 0.24 or later*"])


SYNC = """
import pytest

from atomr import Actor, Props
from atomr.testkit.plugin import actor_system_fixture

shared = actor_system_fixture("shared", scope="module")


class Echo(Actor):
    def receive(self, message):
        return message


def test_asks_without_using_it(actor_system):
    assert actor_system.actors == []


@pytest.mark.parametrize("name", ["actor_system", "shared"])
def test_uses_it(request, name):
    system = request.getfixturevalue(name)
    system.spawn(Props(Echo))
"""


def test_a_sync_test_that_uses_a_fixture_s_system_is_told_to_be_async(
    pytester: pytest.Pytester,
) -> None:
    """It used to be told 'use it inside a coroutine (e.g. atomr.run(main()))':
    wrong inside pytest. A sync test may still ask for it without using it."""
    _project(pytester, "function", "function")
    pytester.makepyfile(test_sync=SYNC)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    for name in ("actor_system", "shared"):
        result.stdout.fnmatch_lines(
            [f"E * RuntimeError: *it is the {name} fixture's, *make the test * `async def`"]
        )
