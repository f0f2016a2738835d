"""Many sessions on one event loop: how long a request holds the loop (issue 14).

    uv run --frozen python -m benchmarks.load [--sizes 1000,16000] [--sessions 1,10]

N sessions (1, 10, 100) run concurrently on one asyncio loop beside a *ticker*, a task
that sleeps 1 ms at a time. Its *lag* at each wake-up is how late it woke: the wall time
since its previous wake-up minus 1 ms. A request that computes for 300 ms between two
awaits makes the ticker 300 ms late; one that yields every few milliseconds does not. On
a busy machine the wall-clock lag also counts the time the operating system gave this
process's CPU to other processes, so the ticker also records its *CPU lag*: the CPU time
this (single-threaded) process spent between two wake-ups, minus the 1 ms wait if it was
busy all along - the work the loop did before it could run the ticker again, whatever
else the machine runs. Part of that work can be a pass of Python's cyclic garbage
collector, which walks every live object of every session; the ticker also records its
CPU lag without those passes (the module's own work), and the longest pass (CPU time).
Reported per history size and number of sessions: the ticker's maximum lag (CPU, and
wall), its p99 CPU lag, its maximum CPU lag without collector passes, the longest pass,
the requests completed per second (all sessions together) and the p99 wall time of one
request (call to return, waiting included).

Each session repeats a cycle (starting new ones for ``DURATION`` seconds, at least one):
its store goes back to the freshly loaded state (no sticky decisions, no cached forms:
what ``clear`` + ``set_messages`` of the same history leaves, without re-admitting it),
then one request compacts (``get_messages_for_request`` with a budget of half the
history's estimated tokens: the size table's first-compaction request) and ``STICKY``
more requests reuse that compaction (sticky reuse, nothing new to decide). In the
*negotiated* rows the compacting request is ``get_measured_request_view`` (``token_meter:
"actual"``) whose ``count_view`` answers at once (``_count_view``), then committed.

Memory: the sessions of one size share one admitted history (a store's requests never
change its history, and nothing is admitted during the run), as sessions resumed from the
same transcript would hold equal ones. A private copy per session costs what the size
table's "memory: history" row shows per store (about 60 MB at 16k messages: 6 GB for 100
sessions); shared, 100 sessions x 16k messages fit (the peak RSS is printed).

The collector: once the sessions are loaded the benchmark calls ``gc.freeze()``, as a
long-running host does with its long-lived state (docs/orchestrators.md, "Many sessions on one event
loop"): otherwise every full collection walks every admitted message of every session,
which at 16k messages alone takes tens of milliseconds. ``FROZEN_ROW`` is measured
without it too.
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
NEGOTIATED_SIZES: Final = (16_000,)
NEGOTIATED_SESSIONS: Final = (1, 10)
FROZEN_ROW: Final = (16_000, 1)
"""(size, sessions) also measured without ``gc.freeze()``."""
COPY_REPEATS: Final = 21


@dataclass(frozen=True)
class LoadResult:
    """One row: ``sessions`` concurrent sessions on ``n``-message histories."""

    n: int
    sessions: int
    kind: str
    """``ordinary`` or ``negotiated`` (the compacting request's path)."""
    frozen: bool
    """Whether the sessions' state was kept out of the collector (``gc.freeze``)."""
    requests: int
    seconds: float
    lag_max: float
    """The ticker's longest lag, wall time."""
    lag_cpu_max: float
    """The ticker's longest lag, this process's CPU time."""
    lag_cpu_p99: float
    lag_own_max: float
    """The ticker's longest CPU lag less the collector's passes in it."""
    collector: float
    """The longest pass of the cyclic garbage collector, CPU time."""
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


class _Collector:
    """The passes of the cyclic garbage collector while installed: the longest (CPU
    time), and the CPU time of all of them."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.total = 0.0
        self._started = 0.0

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            spent = time.process_time() - self._started
            self.total += spent
            self.longest = max(self.longest, spent)

    def __enter__(self) -> Self:
        gc.callbacks.append(self._on_pass)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_pass)


@dataclass
class _Ticker:
    collector: _Collector
    wall: list[float]
    cpu: list[float]
    own: list[float]
    """CPU lag less the collector's passes in it: the module's own work."""

    async def run(self, stop: asyncio.Event) -> None:  # noqa: ASYNC910 - started before stop is set
        clock, cpu_clock = time.perf_counter, time.process_time
        last, last_cpu, last_gc = clock(), cpu_clock(), self.collector.total
        while not stop.is_set():
            await asyncio.sleep(TICK)
            now, now_cpu, now_gc = clock(), cpu_clock(), self.collector.total
            self.wall.append(max(0.0, now - last - TICK))
            self.cpu.append(max(0.0, now_cpu - last_cpu - TICK))
            self.own.append(max(0.0, now_cpu - last_cpu - (now_gc - last_gc) - TICK))
            last, last_cpu, last_gc = now, now_cpu, now_gc

    def clear(self) -> None:
        del self.wall[:], self.cpu[:], self.own[:]


def _fresh(store: SimpleContextManager) -> None:
    """Back to the freshly loaded state: no decisions, no cached forms or views (the
    store's own reset, as ``clear`` + ``set_messages`` of the same list would leave it)."""
    store._reset(store._history)


def _count_view(per_message: float) -> Any:
    """An instant provider count: ``per_message`` tokens per message of the view (a
    removal lowers it, a truncation does not: a simulation, O(1) per count)."""

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        count = int(len(view) * per_message)
        return {  # noqa: ASYNC910 - an instant count: the simulation adds no await point
            "dispatch": None,
            "budget_decision": {
                "estimated_input_tokens": count,
                "input_limit_tokens": 10**12,
                "measurement": {"kind": "provider_count", "source": "bench", "input_tokens": count},
            },
        }

    return count_view


async def _session(  # noqa: ASYNC910 - the first cycle always awaits a request
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
        stats = store.last_compaction_stats
        assert stats is not None, "the cycle's first request must compact"
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


async def run_row(
    n: int, sessions: int, kind: str = "ordinary", *, frozen: bool = True
) -> LoadResult:
    stores, tokens = await _stores(n, sessions, kind)
    budget = int(tokens * BUDGET_FRACTION)
    per_message = tokens / n
    # warm up once (first-request one-offs), outside the measurement
    await _session(stores[0], kind, budget, per_message, 0.0, [], [])
    gc.collect()
    if frozen:
        gc.freeze()
    collector = _Collector()
    ticker = _Ticker(collector, [], [], [])
    latencies: list[float] = []
    compacting: list[float] = []
    stop = asyncio.Event()
    try:
        with collector:
            ticking = asyncio.ensure_future(ticker.run(stop))
            await asyncio.sleep(10 * TICK)
            ticker.clear()
            collector.longest = 0.0
            start = time.perf_counter()
            deadline = start + DURATION
            await asyncio.gather(
                *(
                    _session(s, kind, budget, per_message, deadline, latencies, compacting)
                    for s in stores
                )
            )
            seconds = time.perf_counter() - start
            stop.set()
            await ticking
    finally:
        if frozen:
            gc.unfreeze()
    return LoadResult(
        n=n,
        sessions=sessions,
        kind=kind,
        frozen=frozen,
        requests=len(latencies),
        seconds=seconds,
        lag_max=max(ticker.wall),
        lag_cpu_max=max(ticker.cpu),
        lag_cpu_p99=_p99(ticker.cpu),
        lag_own_max=max(ticker.own),
        collector=collector.longest,
        latency_p99=_p99(latencies),
        compacting_p50=statistics.median(compacting),
        ticks=len(ticker.wall),
    )


async def steady_over_copy(n: int) -> float:
    """A steady-state request (nothing to compact) over a shallow copy of the history
    (``[dict(m) for m in history]``): the ratio of their median CPU times."""
    messages = histories.history(n)
    store = SimpleContextManager()
    await store.set_messages(messages)
    big = 10**12
    await store.get_messages_for_request(token_budget=big)  # first-request one-offs
    ours, copies = [], []
    for _ in range(COPY_REPEATS):
        gc.collect()
        cpu = time.process_time()
        await store.get_messages_for_request(token_budget=big)
        ours.append(time.process_time() - cpu)
        gc.collect()
        cpu = time.process_time()
        [dict(m) for m in messages]
        copies.append(time.process_time() - cpu)
    return statistics.median(ours) / statistics.median(copies)


@dataclass(frozen=True)
class LoadSummary:
    rows: list[LoadResult]
    copy_ratios: dict[int, float]
    """Steady-state request / shallow copy, per size."""
    peak_rss_mb: float


async def measure(
    sizes: Sequence[int] = SIZES,
    sessions: Sequence[int] = SESSIONS,
    negotiated_sizes: Sequence[int] = NEGOTIATED_SIZES,
    negotiated_sessions: Sequence[int] = NEGOTIATED_SESSIONS,
) -> LoadSummary:
    ratios = {n: await steady_over_copy(n) for n in sizes}
    rows = []
    for count in sessions:
        for n in sizes:
            rows.append(await run_row(n, count))
            gc.collect()
    for count in negotiated_sessions:
        for n in negotiated_sizes:
            rows.append(await run_row(n, count, "negotiated"))
            gc.collect()
    n, count = FROZEN_ROW
    if n in sizes and count in sessions:
        rows.append(await run_row(n, count, frozen=False))
    return LoadSummary(rows, ratios, peak_rss_mb())  # noqa: ASYNC910 - nothing cancels the benchmark


def run(
    sizes: Sequence[int] = SIZES,
    sessions: Sequence[int] = SESSIONS,
    negotiated_sizes: Sequence[int] = NEGOTIATED_SIZES,
    negotiated_sessions: Sequence[int] = NEGOTIATED_SESSIONS,
) -> LoadSummary:
    for n in {*sizes, *negotiated_sizes}:
        histories.history(n)
    gc.collect()
    return asyncio.run(measure(sizes, sessions, negotiated_sizes, negotiated_sessions))


def peak_rss_mb() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def describe(result: LoadResult) -> str:
    return (
        f"{result.kind:<10} {result.sessions:>3} x {result.n:>6,}"
        f"{'' if result.frozen else ' (not frozen)'}: lag max cpu "
        f"{result.lag_cpu_max * 1e3:7.1f} ms (wall {result.lag_max * 1e3:7.1f}), p99 cpu "
        f"{result.lag_cpu_p99 * 1e3:6.1f} ms, without collector {result.lag_own_max * 1e3:5.1f} "
        f"ms, collector {result.collector * 1e3:6.1f} ms | "
        f"{result.rate:7.1f} req/s, p99 {result.latency_p99 * 1e3:8.1f} ms | compacting p50 "
        f"{result.compacting_p50 * 1e3:7.1f} ms | {result.requests} requests, "
        f"{result.ticks} ticks, {result.seconds:.1f} s"
    )


# -- the table -------------------------------------------------------------------------------

LAG_LIMIT: Final = 0.010
"""The longest the loop may wait for one session's request (CPU seconds)."""
LAG_MULTIPLE: Final = 3
"""Ten sessions at once: at most this multiple of ``LAG_LIMIT``."""
COPY_LIMIT: Final = 1.2
"""A steady-state request: at most this multiple of a shallow copy of the history."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}" if seconds < 0.1 else f"{seconds * 1e3:,.0f}"


def rows(summary: LoadSummary, sizes: Sequence[int]) -> list[list[str]]:
    """The load section's rows (columns: ``sizes``)."""
    table: list[list[str]] = [
        [
            "steady-state request / shallow copy of the history (CPU)",
            *(f"{summary.copy_ratios[n]:.2f}x" if n in summary.copy_ratios else "-" for n in sizes),
        ]
    ]
    groups: dict[tuple[str, int, bool], dict[int, LoadResult]] = {}
    for result in summary.rows:
        groups.setdefault((result.kind, result.sessions, result.frozen), {})[result.n] = result
    for (kind, sessions, frozen), by_size in groups.items():
        label = f"{sessions} session{'s' if sessions > 1 else ''}"
        if kind != "ordinary":
            label = f"{kind}, {label}"
        if not frozen:
            label += ", collector not frozen"

        def cells(fmt: Any, by_size: dict[int, LoadResult] = by_size) -> list[str]:
            return [fmt(by_size[n]) if n in by_size else "-" for n in sizes]

        table += [
            [
                f"{label}: ticker lag max, CPU (wall) [ms]",
                *cells(lambda r: f"{_ms(r.lag_cpu_max)} ({_ms(r.lag_max)})"),
            ],
            [
                "  lag p99 CPU / max CPU without collector [ms]",
                *cells(lambda r: f"{_ms(r.lag_cpu_p99)} / {_ms(r.lag_own_max)}"),
            ],
            ["  longest collector pass, CPU [ms]", *cells(lambda r: _ms(r.collector))],
            [
                "  requests/s / request p99 [ms]",
                *cells(lambda r: f"{r.rate:,.0f} / {_ms(r.latency_p99)}"),
            ],
        ]
    rss = f"{summary.peak_rss_mb:,.0f}"
    table.append(
        ["peak RSS of this process after the load rows [MB]", *([""] * (len(sizes) - 1)), rss]
    )
    return table


def targets(summary: LoadSummary) -> list[tuple[str, str, str, bool]]:
    """``(name, measured, goal, ok)`` per target (see the legend)."""
    found = {(r.kind, r.sessions, r.n, r.frozen): r for r in summary.rows}
    out: list[tuple[str, str, str, bool]] = []
    largest = max((r.n for r in summary.rows), default=0)
    label = f"{largest // 1000}k"
    for sessions, limit in ((1, LAG_LIMIT), (10, LAG_MULTIPLE * LAG_LIMIT)):
        row = found.get(("ordinary", sessions, largest, True))
        if row is None:
            continue
        goal = f"<= {LAG_LIMIT * 1e3:.0f} ms"
        if sessions > 1:
            goal = f"<= {LAG_MULTIPLE} x {LAG_LIMIT * 1e3:.0f} ms"
        plural = "s" if sessions > 1 else ""
        name = f"load: {sessions} session{plural} on {label}, max lag w/o collector"
        measured = (
            f"cpu {_ms(row.lag_own_max)} ms (with its passes {_ms(row.lag_cpu_max)}, "
            f"wall {_ms(row.lag_max)})"
        )
        out.append((name, measured, goal, row.lag_own_max <= limit))
    if summary.copy_ratios:
        n = max(summary.copy_ratios)
        ratio = summary.copy_ratios[n]
        out.append(
            (
                f"steady-state request on {n // 1000}k / shallow copy",
                f"cpu {ratio:.2f}x",
                f"<= {COPY_LIMIT}x",
                ratio <= COPY_LIMIT,
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--sessions", default=",".join(map(str, SESSIONS)))
    parser.add_argument("--negotiated", default=",".join(map(str, NEGOTIATED_SESSIONS)))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    sessions = [int(s) for s in args.sessions.split(",") if s]
    negotiated = [int(s) for s in args.negotiated.split(",") if s]
    summary = run(sizes, sessions, NEGOTIATED_SIZES, negotiated)
    for n, ratio in summary.copy_ratios.items():
        print(f"steady-state request / shallow copy, {n:,} messages: {ratio:.2f}x (CPU)")
    for result in summary.rows:
        print(describe(result))
    print(f"peak RSS {summary.peak_rss_mb:,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
