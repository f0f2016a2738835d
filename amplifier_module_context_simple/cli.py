"""``amplifier-context-simple replay``: replay a transcript and report the compaction cadence.

::

    amplifier-context-simple replay TRANSCRIPT [--set key=value ...]
        [--window N --max-output N] [--compare key=value ...] [--sliding-window]
        [--price-fresh X --price-cache-read X --price-cache-write X]
        [--plot FILE] [--plot-cost FILE] [--json]

The transcript holds one message object per line (Amplifier's ``transcript.jsonl``; blank
lines are skipped) or one JSON array of messages. Messages are admitted in order with
``add_message``; right before each assistant message (where the provider was called) and
once at the end, the tool makes a request with ``get_messages_for_request``. The provider
is a stub whose ``get_info().defaults`` carry ``--window`` and ``--max-output``; without
``--window`` no provider is passed and the module uses its fallback budget.

``--set`` overrides configuration keys (a value is parsed as JSON when it can be -
numbers, ``true``/``false``, ``null`` - and is a string otherwise). ``--compare`` replays
a second configuration (the ``--set`` one plus these overrides) and reports both side by
side. ``--sliding-window`` also replays a per-request trimmer on the same transcript: on
every request it drops the oldest non-system messages (a tool call with its results, never
a result without its call) until the view fits ``target_usage`` x the module's budget.

The bill: every run's views are passed through a simulated prompt cache, the one the demo's
``provider-window`` applies. Each view's messages are counted with the module's estimator
(``estimate_message``, not a provider tokenizer); the leading messages a view shares with the
previous request's view are read from the cache, the last message (the new input) is fresh,
and everything between is a cache write. The billed input is ``fresh x --price-fresh +
read x --price-cache-read + write x --price-cache-write`` (defaults 1.0, 0.1, 1.25).

``--plot FILE`` writes a PNG of the views, ``--plot-cost FILE`` one of the cumulative billed
input (both need matplotlib, which is not a dependency of the package). ``--json`` prints
the report as JSON.

Malformed input (invalid JSON, a non-object, a message the module rejects with
``InvalidMessageError``) is reported on stderr with its line (or array item) number and
skipped. Exit codes: 0 replayed; 1 the transcript cannot be read, holds nothing
replayable, or the plot cannot be written (matplotlib missing, unwritable file);
2 usage error (bad option, unknown configuration key, invalid value).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio

from .context.classify import carried_result_ids, declared_call_ids
from .context.config import ContextConfig
from .context.estimate import estimate_message
from .context.history import validate_message
from .context.ingress import cap_tool_result
from .context.store import BUDGET_EVENT, COMPACTION_EVENT
from .errors import InvalidMessageError
from .manager import SimpleContextManager

__all__ = (
    "CONFIG_KEYS",
    "DEFAULT_PRICES",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "SUMMARY_ROWS",
    "CacheUse",
    "CliError",
    "EventLog",
    "Prices",
    "Problem",
    "ProviderInfo",
    "RequestRecord",
    "Run",
    "Transcript",
    "WarningTally",
    "WindowProvider",
    "build_config",
    "build_parser",
    "cache_use",
    "cumulative_billed",
    "format_table",
    "main",
    "message_key",
    "parse_assignment",
    "parse_transcript",
    "replay",
    "replay_sliding_window",
    "report_dict",
    "report_text",
    "run_replay",
    "simulate_cache",
    "sliding_window_view",
    "tallied_warnings",
    "use_agg_backend",
    "write_cost_plot",
    "write_plot",
)


PROG: Final = "amplifier-context-simple"
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
CONFIG_KEYS: Final = tuple(f.name for f in dataclasses.fields(ContextConfig))


class CliError(Exception):
    """A failure reported as ``PROG: error: <message>`` with exit code ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# -- parsing ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """A skipped piece of input: where it was (``unit`` ``number``) and why."""

    unit: str
    number: int
    reason: str

    def __str__(self) -> str:
        return f"{self.unit} {self.number}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Transcript:
    """The replayable messages of a transcript, each with its line (or item) number."""

    path: Path
    unit: str
    """``"line"`` (one message per line) or ``"item"`` (one JSON array)."""
    messages: list[tuple[int, dict[str, Any]]]
    problems: list[Problem]


def parse_transcript(path: Path, data: bytes) -> Transcript:
    """Split ``data`` into valid messages and problems; never raises for bad content.

    A document whose first non-blank character is ``[`` and which parses as a JSON array
    is read as one array; anything else is read line by line. Each message must be a JSON
    object that passes the module's own admission check (``InvalidMessageError``).

    Raises:
        CliError: (exit 1) the document looks like a JSON array but is not valid JSON.
    """
    text = data.decode("utf-8-sig", errors="replace")
    if text.lstrip().startswith("["):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            first = text.lstrip().splitlines()[0]
            if not _is_json(first):
                raise CliError(f"{path}: not a valid JSON array: {exc}", EXIT_FAILURE) from exc
        else:
            if isinstance(document, list):
                return _checked(path, "item", list(enumerate(document, start=1)))
    rows: list[tuple[int, object]] = []
    problems: list[Problem] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
        except UnicodeDecodeError as exc:
            problems.append(Problem("line", number, f"not UTF-8 ({exc.reason})"))
            continue
        if not line:
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            problems.append(Problem("line", number, f"invalid JSON ({exc.msg})"))
    checked = _checked(path, "line", rows)
    return dataclasses.replace(
        checked, problems=sorted(problems + checked.problems, key=lambda p: p.number)
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _checked(path: Path, unit: str, rows: list[tuple[int, object]]) -> Transcript:
    messages: list[tuple[int, dict[str, Any]]] = []
    problems: list[Problem] = []
    for number, value in rows:
        if not isinstance(value, dict):
            problems.append(Problem(unit, number, f"not a JSON object ({type(value).__name__})"))
            continue
        try:
            validate_message(value)
        except InvalidMessageError as exc:
            problems.append(Problem(unit, number, f"rejected by the module: {exc}"))
            continue
        messages.append((number, value))
    return Transcript(path, unit, messages, problems)


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)``; the value is JSON when it parses, else the string.

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty key.
    """
    key, sep, raw = (part.strip() for part in text.partition("="))
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE, got {text!r} (a TRANSCRIPT after --set/--compare needs "
            "a -- before it)"
        )
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def build_config(overrides: dict[str, Any], option: str) -> ContextConfig:
    """The validated configuration for ``overrides`` (strict: no lenient fallbacks).

    Raises:
        CliError: (exit 2) an unknown key, or the module's ``ValueError`` for a value.
    """
    unknown = sorted(set(overrides) - set(CONFIG_KEYS))
    if unknown:
        raise CliError(
            f"{option}: unknown configuration key {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(CONFIG_KEYS)})",
            EXIT_USAGE,
        )
    try:
        return ContextConfig(**overrides)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}", EXIT_USAGE) from exc


# -- the bill --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prices:
    """Price of one input token relative to a fresh one: fresh, cache read, cache write."""

    fresh: float = 1.0
    cache_read: float = 0.1
    cache_write: float = 1.25

    def billed(self, fresh: int, cache_read: int, cache_write: int) -> float:
        """The billed-input equivalent (in fresh-token units) of these figures."""
        return fresh * self.fresh + cache_read * self.cache_read + cache_write * self.cache_write

    def describe(self) -> str:
        return (
            f"fresh {self.fresh:g}, cache read {self.cache_read:g}, "
            f"cache write {self.cache_write:g} (x a fresh input token)"
        )


DEFAULT_PRICES: Final = Prices()


@dataclass(frozen=True, slots=True)
class CacheUse:
    """One request through the simulated prompt cache (all in view tokens).

    ``total == cache_read + cache_write + fresh``.
    """

    total: int
    cache_read: int
    cache_write: int
    fresh: int
    shared_messages: int
    """Leading messages shared with the previous request's view (read from the cache)."""


def cache_use(
    previous: Sequence[tuple[str, int]] | None, current: Sequence[tuple[str, int]]
) -> CacheUse:
    """The cache figures of a view, given the previous request's view.

    Views are ``(message key, tokens)`` pairs. The common prefix (compared message by
    message) is read from the cache; of the rest, the last message - the new input - is
    fresh and everything before it is written to the cache (the model of the demo's
    ``provider-window``, without its request framing).
    """
    shared = 0
    for before, now in zip(previous or (), current, strict=False):
        if before[0] != now[0]:
            break
        shared += 1
    tokens = [count for _, count in current]
    read = sum(tokens[:shared])
    fresh = tokens[-1] if shared < len(tokens) else 0
    write = sum(tokens[shared:-1]) if shared < len(tokens) else 0
    return CacheUse(sum(tokens), read, write, fresh, shared)


def simulate_cache(views: Sequence[Sequence[tuple[str, int]]]) -> list[CacheUse]:
    """``cache_use`` of each view against the one before it (the first has no cache)."""
    uses: list[CacheUse] = []
    previous: Sequence[tuple[str, int]] | None = None
    for view in views:
        uses.append(cache_use(previous, view))
        previous = view
    return uses


def message_key(message: Mapping[str, Any]) -> str:
    """A digest of what a provider sees of ``message`` (``metadata`` is not sent)."""
    visible = {k: v for k, v in message.items() if k != "metadata"}
    text = json.dumps(visible, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _keyed(view: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    return [(message_key(m), estimate_message(m)) for m in view]


def cumulative_billed(records: Sequence[RequestRecord], prices: Prices) -> list[float]:
    """The running total of the billed input, request by request."""
    out: list[float] = []
    total = 0.0
    for r in records:
        total += prices.billed(r.cache.fresh, r.cache.cache_read, r.cache.cache_write)
        out.append(total)
    return out


# -- replay ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    """What ``get_info()`` returns: only ``defaults`` is read by the module."""

    defaults: dict[str, int]


@dataclass(frozen=True, slots=True)
class WindowProvider:
    """A provider stub that publishes a context window and a max output."""

    context_window: int
    max_output_tokens: int

    def get_info(self) -> ProviderInfo:
        return ProviderInfo(
            {"context_window": self.context_window, "max_output_tokens": self.max_output_tokens}
        )


@dataclass(slots=True)
class EventLog:
    """A hooks object: records every event the module emits, in order."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def emit(self, event: str, data: dict[str, Any]) -> None:  # noqa: ASYNC910 - records only
        self.events.append((event, dict(data)))


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One replayed request: the history it saw and the view it got."""

    number: int
    history_messages: int
    history_tokens: int
    """The module's estimate of every admitted message as the module holds it - after the
    tool-result ingress cap - uncompacted: what a request without compaction shows."""
    view_messages: int
    view_tokens: int
    """The module's estimate of the returned view (notice included)."""
    compaction: dict[str, Any] | None
    """The ``context:compaction`` payload when this request emitted one."""
    cache: CacheUse = CacheUse(0, 0, 0, 0, 0)
    """The view through the simulated prompt cache (against the previous request's view)."""


def _record(
    number: int,
    history_messages: int,
    history_tokens: int,
    keyed: Sequence[tuple[str, int]],
    compaction: dict[str, Any] | None,
    previous: Sequence[tuple[str, int]] | None,
) -> RequestRecord:
    """One replayed request's record: ``keyed`` is the view as (key, tokens) pairs."""
    return RequestRecord(
        number=number,
        history_messages=history_messages,
        history_tokens=history_tokens,
        view_messages=len(keyed),
        view_tokens=sum(tokens for _, tokens in keyed),
        compaction=compaction,
        cache=cache_use(previous, keyed),
    )


@dataclass(frozen=True, slots=True)
class Run:
    """The replay of one configuration."""

    name: str
    overrides: dict[str, Any]
    config: ContextConfig
    budget: dict[str, Any]
    """The last ``context:budget`` provenance (``effective_budget`` is the budget)."""
    records: list[RequestRecord]
    prices: Prices = DEFAULT_PRICES
    baseline: str | None = None
    """Set for a baseline policy run (not the module): its description."""

    @property
    def label(self) -> str:
        if self.baseline is not None:
            return self.baseline
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in self.overrides.items()) or "defaults"

    @property
    def compactions(self) -> dict[int, dict[str, Any]]:
        """Request number -> ``context:compaction`` payload, for the compaction boundaries."""
        return {r.number: r.compaction for r in self.records if r.compaction is not None}

    @property
    def trigger_tokens(self) -> int:
        """The fewest used tokens that fire compaction: threshold x (budget - notice reserve).

        Mirrors ``SimpleContextManager``'s trigger, for the report and the plot.
        """
        budget: int = self.budget["effective_budget"]
        reserve = self.config.compaction_notice_token_reserve
        if self.config.compaction_notice_enabled and budget - reserve > 0:
            budget -= reserve
        return math.ceil(budget * self.config.compact_threshold)

    def totals(self) -> dict[str, Any]:
        """The summary figures (the ``totals`` of the JSON report)."""
        requests, compactions = len(self.records), list(self.compactions.values())
        budget: int = self.budget["effective_budget"]
        max_view = max(r.view_tokens for r in self.records)
        return {
            "requests": requests,
            "compaction_boundaries": len(compactions),
            "boundaries_per_100_requests": round(100 * len(compactions) / requests, 2),
            "budget": budget,
            "budget_source": self.budget["source"],
            "trigger_tokens": self.trigger_tokens,
            "max_view_tokens": max_view,
            "max_view_over_budget": round(max_view / budget, 4),
            "max_level": max((c["strategy_level"] for c in compactions), default=0),
            "floor_hits": sum(c.get("floor_tokens") is not None for c in compactions),
            **self.bill(),
        }

    def bill(self) -> dict[str, Any]:
        """The session's bill under the simulated prompt cache and ``prices``."""
        uses = [r.cache for r in self.records]
        total = sum(u.total for u in uses)
        read = sum(u.cache_read for u in uses)
        write = sum(u.cache_write for u in uses)
        fresh = sum(u.fresh for u in uses)
        billed = self.prices.billed(fresh, read, write)
        budget: int = self.budget["effective_budget"]
        return {
            "input_tokens": total,
            "cache_read_tokens": read,
            "cache_write_tokens": write,
            "fresh_tokens": fresh,
            "cached_share": round(read / total, 4) if total else 0.0,
            "billed_input": round(billed, 1),
            "billed_over_input": round(billed / total, 4) if total else 0.0,
            # A break: the cached prefix ends before the previous view's last message (a
            # trailing message re-sent after new ones, e.g. the compaction notice, is not).
            "prefix_breaks": sum(
                u.shared_messages < r.view_messages - 1
                for u, r in zip(uses[1:], self.records[:-1], strict=True)
            ),
            "over_budget_requests": sum(r.view_tokens > budget for r in self.records),
            "provider_counts": 0,
        }


async def replay(
    transcript: Transcript,
    config: ContextConfig,
    provider: WindowProvider | None,
    *,
    name: str,
    overrides: dict[str, Any],
    prices: Prices = DEFAULT_PRICES,
) -> Run:
    """Replay ``transcript`` through a fresh manager configured with ``config``.

    A request is made right before each assistant message is admitted and once at the
    end. The manager's events are recorded through an ``EventLog`` hooks object. Each
    view goes through the simulated prompt cache (``cache_use``).
    """
    log = EventLog()
    manager = SimpleContextManager(**dataclasses.asdict(config), hooks=log)
    records: list[RequestRecord] = []
    admitted = history_tokens = 0
    previous: list[tuple[str, int]] | None = None

    async def request() -> None:
        nonlocal previous
        seen = len(log.events)
        view = await manager.get_messages_for_request(provider=provider)
        compaction = next((d for e, d in log.events[seen:] if e == COMPACTION_EVENT), None)
        keyed = _keyed(view)
        records.append(
            _record(len(records) + 1, admitted, history_tokens, keyed, compaction, previous)
        )
        previous = keyed

    for _, message in transcript.messages:
        if message.get("role") == "assistant":
            await request()
        await manager.add_message(message)
        admitted += 1
        # As admitted: the same ingress cap add_message applies (metadata, where the
        # module keeps its bookkeeping, is not estimated).
        capped, _ = cap_tool_result(message, config.max_tool_result_bytes)
        history_tokens += estimate_message(capped)
    await request()
    budgets = [d for e, d in log.events if e == BUDGET_EVENT]
    return Run(name, overrides, config, budgets[-1], records, prices)


def _units(messages: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Non-system messages in droppable units: an assistant message with the results that
    answer its calls is one unit; a message carrying only results that answer no call in
    the unit before it (an orphan) is left out - a trimmer never sends a result alone."""
    units: list[list[Mapping[str, Any]]] = []
    open_calls: set[str] = set()
    for message in messages:
        if message.get("role") == "system":
            continue
        results, only_results = carried_result_ids(message)
        if results and units and open_calls.intersection(results):
            units[-1].append(message)
            continue
        if results and only_results:
            continue  # answers no call of the unit before it
        units.append([message])
        open_calls = set(declared_call_ids(message))
    return units


def sliding_window_view(
    messages: Sequence[Mapping[str, Any]], target: int
) -> list[Mapping[str, Any]]:
    """The view a per-request trimmer sends: system messages, then the newest units of
    ``messages`` (``_units``) that fit ``target`` estimated tokens with them, dropping the
    oldest first. The newest unit is always kept, even when it alone does not fit."""
    system = [m for m in messages if m.get("role") == "system"]
    units = _units(messages)
    used = sum(estimate_message(m) for m in system)
    sizes = [sum(estimate_message(m) for m in unit) for unit in units]
    start = len(units)
    while start > 0 and (start == len(units) or used + sizes[start - 1] <= target):
        used += sizes[start - 1]
        start -= 1
    return [*system, *(m for unit in units[start:] for m in unit)]


def replay_sliding_window(transcript: Transcript, module_run: Run, *, name: str = "sliding") -> Run:
    """The sliding-window baseline on the requests of ``module_run``'s replay.

    The same admitted messages (after the module's tool-result ingress cap) and the same
    target as the module's compaction: ``target_usage`` x its effective budget.
    """
    config = module_run.config
    budget: int = module_run.budget["effective_budget"]
    target = int(budget * config.target_usage)
    held: list[Mapping[str, Any]] = []
    records: list[RequestRecord] = []
    history_tokens = 0
    previous: list[tuple[str, int]] | None = None

    def request() -> None:
        nonlocal previous
        keyed = _keyed(sliding_window_view(held, target))
        records.append(_record(len(records) + 1, len(held), history_tokens, keyed, None, previous))
        previous = keyed

    for _, message in transcript.messages:
        if message.get("role") == "assistant":
            request()
        capped, _ = cap_tool_result(message, config.max_tool_result_bytes)
        held.append(capped)
        history_tokens += estimate_message(capped)
    request()
    description = f"sliding window to target_usage x budget = {target:,} (per-request trim)"
    return Run(
        name,
        module_run.overrides,
        config,
        module_run.budget,
        records,
        module_run.prices,
        baseline=description,
    )


class WarningTally(logging.Handler):
    """Collects the module's log warnings: message template -> (count, first message)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.tally: dict[str, tuple[int, str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        count, first = self.tally.get(str(record.msg), (0, record.getMessage()))
        self.tally[str(record.msg)] = (count + 1, first)


@contextlib.contextmanager
def tallied_warnings() -> Iterator[WarningTally]:
    """Route the package's log records to a ``WarningTally`` instead of stderr, so a
    warning repeated on every request (e.g. the protected floor) is reported once."""
    logger = logging.getLogger(__package__ or "amplifier_module_context_simple")
    handler, propagate = WarningTally(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


# -- report ----------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Aligned plain-text columns: the first ``left`` columns left-aligned, the rest right."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def report_dict(transcript: Transcript, runs: Sequence[Run]) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    return {
        "transcript": str(transcript.path),
        "format": "jsonl" if transcript.unit == "line" else "array",
        "messages": len(transcript.messages),
        "skipped": [dataclasses.asdict(p) for p in transcript.problems],
        "prices": dataclasses.asdict(runs[0].prices) if runs else None,
        "cache_model": CACHE_MODEL,
        "runs": [
            {
                "name": run.name,
                "config": run.overrides,
                "baseline": run.baseline,
                "budget": run.budget,
                "totals": run.totals(),
                "compactions": [
                    {"request": number, **stats} for number, stats in run.compactions.items()
                ],
                "requests": [
                    {
                        "request": r.number,
                        "history_messages": r.history_messages,
                        "history_tokens": r.history_tokens,
                        "view_messages": r.view_messages,
                        "view_tokens": r.view_tokens,
                        "compacted": r.compaction is not None,
                        "cache_read_tokens": r.cache.cache_read,
                        "cache_write_tokens": r.cache.cache_write,
                        "fresh_tokens": r.cache.fresh,
                    }
                    for r in run.records
                ],
            }
            for run in runs
        ],
    }


def _arrow(before: int, after: int) -> str:
    return f"{before:,} -> {after:,}"


SUMMARY_ROWS: Final = (
    ("requests", "requests", "{:,}"),
    ("compaction boundaries", "compaction_boundaries", "{:,}"),
    ("per 100 requests", "boundaries_per_100_requests", "{:.1f}"),
    ("budget", "budget", "{:,}"),
    ("budget source", "budget_source", "{}"),
    ("compaction trigger", "trigger_tokens", "{:,}"),
    ("max view tokens", "max_view_tokens", "{:,}"),
    ("max view / budget", "max_view_over_budget", "{:.1%}"),
    ("max level", "max_level", "{}"),
    ("floor hits", "floor_hits", "{}"),
    ("total input tokens", "input_tokens", "{:,}"),
    ("read from cache", "cache_read_tokens", "{:,}"),
    ("cached share", "cached_share", "{:.1%}"),
    ("cache writes", "cache_write_tokens", "{:,}"),
    ("fresh input", "fresh_tokens", "{:,}"),
    ("billed input", "billed_input", "{:,.0f}"),
    ("billed / total input", "billed_over_input", "{:.3f}"),
    ("prefix breaks", "prefix_breaks", "{:,}"),
    ("over budget (rejected)", "over_budget_requests", "{:,}"),
    ("provider counts", "provider_counts", "{:,}"),
)
"""(title, ``totals`` key, format) of the summary table rows."""

CACHE_MODEL: Final = (
    "views counted with the module's estimator (estimate_message); per request the "
    "leading messages shared with the previous view are cache reads, the last message is "
    "fresh, the rest cache writes"
)


def report_text(transcript: Transcript, runs: Sequence[Run]) -> str:
    """The report as plain text: configurations, compaction boundaries, summary."""
    count = f"{len(transcript.messages)} messages, {len(transcript.problems)} skipped"
    out = [f"transcript: {transcript.path} ({count})"]
    out += [f"{run.name}: {run.label}" for run in runs]
    module_runs = [run for run in runs if run.baseline is None]
    prefix = len(module_runs) > 1
    headers = ["request"]
    for run in module_runs:
        tag = f"{run.name} " if prefix else ""
        headers += [f"{tag}level", f"{tag}tokens", f"{tag}messages"]
    by_number = [run.compactions for run in module_runs]
    rows = []
    for number in sorted(set().union(*by_number)):
        row = [str(number)]
        for compactions in by_number:
            stats = compactions.get(number)
            if stats is None:
                row += ["", "", ""]
                continue
            level = f"L{stats['strategy_level']}" + (" floor" if stats.get("floor_tokens") else "")
            row += [
                level,
                _arrow(stats["before_tokens"], stats["after_tokens"]),
                _arrow(stats["before_messages"], stats["after_messages"]),
            ]
        rows.append(row)
    out += ["", "compaction boundaries (tokens and messages: before -> after)"]
    out.append(format_table(headers, rows, left=0) if rows else "(none)")
    totals = [run.totals() for run in runs]
    summary = [[title, *(spec.format(t[key]) for t in totals)] for title, key, spec in SUMMARY_ROWS]
    out += ["", "summary", format_table(["", *(run.name for run in runs)], summary)]
    if runs:
        out += [
            f"bill: prices {runs[0].prices.describe()}",
            f"cache model: {CACHE_MODEL}",
        ]
    return "\n".join(out)


# -- plot ------------------------------------------------------------------------------


def use_agg_backend() -> None:
    """Select matplotlib's non-interactive Agg backend.

    Raises:
        CliError: (exit 1) matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise CliError(
            "--plot needs matplotlib, which is not installed (pip install matplotlib)",
            EXIT_FAILURE,
        ) from exc
    matplotlib.use("Agg")


def write_plot(runs: Sequence[Run], path: Path, title: str) -> None:
    """Write a PNG of view tokens per request, compaction boundaries marked (one colour
    per configuration): against budget and trigger (top) and against the history (bottom).

    Raises:
        CliError: (exit 1) matplotlib is not installed or the file cannot be written.
    """
    use_agg_backend()
    import matplotlib.pyplot as plt

    fig, (cadence, growth) = plt.subplots(2, 1, figsize=(13, 8), sharex=True)
    history = runs[0].records
    growth.plot(
        [r.number for r in history],
        [r.history_tokens for r in history],
        color="0.5",
        label="history (uncompacted)",
    )
    for run, color in zip(runs, ("tab:blue", "tab:orange"), strict=False):
        name = f"{run.name}: {run.label}"
        marks = list(run.compactions)
        x, y = [r.number for r in run.records], [r.view_tokens for r in run.records]
        growth.plot(x, y, color=color, lw=1.2, label=f"{name}: view")
        cadence.plot(x, y, color=color, lw=1.2, label=f"{name}: view")
        cadence.scatter(
            marks,
            [run.records[number - 1].view_tokens for number in marks],
            marker="v",
            color=color,
            zorder=3,
            label=f"{name}: {len(marks)} compactions",
        )
        budget = run.budget["effective_budget"]
        cadence.axhline(budget, color=color, ls="--", lw=1, label=f"{name}: budget {budget:,}")
        trigger = run.trigger_tokens
        cadence.axhline(trigger, color=color, ls=":", lw=1, label=f"{name}: trigger {trigger:,}")
    cadence.set_title(title)
    cadence.set_ylabel("view tokens (estimated)")
    growth.set_ylabel("tokens (estimated)")
    growth.set_xlabel("request")
    for axes in (cadence, growth):
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: Path) -> None:
    """Write ``fig`` as a PNG to ``path`` and close it.

    Raises:
        CliError: (exit 1) the file cannot be written.
    """
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format="png")
    except OSError as exc:
        raise CliError(f"cannot write plot {path}: {exc.strerror or exc}", EXIT_FAILURE) from exc
    finally:
        plt.close(fig)


def write_cost_plot(runs: Sequence[Run], path: Path, title: str) -> None:
    """Write a PNG of the cumulative billed input per request, one line per run.

    Raises:
        CliError: (exit 1) matplotlib is not installed or the file cannot be written.
    """
    use_agg_backend()
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(11, 5))
    for run in runs:
        billed = cumulative_billed(run.records, run.prices)
        axes.plot(
            [r.number for r in run.records],
            billed,
            lw=1.4,
            label=f"{run.name}: {run.label} ({billed[-1]:,.0f})",
        )
    axes.set_title(f"{title}\nprices: {runs[0].prices.describe()}", fontsize=10)
    axes.set_xlabel("request")
    axes.set_ylabel("cumulative billed input (fresh-token equivalents)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    _save(plt, fig, path)


# -- command line ----------------------------------------------------------------------


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Tools for context-simple.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay_cmd = commands.add_parser(
        "replay",
        help="replay a transcript and report the compaction cadence",
        description="Replay a transcript request by request and report when compaction fires.",
    )
    replay_cmd.add_argument("transcript", type=Path, metavar="TRANSCRIPT")
    replay_cmd.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        type=parse_assignment,
        metavar="KEY=VALUE",
        help="override a configuration key (value parsed as JSON when possible)",
    )
    replay_cmd.add_argument(
        "--compare",
        nargs="+",
        action="extend",
        default=[],
        type=parse_assignment,
        metavar="KEY=VALUE",
        help="also replay the --set configuration with these overrides, side by side",
    )
    replay_cmd.add_argument("--window", type=int, metavar="N", help="provider context window")
    replay_cmd.add_argument(
        "--max-output", type=int, metavar="N", help="provider max output tokens"
    )
    replay_cmd.add_argument(
        "--sliding-window",
        action="store_true",
        help="also replay a per-request sliding-window trimmer (the baseline) to "
        "target_usage x budget",
    )
    for option, default, what in (
        ("--price-fresh", DEFAULT_PRICES.fresh, "a fresh input token"),
        ("--price-cache-read", DEFAULT_PRICES.cache_read, "a token read from the cache"),
        ("--price-cache-write", DEFAULT_PRICES.cache_write, "a token written to the cache"),
    ):
        replay_cmd.add_argument(
            option,
            type=_price,
            default=default,
            metavar="X",
            help=f"price of {what}, in fresh-token units (default {default:g})",
        )
    replay_cmd.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot")
    replay_cmd.add_argument(
        "--plot-cost",
        type=Path,
        metavar="FILE",
        help="write a PNG of the cumulative billed input per run",
    )
    replay_cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def run_replay(args: argparse.Namespace) -> int:
    """The ``replay`` command; ``CliError`` carries its failures."""
    if (args.window is None) != (args.max_output is None):
        raise CliError("--window and --max-output go together", EXIT_USAGE)
    provider = None
    if args.window is not None:
        if args.window <= 0 or args.max_output <= 0:
            raise CliError("--window and --max-output must be positive", EXIT_USAGE)
        provider = WindowProvider(args.window, args.max_output)
    if args.plot is not None or args.plot_cost is not None:
        use_agg_backend()  # fail before the replay, not after it
    prices = Prices(args.price_fresh, args.price_cache_read, args.price_cache_write)
    base = dict(args.overrides)
    configs = [("A", base, build_config(base, "--set"))]
    if args.compare:
        other = base | dict(args.compare)
        configs.append(("B", other, build_config(other, "--compare")))
    try:
        data = args.transcript.read_bytes()
    except OSError as exc:
        message = f"cannot read {args.transcript}: {exc.strerror or exc}"
        raise CliError(message, EXIT_FAILURE) from exc
    transcript = parse_transcript(args.transcript, data)
    for problem in transcript.problems:
        print(f"{args.transcript}: {problem}; skipped", file=sys.stderr)
    if not transcript.messages:
        raise CliError(f"{args.transcript}: no replayable messages", EXIT_FAILURE)

    async def replay_all() -> list[Run]:
        return [  # noqa: ASYNC910 - every replay awaits the module
            await replay(
                transcript, config, provider, name=name, overrides=overrides, prices=prices
            )
            for name, overrides, config in configs
        ]

    with tallied_warnings() as warnings:
        runs = anyio.run(replay_all)
    if args.sliding_window:
        runs.append(replay_sliding_window(transcript, runs[0]))
    for count, first in warnings.tally.values():
        times = f" ({count} times; the first shown)" if count > 1 else ""
        print(f"{PROG}: module warning{times}: {first}", file=sys.stderr)
    if args.plot is not None:
        write_plot(runs, args.plot, f"context-simple replay of {args.transcript.name}")
    if args.plot_cost is not None:
        title = f"context-simple replay of {args.transcript.name}: cumulative billed input"
        write_cost_plot(runs, args.plot_cost, title)
    if args.json:
        print(json.dumps(report_dict(transcript, runs), indent=2, ensure_ascii=False))
    else:
        print(report_text(transcript, runs))
        if args.plot is not None:
            print(f"\nplot written to {args.plot}")
        if args.plot_cost is not None:
            print(f"\ncost plot written to {args.plot_cost}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``amplifier-context-simple``; returns the exit code (0, 1 or 2)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports usage errors (2) and --help (0) this way
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return run_replay(args)
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.code
