"""atomr inside an aiohttp service: the actor system lives on the server's loop.

The application's `cleanup_ctx` starts an `ActorSystem` on the loop aiohttp
runs (no loop, thread or signal handler of atomr's own), spawns a key-value
store and a worker, and terminates the system when the server is cleaned up;
`on_shutdown` terminates it first, so a request still waiting on an actor is
answered at once (503) instead of holding the shutdown. Every handler asks
with a deadline, and one middleware maps errors to HTTP statuses: bad input
400, unknown key 404, an actor that failed 500 (it is restarted by
supervision), an ask that timed out 504, the system shutting down 503.

Routes: `GET /health`, `GET /kv/{key}`, `PUT /kv/{key}` (`{"value": ...}`),
`POST /kv/{key}/incr` (`{"by": int}`), `POST /work` (`{"seconds": s,
"fail": bool}`: the worker sleeps s seconds, then fails if asked to).

Run: python examples/web_service.py --port 8080   (serves until Ctrl-C)
     python examples/web_service.py --self-test   (needs aiohttp: the [test] extra)

Prints (self-test): "listening on http://127.0.0.1:<port>", one line per
request ("PUT /kv/greeting -> 200 {...}", ...) and "shut down cleanly".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import numbers
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientSession, web

import atomr
from atomr import (
    Actor,
    ActorRef,
    ActorStoppedError,
    ActorSystem,
    AskTimeoutError,
    Failure,
    Props,
)

logger = logging.getLogger("web_service")

ASK_TIMEOUT = 2.0  # seconds a handler waits for an actor (the 504 deadline)
TERMINATE_TIMEOUT = 5.0  # seconds the shutdown waits for the actors to stop
MAX_JOB_SECONDS = 60.0


class BadInput(Exception):
    """The request is malformed (HTTP 400), found by a handler or an actor."""


class NotFound(Exception):
    """No such key (HTTP 404)."""


# ---------------------------------------------------------------- the actors


@dataclass(frozen=True)
class Get:
    key: str


@dataclass(frozen=True)
class Put:
    key: str
    value: Any


@dataclass(frozen=True)
class Incr:
    key: str
    by: int


class KeyValueStore(Actor):
    """A dict owned by one actor: concurrent requests are serialized by its mailbox."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, Any] = {}

    def receive(self, message: Get | Put | Incr) -> Any:
        if isinstance(message, Put):
            self.data[message.key] = message.value
            return message.value
        if isinstance(message, Get):
            if message.key not in self.data:
                return Failure(NotFound(f"no key {message.key!r}"))
            return self.data[message.key]
        value = self.data.get(message.key, 0)
        if type(value) is not int:  # bad input: answer 400, keep the state
            return Failure(BadInput(f"{message.key!r} holds {type(value).__name__}, not an int"))
        self.data[message.key] = value + message.by
        return value + message.by


@dataclass(frozen=True)
class Job:
    seconds: float
    fail: bool = False


class Worker(Actor):
    """Sleeps, then answers or fails; `stats` (shared by its restarts) counts
    the jobs started and the restarts."""

    def __init__(self, stats: dict[str, int]) -> None:
        super().__init__()
        self.stats = stats

    def post_restart(self, error: BaseException) -> None:
        self.stats["restarts"] += 1

    async def receive(self, job: Job) -> dict[str, Any]:
        self.stats["jobs"] += 1
        await asyncio.sleep(job.seconds)  # stands for real work
        if job.fail:
            raise RuntimeError("the job failed")  # the asker gets it; supervision restarts
        return {"slept": job.seconds, "restarts": self.stats["restarts"]}


# ---------------------------------------------------------------- the app

SYSTEM = web.AppKey("system", ActorSystem)
STORE = web.AppKey("store", ActorRef)
WORKER = web.AppKey("worker", ActorRef)
STATS = web.AppKey("stats", dict[str, int])
TIMEOUT = web.AppKey("ask_timeout", float)


async def actor_system(app: web.Application) -> AsyncIterator[None]:
    """`cleanup_ctx`: the system on the server's running loop, terminated at cleanup."""
    async with ActorSystem("web", terminate_timeout=TERMINATE_TIMEOUT) as system:
        app[SYSTEM] = system
        app[STATS] = {"jobs": 0, "restarts": 0}
        app[STORE] = system.spawn(Props(KeyValueStore), name="store")
        app[WORKER] = system.spawn(Props(Worker, app[STATS]), name="worker")
        yield
    logger.info("actor system terminated")


async def stop_actors(app: web.Application) -> None:
    """`on_shutdown` (before aiohttp waits for in-flight handlers): their asks
    end now with `ActorStoppedError` (503) instead of at their deadline."""
    await app[SYSTEM].terminate(TERMINATE_TIMEOUT)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, text: str) -> web.Response:
    return web.json_response({"error": text}, status=status)


@web.middleware
async def errors_to_status(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place where errors become HTTP statuses.

    Raises:
        web.HTTPException: aiohttp's own (an unknown route's 404, say), as they are.
    """
    try:
        return await handler(request)
    except BadInput as error:
        return _error(400, str(error))
    except NotFound as error:
        return _error(404, str(error))
    except AskTimeoutError:
        return _error(504, "no answer in time")
    except ActorStoppedError:
        return _error(503, "shutting down")
    except web.HTTPException:
        raise
    except Exception as error:  # an actor (or handler) failed: no details to the client
        logger.warning("%s %s failed: %r", request.method, request.path, error)
        return _error(500, f"internal error ({type(error).__name__})")


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The request's body, a JSON object.

    Raises:
        BadInput: for a body that is not one.
    """
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise BadInput(f"body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise BadInput("body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, *kinds: type, default: Any = ...) -> Any:
    """`body[name]`, which must be one of `kinds` (a bool only where bool is named).

    Raises:
        BadInput: if it is missing (and has no default) or of another type.
    """
    if name not in body and default is not ...:
        return default
    if name not in body:
        raise BadInput(f"body must have {name!r}")
    value = body[name]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise BadInput(f"{name!r} must be {names}, got {json.dumps(value)}")
    return value


async def ask(request: web.Request, ref: web.AppKey[ActorRef], message: Any) -> Any:
    """Ask one of the app's actors, with the app's deadline."""
    return await request.app[ref].ask(message, timeout=request.app[TIMEOUT])


async def health(request: web.Request) -> web.Response:
    """`GET /health`: the live actors, the worker's jobs and restarts."""
    stats = request.app[STATS]
    return web.json_response({"actors": len(request.app[SYSTEM].actors), **stats})


async def get_key(request: web.Request) -> web.Response:
    """`GET /kv/{key}`: its value (404 if unknown)."""
    key = request.match_info["key"]
    return web.json_response({"key": key, "value": await ask(request, STORE, Get(key))})


async def put_key(request: web.Request) -> web.Response:
    """`PUT /kv/{key}` with `{"value": any JSON}`: store it."""
    key, value = request.match_info["key"], _field(await _json_object(request), "value", object)
    return web.json_response({"key": key, "value": await ask(request, STORE, Put(key, value))})


async def incr_key(request: web.Request) -> web.Response:
    """`POST /kv/{key}/incr` with `{"by": int}`: add to an int (a missing key is 0)."""
    key, by = request.match_info["key"], _field(await _json_object(request), "by", int)
    return web.json_response({"key": key, "value": await ask(request, STORE, Incr(key, by))})


async def work(request: web.Request) -> web.Response:
    """`POST /work` with `{"seconds": s, "fail": bool}`: one job for the worker."""
    body = await _json_object(request)
    seconds = _field(body, "seconds", int, float)
    if not 0 <= seconds <= MAX_JOB_SECONDS:
        raise BadInput(f"'seconds' must be in [0, {MAX_JOB_SECONDS}], got {seconds}")
    job = Job(float(seconds), _field(body, "fail", bool, default=False))
    return web.json_response(await ask(request, WORKER, job))


def make_app(ask_timeout: float = ASK_TIMEOUT) -> web.Application:
    """The aiohttp application; its actors start when the server starts it.

    Raises:
        TypeError: if ``ask_timeout`` is not a real number (a bool or a
            string is not).
        ValueError: if it is not positive (NaN included) or too large for
            a float.
    """
    if not isinstance(ask_timeout, numbers.Real) or isinstance(ask_timeout, bool):
        raise TypeError(f"ask_timeout must be a number of seconds, got {ask_timeout!r}")
    try:
        seconds = float(ask_timeout)
    except OverflowError:
        raise ValueError("ask_timeout is too large for a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"ask_timeout must be a positive number of seconds, got {ask_timeout!r}")
    app = web.Application(middlewares=[errors_to_status])
    app[TIMEOUT] = seconds
    app.cleanup_ctx.append(actor_system)
    app.on_shutdown.append(stop_actors)
    app.router.add_get("/health", health)
    app.router.add_get("/kv/{key}", get_key)
    app.router.add_put("/kv/{key}", put_key)
    app.router.add_post("/kv/{key}/incr", incr_key)
    app.router.add_post("/work", work)
    return app


# ---------------------------------------------------------------- standalone

SELF_TEST = [
    ("PUT", "/kv/greeting", {"value": "hello"}),
    ("GET", "/kv/greeting", None),
    ("GET", "/kv/missing", None),
    ("POST", "/kv/greeting/incr", {"by": 1}),
    ("POST", "/kv/hits/incr", {"by": "one"}),
    ("POST", "/work", {"seconds": 0, "fail": True}),
    ("POST", "/work", {"seconds": 0}),
    ("POST", "/work", {"seconds": MAX_JOB_SECONDS}),
    ("GET", "/health", None),
]


async def self_test(url: str) -> None:
    """A few requests, printed as `METHOD PATH -> STATUS BODY`."""
    async with ClientSession(url) as session:
        answers = await asyncio.gather(
            *(session.post("/kv/hits/incr", json={"by": 1}) for _ in range(50))
        )
        hits = sorted([(await answer.json())["value"] for answer in answers])
        print(f"50 concurrent increments -> {hits == list(range(1, 51))}")
        for method, path, body in SELF_TEST:
            async with session.request(method, path, json=body) as answer:
                print(f"{method} {path} -> {answer.status} {await answer.text()}")


async def serve(host: str, port: int, ask_timeout: float, test: bool) -> None:
    """Serve `make_app` until SIGINT / SIGTERM (or, with `test`, run `self_test`)."""
    runner = web.AppRunner(make_app(ask_timeout))
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as error:  # the port is taken, the host unknown, ...
            raise SystemExit(
                f"web_service.py: error: cannot listen on {host}:{port}: {error}"
            ) from None
        url = "http://{}:{}".format(*runner.addresses[0][:2])
        print(f"listening on {url}", flush=True)
        if test:
            await self_test(url)
        else:
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):  # the service's handlers, not atomr's
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            await stop.wait()
    finally:
        await runner.cleanup()
    print("shut down cleanly")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=0, help="0: any free port (default)")
    parser.add_argument(
        "--ask-timeout",
        type=float,
        default=ASK_TIMEOUT,
        help="seconds a handler waits for an actor's answer, else 504 (default: %(default)s)",
    )
    parser.add_argument("--self-test", action="store_true", help="make a few requests and exit")
    args = parser.parse_args()
    if not args.ask_timeout > 0:
        parser.error("--ask-timeout must be > 0")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    logging.basicConfig(level=logging.ERROR)  # the 500's failure is expected in the self-test
    atomr.run(serve(args.host, args.port, args.ask_timeout, args.self_test))


if __name__ == "__main__":
    main()
