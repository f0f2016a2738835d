"""``amplifier-context-simple replay``: replay a transcript and report the compaction cadence.

::

    amplifier-context-simple replay TRANSCRIPT [--set key=value ...]
        [--window N --max-output N] [--compare key=value ...] [--sliding-window]
        [--trimmer-fraction F ...] [--hysteresis F ...] [--equal-context]
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
side.

Baselines replay trimmers on the same requests as the first configuration (A), with B its
effective budget. A trimmer keeps the system messages and drops the oldest other messages
in units (an assistant message with the results of its calls; never a result without its
call), always keeping the newest unit:

- ``--sliding-window``: per request, drops the oldest units until the view fits
  ``target_usage`` x B (run ``sliding``);
- ``--trimmer-fraction F ...``: the same per-request trimmer to F x B (runs ``trim-F``);
- ``--hysteresis F ...``: sends everything since its last trim, and only when that
  exceeds B trims to F x B (runs ``hyst-F``);
- ``--equal-context``: the per-request trimmer whose target is searched (bisection,
  deterministic) so that its mean view tokens come closest to A's; its description gives
  both means and says when they differ by more than 1% (run ``equal``).

F is a fraction in (0, 1]; a value given twice is replayed once. Every run reports the
context it keeps - mean and max view tokens - next to its bill, and its trims: the
requests whose view leaves out a message the previous request's view sent (messages
compared by what the provider sees; a rewritten message counts as left out).

The bill: every run's views are passed through a simulated prompt cache, the one the demo's
``provider-window`` applies. Each view's messages are counted with the module's estimator
(``estimate_message``, not a provider tokenizer); the leading messages a view shares with the
previous request's view are read from the cache, the last message (the new input) is fresh,
and everything between is a cache write. The billed input is ``fresh x --price-fresh +
read x --price-cache-read + write x --price-cache-write`` (defaults 1.0, 0.1, 1.25).
From Python, another count can replace the estimator: ``replay`` takes a ``measure``
(message -> tokens) that counts its records and bill, the baselines replayed against a run
count with that run's measure, and the trimmer pieces (``trimmed_views``,
``sliding_window_view``, ``hysteresis_views``, ``equal_context_target``, ``keyed_view``)
take one too.

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
import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    "EQUAL_CONTEXT_TOLERANCE",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "SUMMARY_ROWS",
    "TRIM_MODEL",
    "CacheUse",
    "CliError",
    "EventLog",
    "Measure",
    "Prices",
    "Problem",
    "ProviderInfo",
    "RequestRecord",
    "Run",
    "Transcript",
    "WarningTally",
    "WindowProvider",
    "baseline_run",
    "build_config",
    "build_parser",
    "cache_use",
    "cumulative_billed",
    "dropped_messages",
    "equal_context_target",
    "format_table",
    "hysteresis_views",
    "keyed_view",
    "main",
    "message_key",
    "parse_assignment",
    "parse_transcript",
    "replay",
    "replay_equal_context",
    "replay_hysteresis",
    "replay_sliding_window",
    "replay_trimmer",
    "report_dict",
    "report_text",
    "request_histories",
    "run_replay",
    "simulate_cache",
    "sliding_window_view",
    "tallied_warnings",
    "trimmed_views",
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


Measure = Callable[[Mapping[str, Any]], int]
"""Counts one message's tokens: the module's ``estimate_message`` by default; a benchmark
passes an independent tokenizer's count instead (it must not mutate the message)."""


def keyed_view(
    view: Sequence[Mapping[str, Any]], measure: Measure = estimate_message
) -> list[tuple[str, int]]:
    """``view`` as the ``(message_key, tokens)`` pairs ``cache_use`` compares, each
    message's tokens counted by ``measure``."""
    return [(message_key(m), measure(m)) for m in view]


def dropped_messages(
    previous: Sequence[tuple[str, int]] | None, current: Sequence[tuple[str, int]]
) -> int:
    """How many messages of the previous keyed view the current one no longer sends.

    Messages are compared by ``message_key`` (what the provider sees), counted with
    multiplicity: a message sent twice before and once now counts one. A request with a
    positive count is a *trim*: it left out something it had sent. (A dropped message
    whose exact copy arrives in the same request is not seen; a rewritten one is.)
    """
    if previous is None:
        return 0
    before = collections.Counter(key for key, _ in previous)
    before.subtract(key for key, _ in current)
    return sum(count for count in before.values() if count > 0)


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
    dropped_messages: int = 0
    """Messages the previous request's view sent that this one does not
    (``dropped_messages``); positive on a trim."""


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
        dropped_messages=dropped_messages(previous, keyed),
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
    measure: Measure = field(default=estimate_message, compare=False, repr=False)
    """What counted the tokens of ``records`` (views, history, the bill); baselines
    replayed against this run count with it too."""

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

    @property
    def mean_view_tokens(self) -> float:
        """The context the run keeps: its views' tokens averaged over its requests."""
        return sum(r.view_tokens for r in self.records) / len(self.records)

    def totals(self) -> dict[str, Any]:
        """The summary figures (the ``totals`` of the JSON report).

        ``trims`` counts the requests whose view left out a message the previous view sent
        (``RequestRecord.dropped_messages`` > 0): a baseline trimmer's trims, and for the
        module its compactions that dropped or rewrote sent messages.
        """
        requests, compactions = len(self.records), list(self.compactions.values())
        budget: int = self.budget["effective_budget"]
        max_view = max(r.view_tokens for r in self.records)
        trims = sum(r.dropped_messages > 0 for r in self.records)
        return {
            "requests": requests,
            "compaction_boundaries": len(compactions),
            "boundaries_per_100_requests": round(100 * len(compactions) / requests, 2),
            "trims": trims,
            "trims_per_100_requests": round(100 * trims / requests, 2),
            "budget": budget,
            "budget_source": self.budget["source"],
            "trigger_tokens": self.trigger_tokens,
            "max_level": max((c["strategy_level"] for c in compactions), default=0),
            "floor_hits": sum(c.get("floor_tokens") is not None for c in compactions),
            "mean_view_tokens": round(self.mean_view_tokens, 1),
            "max_view_tokens": max_view,
            "max_view_over_budget": round(max_view / budget, 4),
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
    measure: Measure = estimate_message,
) -> Run:
    """Replay ``transcript`` through a fresh manager configured with ``config``.

    A request is made right before each assistant message is admitted and once at the
    end. The manager's events are recorded through an ``EventLog`` hooks object. Each
    view goes through the simulated prompt cache (``cache_use``). ``measure`` counts the
    records' tokens (views and history); the module's own decisions use its estimator.
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
        keyed = keyed_view(view, measure)
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
        history_tokens += measure(capped)
    await request()
    budgets = [d for e, d in log.events if e == BUDGET_EVENT]
    return Run(name, overrides, config, budgets[-1], records, prices, measure=measure)


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


def _memoized(measure: Measure) -> Measure:
    """``measure`` remembered per message object (each kept alive, so no id is reused)."""
    memo: dict[int, tuple[Mapping[str, Any], int]] = {}

    def counted(message: Mapping[str, Any]) -> int:
        hit = memo.get(id(message))
        if hit is None:
            hit = memo[id(message)] = (message, measure(message))
        return hit[1]

    return counted


def _trimmed_start(fixed: int, sizes: Sequence[int], start: int, target: float) -> int:
    """The first unit kept when dropping the oldest units from ``start`` on until
    ``fixed`` + the rest fit ``target``; never past the newest unit."""
    used = fixed + sum(sizes[start:])
    while start < len(sizes) - 1 and used > target:
        used -= sizes[start]
        start += 1
    return start


def trimmed_views(
    histories: Iterable[Sequence[Mapping[str, Any]]],
    *,
    trigger: float,
    target: float,
    measure: Measure = estimate_message,
) -> Iterator[list[Mapping[str, Any]]]:
    """The views a trimmer sends, one per history (each history extends the one before it,
    messages only appended, as a session's does).

    The view is the system messages, then every unit (``_units``: a call with its results,
    never a result alone) since the trimmer's last trim. When that exceeds ``trigger``
    tokens (counted by ``measure``), it trims: drops the oldest units until the view fits
    ``target``. The newest unit is always kept, even when it alone does not fit.

    ``trigger == target`` is the per-request trimmer (``sliding_window_view`` on every
    request: the largest suffix of units that fits); ``trigger`` = B and ``target`` = f x B
    the trimmer with hysteresis (``hysteresis_views``).

    Raises:
        ValueError: ``target`` is negative or above ``trigger``.
    """
    if not 0 <= target <= trigger:
        raise ValueError(f"need 0 <= target <= trigger, got target {target}, trigger {trigger}")
    return _trimmed(histories, trigger, target, _memoized(measure))


def _trimmed(
    histories: Iterable[Sequence[Mapping[str, Any]]], trigger: float, target: float, size: Measure
) -> Iterator[list[Mapping[str, Any]]]:
    start = 0  # the first unit sent: the trimmer's state between requests
    for messages in histories:
        system = [m for m in messages if m.get("role") == "system"]
        units = _units(messages)
        fixed = sum(map(size, system))
        sizes = [sum(map(size, unit)) for unit in units]
        if fixed + sum(sizes[start:]) > trigger:
            start = _trimmed_start(fixed, sizes, start, target)
        yield [*system, *(m for unit in units[start:] for m in unit)]


def sliding_window_view(
    messages: Sequence[Mapping[str, Any]], target: float, measure: Measure = estimate_message
) -> list[Mapping[str, Any]]:
    """The view a per-request trimmer sends: system messages, then the newest units of
    ``messages`` (``_units``) that fit ``target`` tokens (``measure``) with them, dropping
    the oldest first. The newest unit is always kept, even when it alone does not fit."""
    return next(trimmed_views([messages], trigger=target, target=target, measure=measure))


def hysteresis_views(
    histories: Iterable[Sequence[Mapping[str, Any]]],
    budget: float,
    fraction: float,
    measure: Measure = estimate_message,
) -> Iterator[list[Mapping[str, Any]]]:
    """The trimmer with hysteresis: it sends everything since its last trim, and only when
    that exceeds ``budget`` trims to ``fraction`` x ``budget`` (``trimmed_views``).

    Raises:
        ValueError: ``fraction`` outside (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return trimmed_views(histories, trigger=budget, target=fraction * budget, measure=measure)


def request_histories(
    transcript: Transcript, config: ContextConfig
) -> list[list[Mapping[str, Any]]]:
    """The messages held at each of ``replay``'s requests (right before each assistant
    message and at the end), each after the tool-result ingress cap the module applies."""
    held: list[Mapping[str, Any]] = []
    histories: list[list[Mapping[str, Any]]] = []
    for _, message in transcript.messages:
        if message.get("role") == "assistant":
            histories.append(list(held))
        held.append(cap_tool_result(message, config.max_tool_result_bytes)[0])
    histories.append(held)
    return histories


def baseline_run(
    module_run: Run,
    histories: Sequence[Sequence[Mapping[str, Any]]],
    views: Iterable[Sequence[Mapping[str, Any]]],
    *,
    name: str,
    description: str,
) -> Run:
    """A baseline's ``Run``: its ``views`` of ``histories`` billed like ``module_run``
    (same budget, prices and measure)."""
    measure = _memoized(module_run.measure)
    records: list[RequestRecord] = []
    previous: list[tuple[str, int]] | None = None
    for history, view in zip(histories, views, strict=True):
        keyed = keyed_view(view, measure)
        tokens = sum(map(measure, history))
        records.append(_record(len(records) + 1, len(history), tokens, keyed, None, previous))
        previous = keyed
    return dataclasses.replace(module_run, name=name, records=records, baseline=description)


def replay_trimmer(
    transcript: Transcript,
    module_run: Run,
    *,
    name: str,
    trigger: float,
    target: float,
    description: str,
) -> Run:
    """A trimmer (``trimmed_views``) on the requests of ``module_run``'s replay: the same
    admitted messages (after the module's tool-result ingress cap), counted and billed
    with ``module_run``'s measure and prices."""
    histories = request_histories(transcript, module_run.config)
    views = trimmed_views(histories, trigger=trigger, target=target, measure=module_run.measure)
    return baseline_run(module_run, histories, views, name=name, description=description)


def replay_sliding_window(
    transcript: Transcript,
    module_run: Run,
    *,
    name: str = "sliding",
    fraction: float | None = None,
) -> Run:
    """The per-request trimmer at ``fraction`` x ``module_run``'s effective budget; without
    ``fraction``, at the module's compaction target, ``target_usage`` x budget."""
    budget: int = module_run.budget["effective_budget"]
    if fraction is None:
        target = int(budget * module_run.config.target_usage)
        what = f"target_usage x budget = {target:,}"
    else:
        target = int(budget * fraction)
        what = f"{fraction:g} x budget = {target:,}"
    description = f"sliding window to {what} (per-request trim)"
    return replay_trimmer(
        transcript, module_run, name=name, trigger=target, target=target, description=description
    )


def replay_hysteresis(
    transcript: Transcript, module_run: Run, fraction: float, *, name: str
) -> Run:
    """The trimmer with hysteresis (``hysteresis_views``) at ``module_run``'s effective
    budget B: it trims only when the view would exceed B, to ``fraction`` x B."""
    budget: int = module_run.budget["effective_budget"]
    target = int(budget * fraction)
    description = (
        f"hysteresis: sends all since its last trim; over budget {budget:,} "
        f"trims to {fraction:g} x budget = {target:,}"
    )
    return replay_trimmer(
        transcript, module_run, name=name, trigger=budget, target=target, description=description
    )


EQUAL_CONTEXT_TOLERANCE: Final = 0.01
"""How far (relative) the equal-context trimmer's mean view may be from the module's for
``replay_equal_context`` to report the two as matched."""


def equal_context_target(
    histories: Sequence[Sequence[Mapping[str, Any]]],
    mean: float,
    measure: Measure = estimate_message,
) -> tuple[int, float]:
    """The integer target whose per-request trimmer's mean view tokens come closest to
    ``mean``, and that mean; ties go to the smaller target. Deterministic.

    The mean view is a non-decreasing step function of the target (a larger target keeps
    a longer suffix of every history), so bisection over [0, the largest history] finds
    the smallest target reaching ``mean``; the closer of it and the target below wins. The
    gap left is at most one step of that function: the units one more token of target
    admits, averaged over the requests.
    """
    size = _memoized(measure)

    @functools.cache
    def mean_at(target: int) -> float:
        views = trimmed_views(histories, trigger=target, target=target, measure=size)
        return sum(size(m) for view in views for m in view) / len(histories)

    low, high = 0, max(sum(map(size, history)) for history in histories)
    if mean_at(high) < mean:
        return high, mean_at(high)
    while low < high:  # the smallest target whose mean reaches ``mean``
        middle = (low + high) // 2
        if mean_at(middle) >= mean:
            high = middle
        else:
            low = middle + 1
    candidates = [(abs(mean_at(t) - mean), t) for t in (low - 1, low) if t >= 0]
    _, best = min(candidates)
    return best, mean_at(best)


def replay_equal_context(transcript: Transcript, module_run: Run, *, name: str = "equal") -> Run:
    """The per-request trimmer whose target makes its mean view tokens equal
    ``module_run``'s (``equal_context_target``): the bill at equal context. Its description
    gives both means and whether they are within ``EQUAL_CONTEXT_TOLERANCE``."""
    histories = request_histories(transcript, module_run.config)
    wanted = module_run.mean_view_tokens
    target, got = equal_context_target(histories, wanted, module_run.measure)
    gap = (got - wanted) / wanted if wanted else 0.0
    verdict = (
        "" if abs(gap) <= EQUAL_CONTEXT_TOLERANCE else f", NOT within {EQUAL_CONTEXT_TOLERANCE:.0%}"
    )
    description = (
        f"sliding window to {target:,} (per-request trim), the target whose mean view "
        f"{got:,.1f} is closest to {module_run.name}'s {wanted:,.1f} ({gap:+.2%}{verdict})"
    )
    views = trimmed_views(histories, trigger=target, target=target, measure=module_run.measure)
    return baseline_run(module_run, histories, views, name=name, description=description)


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
        "trim_model": TRIM_MODEL,
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
                        "dropped_messages": r.dropped_messages,
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
    ("trims", "trims", "{:,}"),
    ("trims per 100 requests", "trims_per_100_requests", "{:.1f}"),
    ("budget", "budget", "{:,}"),
    ("budget source", "budget_source", "{}"),
    ("compaction trigger", "trigger_tokens", "{:,}"),
    ("max level", "max_level", "{}"),
    ("floor hits", "floor_hits", "{}"),
    ("mean view tokens", "mean_view_tokens", "{:,.0f}"),
    ("max view tokens", "max_view_tokens", "{:,}"),
    ("max view / budget", "max_view_over_budget", "{:.1%}"),
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


TRIM_MODEL: Final = (
    "a request whose view leaves out a message the previous request's view sent "
    "(compared by what the provider sees)"
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
            f"trim: {TRIM_MODEL}",
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


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
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
    baselines = replay_cmd.add_argument_group(
        "baselines",
        "trimmers replayed on the same requests as A (B is A's effective budget); each "
        "reports the context it keeps (mean and max view tokens) next to its bill",
    )
    baselines.add_argument(
        "--sliding-window",
        action="store_true",
        help="a per-request trimmer (drops the oldest units until the view fits) to "
        "target_usage x B (run 'sliding')",
    )
    baselines.add_argument(
        "--trimmer-fraction",
        nargs="+",
        action="extend",
        default=[],
        type=_fraction,
        metavar="F",
        help="a per-request trimmer to F x B, F in (0, 1] (runs 'trim-F')",
    )
    baselines.add_argument(
        "--hysteresis",
        nargs="+",
        action="extend",
        default=[],
        type=_fraction,
        metavar="F",
        help="a trimmer with hysteresis: sends everything since its last trim and only "
        "when that exceeds B trims to F x B, F in (0, 1] (runs 'hyst-F')",
    )
    baselines.add_argument(
        "--equal-context",
        action="store_true",
        help="a per-request trimmer whose target is searched so its mean view tokens "
        "equal A's (run 'equal'): the bill at equal context",
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


def _replay_baselines(
    transcript: Transcript, module_run: Run, args: argparse.Namespace
) -> list[Run]:
    """The baseline runs the options ask for, in option order (a repeated F once)."""
    runs: list[Run] = []
    if args.sliding_window:
        runs.append(replay_sliding_window(transcript, module_run))
    runs += [
        replay_sliding_window(transcript, module_run, name=f"trim-{f:g}", fraction=f)
        for f in dict.fromkeys(args.trimmer_fraction)
    ]
    runs += [
        replay_hysteresis(transcript, module_run, f, name=f"hyst-{f:g}")
        for f in dict.fromkeys(args.hysteresis)
    ]
    if args.equal_context:
        runs.append(replay_equal_context(transcript, module_run))
    return runs


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
    runs += _replay_baselines(transcript, runs[0], args)
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
