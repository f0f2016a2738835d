"""Long sessions at production budgets (issue 30): views over the budget, latency, the bill
with the cache's lifetime, and session resume, on the two long real sessions.

    uv run --frozen python -m benchmarks.long                   # this section alone
    uv run --frozen python -m benchmarks.long --run "module, idle 0.7" idle_compact_at=0.7

LEGEND
------
Sessions: the long timestamped Claude Code sessions of ``tests/data/real/long``
(``tests/realdata.py: long_sessions()``: 1,016 and 831 messages, ~300k and ~224k tokens,
one ISO timestamp per message). A *case* is one (session, budget B), B in ``BUDGETS``:
128,000, 163,904 (the budget the module derives for a 200k-window model, taken as is) and
one small budget, 32,000.

Runs of a case, on the same requests (right before each assistant message, and once at the
end: the replay CLI's cadence):

- ``module``: ``amplifier_module_context_simple.cli.replay`` through a real
  ``SimpleContextManager`` with ``max_tokens = max_tokens_fallback = B``, no provider, and
  otherwise the default configuration (compacts at ``compact_threshold`` 0.92 of B less
  the notice reserve, down to ``target_usage`` 0.50 of it). Its clock is the session's
  request times (the replay's ``times``), so its idle-aware rule is on: after a gap of
  more than ``cache_lifetime`` (300 s, the bill's 5-minute cache), when the request writes
  its whole view anyway, a view at or above ``idle_compact_at`` x the trigger compacts.
- ``module, idle off``: the same with ``cache_lifetime`` 0 (no idle-aware compaction), on
  the same timestamped requests and bill. ``MODULE_RUNS`` (and ``--run``) add module runs
  with extra configuration keys; a key the installed module rejects is reported as that
  run's row ("rejected"), not raised. The trimmer is replayed on the first module run's
  requests (every run has the same ones); ``*`` marks it when it beats any module run of
  its case (the targets say which).
- ``trim 92/50``: a trimmer, not the module: ``cli.trimmed_views`` with trigger 0.92 x B
  and target 0.50 x B (the module's threshold and target, on the whole of B), deciding
  with the module's estimator (``estimate_message``) as the module does. It keeps the
  system messages and sends every unit (an assistant message with the results of its
  calls; never a result alone) since its last trim; when that exceeds the trigger it drops
  the oldest units until the view fits the target. Like ``economics.py``'s ``hy50`` but
  triggered at 0.92 x B instead of B. It has no latency (it is not timed).

Columns (per case and run):

- ``requests``; ``latency ms``: the wall time (``time.perf_counter``) of each
  ``get_messages_for_request`` call alone, in ms: median / p99 (nearest rank) / max, the
  collector's passes included (module runs only);
- ``views > B``: the views whose count by the INDEPENDENT counter (``benchmarks.provider.
  Counter``, o200k_base with OpenAI's message accounting; it shares nothing with the
  module's estimator) is above B - the request's count: its messages and 3 tokens of reply
  priming - then the largest count / B, then how many of those views hold one message
  whose count alone is above B (no policy that keeps the newest message can fit those);
- ``comp/100``: the module's compactions (``context:compaction`` events) per 100 requests;
  ``brk/100``: cache breaks per 100 requests, the CLI's ``prefix_breaks`` (the prefix a
  view shares with the previous one ends before that one's last message but one), the
  same definition as ``economics.py``; ``cold``: requests that found the cache expired;
- ``bill 5m`` / ``bill none``: billed input (in thousands of fresh-input tokens) under an
  exact-prefix cache (``cli.bill``): the leading messages shared with the previous view
  read at 0.1, every other token written at 1.25 (the last message too:
  ``Prices(fresh=1.25, cache_read=0.1, cache_write=1.25)``, as ``economics.py``), counted
  with the independent counter. ``5m``: with the session's timestamps, a request made
  more than 5 minutes after the previous one finds the cache cold and writes its whole
  view (``--cache-ttl 5m --times``); ``none``: the same views with a cache that never
  expires (the model without time), for reference;
- ``mean ctx``: the view's independent count (messages only) averaged over the requests;
  ``mean msgs``: the messages shown per request, averaged. ``*`` after a trimmer row: it
  bills less (5m) AND keeps more mean context than the module on that case.

Resume (per session): a fresh ``SimpleContextManager(max_tokens=B,
max_tokens_fallback=B)``'s ``set_messages(all messages)`` followed by its first
``get_messages_for_request`` (which compacts when the session is over the trigger), wall
ms, the median of ``RESUME_REPEATS`` runs after ``gc.collect()``, set_messages alone in
brackets; beside it ``json.dumps`` of the same list (median of as many runs) and the ratio
of the two. The ratio includes our own time (admission and, in the first request, the
whole compaction); ``json.dumps`` is only a size reference - what reading the session's
bytes once costs - not a baseline: no other context manager is timed here.

Targets: per module run, no view over B except where one message alone exceeds it (o200k),
and no case where the trimmer both bills less (5m) and keeps more mean context.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import math
import statistics
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.lowlevel

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.cli import (
    NO_EXPIRY,
    CacheUse,
    CliError,
    Prices,
    ReplayedRequest,
    Run,
    Transcript,
    baseline_run,
    build_config,
    format_table,
    message_key,
    parse_assignment,
    replay,
    request_histories,
    request_times,
    simulate_cache,
    tallied_warnings,
    trimmed_views,
)
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from benchmarks.provider import REPLY_PRIMING, Counter

ROOT: Final = Path(__file__).resolve().parent.parent
BUDGETS: Final = (32_000, 128_000, 163_904)
TRIGGER: Final = 0.92
TARGET: Final = 0.50
TRIMMER: Final = "trim 92/50"
PRICES: Final = Prices(fresh=1.25, cache_read=0.1, cache_write=1.25)
"""The bill of ``economics.py``, with the 5-minute cache (``Prices``'s default lifetime)."""
UNEXPIRING: Final = dataclasses.replace(PRICES, lifetime=NO_EXPIRY)
MODULE_RUNS: Final[tuple[tuple[str, dict[str, Any]], ...]] = (
    ("module", {}),
    ("module, idle off", {"cache_lifetime": 0}),
)
"""(run name, extra configuration keys) of every module run: the default module (its
idle-aware rule on, the clock being the session's times) and the same without the rule."""
RESUME_REPEATS: Final = 5
LEGEND: Final = "- Long sessions (benchmarks/long.py):\n" + textwrap.indent(
    (__doc__ or "").split("LEGEND\n------\n", 1)[-1].strip(), "  "
)
"""The docstring's legend, as a bullet of ``make bench``'s legend."""


@dataclass(frozen=True)
class Session:
    """A long session: its name, messages and one time per message (POSIX seconds)."""

    name: str
    messages: list[dict[str, Any]]
    stamps: tuple[Any, ...]
    """The loader's ``datetime`` per message."""


def sessions() -> list[Session]:
    """The long sessions of ``tests/realdata.py`` (empty when the loader is missing)."""
    if not (ROOT / "tests" / "realdata.py").exists():
        return []
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    loader = importlib.import_module("tests.realdata")
    return [
        Session(str(s.name), list(s.conversation.messages), tuple(s.times))
        for s in loader.long_sessions()
    ]


@dataclass(frozen=True, slots=True)
class Row:
    """One run of one case (the legend's columns)."""

    session: str
    budget: int
    run: str
    requests: int = 0
    latency_ms: tuple[float, float, float] | None = None
    """median, p99, max of the module's calls; None for the trimmer."""
    over: int = 0
    over_single: int = 0
    max_ratio: float = 0.0
    compactions_per_100: float | None = None
    breaks_per_100: float = 0.0
    cold: int = 0
    bill_5m: float = 0.0
    bill_none: float = 0.0
    mean_context: float = 0.0
    mean_messages: float = 0.0
    rejected: str | None = None
    """Why the run did not replay (a configuration key the module rejects)."""

    @property
    def module(self) -> bool:
        return self.run != TRIMMER


@dataclass(frozen=True, slots=True)
class Resume:
    session: str
    messages: int
    dumps_ms: float
    resume_ms: dict[int, tuple[float, float]]
    """B -> (set_messages + first request, set_messages alone), medians in ms."""


def _transcript(session: Session) -> Transcript:
    messages = [(index + 1, message) for index, message in enumerate(session.messages)]
    return Transcript(Path(session.name), "line", messages, [])


def _quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _bill(prices: Prices, uses: Sequence[CacheUse]) -> float:
    return prices.billed(
        sum(u.fresh for u in uses),
        sum(u.cache_read for u in uses),
        sum(u.cache_write for u in uses),
    )


def _views_figures(
    keyed: Sequence[Sequence[tuple[str, int]]], budget: int
) -> tuple[int, int, float, float, float]:
    """Views over B (request count), those with one message over B, the max ratio, the
    mean context (message counts) and mean messages shown."""
    counts = [sum(t for _, t in view) + REPLY_PRIMING for view in keyed]
    over = [i for i, count in enumerate(counts) if count > budget]
    single = sum(max((t for _, t in keyed[i]), default=0) > budget for i in over)
    mean_context = statistics.fmean(count - REPLY_PRIMING for count in counts)
    mean_messages = statistics.fmean(len(view) for view in keyed)
    return len(over), single, max(counts) / budget, mean_context, mean_messages


class Measures:
    """The independent counter's per-message count, memoised, and the trimmer's keyed
    views (its views are slices of the same history objects, so keys are memoised by
    identity; the history lists keep every object alive, so no id is reused)."""

    def __init__(self) -> None:
        self.counter = Counter()
        self._keys: dict[int, tuple[Mapping[str, Any], str, int]] = {}

    def tokens(self, message: Mapping[str, Any]) -> int:
        """One message's count (no reply priming); memoised by content identity inside
        ``Counter.count_request``."""
        return self.counter.count_request([message]) - REPLY_PRIMING

    def keyed(self, view: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
        out = []
        for message in view:
            hit = self._keys.get(id(message))
            if hit is None:
                hit = self._keys[id(message)] = (
                    message,
                    message_key(message),
                    self.tokens(message),
                )
            out.append((hit[1], hit[2]))
        return out


async def replay_module(
    session: Session, budget: int, name: str, extra: Mapping[str, Any], measures: Measures
) -> tuple[Row, Run | None]:
    """The module's run of a case (legend), or a ``rejected`` row."""
    overrides: dict[str, Any] = {"max_tokens": budget, "max_tokens_fallback": budget, **extra}
    transcript = _transcript(session)
    times = request_times(transcript, session.stamps)
    seen: list[ReplayedRequest] = []
    try:  # the configuration alone: what the replay raises is not a rejection
        config = build_config(overrides, name)
        SimpleContextManager(**dataclasses.asdict(config))
    except (CliError, TypeError, ValueError) as exc:
        await anyio.lowlevel.checkpoint()
        return Row(session.name, budget, name, rejected=f"{type(exc).__name__}: {exc}"), None
    run = await replay(
        transcript,
        config,
        None,
        name=name,
        overrides=overrides,
        prices=PRICES,
        measure=measures.tokens,
        times=times,
        on_request=seen.append,
    )
    keyed = [request.keyed for request in seen]
    totals = run.totals()
    none = _bill(UNEXPIRING, simulate_cache(keyed))
    timed = simulate_cache(keyed, times=times, lifetime=PRICES.lifetime)
    assert round(_bill(PRICES, timed), 1) == totals["billed_input"]  # the CLI's own bill
    over, single, ratio, context, shown = _views_figures(keyed, budget)
    latencies = [1e3 * request.seconds for request in seen]
    requests = totals["requests"]
    row = Row(
        session=session.name,
        budget=budget,
        run=name,
        requests=requests,
        latency_ms=(
            statistics.median(latencies),
            _quantile(latencies, 0.99),
            max(latencies),
        ),
        over=over,
        over_single=single,
        max_ratio=ratio,
        compactions_per_100=float(totals["boundaries_per_100_requests"]),
        breaks_per_100=100 * totals["prefix_breaks"] / requests,
        cold=sum(use.expired for use in timed),
        bill_5m=float(totals["billed_input"]),
        bill_none=none,
        mean_context=context,
        mean_messages=shown,
    )
    return row, run


def replay_trimmer(
    session: Session, budget: int, module: Run, measures: Measures, times: Sequence[float]
) -> Row:
    """The trimmer's run of a case on the module run's requests (legend)."""
    transcript = _transcript(session)
    histories = request_histories(transcript, module.config)
    views = list(
        trimmed_views(
            histories, trigger=TRIGGER * budget, target=TARGET * budget, measure=estimate_message
        )
    )
    run = baseline_run(module, histories, views, name=TRIMMER, description=TRIMMER)
    totals = run.totals()
    keyed = [measures.keyed(view) for view in views]
    over, single, ratio, context, shown = _views_figures(keyed, budget)
    requests = totals["requests"]
    timed = simulate_cache(keyed, times=times, lifetime=PRICES.lifetime)
    assert round(_bill(PRICES, timed), 1) == totals["billed_input"]
    return Row(
        session=session.name,
        budget=budget,
        run=TRIMMER,
        requests=requests,
        over=over,
        over_single=single,
        max_ratio=ratio,
        breaks_per_100=100 * totals["prefix_breaks"] / requests,
        cold=sum(use.expired for use in timed),
        bill_5m=float(totals["billed_input"]),
        bill_none=_bill(UNEXPIRING, simulate_cache(keyed)),
        mean_context=context,
        mean_messages=shown,
    )


async def resume(
    session: Session, budgets: Sequence[int] = BUDGETS, repeats: int = RESUME_REPEATS
) -> Resume:
    """The resume figures of one session (legend)."""
    await anyio.lowlevel.checkpoint()  # (zero repeats await nothing else)
    dumps: list[float] = []
    timings: dict[int, list[tuple[float, float]]] = {budget: [] for budget in budgets}
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        json.dumps(session.messages)
        dumps.append(time.perf_counter() - started)
        for budget in budgets:
            manager = SimpleContextManager(max_tokens=budget, max_tokens_fallback=budget)
            gc.collect()
            started = time.perf_counter()
            await manager.set_messages(session.messages)
            loaded = time.perf_counter()
            await manager.get_messages_for_request()
            done = time.perf_counter()
            timings[budget].append((done - started, loaded - started))
            del manager
    return Resume(
        session=session.name,
        messages=len(session.messages),
        dumps_ms=1e3 * statistics.median(dumps),
        resume_ms={
            budget: (
                1e3 * statistics.median(t for t, _ in samples),
                1e3 * statistics.median(s for _, s in samples),
            )
            for budget, samples in timings.items()
        },
    )


@dataclass(frozen=True, slots=True)
class Result:
    budgets: tuple[int, ...]
    rows: list[Row]
    resumes: list[Resume]
    warnings: list[tuple[int, str]]
    """The module's log warnings: (count, the first message)."""


def run(
    runs: Sequence[tuple[str, Mapping[str, Any]]] = MODULE_RUNS,
    found: Sequence[Session] | None = None,
    budgets: Sequence[int] = BUDGETS,
    repeats: int = RESUME_REPEATS,
) -> Result:
    """Every case's runs (module runs in order, then the trimmer) and every resume;
    ``found``: the sessions (default ``sessions()``)."""
    found = sessions() if found is None else found
    measures = Measures()

    async def main() -> tuple[list[Row], list[Resume]]:
        rows: list[Row] = []
        for session in found:
            times = request_times(_transcript(session), session.stamps)
            for budget in budgets:
                reference: Run | None = None
                for name, extra in runs:
                    row, replayed = await replay_module(session, budget, name, extra, measures)
                    rows.append(row)
                    reference = reference or replayed
                if reference is not None:
                    rows.append(replay_trimmer(session, budget, reference, measures, times))
        resumes = [await resume(session, budgets, repeats) for session in found]
        return rows, resumes  # noqa: ASYNC910 - the benchmark's only task

    with tallied_warnings() as tally:
        rows, resumes = anyio.run(main)
    return Result(tuple(budgets), rows, resumes, list(tally.tally.values()))


# -- the table -----------------------------------------------------------------------------------


def _k(budget: int) -> str:
    return f"{budget // 1000}k" if budget % 1000 == 0 else f"{budget:,}"


HEADER: Final = (
    "long sessions: session @ B, run",
    "requests",
    "latency ms: med / p99 / max",
    "views > B (max/B, 1 msg > B)",
    "comp/100",
    "brk/100",
    "cold",
    "bill 5m / none [k]",
    "mean ctx / msgs",
)


def _dominating(result: Result) -> set[tuple[str, int, str]]:
    """(session, budget, module run) where the trimmer bills less (5m) and keeps more
    mean context than that module run."""
    trimmer = {(r.session, r.budget): r for r in result.rows if r.run == TRIMMER}
    return {
        (r.session, r.budget, r.run)
        for r in result.rows
        if r.module
        and r.rejected is None
        and (t := trimmer.get((r.session, r.budget))) is not None
        and t.bill_5m < r.bill_5m
        and t.mean_context > r.mean_context
    }


def rows(result: Result) -> list[list[str]]:
    """One row per run of every case; ``*`` marks a trimmer row that is cheaper (5m) and
    keeps more mean context than a module run of its case."""
    dominating = {(session, budget) for session, budget, _ in _dominating(result)}
    out: list[list[str]] = []
    for row in result.rows:
        label = f"{row.session} @ {_k(row.budget)}, {row.run}"
        if row.run == TRIMMER and (row.session, row.budget) in dominating:
            label += " *"
        if row.rejected is not None:
            out.append([label, "rejected", *(["-"] * (len(HEADER) - 2))])
            continue
        latency = "-"
        if row.latency_ms is not None:
            latency = " / ".join(f"{ms:,.1f}" for ms in row.latency_ms)
        compactions = "-" if row.compactions_per_100 is None else f"{row.compactions_per_100:.1f}"
        out.append(
            [
                label,
                f"{row.requests:,}",
                latency,
                f"{row.over} ({row.max_ratio:.3f}, {row.over_single})",
                compactions,
                f"{row.breaks_per_100:.1f}",
                f"{row.cold}",
                f"{row.bill_5m / 1e3:,.0f} / {row.bill_none / 1e3:,.0f}",
                f"{row.mean_context:,.0f} / {row.mean_messages:,.0f}",
            ]
        )
    return out


def resume_header(result: Result) -> list[str]:
    return [
        "long sessions: resume (messages)",
        "json.dumps [ms]",
        *(f"set + 1st request @ {_k(b)} (set) [ms] / ratio" for b in result.budgets),
    ]


def resume_rows(result: Result) -> list[list[str]]:
    out: list[list[str]] = []
    for r in result.resumes:
        cells = [f"{r.session} ({r.messages:,})", f"{r.dumps_ms:,.1f}"]
        for budget in result.budgets:
            total, alone = r.resume_ms[budget]
            cells.append(f"{total:,.0f} ({alone:,.0f}) / {total / r.dumps_ms:.1f}x")
        out.append(cells)
    return out


def targets(result: Result) -> list[tuple[str, str, str, bool]]:
    """(name, measured, goal, ok) per target (legend)."""
    out: list[tuple[str, str, str, bool]] = []
    cases = len({(r.session, r.budget) for r in result.rows})
    for name in dict.fromkeys(r.run for r in result.rows if r.module):
        mine = [r for r in result.rows if r.run == name]
        if any(r.rejected is not None for r in mine):
            out.append((f"long, {name}: replayed", "rejected", "every case", False))
            continue
        over = sum(r.over - r.over_single for r in mine)
        views = sum(r.requests for r in mine)
        worst = max(mine, key=lambda r: r.max_ratio)
        measured = (
            f"{over} of {views:,} views; max {worst.max_ratio:.3f} x B "
            f"({worst.session} @ {_k(worst.budget)})"
        )
        out.append(
            (f"long, {name}: views over B (o200k) but one message alone", measured, "0", over == 0)
        )
        dominated = [key for key in _dominating(result) if key[2] == name]
        out.append(
            (
                f"long, {name}: cases {TRIMMER} is cheaper (5m) AND keeps more",
                f"{len(dominated)} of {cases}",
                "0",
                not dominated,
            )
        )
    return out


def notes(result: Result) -> list[str]:
    """The rejected runs and the module's log warnings, for below the table."""
    rejected: dict[tuple[str, str], int] = {}
    for row in result.rows:
        if row.rejected is not None:
            rejected[row.run, row.rejected] = rejected.get((row.run, row.rejected), 0) + 1
    out = [
        f"- Module run {name!r} rejected in {cases} cases: {why}"
        for (name, why), cases in rejected.items()
    ]
    out += [
        f"- Module log warning during the long sessions, {count} times (the first shown): {first}"
        for count, first in result.warnings
    ]
    return out


def _parse_runs(argv: Sequence[str] | None) -> list[tuple[str, dict[str, Any]]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long")
    parser.add_argument(
        "--run",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "KEY=VALUE"),
        help="one more module run: its name, then configuration keys (values parsed as JSON)",
    )
    args = parser.parse_args(argv)
    extra: list[tuple[str, dict[str, Any]]] = []
    for name, *assignments in args.run:
        try:
            extra.append((name, dict(parse_assignment(a) for a in assignments)))
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    return [*MODULE_RUNS, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    result = run(_parse_runs(argv))
    if not result.rows:
        print("no long sessions found (tests/realdata.py: long_sessions())")
        return 0
    print(format_table(list(HEADER), rows(result)))
    print()
    print(format_table(resume_header(result), resume_rows(result)))
    print()
    table = [
        [name, measured, goal, "PASS" if ok else "FAIL"]
        for name, measured, goal, ok in targets(result)
    ]
    print(format_table(["targets", "measured", "target", "result"], table))
    for note in notes(result):
        print(note)
    print(f"runtime {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
