"""``amplifier-context-simple replay``: replay a transcript and report the compaction cadence.

::

    amplifier-context-simple replay TRANSCRIPT [--set key=value ...]
        [--window N --max-output N] [--compare key=value ...] [--plot FILE] [--json]

The transcript holds one message object per line (Amplifier's ``transcript.jsonl``; blank
lines are skipped) or one JSON array of messages. Messages are admitted in order with
``add_message``; right before each assistant message (where the provider was called) and
once at the end, the tool makes a request with ``get_messages_for_request``. The provider
is a stub whose ``get_info().defaults`` carry ``--window`` and ``--max-output``; without
``--window`` no provider is passed and the module uses its fallback budget.

``--set`` overrides configuration keys (a value is parsed as JSON when it can be -
numbers, ``true``/``false``, ``null`` - and is a string otherwise). ``--compare`` replays
a second configuration (the ``--set`` one plus these overrides) and reports both side by
side. ``--plot FILE`` writes a PNG (needs matplotlib, which is not a dependency of the
package). ``--json`` prints the report as JSON.

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
import json
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio

from .context.config import ContextConfig
from .context.estimate import estimate_message
from .context.history import validate_message
from .context.ingress import cap_tool_result
from .context.store import BUDGET_EVENT, COMPACTION_EVENT
from .errors import InvalidMessageError
from .manager import SimpleContextManager

__all__ = (
    "CONFIG_KEYS",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "SUMMARY_ROWS",
    "CliError",
    "EventLog",
    "Problem",
    "ProviderInfo",
    "RequestRecord",
    "Run",
    "Transcript",
    "WarningTally",
    "WindowProvider",
    "build_config",
    "build_parser",
    "format_table",
    "main",
    "parse_assignment",
    "parse_transcript",
    "replay",
    "report_dict",
    "report_text",
    "run_replay",
    "tallied_warnings",
    "use_agg_backend",
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

    async def emit(self, event: str, data: dict[str, Any]) -> None:  # noqa: ASYNC910
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


@dataclass(frozen=True, slots=True)
class Run:
    """The replay of one configuration."""

    name: str
    overrides: dict[str, Any]
    config: ContextConfig
    budget: dict[str, Any]
    """The last ``context:budget`` provenance (``effective_budget`` is the budget)."""
    records: list[RequestRecord]

    @property
    def label(self) -> str:
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
        }


async def replay(
    transcript: Transcript,
    config: ContextConfig,
    provider: WindowProvider | None,
    *,
    name: str,
    overrides: dict[str, Any],
) -> Run:
    """Replay ``transcript`` through a fresh manager configured with ``config``.

    A request is made right before each assistant message is admitted and once at the
    end. The manager's events are recorded through an ``EventLog`` hooks object.
    """
    log = EventLog()
    manager = SimpleContextManager(**dataclasses.asdict(config), hooks=log)
    records: list[RequestRecord] = []
    admitted = history_tokens = 0

    async def request() -> None:
        seen = len(log.events)
        view = await manager.get_messages_for_request(provider=provider)
        compaction = next((d for e, d in log.events[seen:] if e == COMPACTION_EVENT), None)
        records.append(
            RequestRecord(
                number=len(records) + 1,
                history_messages=admitted,
                history_tokens=history_tokens,
                view_messages=len(view),
                view_tokens=sum(estimate_message(m) for m in view),
                compaction=compaction,
            )
        )

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
    return Run(name, overrides, config, budgets[-1], records)


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
        "runs": [
            {
                "name": run.name,
                "config": run.overrides,
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
)
"""(title, ``totals`` key, format) of the summary table rows."""


def report_text(transcript: Transcript, runs: Sequence[Run]) -> str:
    """The report as plain text: configurations, compaction boundaries, summary."""
    count = f"{len(transcript.messages)} messages, {len(transcript.problems)} skipped"
    out = [f"transcript: {transcript.path} ({count})"]
    out += [f"{run.name}: {run.label}" for run in runs]
    prefix = len(runs) > 1
    headers = ["request"]
    for run in runs:
        tag = f"{run.name} " if prefix else ""
        headers += [f"{tag}level", f"{tag}tokens", f"{tag}messages"]
    by_number = [run.compactions for run in runs]
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
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format="png")
    except OSError as exc:
        raise CliError(f"cannot write plot {path}: {exc.strerror or exc}", EXIT_FAILURE) from exc
    finally:
        plt.close(fig)


# -- command line ----------------------------------------------------------------------


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
    replay_cmd.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot")
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
    if args.plot is not None:
        use_agg_backend()  # fail before the replay, not after it
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
            await replay(transcript, config, provider, name=name, overrides=overrides)
            for name, overrides, config in configs
        ]

    with tallied_warnings() as warnings:
        runs = anyio.run(replay_all)
    for count, first in warnings.tally.values():
        times = f" ({count} times; the first shown)" if count > 1 else ""
        print(f"{PROG}: module warning{times}: {first}", file=sys.stderr)
    if args.plot is not None:
        write_plot(runs, args.plot, f"context-simple replay of {args.transcript.name}")
    if args.json:
        print(json.dumps(report_dict(transcript, runs), indent=2, ensure_ascii=False))
    else:
        print(report_text(transcript, runs))
        if args.plot is not None:
            print(f"\nplot written to {args.plot}")
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
