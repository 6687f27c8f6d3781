"""pytest plugin (entry point ``atomr.testkit.plugin``): the ``actor_system``
fixture, and ``actor_system_fixture`` to declare one of a wider scope.

It is loaded by every pytest run in an environment where atomr is installed,
so it must never break one: without pytest-asyncio (atomr's ``test`` extra)
the fixtures are still defined, and a test that uses one fails with a message
saying what to install; every other test runs as usual.

A synchronous test may ask for a fixture's system; using it raises a
``RuntimeError`` saying to make the test ``async def``.

``actor_system`` runs on the loop of the test that asks for it, whatever its
pytest-asyncio ``loop_scope`` (the ``asyncio`` mark's, else
``asyncio_default_test_loop_scope``): pytest-asyncio would start it on the
loop of ``asyncio_default_fixture_loop_scope``, which another loop scope's
test cannot use. That needs pytest-asyncio 1.1 or later, which sets async
fixtures up in its ``pytest_fixture_setup`` hook; an older one keeps its own
choice, and one without loop scopes (before 0.24) has no
``actor_system_fixture`` either (a test that uses one fails saying so).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, cast, get_args

import pytest

from atomr.actor.system import ActorSystem

__all__ = ["actor_system", "actor_system_fixture"]

try:
    import pytest_asyncio
except ImportError:  # atomr installed without its test extra, + pytest
    _HAVE_PYTEST_ASYNCIO = _HAVE_LOOP_SCOPES = False
else:
    _HAVE_PYTEST_ASYNCIO = True
    _HAVE_LOOP_SCOPES = "loop_scope" in inspect.signature(pytest_asyncio.fixture).parameters

_Scope = Literal["function", "class", "module", "package", "session"]
_SCOPES: tuple[_Scope, ...] = get_args(_Scope)  # narrowest first

_NEEDS_PYTEST_ASYNCIO = (
    "the actor_system fixture needs pytest-asyncio: pip install -e '.[test]' "
    '(or pytest-asyncio), and set asyncio_mode = "auto" in the pytest config'
)
_NEEDS_LOOP_SCOPES = (
    "actor_system_fixture needs pytest-asyncio 0.24 or later (loop scopes), "
    f"this is {getattr(pytest_asyncio, '__version__', '?') if _HAVE_PYTEST_ASYNCIO else 'none'}: "
    "pip install -U pytest-asyncio"
)


def _new_system_function(name: str = "actor_system") -> Callable[[], AsyncIterator[ActorSystem]]:
    """A new fixture function (each may carry its own loop scope) of the
    fixture ``name``: its system, used with no loop running (a sync test
    that asks for it: its loop runs only async ones), says to make the test
    ``async def`` (a sync test may ask for it without using it)."""
    advice = (
        f"it is the {name} fixture's, whose event loop runs only async tests: make "
        "the test (or fixture) that uses it `async def`"
    )

    async def actor_system() -> AsyncIterator[ActorSystem]:
        """A fresh ``ActorSystem`` on the fixture's loop, terminated at its teardown."""
        async with ActorSystem("test") as system:  # bound now: another loop is told so
            system._no_loop_advice = advice
            yield system

    return actor_system


def _check_scopes(name: object, scope: object, loop_scope: object) -> tuple[_Scope, _Scope]:
    """``actor_system_fixture``'s arguments; its scope and loop scope.

    Raises:
        TypeError: if ``name`` is no str.
        ValueError: if ``name`` is no identifier, a scope is no pytest scope
            name, or ``loop_scope`` is narrower than ``scope``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name.isidentifier():
        raise ValueError(f"name must be an identifier, got {name!r}")
    loop_scope = scope if loop_scope is None else loop_scope
    for what, value in (("scope", scope), ("loop_scope", loop_scope)):
        if not isinstance(value, str) or value not in _SCOPES:
            raise ValueError(f"{what} must be one of {', '.join(_SCOPES)}; got {value!r}")
    if _SCOPES.index(cast(_Scope, loop_scope)) < _SCOPES.index(cast(_Scope, scope)):
        raise ValueError(
            f"loop_scope {loop_scope!r} is narrower than scope {scope!r}: a system kept "
            "for the whole scope needs a loop that lives as long"
        )
    return cast(_Scope, scope), cast(_Scope, loop_scope)


def actor_system_fixture(
    name: str = "actor_system", *, scope: str = "function", loop_scope: str | None = None
) -> Any:
    """A pytest fixture ``name``: one fresh ``ActorSystem`` for each ``scope``
    (a pytest scope name), started on the loop of pytest-asyncio's
    ``loop_scope`` (default: ``scope``) and terminated when the scope ends.
    Assign it in a test module or conftest, e.g. ``shared =
    actor_system_fixture("shared", scope="module")``; the tests that use it
    run on its loop (``pytestmark = pytest.mark.asyncio(loop_scope="module")``).

    Raises:
        TypeError: if ``name`` is no str.
        ValueError: if ``name`` is no identifier, a scope is no pytest scope
            name, or ``loop_scope`` is narrower than ``scope``.
    """
    scope, loop = _check_scopes(name, scope, loop_scope)
    if not _HAVE_LOOP_SCOPES:
        return _failing(name, scope, _NEEDS_LOOP_SCOPES if _HAVE_PYTEST_ASYNCIO else None)
    function = _new_system_function(name)
    return pytest_asyncio.fixture(function, name=name, scope=scope, loop_scope=loop)


def _failing(name: str, scope: Any, message: str | None = None) -> Any:
    """A fixture ``name`` that fails the test asking for it, saying what to
    install (``message``; by default pytest-asyncio)."""

    def needs_pytest_asyncio() -> None:
        pytest.fail(message or _NEEDS_PYTEST_ASYNCIO, pytrace=False)

    return pytest.fixture(needs_pytest_asyncio, name=name, scope=scope)


def _test_loop_scope(request: pytest.FixtureRequest) -> _Scope | None:
    """The loop scope pytest-asyncio runs the requesting test in (None: no
    async test, or a scope pytest-asyncio refuses itself)."""
    item = request.node
    if not _HAVE_LOOP_SCOPES or not pytest_asyncio.is_async_test(item):
        return None
    mark = item.get_closest_marker("asyncio")
    kwargs = mark.kwargs if mark is not None else {}
    scope = kwargs.get("loop_scope") or kwargs.get("scope")
    scope = scope or request.config.getini("asyncio_default_test_loop_scope")
    return cast(_Scope, scope) if scope in _SCOPES else None


_FOLLOWS_THE_TEST = _new_system_function()  # the plugin's own ``actor_system``
_FOLLOWS_THE_TEST.__doc__ = (
    "A fresh ActorSystem on the loop of the test that asks for it (any loop_scope), "
    "terminated after the test (atomr's plugin)."
)
_ON_LOOP = {scope: _new_system_function() for scope in _SCOPES}
if _HAVE_PYTEST_ASYNCIO:
    actor_system = pytest_asyncio.fixture(_FOLLOWS_THE_TEST, name="actor_system")
else:
    actor_system = _failing("actor_system", "function")
if _HAVE_LOOP_SCOPES:
    for _scope, _function in _ON_LOOP.items():
        pytest_asyncio.fixture(_function, loop_scope=_scope)  # marks the function


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    """Sets the plugin's ``actor_system`` up on the loop of the test that asks
    for it: pytest-asyncio (whose hook runs inside this one) reads the loop
    scope from the fixture function, so this lends it the function marked with
    the test's loop scope. A user's own ``actor_system`` is left alone, and so
    is this one under a pytest-asyncio older than 1.1 (which replaced the
    function when it collected the tests: the identity check fails)."""
    loop_scope = _test_loop_scope(request) if fixturedef.func is _FOLLOWS_THE_TEST else None
    if loop_scope is None:
        return (yield)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fixturedef, "func", _ON_LOOP[loop_scope])
        return (yield)
