"""A loaded session's footprint: what the module adds to the collector's and the
allocator's work on top of the caller's own messages (issue 21).

    uv run --frozen python -m benchmarks.footprint [--sizes 1000,4000,16000]
    uv run --frozen python -m benchmarks.footprint --history FILE.json [--json]

Each history size (``benchmarks.histories``) is measured in a fresh interpreter that holds
what a host would (``run`` starts one per size): the module imported, the history's JSON
read from a file and decoded, nothing frozen. Measured there (``measure``): the tracked
objects the module adds per message, tracemalloc's peak over ``set_messages`` plus one
compacting request, full-collection times with and without the loaded manager, resume
(``set_messages`` alone and with its first request), and the longest gap of a 1 ms
ticker while 1 or 10 sessions compact on its loop, with the default collector and with
everything frozen once loaded. ``LEGEND`` (printed under the table) says exactly what
each figure is; ``rows`` and ``targets`` are the ``make bench`` section and its verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from benchmarks import histories
from benchmarks import load as load_bench

SIZES: Final = (1_000, 4_000, 16_000)
SESSIONS: Final = (1, 10)
BUDGET_FRACTION: Final = 0.5
WARMUP: Final = 200
"""Messages of the history that builds the module's one-off lazy state first."""
COLLECTS: Final = 9
RESUMES: Final = 3
DURATION: Final = 1.5
"""Seconds of compaction per lag row (every session runs at least one request)."""
ROOT: Final = Path(__file__).resolve().parent.parent

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class Lag:
    """One lag row: ``sessions`` compacting on one loop."""

    sessions: int
    frozen: bool
    cpu_max: float
    """The ticker's longest gap, this process's CPU time (less the 1 ms sleep)."""
    wall_max: float
    collector: float
    """The longest pass of the cyclic collector (CPU time)."""
    full_collections: int
    compactions: int


@dataclass(frozen=True)
class Footprint:
    n: int
    json_chars: int
    """``len(json.dumps(history))``."""
    objects_startup: int
    """Tracked objects before the history is decoded (the imports, the warm-up)."""
    objects_alone: int
    objects_loaded: int
    peak: int
    """tracemalloc peak of ``set_messages`` + one compacting request, bytes."""
    gc_startup: tuple[float, float]
    """Fastest full collection before the history is decoded: (wall, CPU) seconds."""
    gc_alone: tuple[float, float]
    """Fastest full collection, caller's messages alone: (wall, CPU) seconds."""
    gc_loaded: tuple[float, float]
    set_messages: float
    """Median wall seconds of a fresh ``set_messages``."""
    first_request: float
    """Median wall seconds of ``set_messages`` + the first (compacting) request."""
    lags: tuple[Lag, ...]
    refs_startup: int = 0
    """References the collector walks (``walked``) before the history is decoded."""
    refs_alone: int = 0
    refs_loaded: int = 0
    refs_ten: int = 0
    """The same with the ten managers of the 10-session rows loaded."""

    @property
    def added_per_message(self) -> float:
        return (self.objects_loaded - self.objects_alone) / self.n

    @property
    def caller_per_message(self) -> float:
        """The caller's decoded messages' own tracked objects, per message."""
        return (self.objects_alone - self.objects_startup) / self.n

    @property
    def refs_added_per_message(self) -> float:
        return (self.refs_loaded - self.refs_alone) / self.n

    @property
    def refs_caller_per_message(self) -> float:
        return (self.refs_alone - self.refs_startup) / self.n

    def lag(self, sessions: int, frozen: bool) -> Lag | None:
        return next((g for g in self.lags if (g.sessions, g.frozen) == (sessions, frozen)), None)


# -- measuring, in this process ----------------------------------------------------------


def tracked() -> int:
    """Tracked objects once the collector has freed what it can."""
    gc.collect()
    return len(gc.get_objects())


def walked() -> int:
    """References the collector walks in a full collection once it has freed what it can:
    everything every tracked object holds (``gc.get_referents``). A count, not a time: the
    machine-independent side of the collection timings."""
    gc.collect()
    return sum(map(len, map(gc.get_referents, gc.get_objects())))


def budget_of(history: Messages) -> int:
    return int(sum(map(estimate_message, history)) * BUDGET_FRACTION)


async def load(history: Messages, budget: int) -> SimpleContextManager:
    """A manager holding ``history`` that has served one compacting request."""
    store = SimpleContextManager()
    await store.set_messages(history)
    await compact(store, budget)
    return store


async def compact(store: SimpleContextManager, budget: int) -> None:
    await store.get_messages_for_request(token_budget=budget)
    assert store.last_compaction_stats is not None, "the request must compact"


async def warm_up(text: str) -> None:
    """The module's one-off lazy state (first-use tables and the like), built on the
    first ``WARMUP`` messages of ``text`` and kept out of the per-message figures."""
    small = json.loads(text)[:WARMUP]
    await load(small, budget_of(small))


def _collect_times(earlier: tuple[float, float] = (math.inf, math.inf)) -> tuple[float, float]:
    """The fastest of ``COLLECTS`` full collections, wall and CPU (or ``earlier``'s)."""
    wall_best, cpu_best = earlier
    for _ in range(COLLECTS):
        wall, cpu = time.perf_counter(), time.process_time()
        gc.collect()
        cpu_best = min(cpu_best, time.process_time() - cpu)
        wall_best = min(wall_best, time.perf_counter() - wall)
    return wall_best, cpu_best


async def _peak(history: Messages, budget: int) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        await load(history, budget)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def _resume(history: Messages, budget: int) -> tuple[float, float]:
    alone, first = [], []
    for _ in range(RESUMES):
        gc.collect()
        store = SimpleContextManager()
        start = time.perf_counter()
        await store.set_messages(history)
        alone.append(time.perf_counter() - start)
        await compact(store, budget)
        first.append(time.perf_counter() - start)
        del store
    return statistics.median(alone), statistics.median(first)  # noqa: ASYNC910 - RESUMES >= 1


async def _compacting(store: SimpleContextManager, budget: int, deadline: float) -> int:
    done = 0
    while not done or time.perf_counter() < deadline:
        load_bench._fresh(store)
        await compact(store, budget)
        done += 1
    return done  # noqa: ASYNC910 - the first request always runs


class _Passes(load_bench._Collector):
    """``benchmarks.load``'s collector record, counting the full collections too."""

    def __init__(self) -> None:
        super().__init__()
        self.full = 0

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        super()._on_pass(phase, info)
        if phase == "stop" and info["generation"] == 2:
            self.full += 1


async def lag(stores: Sequence[SimpleContextManager], budget: int, *, frozen: bool) -> Lag:
    """The ticker's longest gap while ``stores`` compact for ``DURATION`` seconds."""
    gc.collect()
    if frozen:
        gc.freeze()
    collector = _Passes()
    ticker = load_bench._Ticker(collector, [], [], [])
    stop = asyncio.Event()
    try:
        with collector:
            ticking = asyncio.ensure_future(ticker.run(stop))
            await asyncio.sleep(10 * load_bench.TICK)
            ticker.clear()
            collector.longest, collector.full = 0.0, 0
            deadline = time.perf_counter() + DURATION
            done = await asyncio.gather(*(_compacting(s, budget, deadline) for s in stores))
            stop.set()
            await ticking
    finally:
        if frozen:
            gc.unfreeze()
    return Lag(
        sessions=len(stores),
        frozen=frozen,
        cpu_max=max(ticker.cpu),
        wall_max=max(ticker.wall),
        collector=collector.longest,
        full_collections=collector.full,
        compactions=sum(done),
    )


async def measure(text: str) -> Footprint:
    """Every figure of the history ``text`` holds (JSON), measured in a fresh interpreter
    that has imported the module and ``benchmarks.load`` and nothing else (see ``run``)."""
    await warm_up(text)
    startup, refs_startup = tracked(), walked()
    gc_startup = _collect_times()
    history = json.loads(text)  # the caller's messages, as a resumed session decodes them
    budget = budget_of(history)
    alone, refs_alone = tracked(), walked()
    gc_alone = _collect_times()
    peak = await _peak(history, budget)
    set_messages, first_request = await _resume(history, budget)
    stores = [await load(history, budget)]
    loaded, refs_loaded = tracked(), walked()
    gc_loaded = _collect_times()
    lags = []
    refs_ten = 0
    for count in SESSIONS:
        while len(stores) < count:
            stores.append(await load(history, budget))
        if count == 10:
            refs_ten = walked()
        lags += [await lag(stores, budget, frozen=frozen) for frozen in (False, True)]
    # Each full-collection time is the fastest at two moments (a collection's time drifts
    # as the collector reorders what it walks): loaded again with the first manager alone,
    # and the messages alone again once no manager is left.
    del stores[1:]
    gc_loaded = _collect_times(gc_loaded)
    del stores
    gc_alone = _collect_times(gc_alone)
    return Footprint(  # noqa: ASYNC910 - nothing cancels the benchmark
        n=len(history),
        json_chars=len(text),
        objects_startup=startup,
        objects_alone=alone,
        objects_loaded=loaded,
        peak=peak,
        gc_startup=gc_startup,
        gc_alone=gc_alone,
        gc_loaded=gc_loaded,
        set_messages=set_messages,
        first_request=first_request,
        lags=tuple(lags),
        refs_startup=refs_startup,
        refs_alone=refs_alone,
        refs_loaded=refs_loaded,
        refs_ten=refs_ten,
    )


# -- one interpreter per size ------------------------------------------------------------


def to_json(result: Footprint) -> str:
    return json.dumps(dataclasses.asdict(result))


def from_json(text: str) -> Footprint:
    data = json.loads(text)
    data["lags"] = tuple(Lag(**g) for g in data["lags"])
    for key in ("gc_startup", "gc_alone", "gc_loaded"):
        data[key] = tuple(data[key])
    return Footprint(**data)


def run(sizes: Sequence[int] = SIZES) -> list[Footprint]:
    """Each size measured in its own fresh interpreter, from the history's JSON in a
    temporary file (so the benchmark's generator and its caches are not in that process)."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes:
            path = Path(folder) / f"history-{n}.json"
            path.write_text(json.dumps(histories.history(n)), encoding="utf-8")
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.footprint", "--history", str(path), "--json"],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            results.append(from_json(done.stdout.strip().splitlines()[-1]))
    return results


# -- the table -------------------------------------------------------------------------------

OBJECTS_LIMIT: Final = 1.0
PEAK_LIMIT: Final = 0.5
COLLECT_LIMIT: Final = 1.5
LAG_LIMIT: Final = 0.030
SESSIONS_LIMIT: Final = 3.0

HEADER: Final = "footprint: one fresh process per size (messages)"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}" if seconds < 0.1 else f"{seconds * 1e3:,.0f}"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def _gap(lag: Lag | None) -> str:
    return "-" if lag is None else f"{_ms(lag.cpu_max)} ({_ms(lag.wall_max)})"


def rows(results: Sequence[Footprint]) -> list[list[str]]:
    def row(label: str, fmt: Any) -> list[str]:
        return [label, *(fmt(r) for r in results)]

    table = [
        row("history: len(json.dumps(history)) [MiB]", lambda r: _mib(r.json_chars)),
        row(
            "tracked objects/message: module's addition (caller's alone)",
            lambda r: f"{r.added_per_message:.2f} ({r.caller_per_message:.2f})",
        ),
        row(
            "peak, set_messages + compacting request [MiB] / JSON size",
            lambda r: f"{_mib(r.peak)} / {r.peak / r.json_chars:.2f}x",
        ),
        row(
            "references the collector walks/message: module's (caller's)",
            lambda r: f"{r.refs_added_per_message:.2f} ({r.refs_caller_per_message:.2f})",
        ),
        row(
            "  whole process: loaded / messages alone; 10 sessions / 1",
            lambda r: (
                f"{r.refs_loaded / r.refs_alone:.2f}x; {r.refs_ten / r.refs_loaded:.2f}x"
                if r.refs_alone and r.refs_loaded
                else "-"
            ),
        ),
        row(
            "full gc.collect(), whole process: loaded / messages alone, CPU [ms]",
            lambda r: (
                f"{r.gc_loaded[1] / r.gc_alone[1]:.2f}x "
                f"({_ms(r.gc_loaded[1])} / {_ms(r.gc_alone[1])})"
            ),
        ),
        row(
            "  the process before the messages (imports, warm-up), CPU [ms]",
            lambda r: _ms(r.gc_startup[1]),
        ),
        row(
            "resume: set_messages + first request / set_messages alone [ms]",
            lambda r: f"{_ms(r.first_request)} / {_ms(r.set_messages)}",
        ),
    ]
    for sessions in SESSIONS:
        plural = "s" if sessions > 1 else ""
        for frozen, how in ((False, "default collector"), (True, "gc.freeze() once loaded")):
            table.append(
                row(
                    f"{sessions} session{plural} compacting, {how}: longest gap, CPU (wall) [ms]",
                    lambda r, s=sessions, f=frozen: _gap(r.lag(s, f)),
                )
            )
            table.append(
                row(
                    "  longest collector pass [ms], CPU / full passes / requests",
                    lambda r, s=sessions, f=frozen: (
                        "-"
                        if (g := r.lag(s, f)) is None
                        else f"{_ms(g.collector)} / {g.full_collections} / {g.compactions}"
                    ),
                )
            )
    return table


def targets(results: Sequence[Footprint]) -> list[tuple[str, str, str, bool]]:
    """``(name, measured, goal, ok)`` per target, on the largest size."""
    r = max(results, key=lambda f: f.n)
    label = f"{r.n // 1000}k"
    peak = r.peak / r.json_chars
    collect = r.gc_loaded[1] / r.gc_alone[1]
    one, ten = r.lag(1, False), r.lag(10, False)
    out = [
        (
            f"footprint on {label}: module's tracked objects per message",
            f"{r.added_per_message:.2f} (caller's {r.caller_per_message:.2f})",
            f"<= {OBJECTS_LIMIT:g}",
            r.added_per_message <= OBJECTS_LIMIT,
        ),
        (
            f"footprint on {label}: peak / JSON size (old module: no copy here)",
            f"{peak:.2f}x ({_mib(r.peak)} MiB)",
            f"<= {PEAK_LIMIT:g}x",
            peak <= PEAK_LIMIT,
        ),
        (
            f"footprint on {label}: full collection, loaded / messages alone",
            f"cpu {collect:.2f}x (wall {r.gc_loaded[0] / r.gc_alone[0]:.2f}x)",
            f"<= {COLLECT_LIMIT:g}x",
            collect <= COLLECT_LIMIT,
        ),
    ]
    if one is not None:
        out.append(
            (
                f"footprint on {label}: longest gap, 1 session, default collector",
                f"cpu {_ms(one.cpu_max)} ms (wall {_ms(one.wall_max)})",
                f"<= {LAG_LIMIT * 1e3:.0f} ms",
                one.cpu_max <= LAG_LIMIT,
            )
        )
    if one is not None and ten is not None:
        ratio = ten.cpu_max / one.cpu_max
        out.append(
            (
                f"footprint on {label}: longest gap, 10 / 1 sessions, default collector",
                f"cpu {ratio:.1f}x (wall {ten.wall_max / one.wall_max:.1f}x)",
                f"<= {SESSIONS_LIMIT:g}x",
                ratio <= SESSIONS_LIMIT,
            )
        )
    return out


LEGEND: Final = """\
- Footprint (benchmarks/footprint.py): each size in a fresh interpreter that holds what
  a host would: the module imported (amplifier-core with it), the history's JSON read from
  a file and decoded (the caller's messages; the benchmark's generator is not in that
  process), nothing frozen, the module's one-off lazy state built first on the first 200
  messages and dropped. A compacting request = get_messages_for_request with half the
  history's estimated tokens. Tracked objects per message: module's addition =
  (len(gc.get_objects()) after gc.collect() once a manager holds the history
  (set_messages) and has served one compacting request, view dropped) minus (the same
  with the caller's messages alone), over the messages; in brackets the caller's decoded
  messages' own (alone minus before decoding; JSON decoding leaves dicts of plain values
  untracked). References the collector walks: the sum of len(gc.get_referents(o)) over
  every tracked object after gc.collect() (each is visited twice by a full collection), the
  module's addition and the caller's per message as above, and the whole process's count
  loaded (one manager) over the messages alone, and with the ten managers of the
  10-session rows over one: counts, the same on every machine, beside the timings they
  explain. Peak = tracemalloc's peak over set_messages on a fresh manager + one
  compacting request (tracing started just before: the caller's messages are not
  counted, the returned view is), over len(json.dumps(history)) (ASCII escapes). The
  existing public module has no copy in this repository: its peak is not measured, only
  the JSON size is the baseline. Full collection: the fastest CPU time of 18 gc.collect()
  of the whole process with the loaded manager (9 once it is loaded, 9 after the lag rows
  with the other managers dropped), over the same with the caller's messages alone
  (fastest of 18: 9 before the managers exist, 9 once all are dropped at the end); both
  include the process's imports, timed alone on the next row (on this machine
  amplifier-core and pydantic alone cost a full collection ~20-40 ms). Resume:
  median wall time of 3 fresh set_messages(history), and of the same plus its first
  request (compacting), from the same samples, collector enabled. Longest gap:
  benchmarks/load.py's 1 ms ticker on the loop while the sessions compact for 1.5 s
  (each: back to its freshly loaded state, one compacting request, again; the last ones
  finish after), CPU time between wake-ups less the 1 ms sleep (wall in brackets),
  collector passes included; whether a full collection falls in the 1.5 s is the
  collector's own schedule, so the next row gives the longest pass and the number of
  full passes. "default collector" = gc enabled, nothing frozen; "gc.freeze() once
  loaded" = everything alive then frozen. 10 sessions = 10 managers, each set_messages of
  the same caller's list (its dicts shared: one history's worth, ten managers' state).
  Targets on the largest size; 10 / 1 sessions = ratio of their longest gaps (CPU),
  default collector."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.footprint")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--history", type=Path, help="measure this JSON history, here")
    parser.add_argument("--json", action="store_true", help="print the --history result as JSON")
    args = parser.parse_args(argv)
    if args.history is not None:
        result = asyncio.run(measure(args.history.read_text(encoding="utf-8")))
        print(to_json(result) if args.json else result)
        return 0
    from benchmarks.__main__ import Table  # the make bench table's layout (lazily: it imports us)

    started = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    results = run([int(s) for s in args.sizes.split(",") if s])
    table = Table()
    table.title(
        f"python -m benchmarks.footprint - {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load average {load:.2f} at start"
    )
    table.section([HEADER, *(f"{r.n:,}" for r in results)], rows(results))
    table.section(
        ["targets", "measured", "target", "result"],
        [[name, got, goal, "PASS" if ok else "FAIL"] for name, got, goal, ok in targets(results)],
    )
    print(table.render())
    print(f"Runtime {time.perf_counter() - started:.0f} s.")
    print()
    print(LEGEND)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
