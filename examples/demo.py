"""The real-session demo (``make demo``): one long conversation, three request paths.

Runs the scripted conversation of ``conversation.py`` through a real
``amplifier_core.AmplifierSession`` three times, with ``context-simple`` as the context,
``provider-window`` (a hard 32k window counted with the real o200k BPE) as the provider
and ``loop-negotiating`` as the orchestrator:

1. ``legacy``   - estimate-mode context, ``get_messages_for_request`` only;
2. ``measured`` - ``token_meter: "actual"``, the negotiated provider-count path;
3. ``hardfit``  - the retention capability, with a provider-directed hard-fit retry.

For each run it prints a table of the requests where something happened (plus every Nth),
one line per compaction saying what it removed (``compaction_line``: level, tokens before
-> after, messages removed, tool results truncated, user envelopes stubbed, thinking
blocks the view omits), a summary row, and writes ``out/demo-<run>.png`` (context
occupancy over requests) and ``out/demo-<run>.json`` (every row). The summary carries the session's bill: the
provider simulates a prefix cache and reports, per accepted request, the tokens read from
the cache (the prefix shared with the previous request), written to it and sent fresh;
the billed input prices them (``--price-fresh/--price-cache-read/--price-cache-write``,
defaults 1.0, 0.1, 1.25). ``out/demo-cost.png`` plots the cumulative billed input of every
run. The demo ends with a verdict: it FAILS (exit code 1), naming the run and the reason,
when a run degraded - a measured run that fell back to the legacy getter, a turn that
failed closed, was cancelled or hit an unhandled provider overflow, a session error, or a
request whose outcome its path does not produce when it works (``RunResult.problems``).

The example modules are found through their entry points when installed (the ``demo``
dependency group) and otherwise through ``sys.path`` (their directories are added here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent
for _path in (EXAMPLES, EXAMPLES / "provider-window", EXAMPLES / "loop-negotiating"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))

import anyio
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from amplifier_core import AmplifierSession
from conversation import (
    SCRIPT_CAPABILITY,
    SYSTEM_PROMPT,
    Conversation,
    build_conversation,
)
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from amplifier_module_context_simple.context.ladder.rungs import rung_name
from amplifier_module_context_simple.testing.thinking_oracle import PrefixLedger

MEASURED_CAPABILITY = "context.measured_request_view"
MEASURED_OUTCOMES = frozenset({"not_needed", "target_reached", "protected_floor", "reduced_output"})
"""The outcomes of a measured request whose provider count worked (``measurement_unavailable``
means the module fell back to its own estimate: a degraded request)."""


STALE_WINDOW = 40_000


@dataclass(frozen=True)
class Prices:
    """Price of one input token relative to a fresh one."""

    fresh: float = 1.0
    cache_read: float = 0.1
    cache_write: float = 1.25

    def billed(self, usage: Usage) -> float:
        """The billed-input equivalent of one request's usage."""
        return (
            usage.fresh * self.fresh
            + usage.cache_read * self.cache_read
            + usage.cache_write * self.cache_write
        )


@dataclass(frozen=True)
class Usage:
    """One accepted request's input as the provider reports it (``llm:response``).

    ``input_tokens`` is gross (fresh + cache read); ``cache_write`` is disjoint.
    """

    input_tokens: int
    cache_read: int
    cache_write: int

    @classmethod
    def from_payload(cls, usage: dict[str, Any]) -> Usage:
        return cls(
            int(usage.get("input_tokens") or 0),
            int(usage.get("cache_read_tokens") or 0),
            int(usage.get("cache_write_tokens") or 0),
        )

    @property
    def fresh(self) -> int:
        return self.input_tokens - self.cache_read

    @property
    def total(self) -> int:
        return self.input_tokens + self.cache_write


@dataclass(frozen=True)
class Bill:
    """A run's input bill: totals over its accepted requests."""

    requests: int
    total: int
    cache_read: int
    cache_write: int
    fresh: int
    billed: float

    @property
    def cached_share(self) -> float:
        return self.cache_read / self.total if self.total else 0.0


def bill(usages: Sequence[Usage], prices: Prices) -> Bill:
    """Sum ``usages`` and price them."""
    return Bill(
        requests=len(usages),
        total=sum(u.total for u in usages),
        cache_read=sum(u.cache_read for u in usages),
        cache_write=sum(u.cache_write for u in usages),
        fresh=sum(u.fresh for u in usages),
        billed=sum(prices.billed(u) for u in usages),
    )


@dataclass(frozen=True)
class Compaction:
    """One ``context:compaction`` event: the provider request (row number, 0 before the
    first) and turn it came in, and its payload (``CompactionStats.to_event()``)."""

    request: int
    turn: int
    payload: dict[str, Any]


REDUCTIONS = (
    ("messages_removed", "removed {} message(s)"),
    ("messages_truncated", "truncated {} tool result(s)"),
    ("user_messages_stubbed", "stubbed {} user envelope(s)"),
    ("protected_results_truncated", "truncated {} protected result(s)"),
)
"""The payload's cumulative counts (the view's committed decisions only grow), and how a
compaction line names what one compaction added to them."""


def compaction_line(number: int, event: Compaction, previous: Compaction | None) -> str:
    """One line saying what compaction ``number`` of a run removed: its level, what it
    added to the view's decisions since the previous compaction (its counts are
    cumulative), the thinking blocks the view leaves out, and tokens before -> after (the
    provider's count on the measured path, the module's estimate otherwise)."""
    data = event.payload
    before = previous.payload if previous is not None else {}
    done = []
    for key, text in REDUCTIONS:
        now, was = int(data.get(key) or 0), int(before.get(key) or 0)
        added = now - was if now >= was else now  # fewer: the decisions were reset
        if added:
            done.append(text.format(f"{added:,}"))
    thinking = int(data.get("thinking_blocks_omitted") or 0)
    if thinking:
        done.append(f"view omits {thinking:,} thinking block(s)")
    if data.get("measured_after") is not None:
        start, end, unit = data.get("measured_before"), data["measured_after"], "provider count"
    else:
        start, end, unit = data.get("before_tokens"), data.get("after_tokens"), "estimate"
    target = _figure(data.get("target_tokens"))
    tokens = f"{_figure(start)} -> {_figure(end)} tokens ({unit}; target {target})"
    outcome = f" {data['outcome']}" if data.get("outcome") else ""
    return (
        f"compaction {number} at request {event.request} (turn {event.turn}): "
        f"L{data.get('strategy_level', '?')}{outcome}, {tokens}; "
        + (", ".join(done) if done else "no new reduction")
    )


def compaction_lines(result: RunResult) -> list[str]:
    """``compaction_line`` for every compaction of ``result``, in order."""
    events = result.compaction_events
    return [
        compaction_line(index + 1, event, events[index - 1] if index else None)
        for index, event in enumerate(events)
    ]


def _figure(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


@dataclass(frozen=True)
class RunSpec:
    """One of the three runs: the loop mode, the context's token meter, and whether the
    provider advertises a stale (larger) window than the one it enforces."""

    key: str
    title: str
    mode: str
    token_meter: str
    stale_window: bool = False


RUNS = (
    RunSpec("legacy", "legacy estimate mode", "legacy", "estimate"),
    RunSpec("measured", "measured negotiation", "measured", "actual"),
    RunSpec("hardfit", "hard-fit retry", "hardfit", "estimate", stale_window=True),
)


@dataclass
class RunResult:
    """What one run produced."""

    spec: RunSpec
    rows: list[Any] = field(default_factory=list)
    seconds: float = 0.0
    turns: int = 0
    failed_turns: int = 0
    session_errors: list[str] = field(default_factory=list)
    overflow_errors: int = 0
    unhandled: int = 0
    recovered: int = 0
    context_failures: int = 0
    count_calls: int = 0
    compactions: int = 0
    degraded: str | None = None
    plot: Path | None = None
    usages: list[Usage] = field(default_factory=list)
    """The provider's usage of every accepted request, in order."""
    compaction_events: list[Compaction] = field(default_factory=list)
    """Every ``context:compaction`` event of the run, in order, with its request."""
    thinking_sent: int = 0
    """Thinking blocks the provider received back (every answer carries one)."""
    meter: dict[str, Any] | None = None
    """The context's meter stats after the last request (its count correction)."""
    thinking_invalid: int = 0
    """Requests a model with preserved thinking rejects: a thinking block sent with another
    prefix than the request that produced it (``testing/thinking_oracle.py``)."""

    @property
    def ok(self) -> bool:
        """The run did not degrade (``problems`` is empty)."""
        return not self.problems()

    def problems(self) -> list[str]:
        """Why the run degraded, one line per kind of problem (empty: it did not)."""
        found: list[str] = []
        if self.degraded:
            found.append(f"fell back to the legacy getter: {self.degraded}")
        if self.unhandled:
            found.append(f"{self.unhandled} unhandled provider overflow(s)")
        if self.context_failures:
            found.append(
                f"{self.context_failures} turn(s) failed closed (the context raised "
                "ContextLengthError)"
            )
        other = self.failed_turns - self.unhandled - self.context_failures
        if other > 0:
            found.append(f"{other} turn(s) failed or were cancelled")
        if self.thinking_invalid:
            found.append(
                f"{self.thinking_invalid} request(s) a model with preserved thinking rejects "
                "(a thinking block sent with another prefix than it was produced with)"
            )
        if self.session_errors:
            found.append(
                f"{len(self.session_errors)} session error(s); first: {self.session_errors[0]}"
            )
        unexpected = Counter(
            row.outcome
            for row in self.rows
            if row.overflow not in ("unhandled", "context")  # counted above
            and not outcome_expected(self.spec.mode, row.outcome)
        )
        if unexpected:
            found.append(
                f"unexpected outcome(s) for mode {self.spec.mode!r}: "
                + ", ".join(f"{outcome!r} x{n}" for outcome, n in unexpected.most_common())
            )
        return found


def outcome_expected(mode: str, outcome: str) -> bool:
    """Whether a request's ``outcome`` is one its path produces when it works: a measured
    outcome of ``MEASURED_OUTCOMES`` on the measured path, ``-`` or ``level N`` (the
    context's strategy level) on the others."""
    if mode == "measured":
        return outcome in MEASURED_OUTCOMES
    return outcome == "-" or outcome.startswith("level ")


def verdict(results: Sequence[RunResult]) -> list[str]:
    """Why the demo failed, ``"<run>: <problem>"`` per line (empty: it passed)."""
    if not results:
        return ["no run was selected"]
    return [f"{result.spec.key}: {problem}" for result in results for problem in result.problems()]


def mount_plan(spec: RunSpec, provider_config: dict[str, Any]) -> dict[str, Any]:
    """The AmplifierSession mount plan for ``spec``."""
    return {
        "session": {"orchestrator": "loop-negotiating", "context": "context-simple"},
        "orchestrator": {"config": {"mode": spec.mode}},
        "context": {"config": {"token_meter": spec.token_meter}},
        "providers": [{"module": "provider-window", "config": dict(provider_config)}],
    }


async def run_conversation(
    spec: RunSpec, conversation: Conversation, provider_config: dict[str, Any]
) -> RunResult:
    """Replay ``conversation`` through a real session configured for ``spec``."""
    result = RunResult(spec)
    session = AmplifierSession(mount_plan(spec, provider_config))
    session.coordinator.register_capability(SCRIPT_CAPABILITY, conversation)
    await session.initialize()

    async def on_response(  # noqa: ASYNC910 - records in memory: nothing to wait for
        event: str,
        data: dict[str, Any],
    ) -> None:
        usage = data.get("usage")
        if isinstance(usage, dict):
            result.usages.append(Usage.from_payload(usage))

    async def on_compaction(  # noqa: ASYNC910 - records in memory: nothing to wait for
        event: str,
        data: dict[str, Any],
    ) -> None:
        rows = getattr(session.coordinator.get("orchestrator"), "rows", None) or []
        request, turn = (rows[-1].number, rows[-1].turn) if rows else (0, 0)
        result.compaction_events.append(Compaction(request, turn, dict(data or {})))

    session.coordinator.hooks.register("llm:response", on_response, name="demo-bill")
    session.coordinator.hooks.register("context:compaction", on_compaction, name="demo-compactions")
    try:
        context = session.coordinator.get("context")
        await context.add_message({"role": "system", "content": SYSTEM_PROMPT})
        started = time.perf_counter()
        for turn in conversation.turns:
            try:
                answer = await session.execute(turn.prompt)
            except RuntimeError as exc:
                result.session_errors.append(f"turn {turn.number}: {exc}")
                continue
            result.turns += 1
            result.failed_turns += str(answer).startswith("[turn ")
        result.seconds = time.perf_counter() - started
        collect(result, session)
    finally:
        with anyio.CancelScope(shield=True):  # the kernel's session is always cleaned up
            await session.cleanup()
    return result


def collect(result: RunResult, session: Any) -> None:
    """Copy the orchestrator's rows and the provider's counters into ``result``."""
    loop = session.coordinator.get("orchestrator")
    provider = next(iter(session.coordinator.get("providers").values()))
    result.rows = list(loop.rows)
    result.unhandled = loop.unhandled_overflows
    result.recovered = loop.recovered_overflows
    result.context_failures = loop.context_failures
    result.degraded = loop.degraded
    result.compactions = loop.events.total.get("context:compaction", 0)
    result.overflow_errors = provider.stats.overflow_errors
    result.count_calls = provider.stats.count_calls
    result.meter = session.coordinator.get("context").last_token_meter_stats
    check_thinking(result, provider.stats.exchanges)
    capability = session.coordinator.get_capability(MEASURED_CAPABILITY)
    if result.spec.mode == "measured" and result.degraded is None and capability is None:
        result.degraded = f"capability {MEASURED_CAPABILITY!r} is missing"


def check_thinking(result: RunResult, exchanges: Sequence[tuple[list[Any], str]]) -> None:
    """Check every request the provider answered under the preserved-thinking prefix rule:
    each answer's thinking block is bound to the request it answered."""
    ledger = PrefixLedger()
    for messages, signature in exchanges:
        verdict = ledger.check(messages)
        result.thinking_sent += verdict.shown
        result.thinking_invalid += bool(verdict.invalid)
        block = {"type": "thinking", "thinking": "", "signature": signature}
        ledger.answered(messages, {"role": "assistant", "content": [block]})


# -- tables ----------------------------------------------------------------------------


def is_notable(row: Any) -> bool:
    """A row where the context or the provider did something worth showing."""
    quiet = row.outcome in ("-", "not_needed") or row.outcome.startswith("level")
    return bool(row.compactions or row.overflow or not quiet)


def select_rows(rows: Sequence[Any], every: int, limit: int) -> list[Any]:
    """Notable rows (thinned evenly to ``limit``), every ``every``-th row, first and last."""
    notable = [row for row in rows if is_notable(row)]
    if len(notable) > limit:
        step = len(notable) / limit
        notable = [notable[int(index * step)] for index in range(limit)]
    chosen = {row.number: row for row in notable}
    for row in rows:
        if row.number % every == 0 or row.number in (1, len(rows)):
            chosen.setdefault(row.number, row)
    return [chosen[number] for number in sorted(chosen)]


def level_name(level: int) -> str:
    """`` <name>`` of the rung a strategy level reached (the module's rung table), or
    nothing for a level that names no rung."""
    name = rung_name(level)
    return f" {name}" if name else ""


def outcome_cell(row: Any) -> str:
    """Outcome/level text (a level with its rung's name), with overflow markers coloured."""
    text = str(row.outcome)
    if row.level is not None and text.startswith("level"):
        text += level_name(row.level)
    elif row.level is not None:
        text += f" (L{row.level}{level_name(row.level)})"
    rejected = f"{row.rejected_tokens:,}" if row.rejected_tokens is not None else "?"
    if row.overflow == "recovered":
        text += f" [yellow]{rejected} rejected → hard-fit ok[/]"
    elif row.overflow == "unhandled":
        text += f" [bold red]OVERFLOW {rejected}[/]"
    elif row.overflow == "context":
        text += " [red]context fail-closed[/]"
    return text


def request_table(result: RunResult, every: int, limit: int) -> Table:
    """The per-request table of one run."""
    shown = select_rows(result.rows, every, limit)
    table = Table(
        title=f"{result.spec.title}: {len(shown)} of {len(result.rows)} requests "
        f"(notable + every {every}th)",
        title_justify="left",
    )
    for name in ("req", "turn", "history", "view", "window", "outcome / level", "counts"):
        table.add_column(name, justify="right" if name != "outcome / level" else "left")
    table.add_column("events", overflow="fold")
    for row in shown:
        view = "-" if row.view_tokens is None else f"{row.view_tokens:,}"
        table.add_row(
            str(row.number),
            str(row.turn),
            f"{row.history_tokens:,}",
            view,
            f"{row.window:,}",
            outcome_cell(row),
            str(row.count_calls),
            escape(", ".join(row.events))
            or ("" if not row.note else f"[dim]{escape(row.note)}[/]"),
        )
    return table


def summary_table(results: Sequence[RunResult], prices: Prices | None = None) -> Table:
    """One summary row per run, with its input bill under ``prices``."""
    prices = prices or Prices()
    table = Table(
        title=f"summary (billed input: fresh x {prices.fresh:g} + cache read x "
        f"{prices.cache_read:g} + cache write x {prices.cache_write:g})",
        title_justify="left",
    )
    columns = (
        "run", "requests", "turns ok", "compaction boundaries", "provider overflows",
        "recovered", "unhandled", "context fail-closed", "provider counts", "peak view",
        "input tokens", "cached", "cache writes", "billed input", "thinking sent",
        "invalid thinking", "seconds", "verdict",
    )  # fmt: skip
    for name in columns:
        table.add_column(name, justify="left" if name == "run" else "right")
    for result in results:
        peak = max((row.view_tokens or 0 for row in result.rows), default=0)
        unhandled = f"[bold red]{result.unhandled}[/]" if result.unhandled else "0"
        cost = bill(result.usages, prices)
        table.add_row(
            result.spec.key,
            str(len(result.rows)),
            f"{result.turns - result.failed_turns}/{result.turns + len(result.session_errors)}",
            str(result.compactions),
            str(result.overflow_errors),
            str(result.recovered),
            unhandled,
            str(result.context_failures),
            str(result.count_calls),
            f"{peak:,}",
            f"{cost.total:,}",
            f"{cost.cached_share:.1%}",
            f"{cost.cache_write:,}",
            f"{cost.billed:,.0f}",
            f"{result.thinking_sent:,}",
            f"[bold red]{result.thinking_invalid}[/]" if result.thinking_invalid else "0",
            f"{result.seconds:.1f}",
            "ok" if result.ok else "[bold red]FAILED[/]",
        )
    return table


# -- plots and files -------------------------------------------------------------------


def plot_run(result: RunResult, path: Path) -> Path:
    """Context occupancy over requests: history vs view vs window, boundaries marked."""
    rows = result.rows
    numbers = [row.number for row in rows]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    top.plot(numbers, [row.history_tokens for row in rows], color="tab:gray", label="history")
    top.set_ylabel("history tokens (o200k)")
    top.legend(loc="upper left")
    views = [row.view_tokens if row.view_tokens is not None else float("nan") for row in rows]
    bottom.plot(numbers, views, color="tab:blue", label="view sent")
    bottom.plot(numbers, [row.window for row in rows], color="black", label="window")
    limits = [row.input_limit or float("nan") for row in rows]
    bottom.plot(numbers, limits, color="black", linestyle="--", label="input limit")
    for index, row in enumerate(rows):
        if row.compactions:
            label = "compaction" if index == _first(rows, "compactions") else None
            bottom.axvline(row.number, color="tab:orange", alpha=0.35, linewidth=1, label=label)
    _mark(bottom, rows, "unhandled", "red", "unhandled overflow")
    _mark(bottom, rows, "recovered", "goldenrod", "rejected, then hard-fit ok")
    _mark(bottom, rows, "context", "purple", "context fail-closed")
    bottom.set_ylabel("tokens")
    bottom.set_xlabel("provider request")
    bottom.set_ylim(0, max(rows[0].window if rows else 1, 1) * 1.1)
    bottom.legend(loc="lower right", fontsize="small")
    figure.suptitle(f"context-simple demo: {result.spec.title}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_cost(results: Sequence[RunResult], prices: Prices, path: Path) -> Path:
    """Cumulative billed input over the accepted requests, one line per run."""
    figure, axes = plt.subplots(figsize=(11, 5))
    for result in results:
        running, total = [], 0.0
        for usage in result.usages:
            total += prices.billed(usage)
            running.append(total)
        axes.plot(
            range(1, len(running) + 1),
            running,
            label=f"{result.spec.title} ({total:,.0f})",
        )
    axes.set_xlabel("accepted provider request")
    axes.set_ylabel("cumulative billed input (fresh-token equivalents)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
    axes.set_title(
        f"context-simple demo: what the session costs (fresh x {prices.fresh:g}, "
        f"cache read x {prices.cache_read:g}, cache write x {prices.cache_write:g})"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _first(rows: Sequence[Any], attribute: str) -> int:
    return next((i for i, row in enumerate(rows) if getattr(row, attribute)), -1)


def _mark(axes: Any, rows: Sequence[Any], overflow: str, colour: str, label: str) -> None:
    hits = [row for row in rows if row.overflow == overflow]
    if hits:
        axes.scatter(
            [row.number for row in hits],
            [row.rejected_tokens or row.view_tokens or 0 for row in hits],
            color=colour,
            marker="x",
            zorder=3,
            label=label,
        )


def write_rows(result: RunResult, path: Path) -> None:
    """Every row of the run as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([row.as_dict() for row in result.rows], indent=1))


# -- main ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options (all have demo defaults)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=160)
    parser.add_argument("--window", type=int, default=32_000)
    parser.add_argument("--max-output", type=int, default=4_000)
    parser.add_argument(
        "--stale-window",
        type=int,
        default=STALE_WINDOW,
        help="window the provider advertises in the hard-fit run (0: the real one)",
    )
    parser.add_argument("--runs", default=",".join(spec.key for spec in RUNS))
    parser.add_argument("--every", type=int, default=25, help="also show every Nth request")
    parser.add_argument("--limit", type=int, default=30, help="at most this many notable rows")
    parser.add_argument("--out", type=Path, default=ROOT / "out")
    parser.add_argument("--price-fresh", type=float, default=Prices.fresh)
    parser.add_argument("--price-cache-read", type=float, default=Prices.cache_read)
    parser.add_argument("--price-cache-write", type=float, default=Prices.cache_write)
    return parser.parse_args(list(argv))


async def main(argv: Sequence[str]) -> int:
    """Run the selected runs; return the process exit code."""
    options = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 210)
    conversation = build_conversation(options.turns)
    stats = conversation.stats()
    console.print(
        f"[bold]conversation[/]: {stats.turns} turns, {stats.tool_calls} tool calls "
        f"({stats.anthropic_calls} Anthropic-style), tool output bytes {stats.output_bytes}"
    )
    wanted = set(options.runs.split(","))
    results: list[RunResult] = []
    for spec in RUNS:
        if spec.key not in wanted:
            continue
        with captured_warnings() as tally:
            result = await run_conversation(spec, conversation, provider_config(spec, options))
        report_run(console, result, options, tally)
        results.append(result)
    prices = Prices(options.price_fresh, options.price_cache_read, options.price_cache_write)
    console.print(summary_table(results, prices))
    if results:
        console.print(f"cost plot: {plot_cost(results, prices, options.out / 'demo-cost.png')}")
    problems = verdict(results)
    if problems:
        console.print("verdict: [bold red]FAILED[/]")
        for line in problems:
            console.print(f"  {escape(line)}")
    else:
        console.print(
            "verdict: [bold green]ok[/] (no run fell back to the legacy getter, failed "
            "closed, failed or cancelled a turn, hit an unhandled provider overflow or a "
            "session error, or had an unexpected outcome)"
        )
    return 1 if problems else 0  # noqa: ASYNC910 - the demo's only task: nothing cancels it


def provider_config(spec: RunSpec, options: argparse.Namespace) -> dict[str, Any]:
    """The provider's config for ``spec``: the real window, maybe a stale advertised one."""
    config: dict[str, Any] = {
        "context_window": options.window,
        "max_output_tokens": options.max_output,
    }
    if spec.stale_window and options.stale_window:
        config["advertised_context_window"] = options.stale_window
    return config


class WarningTally(logging.Handler):
    """Collects WARNING+ log records during a run instead of printing each one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[str]:
        """One line per logger: how many warnings, and the first message, whole."""
        by_logger: dict[str, list[logging.LogRecord]] = {}
        for record in self.records:
            by_logger.setdefault(record.name, []).append(record)
        return [
            f"{name}: {len(records)} warning(s); first: {records[0].getMessage()}"
            for name, records in by_logger.items()
        ]


@contextlib.contextmanager
def captured_warnings() -> Iterator[WarningTally]:
    """Route WARNING+ records to a tally for the duration of the block."""
    tally = WarningTally()
    root = logging.getLogger()
    root.addHandler(tally)
    try:
        yield tally
    finally:
        root.removeHandler(tally)


def correction_line(meter: dict[str, Any] | None) -> str | None:
    """What the context made of the provider's usage reports (estimate mode), or None."""
    if meter is None or "count_scale" not in meter:
        return None
    if meter["mode"] != "estimate":
        return "count correction: none (token_meter=actual: the provider's counts are used)"
    return (
        f"count correction: {meter['count_samples']} usage report(s) in the window; the "
        f"provider counts {meter['count_scale']:.3f} tokens per estimated token; margin "
        f"{meter['count_margin']:.1%} kept below the budget"
    )


def report_run(
    console: Console, result: RunResult, options: argparse.Namespace, tally: WarningTally
) -> None:
    """Print one run's table and notices; write its plot and rows."""
    stale = ""
    if result.spec.stale_window and options.stale_window:
        stale = f", provider advertises {options.stale_window:,} but enforces {options.window:,}"
    console.rule(
        f"[bold]{result.spec.title}[/] (mode={result.spec.mode}, "
        f"token_meter={result.spec.token_meter}{stale})"
    )
    for line in tally.lines():
        console.print(f"[dim]log[/] {escape(line)}")
    if result.degraded:
        console.print(
            f"[bold yellow]measured path unavailable[/]: {result.degraded}; "
            "this run used the legacy getter instead."
        )
    for error in result.session_errors[:5]:
        console.print(f"[bold red]session error[/] {escape(error)}")
    console.print(request_table(result, options.every, options.limit))
    for line in compaction_lines(result):
        console.print(escape(line), soft_wrap=True)
    correction = correction_line(result.meter)
    if correction is not None:
        console.print(correction)
    result.plot = plot_run(result, options.out / f"demo-{result.spec.key}.png")
    write_rows(result, options.out / f"demo-{result.spec.key}.json")
    console.print(f"plot: {result.plot}  rows: {options.out / f'demo-{result.spec.key}.json'}")


if __name__ == "__main__":
    exit_code = asyncio.run(main(sys.argv[1:]))
    gc.collect()
    sys.exit(exit_code)
