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
from amplifier_module_context_simple.context.estimate import estimate_message
from benchmarks import real
from benchmarks.provider import Counter

BUDGETS: Final = (8_000, 12_000, 16_000, 24_000, 32_000, 48_000, 64_000, 96_000, 128_000, 200_000)
SMALL: Final = 16_000
"""Budgets up to this are the small ones of the breaks summary."""
PRICES: Final = Prices(fresh=1.25, cache_read=0.1, cache_write=1.25)
TRIMMERS: Final = (("pr50", 0.5, False), ("pr90", 0.9, False), ("hy50", 0.5, True), ("hy90", 0.9, True))
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
    """The module first, then ``TRIMMERS``, then ``equal``."""

    @property
    def module(self) -> Policy:
        return self.runs[0]

    def run(self, name: str) -> Policy:
        return next(run for run in self.runs if run.name == name)

    @property
    def dominating(self) -> list[str]:
        """The trimmers that are both cheaper and keep more mean context than the module."""
        module = self.module
        return [
            run.name
            for run in self.runs[1:]
            if run.name != "equal"
            and run.bill < module.bill
            and run.mean_context > module.mean_context
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
    return Case(
        conversation=conversation.name,
        budget=budget,
        requests=len(module.records),
        whole=counter.count_request(conversation.messages),
        runs=tuple(runs),
    )


def run(conversations: Sequence[real.Conversation] | None = None) -> list[Case]:
    """Every case (module docstring), conversations in order, budgets ascending."""
    conversations = real.conversations() if conversations is None else conversations
    counter = Counter()

    async def main() -> list[Case]:
        cases: list[Case] = []
        for conversation in conversations:
            whole = counter.count_request(conversation.messages)
            for budget in BUDGETS:
                if whole > budget:
                    cases.append(await replay_case(conversation, budget, counter))
        return cases

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


def summarize(cases: Sequence[Case]) -> Summary:
    small = [case for case in cases if case.budget <= SMALL]
    return Summary(
        cases=len(cases),
        dominated=sum(bool(case.dominating) for case in cases),
        module_breaks_small=statistics.median(c.module.breaks_per_100 for c in small),
        hy50_breaks_small=statistics.median(c.run("hy50").breaks_per_100 for c in small),
        equal_bill_ratio=statistics.median(c.run("equal").bill / c.module.bill for c in cases),
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
            row.append(
                f"{policy.bill / module.bill:.2f} / {policy.mean_context / module.mean_context:.2f}"
                f" / {policy.breaks_per_100:.0f}{mark}"
            )
        out.append(row)
    return out


HEADER: Final = (
    "case (conversation @ budget)",
    "module bill",
    "mean ctx",
    "comp/100",
    "brk/100",
    *(f"{name}: bill / ctx / brk" for name, _, _ in TRIMMERS),
    "equal: bill / ctx / brk",
)


def format_rows(cases: Sequence[Case]) -> str:
    table = [list(HEADER), *rows(cases)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        for row in table
    ]
    return "\n".join(lines)


def main() -> int:
    cases = run()
    print(format_rows(cases))
    summary = summarize(cases)
    print(
        f"\n{summary.cases} cases; dominated (a trimmer cheaper AND keeping more mean context, "
        f"marked *): {summary.dominated}; median breaks per 100 requests at budgets <= "
        f"{SMALL // 1000}k: module {summary.module_breaks_small:.1f}, hy50 "
        f"{summary.hy50_breaks_small:.1f}; equal-context trimmer's bill / module's (median): "
        f"{summary.equal_bill_ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
