"""examples/web_service.py: atomr inside an aiohttp server, driven in process
with aiohttp's TestServer / TestClient on pytest-asyncio's loop, and run as a
script (its self-test)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from atomr.testkit import await_condition

ROOT = Path(__file__).resolve().parents[2]


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "web_service_example", ROOT / "examples" / "web_service.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ws = _load_example()


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    """The example's app (ask deadline 0.2 s) on a TestServer; closed after the test."""
    server = TestServer(ws.make_app(ask_timeout=0.2))
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def client(server: TestServer) -> AsyncIterator[TestClient]:
    async with TestClient(server) as client:
        yield client


async def _call(client: TestClient, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with client.request(method, path, json=body) as answer:
        return answer.status, await answer.json()


def test_the_script_runs_its_self_test(run_example) -> None:
    out = run_example("web_service.py", "--self-test", timeout=60).splitlines()
    assert out[0].startswith("listening on http://127.0.0.1:")
    statuses = [line.split(" -> ")[1].split()[0] for line in out[2:-1]]
    assert out[1] == "50 concurrent increments -> True"
    assert statuses == ["200", "200", "404", "400", "400", "500", "200", "504", "200"]
    assert json.loads(out[-2].split(" -> 200 ")[1]) == {"actors": 2, "jobs": 3, "restarts": 1}
    assert out[-1] == "shut down cleanly"


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "web_service.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("port", ["-5", "70000"])
def test_a_port_out_of_range_is_one_usage_line(port: str) -> None:
    """It was a traceback (socket.gaierror) from deep inside aiohttp."""
    result = _script("--port", port, "--self-test")
    assert result.returncode == 2, result.stderr
    assert f"error: --port must be in 0..65535 (0: any free port), got {port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_one_error_line() -> None:
    """It was a traceback (OSError: address already in use)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _script("--port", str(port), "--self-test")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"web_service.py: error: cannot listen on 127.0.0.1:{port}: "
    ), result.stderr
    assert "address already in use" in lines[0]


@pytest.mark.parametrize(
    ("ask_timeout", "error", "needle"),
    [
        (0, ValueError, "ask_timeout must be a positive number of seconds, got 0"),
        (-1.0, ValueError, "must be a positive number of seconds, got -1.0"),
        (float("nan"), ValueError, "must be a positive number of seconds, got nan"),
        (10**400, ValueError, "ask_timeout is too large"),
        (True, TypeError, "ask_timeout must be a number of seconds, got True"),
        ("2", TypeError, "ask_timeout must be a number of seconds, got '2'"),
        (None, TypeError, "ask_timeout must be a number of seconds, got None"),
    ],
    ids=["zero", "negative", "nan", "huge", "bool", "str", "None"],
)
def test_make_app_refuses_a_bad_ask_timeout(ask_timeout: Any, error: type, needle: str) -> None:
    with pytest.raises(error) as info:
        ws.make_app(ask_timeout=ask_timeout)
    assert needle in str(info.value)


@pytest.mark.parametrize("ask_timeout", [1, np.float32(0.5), np.int64(3)])
def test_make_app_takes_any_positive_real_number(ask_timeout: Any) -> None:
    assert ws.make_app(ask_timeout=ask_timeout)[ws.TIMEOUT] == float(ask_timeout)


async def test_many_concurrent_requests_are_answered_correctly(client: TestClient) -> None:
    keys, per_key = ["a", "b", "c", "d"], 50
    answers = await asyncio.gather(
        *(_call(client, "POST", f"/kv/{k}/incr", {"by": 1}) for k in keys for _ in range(per_key))
    )
    assert {status for status, _ in answers} == {200}
    for key in keys:  # each increment saw a distinct count: none lost, none doubled
        values = sorted(body["value"] for _, body in answers if body["key"] == key)
        assert values == list(range(1, per_key + 1))
        assert await _call(client, "GET", f"/kv/{key}") == (200, {"key": key, "value": per_key})


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("PUT", "/kv/k", [1, 2], 400, "body must be a JSON object"),
        ("PUT", "/kv/k", {"val": 1}, 400, "body must have 'value'"),
        ("POST", "/kv/k/incr", {"by": 1.5}, 400, "'by' must be int, got 1.5"),
        ("POST", "/kv/k/incr", {"by": True}, 400, "'by' must be int, got true"),
        ("POST", "/work", {"seconds": -1}, 400, "'seconds' must be in [0, 60.0], got -1"),
        ("POST", "/work", {"seconds": 0, "fail": "yes"}, 400, "'fail' must be bool"),
        ("GET", "/kv/nothing", None, 404, "no key 'nothing'"),
    ],
)
async def test_bad_input_is_a_400_and_an_unknown_key_a_404(
    client: TestClient, method: str, path: str, body: Any, status: int, error: str
) -> None:
    answer_status, answer = await _call(client, method, path, body)
    assert (answer_status, answer["error"][: len(error)]) == (status, error)


async def test_a_body_that_is_not_json_is_a_400(client: TestClient) -> None:
    async with client.post("/kv/k/incr", data=b"{not json") as answer:
        assert answer.status == 400
        assert (await answer.json())["error"].startswith("body is not JSON")


async def test_an_actor_refusing_bad_input_keeps_its_state(client: TestClient) -> None:
    assert (await _call(client, "PUT", "/kv/k", {"value": "text"}))[0] == 200
    status, answer = await _call(client, "POST", "/kv/k/incr", {"by": 1})
    assert (status, answer["error"]) == (400, "'k' holds str, not an int")
    assert await _call(client, "GET", "/kv/k") == (200, {"key": "k", "value": "text"})


async def test_an_ask_that_times_out_is_a_504_and_the_server_stays_healthy(
    client: TestClient,
) -> None:
    async with asyncio.timeout(10):  # the job takes 60 s; the ask's deadline is 0.2 s
        status, answer = await _call(client, "POST", "/work", {"seconds": 60})
    assert (status, answer) == (504, {"error": "no answer in time"})
    assert await _call(client, "GET", "/health") == (200, {"actors": 2, "jobs": 1, "restarts": 0})
    assert (await _call(client, "POST", "/kv/x/incr", {"by": 2}))[1]["value"] == 2


async def test_a_failing_actor_is_a_500_and_supervision_restarts_it(client: TestClient) -> None:
    status, answer = await _call(client, "POST", "/work", {"seconds": 0, "fail": True})
    assert (status, answer) == (500, {"error": "internal error (RuntimeError)"})
    status, answer = await _call(client, "POST", "/work", {"seconds": 0})
    assert (status, answer) == (200, {"slept": 0.0, "restarts": 1})  # a new instance answered
    assert await _call(client, "GET", "/health") == (200, {"actors": 2, "jobs": 2, "restarts": 1})


def _atomr_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("atomr")}


async def test_shutdown_answers_a_request_in_flight_and_leaves_nothing_behind() -> None:
    tasks_before, threads_before = asyncio.all_tasks(), _atomr_threads()
    app = ws.make_app(ask_timeout=60.0)  # the in-flight ask would wait a minute
    server = TestServer(app)
    async with TestClient(server) as client:
        in_flight = asyncio.create_task(_call(client, "POST", "/work", {"seconds": 60}))
        await await_condition(lambda: app[ws.STATS]["jobs"] == 1, message="the job started")
        system = app[ws.SYSTEM]
        async with asyncio.timeout(10):
            await server.close()  # aiohttp: on_shutdown, wait for handlers, cleanup
            status, answer = await in_flight
    assert (status, answer) == (503, {"error": "shutting down"})
    assert system.is_terminated and system.actors == []
    left = asyncio.all_tasks() - tasks_before - {asyncio.current_task()}
    assert left == set(), left
    assert _atomr_threads() <= threads_before
