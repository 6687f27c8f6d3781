"""Load and soak scenarios for the actor runtime, shared by `tests/stress/`
and `benchmarks/soak.py` (the full-size form).

Each scenario runs inside a running event loop on a given `ActorSystem`,
checks its own invariants (returned as a report whose `errors` list must be
empty) and returns the figures it measured. Nothing here asserts a timing.

- `message_exchange`: actors pass tokens to pseudo-random peers; every
  message carries a per-(sender, receiver) sequence number, so a lost,
  duplicated or reordered message is detected where it arrives, and the
  per-pair totals are compared at the end.
- `concurrent_asks`: many asks in flight at once, some to actors that answer
  too late or never, each with its own timeout: every ask ends exactly once,
  with the right answer or an `AskTimeoutError`.
- `supervision_storm`: workers fail at random while they are told work; a
  ping actor must keep answering, every message reaches a worker exactly once
  (failing messages included), and tracemalloc shows flat memory across
  rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from atomr import (
    Actor,
    ActorRef,
    ActorSystem,
    AskTimeoutError,
    Directive,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)

__all__ = [
    "FULL",
    "Report",
    "concurrent_asks",
    "message_exchange",
    "quiet_runtime_logs",
    "supervision_storm",
]

FULL = os.environ.get("ATOMR_STRESS_FULL") == "1"
"""True when the full-size form is asked for (`ATOMR_STRESS_FULL=1`)."""


@dataclass
class Report:
    """What a scenario measured.

    Attributes:
        name: the scenario.
        figures: numbers to print (counts, seconds, rates, bytes).
        errors: broken invariants; empty when everything held.
    """

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def quiet_runtime_logs() -> Iterator[None]:
    """Silence the runtime's per-failure warnings for the duration (a storm
    logs thousands; captured log records would also skew tracemalloc)."""
    logger = logging.getLogger("atomr.actor")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.CRITICAL)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(level)
        logger.propagate = propagate


# ---------------------------------------------------------------- exchange


@dataclass(frozen=True, slots=True)
class _Peers:
    refs: tuple[ActorRef, ...]
    collector: ActorRef


@dataclass(frozen=True, slots=True)
class _Counts:
    """Ask an exchange actor for its per-peer sent and received counts."""


class _Exchanger(Actor):
    """Receives `(src, seq, token, hops)` tuples, checks `seq`, forwards."""

    def __init__(self, index: int, n: int) -> None:
        super().__init__()
        self.index = index
        self.sent = [0] * n
        self.received = [0] * n
        self.total = 0
        self.errors: list[str] = []
        self.rng = random.Random(index)
        self.peers: tuple[ActorRef, ...] = ()
        self.collector: ActorRef | None = None

    def receive(self, message: Any) -> Any:
        """Check and forward a token; answer `_Peers` and `_Counts`."""
        if message.__class__ is tuple:
            src, seq, token, hops = message
            expected = self.received[src]
            if seq != expected:
                kind = "duplicate/reorder" if seq < expected else "gap (loss)"
                if len(self.errors) < 10:
                    self.errors.append(
                        f"actor {self.index}: from {src} got seq {seq}, expected {expected} ({kind})"
                    )
            self.received[src] = seq + 1
            self.total += 1
            if hops > 1:
                self._send(token, hops - 1)
            else:
                assert self.collector is not None
                self.collector.tell(token)
            return None
        if isinstance(message, _Peers):
            self.peers, self.collector = message.refs, message.collector
            return None
        if isinstance(message, _Counts):
            return list(self.sent), list(self.received), self.total, list(self.errors)
        return None

    def _send(self, token: int, hops: int) -> None:
        dst = self.rng.randrange(len(self.peers))
        seq = self.sent[dst]
        self.sent[dst] = seq + 1
        self.peers[dst].tell((self.index, seq, token, hops))


@dataclass(frozen=True, slots=True)
class _Start:
    tokens: range
    hops: int


class _StartableExchanger(_Exchanger):
    def receive(self, message: Any) -> Any:
        """Also answer `_Start`: inject tokens into the ring."""
        if isinstance(message, _Start):
            for token in message.tokens:
                self._send(token, message.hops)
            return None
        return super().receive(message)


class _Collector(Actor):
    """Counts finished tokens; resolves `done` when all have finished once."""

    def __init__(self, n_tokens: int, done: asyncio.Future[None]) -> None:
        super().__init__()
        self.seen = bytearray(n_tokens)
        self.left = n_tokens
        self.duplicates = 0
        self.done = done

    def receive(self, message: Any) -> Any:
        """Record a finished token id; `None` asks for the duplicate count."""
        if message is None:
            return self.duplicates
        if self.seen[message]:
            self.duplicates += 1
        else:
            self.seen[message] = 1
            self.left -= 1
            if self.left == 0 and not self.done.done():
                self.done.set_result(None)
        return None


async def message_exchange(
    system: ActorSystem, n_actors: int, n_messages: int, tokens_per_actor: int = 10
) -> Report:
    """`n_actors` actors exchange about `n_messages` messages; nothing may be
    lost, duplicated or reordered between any pair.

    Args:
        system: where to spawn.
        n_actors: number of exchanging actors.
        n_messages: messages to exchange in total (rounded to tokens x hops).
        tokens_per_actor: tokens each actor injects (the concurrency).

    Returns:
        The report: messages, seconds, messages per second, errors.
    """
    report = Report("message_exchange")
    n_tokens = n_actors * tokens_per_actor
    hops = max(1, n_messages // n_tokens)
    expected = n_tokens * hops
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    collector = system.spawn(Props(_Collector, n_tokens, done))
    refs = tuple(system.spawn(Props(_StartableExchanger, i, n_actors)) for i in range(n_actors))
    for ref in refs:
        ref.tell(_Peers(refs, collector))
    dead_before = system.dead_letters.count
    t0 = time.perf_counter()
    for i, ref in enumerate(refs):
        ref.tell(_Start(range(i * tokens_per_actor, (i + 1) * tokens_per_actor), hops))
    await asyncio.wait_for(done, timeout=max(60.0, expected / 50_000))
    elapsed = time.perf_counter() - t0
    duplicates = await collector.ask(None)
    sent_tot = [0] * n_actors  # sent[i][j] must equal received[j][i]
    total = 0
    counts = [await ref.ask(_Counts()) for ref in refs]
    for j, (_sent, received, got, errors) in enumerate(counts):
        total += got
        report.errors.extend(errors)
        for i in range(n_actors):
            if counts[i][0][j] != received[i]:
                report.errors.append(
                    f"pair {i}->{j}: sent {counts[i][0][j]}, received {received[i]}"
                )
                break
        sent_tot[j] = sum(_sent)
    if total != expected:
        report.errors.append(f"{total} messages received, {expected} sent")
    if sum(sent_tot) != expected:
        report.errors.append(f"{sum(sent_tot)} messages sent, {expected} expected")
    if duplicates:
        report.errors.append(f"{duplicates} tokens finished twice")
    report.figures = {
        "actors": n_actors,
        "messages": total,
        "seconds": round(elapsed, 3),
        "messages_per_s": round(total / elapsed),
        "dead_letters": system.dead_letters.count - dead_before,
    }
    await asyncio.gather(*(ref.stop() for ref in (*refs, collector)))
    return report


# -------------------------------------------------------------------- asks


class _Echo(Actor):
    """Answers `n` with `2 * n`."""

    def receive(self, message: Any) -> Any:
        """Double the number."""
        return 2 * message


class _Late(Actor):
    """Answers after `delay` seconds (a deferred reply), or never if None."""

    def __init__(self, delay: float | None) -> None:
        super().__init__()
        self.delay = delay
        self.held: list[Any] = []

    def receive(self, message: Any) -> Any:
        """Defer the answer."""
        reply = self.context.defer()
        if self.delay is None:
            self.held.append(reply)  # never answered while the actor lives
        else:
            asyncio.get_running_loop().call_later(self.delay, reply.set_result, 2 * message)
        return None


async def concurrent_asks(system: ActorSystem, n_asks: int, n_echo: int = 50) -> Report:
    """`n_asks` asks in flight at once: 80 % to echo actors (must answer
    correctly), 10 % to an actor answering after 0.3 s with a 0.05 s timeout
    and 10 % to one that never answers (both must raise `AskTimeoutError`).

    Args:
        system: where to spawn.
        n_asks: asks to start concurrently.
        n_echo: number of echo actors.

    Returns:
        The report: answers, timeouts, seconds, errors.
    """
    report = Report("concurrent_asks")
    echoes = [system.spawn(Props(_Echo)) for _ in range(n_echo)]
    late = system.spawn(Props(_Late, 0.3))
    never = system.spawn(Props(_Late, None))
    rng = random.Random(1)
    kinds = [rng.random() for _ in range(n_asks)]

    async def one(i: int, kind: float) -> tuple[int, Any]:
        try:
            if kind < 0.8:
                return 0, await echoes[i % n_echo].ask(i, timeout=120.0)
            target = late if kind < 0.9 else never
            return 1, await target.ask(i, timeout=0.05)
        except AskTimeoutError:
            return 2, None

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, k) for i, k in enumerate(kinds)))
    elapsed = time.perf_counter() - t0
    answers = timeouts = 0
    for i, (k, (kind, value)) in enumerate(zip(kinds, results, strict=True)):
        if k < 0.8:
            if kind != 0 or value != 2 * i:
                report.errors.append(f"ask {i} to an echo got {kind, value}")
            answers += 1
        else:
            if kind != 2:
                report.errors.append(f"ask {i} to a slow actor did not time out: {value!r}")
            timeouts += 1
    await asyncio.sleep(0.35)  # the late replies arrive after their asks gave up: harmless
    still = await echoes[0].ask(21, timeout=10.0)
    if still != 42:
        report.errors.append("echo broken after the late replies")
    report.figures = {
        "asks": n_asks,
        "answered": answers,
        "timed_out": timeouts,
        "seconds": round(elapsed, 3),
        "asks_per_s": round(n_asks / elapsed),
    }
    await asyncio.gather(*(r.stop() for r in (*echoes, late, never)))
    return report


# ------------------------------------------------------------------- storm


class _Tally(Actor):
    """Counts the work messages the workers received (never fails)."""

    def __init__(self, n_messages: int) -> None:
        super().__init__()
        self.seen = bytearray(n_messages)
        self.duplicates = 0

    def receive(self, message: Any) -> Any:
        """Record a message id; `None` asks for `(received, duplicates)`."""
        if message is None:
            return sum(self.seen), self.duplicates
        if self.seen[message]:
            self.duplicates += 1
        self.seen[message] = 1
        return None


class _Flaky(Actor):
    """Reports each message to the tally, then fails for a fraction `p` of them."""

    def __init__(self, tally: ActorRef, p: float) -> None:
        super().__init__()
        self.tally = tally
        self.threshold = int(p * 1_000_003)
        self.ballast = bytearray(1024)  # state a leak on restart would keep

    def receive(self, message: Any) -> Any:
        """Report, then fail for a pseudo-random `p` of the message ids."""
        self.tally.tell(message)
        if (message * 2_654_435_761) % 1_000_003 < self.threshold:
            raise RuntimeError(f"injected failure on {message}")
        return None


@dataclass(frozen=True, slots=True)
class _Alive:
    """Ask the boss how many of its workers are alive."""


class _Boss(Actor):
    """Parent of the flaky workers: restarts them, without limit."""

    def __init__(self, n_workers: int, tally: ActorRef, p: float, restarts: list[int]) -> None:
        super().__init__()
        self.n_workers, self.tally, self.p = n_workers, tally, p
        self.restarts = restarts
        self.workers: list[ActorRef] = []
        self.round = 0

    def pre_start(self) -> None:
        """Spawn the workers."""
        self.workers = [
            self.context.spawn(Props(_Flaky, self.tally, self.p), name=f"w{i}")
            for i in range(self.n_workers)
        ]

    def supervisor_strategy(self) -> SupervisorStrategy:
        """Restart any failed worker (counting the restarts)."""

        def decider(error: BaseException) -> Directive:
            self.restarts[0] += 1
            return Directive.RESTART

        return OneForOneStrategy(decider=decider)

    def receive(self, message: Any) -> Any:
        """`range` of message ids: spread over the workers; `_Alive`: count live ones."""
        if isinstance(message, _Alive):
            return sum(w.is_alive for w in self.workers)
        workers = self.workers
        n = len(workers)
        for i in message:
            workers[i % n].tell(i)
        return None


async def supervision_storm(
    system: ActorSystem,
    n_workers: int,
    n_messages: int,
    rounds: int = 5,
    failure_rate: float = 0.05,
) -> Report:
    """Workers fail at random while told `n_messages` per round.

    Memory is measured with tracemalloc after a warm-up round and after the
    last round; between rounds a ping actor is asked (its latency printed).

    Args:
        system: where to spawn.
        n_workers: flaky workers under one supervisor.
        n_messages: work messages per round.
        rounds: rounds after the warm-up.
        failure_rate: probability that a message makes its worker fail.

    Returns:
        The report: failures, restarts, ping latencies, memory growth, errors.
    """
    report = Report("supervision_storm")
    ping = system.spawn(Props(_Echo))
    total = n_messages * (rounds + 1)
    tally = system.spawn(Props(_Tally, total))
    restarts = [0]
    boss = system.spawn(Props(_Boss, n_workers, tally, failure_rate, restarts))
    pings: list[float] = []
    mem: list[int] = []
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        for r in range(rounds + 1):
            boss.tell(range(r * n_messages, (r + 1) * n_messages))
            # while the storm runs: the system must keep answering
            round_deadline = time.monotonic() + 120.0
            while True:
                p0 = time.perf_counter()
                if await ping.ask(r, timeout=30.0) != 2 * r:
                    report.errors.append("ping answered wrongly")
                pings.append(time.perf_counter() - p0)
                received, _dup = await tally.ask(None, timeout=30.0)
                if received >= (r + 1) * n_messages:
                    break
                if time.monotonic() > round_deadline:
                    report.errors.append(f"round {r}: {received} messages handled after 120 s")
                    break
                await asyncio.sleep(0.01)  # the pause between two pings of the storm
            gc.collect()
            mem.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    received, duplicates = await tally.ask(None, timeout=30.0)
    if received != total:
        report.errors.append(f"{received} of {total} work messages reached a worker")
    if duplicates:
        report.errors.append(f"{duplicates} work messages arrived twice")
    if restarts[0] == 0:
        report.errors.append("no worker failed: the storm did not happen")
    workers_alive = await boss.ask(_Alive(), timeout=30.0)
    if workers_alive != n_workers:
        report.errors.append(f"{workers_alive} of {n_workers} workers alive after the storm")
    growth = mem[-1] - mem[0]
    report.figures = {
        "workers": n_workers,
        "messages": total,
        "failure_rate": failure_rate,
        "restarts": restarts[0],
        "seconds": round(elapsed, 3),
        "ping_asks": len(pings),
        "ping_max_ms": round(max(pings) * 1e3, 2),
        "ping_median_ms": round(sorted(pings)[len(pings) // 2] * 1e3, 3),
        "traced_bytes_after_warmup": mem[0],
        "traced_bytes_at_end": mem[-1],
        "growth_bytes": growth,
    }
    await asyncio.gather(boss.stop(), tally.stop(), ping.stop())
    return report
