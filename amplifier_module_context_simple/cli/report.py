"""The report of a replay's runs: as plain text (``report_text``: the configurations,
the compaction boundaries, the summary table) or as JSON-ready data (``report_dict``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ..context.ladder.rungs import rung_name
from .bill import Prices
from .runs import RequestRecord, Run
from .transcript import Transcript

__all__ = (
    "CACHE_LIFETIME_MODEL",
    "CACHE_MODEL",
    "SUMMARY_ROWS",
    "THINKING_MODEL",
    "TRIM_MODEL",
    "format_table",
    "report_dict",
    "report_text",
    "totals",
)

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
    ("thinking blocks sent", "thinking_blocks_sent", "{:,}"),
    ("invalid thinking (requests)", "thinking_invalid_requests", "{:,}"),
    ("valid thinking left out", "thinking_left_out", "{:,}"),
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
    ("cache expiries", "cache_expiries", "{:,}"),
    ("over budget (rejected)", "over_budget_requests", "{:,}"),
    ("provider counts", "provider_counts", "{:,}"),
)
"""(title, ``totals`` key, format) of the summary table rows."""

CACHE_LIFETIME_MODEL: Final = (
    "a request made more than the lifetime after the previous one finds the cache cold "
    "and writes its whole view (the shared prefix still counts as kept for the prefix "
    "breaks); every request refreshes the entry"
)

CACHE_MODEL: Final = (
    "views counted with the module's estimator (estimate_message); per request the "
    "leading messages shared with the previous view are cache reads, the last message is "
    "fresh, the rest cache writes"
)


THINKING_MODEL: Final = (
    "each assistant message is the answer to the view sent before it; a thinking block is "
    "invalid when sent with another prefix than that view gave it (or after an invalid "
    "one): the preserved-thinking rule (docs/thinking.md)"
)


TRIM_MODEL: Final = (
    "a request whose view leaves out a message the previous request's view sent "
    "(compared by what the provider sees)"
)


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


def totals(run: Run) -> dict[str, Any]:
    """``run.totals()`` and ``cache_expiries``: the requests that found the cache cold."""
    return {**run.totals(), "cache_expiries": sum(r.cache.expired for r in run.records)}


def report_dict(
    transcript: Transcript, runs: Sequence[Run], *, times: Path | None = None
) -> dict[str, Any]:
    """The whole report as JSON-ready data; ``times``: the request times' file, if any."""
    prices = runs[0].prices if runs else None
    return {
        "transcript": str(transcript.path),
        "format": "jsonl" if transcript.unit == "line" else "array",
        "messages": len(transcript.messages),
        "skipped": [dataclasses.asdict(p) for p in transcript.problems],
        "prices": None if prices is None else prices.as_dict(),
        "cache_lifetime": None if prices is None else _lifetime_dict(prices, times),
        "cache_model": CACHE_MODEL,
        "trim_model": TRIM_MODEL,
        "runs": [_run_dict(run) for run in runs],
    }


def _lifetime_dict(prices: Prices, times: Path | None) -> dict[str, Any]:
    """The cache's lifetime in ``report_dict``: its name and seconds, both write prices
    and the request times' file (without one nothing expires)."""
    return {
        "name": prices.lifetime.name,
        "seconds": prices.lifetime.seconds,
        "cache_write_5m": prices.cache_write,
        "cache_write_1h": prices.cache_write_1h,
        "times": None if times is None else str(times),
        "model": CACHE_LIFETIME_MODEL,
    }


def _run_dict(run: Run) -> dict[str, Any]:
    """One run of ``report_dict``: its configuration, totals, compactions and requests."""
    return {
        "name": run.name,
        "config": run.overrides,
        "baseline": run.baseline,
        "budget": run.budget,
        "totals": totals(run),
        "compactions": [{"request": number, **stats} for number, stats in run.compactions.items()],
        "requests": [_request_dict(r) for r in run.records],
    }


def _request_dict(r: RequestRecord) -> dict[str, Any]:
    """One request of a run of ``report_dict``."""
    return {
        "request": r.number,
        "history_messages": r.history_messages,
        "history_tokens": r.history_tokens,
        "view_messages": r.view_messages,
        "view_tokens": r.view_tokens,
        "compacted": r.compaction is not None,
        "cache_read_tokens": r.cache.cache_read,
        "cache_write_tokens": r.cache.cache_write,
        "fresh_tokens": r.cache.fresh,
        "cache_expired": r.cache.expired,
        "dropped_messages": r.dropped_messages,
        "thinking_shown": r.thinking_shown,
        "thinking_invalid": r.thinking_invalid,
        "thinking_left_out": r.thinking_left_out,
    }


def _arrow(before: int, after: int) -> str:
    return f"{before:,} -> {after:,}"


def report_text(transcript: Transcript, runs: Sequence[Run], *, times: Path | None = None) -> str:
    """The report as plain text: configurations, compaction boundaries, summary;
    ``times``: the request times' file, if any."""
    count = f"{len(transcript.messages)} messages, {len(transcript.problems)} skipped"
    out = [f"transcript: {transcript.path} ({count})"]
    out += [f"{run.name}: {run.label}" for run in runs]
    out += ["", "compaction boundaries (tokens and messages: before -> after)"]
    out.append(_boundaries_table([run for run in runs if run.baseline is None]))
    figures = [totals(run) for run in runs]
    summary = [
        [title, *(_summary_cell(key, spec, t[key]) for t in figures)]
        for title, key, spec in SUMMARY_ROWS
    ]
    out += ["", "summary", format_table(["", *(run.name for run in runs)], summary)]
    if runs:
        lifetime = runs[0].prices.lifetime
        if lifetime.seconds is None:
            expiry = "the cache never expires"
        elif times is None:
            expiry = "no request times (--times), so the cache never expires"
        else:
            expiry = f"request times from {times}: {CACHE_LIFETIME_MODEL}"
        out += [
            f"bill: prices {runs[0].prices.describe()}",
            f"cache lifetime: {lifetime.name}; {expiry}",
            f"cache model: {CACHE_MODEL}",
            f"trim: {TRIM_MODEL}",
            f"thinking: {THINKING_MODEL}",
        ]
    return "\n".join(out)


def _summary_cell(key: str, spec: str, value: Any) -> str:
    """A summary table cell; a level with its rung's name (``rungs.RUNGS``)."""
    text = spec.format(value)
    if key == "max_level" and rung_name(value):
        text += f" {rung_name(value)}"
    return text


def _level(level: int) -> str:
    """``L<level>`` and the rung's short name (``rungs.RUNGS``), as the reports print it."""
    name = rung_name(level)
    return f"L{level} {name}" if name else f"L{level}"


def _boundaries_table(module_runs: Sequence[Run]) -> str:
    """The compaction boundaries of the module runs, a row per request that compacted in
    any of them (level, tokens and messages before -> after), or ``(none)``."""
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
            row += _boundary_cells(compactions.get(number))
        rows.append(row)
    return format_table(headers, rows, left=0) if rows else "(none)"


def _boundary_cells(stats: dict[str, Any] | None) -> list[str]:
    """A run's three cells of a boundary row: blank when it did not compact there."""
    if stats is None:
        return ["", "", ""]
    level = _level(stats["strategy_level"]) + (" floor" if stats.get("floor_tokens") else "")
    return [
        level,
        _arrow(stats["before_tokens"], stats["after_tokens"]),
        _arrow(stats["before_messages"], stats["after_messages"]),
    ]
