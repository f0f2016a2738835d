"""Many sessions on one event loop: how long a request holds the loop (issue 14).

    uv run --frozen python -m benchmarks.load [--sizes 1000,4000] [--sessions 1,10]

N sessions (1, 10, 100) run concurrently on one asyncio loop beside a *ticker*, a task
that sleeps 1 ms at a time and records how late each wake-up is (its *lag*: wall time
since the previous wake-up minus 1 ms). A request that computes for 300 ms between two
awaits makes the ticker 300 ms late; one that yields every few milliseconds does not.
Reported per history size and number of sessions: the ticker's maximum and p99 lag, the
requests completed per second (all sessions together) and the p99 wall time of one
request (call to return, waiting for the loop included).

The ticker's lag is wall time: on a busy machine it also counts the time the operating
system gave this process's CPU to others. So the run also times every callback the loop
runs (``asyncio.Handle._run``: one step of a task), in wall time and in this thread's CPU
time; the longest *hold* in CPU time is what the module alone costs the loop, whatever
else the machine runs. (With N sessions busy at once, the ticker waits for up to about
two rounds of the others' holds: asyncio runs every callback that was ready when an
iteration started before it looks at its timers again.)

Each session repeats a cycle (starting new ones for ``DURATION`` seconds, at least one): its store goes back to the freshly loaded state (no sticky
decisions, no cached forms: what ``clear`` + ``set_messages`` of the same history leaves,
without re-admitting it), then one request compacts (``get_messages_for_request`` with a
budget of half the history's estimated tokens: the benchmark's first-compaction request)
and ``STICKY`` more requests reuse that compaction (sticky reuse, nothing new to decide).
In the *negotiated* rows the compacting request is ``get_measured_request_view``
(``token_meter: "actual"``) whose ``count_view`` answers at once (see ``_count_view``),
and its transaction is committed.

Memory: the sessions of one size share one admitted history (a store's requests never
change its history, and nothing is admitted during the run), as sessions resumed from the
same transcript would hold equal ones. A private copy per session costs what ``make
bench``'s "memory: history" row shows per store (about 60 MB at 16k messages, so 6 GB for
100 sessions); shared, 100 sessions x 16k messages fit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Self

from amplifier_module_context_simple import SimpleContextManager
from benchmarks import histories

TICK: Final = 0.001
"""The ticker's sleep."""
SIZES: Final = (1_000, 4_000, 16_000)
SESSIONS: Final = (1, 10, 100)
STICKY: Final = 3
"""Sticky-reuse requests after each compacting request."""
BUDGET_FRACTION: Final = 0.5
"""The compacting request's budget: this fraction of the history's estimated tokens."""
DURATION: Final = 1.5
"""Seconds per row: every session starts cycles until then (and runs at least one)."""
FREEZE = True
"""``gc.freeze()`` once the sessions are loaded (``--no-freeze``: leave them to the
collector)."""
NEGOTIATED_SIZES: Final = (16_000,)
NEGOTIATED_SESSIONS: Final = (1, 10)


@dataclass(frozen=True)
class LoadResult:
    """One row: ``sessions`` concurrent sessions on ``n``-message histories."""

    n: int
    sessions: int
    kind: str
    """``ordinary`` or ``negotiated`` (the compacting request's path)."""
    requests: int
    seconds: float
    lag_max: float
    lag_p99: float
    hold_wall: float
    """The longest single callback of the loop, wall time."""
    hold_cpu: float
    """The longest single callback of the loop, this thread's CPU time."""
    hold_own: float
    """The longest single callback, wall time, less the collector's passes inside it."""
    collector: float
    """The longest pass of the cyclic garbage collector."""
    latency_p99: float
    compacting_p50: float
    """Median wall time of the compacting requests."""
    ticks: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    clock = time.perf_counter
    last = clock()
    while not stop.is_set():
        await asyncio.sleep(TICK)
        now = clock()
        lags.append(max(0.0, now - last - TICK))
        last = now


class _Holds:
    """Times every callback the asyncio loop runs (while installed): the longest, in wall
    and in CPU time, and the longest without the cyclic collector's passes inside it."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.own = 0.0
        """The longest callback's wall time minus the collector's passes inside it."""
        self.collector = 0.0
        """The longest collector pass."""
        self._in_collector = 0.0
        self._started = 0.0
        self._original = asyncio.events.Handle._run

    def _on_collect(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            spent = time.perf_counter() - self._started
            self._in_collector += spent
            self.collector = max(self.collector, spent)

    def __enter__(self) -> Self:
        original = self._original
        holds = self

        def timed(handle: asyncio.events.Handle) -> None:
            collected = holds._in_collector
            wall, cpu = time.perf_counter(), time.thread_time()
            original(handle)
            cpu = time.thread_time() - cpu
            wall = time.perf_counter() - wall
            holds.wall = max(holds.wall, wall)
            holds.cpu = max(holds.cpu, cpu)
            holds.own = max(holds.own, wall - (holds._in_collector - collected))

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        gc.callbacks.append(self._on_collect)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]
        gc.callbacks.remove(self._on_collect)


def _fresh(store: SimpleContextManager) -> None:
    """Back to the freshly loaded state: no decisions, no cached forms or views (the
    store's own reset, as ``clear`` + ``set_messages`` of the same list would leave it)."""
    store._reset(store._history)


def _count_view(per_message: float) -> Any:
    """An instant provider count: ``per_message`` tokens per message of the view (a
    removal lowers it, a truncation does not: a simulation, O(1) per count)."""

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        count = int(len(view) * per_message)
        return {
            "dispatch": None,
            "budget_decision": {
                "estimated_input_tokens": count,
                "input_limit_tokens": 10**12,
                "measurement": {"kind": "provider_count", "source": "bench", "input_tokens": count},
            },
        }

    return count_view


async def _session(
    store: SimpleContextManager,
    kind: str,
    budget: int,
    per_message: float,
    deadline: float,
    latencies: list[float],
    compacting: list[float],
) -> None:
    clock = time.perf_counter
    count_view = _count_view(per_message)
    first = True
    while first or clock() < deadline:
        first = False
        _fresh(store)
        start = clock()
        if kind == "ordinary":
            await store.get_messages_for_request(token_budget=budget)
        else:
            result = await store.get_measured_request_view(
                provider=None, retain_contents=[], count_view=count_view
            )
            transaction = result["transaction"]
            assert transaction is not None and await transaction.commit(), result["outcome"]
        elapsed = clock() - start
        latencies.append(elapsed)
        compacting.append(elapsed)
        assert store.last_compaction_stats is not None, "the cycle's first request must compact"
        stats = store.last_compaction_stats
        for _ in range(STICKY):
            start = clock()
            await store.get_messages_for_request(token_budget=budget)
            latencies.append(clock() - start)
        assert store.last_compaction_stats is stats, "a sticky request compacted again"


async def _stores(n: int, sessions: int, kind: str) -> tuple[list[SimpleContextManager], int]:
    """``sessions`` stores sharing one admitted ``n``-message history; the history's
    estimated tokens."""
    template = SimpleContextManager()
    await template.set_messages(histories.history(n))
    shared = template._history
    stores = []
    for _ in range(sessions):
        store = SimpleContextManager(token_meter="actual" if kind == "negotiated" else "estimate")
        store._reset(shared)
        stores.append(store)
    return stores, sum(entry.tokens for entry in shared.entries)


async def run_row(n: int, sessions: int, kind: str = "ordinary") -> LoadResult:
    stores, tokens = await _stores(n, sessions, kind)
    budget = int(tokens * BUDGET_FRACTION)
    per_message = tokens / n
    # warm up once (first-request one-offs), outside the measurement
    await _session(stores[0], kind, budget, per_message, 0.0, [], [])
    # what a long-running host does with its long-lived state: keep it out of the
    # collector's full passes (see the module docstring)
    gc.collect()
    if FREEZE:
        gc.freeze()
    lags: list[float] = []
    latencies: list[float] = []
    compacting: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.ensure_future(_ticker(lags, stop))
    await asyncio.sleep(10 * TICK)
    del lags[:]
    start = time.perf_counter()
    deadline = start + DURATION
    with _Holds() as holds:
        await asyncio.gather(
            *(
                _session(s, kind, budget, per_message, deadline, latencies, compacting)
                for s in stores
            )
        )
    seconds = time.perf_counter() - start
    stop.set()
    await ticker
    if FREEZE:
        gc.unfreeze()
    return LoadResult(
        n=n,
        sessions=sessions,
        kind=kind,
        requests=len(latencies),
        seconds=seconds,
        lag_max=max(lags),
        lag_p99=_p99(lags),
        hold_wall=holds.wall,
        hold_cpu=holds.cpu,
        hold_own=holds.own,
        collector=holds.collector,
        latency_p99=_p99(latencies),
        compacting_p50=statistics.median(compacting),
        ticks=len(lags),
    )


async def measure(
    sizes: Sequence[int] = SIZES,
    sessions: Sequence[int] = SESSIONS,
    negotiated_sizes: Sequence[int] = NEGOTIATED_SIZES,
    negotiated_sessions: Sequence[int] = NEGOTIATED_SESSIONS,
) -> list[LoadResult]:
    results = []
    for count in sessions:
        for n in sizes:
            results.append(await run_row(n, count))
            gc.collect()
    for count in negotiated_sessions:
        for n in negotiated_sizes:
            results.append(await run_row(n, count, "negotiated"))
            gc.collect()
    return results


def run(
    sizes: Sequence[int] = SIZES,
    sessions: Sequence[int] = SESSIONS,
    negotiated_sizes: Sequence[int] = NEGOTIATED_SIZES,
    negotiated_sessions: Sequence[int] = NEGOTIATED_SESSIONS,
) -> list[LoadResult]:
    for n in {*sizes, *negotiated_sizes}:
        histories.history(n)
    gc.collect()
    gc.freeze()  # the benchmark's own data (the histories), as benchmarks.timing does
    return asyncio.run(measure(sizes, sessions, negotiated_sizes, negotiated_sessions))


def peak_rss_mb() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def describe(result: LoadResult) -> str:
    return (
        f"{result.kind:<10} {result.sessions:>3} x {result.n:>6,}: lag max "
        f"{result.lag_max * 1e3:8.1f} ms, p99 {result.lag_p99 * 1e3:7.1f} ms, hold "
        f"{result.hold_wall * 1e3:7.1f} / cpu {result.hold_cpu * 1e3:7.1f} / own "
        f"{result.hold_own * 1e3:6.1f} ms, gc {result.collector * 1e3:6.1f} ms, "
        f"{result.ticks} ticks | "
        f"{result.rate:8.1f} req/s, p99 {result.latency_p99 * 1e3:8.1f} ms | compacting p50 "
        f"{result.compacting_p50 * 1e3:7.1f} ms | {result.requests} requests, "
        f"{result.seconds:.1f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--sessions", default=",".join(map(str, SESSIONS)))
    parser.add_argument("--negotiated", default=",".join(map(str, NEGOTIATED_SESSIONS)))
    parser.add_argument("--no-freeze", action="store_true")
    args = parser.parse_args(argv)
    global FREEZE
    FREEZE = not args.no_freeze
    sizes = [int(s) for s in args.sizes.split(",") if s]
    sessions = [int(s) for s in args.sessions.split(",") if s]
    negotiated = [int(s) for s in args.negotiated.split(",") if s]
    for result in run(sizes, sessions, NEGOTIATED_SIZES, negotiated):
        print(describe(result))
    print(f"peak RSS {peak_rss_mb():,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
