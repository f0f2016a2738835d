"""The bill and the context kept: the module against trimmers, on real conversations.

    uv run --frozen python -m benchmarks.economics      # this section alone

Every real conversation (``benchmarks.real.conversations()``) is replayed at every budget
``B`` of ``BUDGETS`` that it does not fit whole (the provider's count of the whole
conversation is above ``B``: below that no policy has anything to do). A *case* is one
(conversation, budget). Each case is replayed by ``amplifier_module_context_simple.cli``'s
``replay`` - a request right before each assistant message and once at the end, through
``get_messages_for_request`` of a manager with ``max_tokens = max_tokens_fallback = B``
and the default configuration - and the same requests are sent by four trimmers and one
trimmer at equal context (``cli.trimmed_views``: system messages kept, the oldest other
messages dropped in units, a call with its results, never a result alone):

- ``pr50``, ``pr90``: per request, the newest units that fit 0.5 x B, 0.9 x B;
- ``hy50``, ``hy90``: with hysteresis: everything since the last trim, trimmed to
  0.5 x B, 0.9 x B only when it exceeds B;
- ``equal``: the per-request trimmer whose mean view equals the module's
  (``cli.equal_context_target``; it alone decides with the independent counter, so that
  its mean matches the module's in the units both are measured in).

The trimmers decide with the module's estimator (``estimate_message``), as the module does:
both policies see the same numbers. What every run is measured with is independent of both:
each message is counted by ``benchmarks.provider.Counter`` (o200k_base, the OpenAI message
accounting; it shares nothing with the estimator), and the bill is an exact-prefix cache:
the leading messages a view shares with the previous request's view are read at 0.1, every
other token is written at 1.25 (``Prices(fresh=1.25, cache_read=0.1, cache_write=1.25)``:
the last message is written too, as a cache breakpoint on it does).

Reported per case: each run's bill and mean context (view tokens averaged over the
requests), the module's compactions per 100 requests and every run's cache breaks per
100 requests (``prefix_breaks``: the shared prefix ends before the previous view's last
message but one). Summary: the cases where a trimmer is both cheaper and keeps more mean
context than the module (*dominated*), and the median breaks per 100 requests at budgets
up to 16k, for the module and for ``hy50``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.cli import (
    Prices,
    Run,
    Transcript,
    baseline_run,
    build_config,
    equal_context_target,
    replay,
    request_histories,
    tallied_warnings,
    trimmed_views,
)
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.errors import ProviderLimitError
from benchmarks import real
from benchmarks.provider import Counter

BUDGETS: Final = (8_000, 12_000, 16_000, 24_000, 32_000, 48_000, 64_000, 96_000, 128_000, 200_000)
SMALL: Final = 16_000
"""Budgets up to this are the small ones of the breaks summary."""
PRICES: Final = Prices(fresh=1.25, cache_read=0.1, cache_write=1.25)
TRIMMERS: Final = (
    ("pr50", 0.5, False),
    ("pr90", 0.9, False),
    ("hy50", 0.5, True),
    ("hy90", 0.9, True),
)
"""(name, fraction f, with hysteresis)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """One run of one case."""

    name: str
    bill: float
    mean_context: float
    breaks_per_100: float
    compactions_per_100: float


@dataclass(frozen=True, slots=True)
class Case:
    conversation: str
    budget: int
    requests: int
    whole: int
    """The provider's count of the whole conversation."""
    runs: tuple[Policy, ...]
    """The module first, then ``TRIMMERS``, then ``equal``, then ``negotiated``."""
    failed: int = 0
    """Negotiated requests that failed closed (``ProviderLimitError``: not sent, not billed)."""

    @property
    def module(self) -> Policy:
        return self.runs[0]

    def run(self, name: str) -> Policy:
        return next(run for run in self.runs if run.name == name)

    @property
    def dominating(self) -> list[str]:
        """The trimmers that are both cheaper and keep more mean context than the module."""
        return self.dominating_over("module")

    def dominating_over(self, name: str) -> list[str]:
        """The trimmers (``TRIMMERS``) both cheaper and keeping more mean context than run
        ``name``."""
        reference = self.run(name)
        trimmers = {trimmer for trimmer, _, _ in TRIMMERS}
        return [
            run.name
            for run in self.runs
            if run.name in trimmers
            and run.bill < reference.bill
            and run.mean_context > reference.mean_context
        ]


def _policy(name: str, run: Run) -> Policy:
    totals = run.totals()
    requests = totals["requests"]
    return Policy(
        name=name,
        bill=float(totals["billed_input"]),
        mean_context=float(totals["mean_view_tokens"]),
        breaks_per_100=100 * totals["prefix_breaks"] / requests,
        compactions_per_100=float(totals["boundaries_per_100_requests"]),
    )


def _transcript(conversation: real.Conversation) -> Transcript:
    messages = [(index + 1, message) for index, message in enumerate(conversation.messages)]
    return Transcript(Path(conversation.name), "line", messages, [])


async def replay_case(conversation: real.Conversation, budget: int, counter: Counter) -> Case:
    """The module and every trimmer on ``conversation`` at ``budget`` (module docstring)."""
    transcript = _transcript(conversation)
    overrides: dict[str, Any] = {"max_tokens": budget, "max_tokens_fallback": budget}
    config = build_config(overrides, "economics")
    module = await replay(
        transcript,
        config,
        None,
        name="module",
        overrides=overrides,
        prices=PRICES,
        measure=counter.message_tokens,
    )
    histories = request_histories(transcript, config)
    runs = [_policy("module", module)]
    for name, fraction, hysteresis in TRIMMERS:
        target = fraction * budget
        views = trimmed_views(
            histories,
            trigger=budget if hysteresis else target,
            target=target,
            measure=estimate_message,
        )
        run = baseline_run(module, histories, views, name=name, description=name)
        runs.append(_policy(name, run))
    # the trimmer at the module's own mean context (searched and kept in the measured
    # units, so the two means match as closely as the units allow)
    measure = counter.message_tokens
    target, _ = equal_context_target(histories, module.mean_view_tokens, measure)
    views = trimmed_views(histories, trigger=target, target=target, measure=measure)
    equal = baseline_run(module, histories, views, name="equal", description="equal")
    runs.append(_policy("equal", equal))
    negotiated, failed = await replay_negotiated(conversation, budget, counter, module)
    runs.append(_policy("negotiated", negotiated))
    return Case(
        conversation=conversation.name,
        budget=budget,
        requests=len(module.records),
        whole=counter.count_request(conversation.messages),
        runs=tuple(runs),
        failed=failed,
    )


async def replay_negotiated(
    conversation: real.Conversation, budget: int, counter: Counter, module: Run
) -> tuple[Run, int]:
    """The negotiated path on the same requests: ``get_measured_request_view`` on a
    ``token_meter: "actual"`` manager (``max_tokens`` = B), the provider's count being the
    independent counter's count of the view with B as its hard input limit; every
    transaction is committed and the counted view is what is sent. Billed like
    ``module``; returns the run and how many requests failed closed."""
    manager = SimpleContextManager(
        token_meter="actual", max_tokens=budget, max_tokens_fallback=budget
    )

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        count = counter.count_request(view)
        measurement = {"kind": "provider_count", "source": "bench.o200k", "input_tokens": count}
        decision = {
            "estimated_input_tokens": count,
            "input_limit_tokens": budget,
            "measurement": measurement,
        }
        return {"dispatch": {"messages": len(view)}, "budget_decision": decision}

    histories: list[list[dict[str, Any]]] = []
    views: list[list[dict[str, Any]]] = []
    failed = 0
    held: list[dict[str, Any]] = []

    async def request() -> None:
        nonlocal failed
        try:
            result = await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=count_view
            )
        except ProviderLimitError:
            failed += 1
            return  # noqa: ASYNC910 - the request awaited the module just before
        if result["transaction"] is not None:
            await result["transaction"].commit()
        histories.append(list(held))
        views.append(result["base_view"])

    for message in conversation.messages:
        if message.get("role") == "assistant":
            await request()
        await manager.add_message(message)
        held.append(message)
    await request()
    run = baseline_run(module, histories, views, name="negotiated", description="negotiated")
    return run, failed


def run(conversations: Sequence[real.Conversation] | None = None) -> list[Case]:
    """Every case (module docstring), conversations in order, budgets ascending.

    ``python -m benchmarks.economics --plot FILE`` also writes ``write_plot``'s PNG."""
    conversations = real.conversations() if conversations is None else conversations
    counter = Counter()

    async def main() -> list[Case]:
        todo = [
            (conversation, budget)
            for conversation in conversations
            for budget in BUDGETS
            if counter.count_request(conversation.messages) > budget
        ]
        return [  # noqa: ASYNC910 - the benchmark's only task: nothing cancels it
            await replay_case(c, budget, counter) for c, budget in todo
        ]

    with tallied_warnings():
        return anyio.run(main)


@dataclass(frozen=True, slots=True)
class Summary:
    cases: int
    dominated: int
    """Cases where at least one trimmer is cheaper and keeps more mean context."""
    module_breaks_small: float
    """Median cache breaks per 100 requests at budgets <= ``SMALL``, the module."""
    hy50_breaks_small: float
    equal_bill_ratio: float
    """Median bill of the equal-context trimmer / the module's."""
    negotiated_dominated: int
    """Cases where a trimmer is cheaper and keeps more mean context than the negotiated
    path."""
    negotiated_breaks_small: float
    negotiated_failed: int
    """Negotiated requests that failed closed, over every case."""


def summarize(cases: Sequence[Case]) -> Summary:
    small = [case for case in cases if case.budget <= SMALL]
    return Summary(
        cases=len(cases),
        dominated=sum(bool(case.dominating) for case in cases),
        module_breaks_small=statistics.median(c.module.breaks_per_100 for c in small),
        hy50_breaks_small=statistics.median(c.run("hy50").breaks_per_100 for c in small),
        equal_bill_ratio=statistics.median(c.run("equal").bill / c.module.bill for c in cases),
        negotiated_dominated=sum(bool(case.dominating_over("negotiated")) for case in cases),
        negotiated_breaks_small=statistics.median(
            c.run("negotiated").breaks_per_100 for c in small
        ),
        negotiated_failed=sum(case.failed for case in cases),
    )


def rows(cases: Sequence[Case]) -> list[list[str]]:
    """One row per case: the module's bill, mean context and rates, then for each trimmer
    its bill and mean context relative to the module's, and its breaks per 100 requests."""
    out: list[list[str]] = []
    for case in cases:
        module = case.module
        row = [
            f"{case.conversation} @ {case.budget // 1000}k",
            f"{module.bill:,.0f}",
            f"{module.mean_context:,.0f}",
            f"{module.compactions_per_100:.1f}",
            f"{module.breaks_per_100:.1f}",
        ]
        for policy in case.runs[1:]:
            mark = " *" if policy.name in case.dominating else ""
            if policy.name == "negotiated" and case.dominating_over("negotiated"):
                mark = " *" + ",".join(case.dominating_over("negotiated"))
            row.append(
                f"{policy.bill / module.bill:.2f} / {policy.mean_context / module.mean_context:.2f}"
                f" / {policy.breaks_per_100:.0f}{mark}"
            )
        out.append(row)
    return out


def budget_rows(cases: Sequence[Case]) -> list[list[str]]:
    """One row per budget: its cases, the module's median compactions and cache breaks
    per 100 requests, the cases a trimmer dominates, and per trimmer the median bill and
    mean context relative to the module's."""
    out: list[list[str]] = []
    for budget in BUDGETS:
        at = [case for case in cases if case.budget == budget]
        if not at:
            continue
        row = [
            f"{budget // 1000}k",
            f"{len(at)}",
            f"{statistics.median(c.module.compactions_per_100 for c in at):.1f}",
            f"{statistics.median(c.module.breaks_per_100 for c in at):.1f}",
            f"{sum(bool(c.dominating) for c in at)}",
        ]
        for name in (*(t for t, _, _ in TRIMMERS), "equal", "negotiated"):
            bill = statistics.median(c.run(name).bill / c.module.bill for c in at)
            context = statistics.median(
                c.run(name).mean_context / c.module.mean_context for c in at
            )
            row.append(f"{bill:.2f} / {context:.2f}")
        out.append(row)
    return out


BUDGET_HEADER: Final = (
    "budget",
    "cases",
    "module comp/100",
    "module brk/100",
    "dominated",
    *(f"{name}: bill / ctx" for name, _, _ in TRIMMERS),
    "equal: bill / ctx",
    "negotiated: bill / ctx",
)


HEADER: Final = (
    "case (conversation @ budget)",
    "module bill",
    "mean ctx",
    "comp/100",
    "brk/100",
    *(f"{name}: bill / ctx / brk" for name, _, _ in TRIMMERS),
    "equal: bill / ctx / brk",
    "negotiated: bill / ctx / brk",
)


def format_rows(
    cases: Sequence[Case], header: Sequence[str] = HEADER, body: list[list[str]] | None = None
) -> str:
    table = [list(header), *(rows(cases) if body is None else body)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    return "\n".join(lines)


COLORS: Final = {"pr50": "tab:red", "pr90": "tab:orange", "hy50": "tab:blue", "hy90": "tab:cyan"}


def write_plot(cases: Sequence[Case], path: Path) -> None:
    """A PNG: every trimmer run of every case as a point (its mean context and its bill,
    both relative to the module's on the same case); the module is (1, 1) on every case.
    The lower right quadrant (cheaper and more context) is where a trimmer dominates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(9, 6))
    axes.axvspan(1, 2, ymin=0, ymax=0.5, color="0.92", zorder=0)

    def relative(name: str) -> tuple[list[float], list[float]]:
        runs = [(case.run(name), case.module) for case in cases]
        return (
            [run.mean_context / module.mean_context for run, module in runs],
            [run.bill / module.bill for run, module in runs],
        )

    for name, color in COLORS.items():
        context, bill = relative(name)
        axes.scatter(context, bill, s=18, color=color, label=name, zorder=2)
    context, bill = relative("negotiated")
    axes.scatter(context, bill, s=18, marker="x", color="k", label="negotiated path")
    axes.scatter([1], [1], s=80, marker="*", color="k", label="module (every case)", zorder=3)
    axes.set_xlim(0.4, 1.6)
    axes.set_ylim(0.0, 2.0)
    axes.axhline(1, color="0.5", lw=0.8)
    axes.axvline(1, color="0.5", lw=0.8)
    axes.set_xlabel("mean context kept / the module's (o200k tokens)")
    axes.set_ylabel("bill / the module's (exact-prefix cache: read 0.1, write 1.25)")
    small = sum(case.budget <= SMALL for case in cases)
    axes.set_title(
        f"{len(cases)} cases: real conversations x budgets 8k-200k ({small} at <= 16k); "
        "shaded: cheaper AND more context",
        fontsize=9,
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def main() -> int:
    cases = run()
    if len(sys.argv) > 2 and sys.argv[1] == "--plot":
        write_plot(cases, Path(sys.argv[2]))
    print(format_rows(cases))
    print()
    print(format_rows(cases, BUDGET_HEADER, budget_rows(cases)))
    summary = summarize(cases)
    print(
        f"\n{summary.cases} cases; dominated (a trimmer cheaper AND keeping more mean context, "
        f"marked *): {summary.dominated}; median breaks per 100 requests at budgets <= "
        f"{SMALL // 1000}k: module {summary.module_breaks_small:.1f}, hy50 "
        f"{summary.hy50_breaks_small:.1f}; equal-context trimmer's bill / module's (median): "
        f"{summary.equal_bill_ratio:.2f}; negotiated path: dominated "
        f"{summary.negotiated_dominated}, "
        f"median breaks at <= {SMALL // 1000}k {summary.negotiated_breaks_small:.1f}, "
        f"requests failed closed {summary.negotiated_failed}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
