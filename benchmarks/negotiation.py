"""Provider counts per negotiated request: count skipping (default) vs ``count_every_rung``.

Each case is one compacting negotiation through ``get_measured_request_view`` on a
``token_meter: "actual"`` manager. Two sets of cases, reported separately:

- generated: a history of 40-400 messages, a window of a deterministic session
  (``histories.window``) of one of the content mixes in ``histories.MIXES`` and one of a
  few session seeds, starting at a random user prompt;
- real: every real conversation (``benchmarks.real.conversations()``: the project's
  ``tests/data/real``), whole, ``REAL_BUDGETS`` times with different budgets.

For every case:

- a simulated provider: ``count_view(view)`` returns the count of ``benchmarks.provider``
  - the view converted to the OpenAI Chat Completions ``messages`` it would be sent as and
  counted with o200k_base BPE (toktok) over the serialized message fields, plus 3 tokens
  per message, 1 per ``name`` and 3 per request for the reply priming (OpenAI's published
  accounting; that module's docstring says exactly what is counted). It shares nothing
  with the module's estimator (``context/counting/estimate.py``). Counts are cached per string.
  The envelope is ``{dispatch, budget_decision: {estimated_input_tokens,
  input_limit_tokens, context_token_budget, measurement: {kind: "provider_count", source:
  "bench.o200k", input_tokens}}}`` with ``estimated_input_tokens`` = the count and a hard
  input limit far above the view (the limit never binds: this measures the rung search,
  not ``fit_output``);
- a budget ``B`` (``max_tokens`` and ``max_tokens_fallback``) chosen so the first count is
  above the trigger: the policy budget ``E = B - reserve`` (the notice reserve: 800
  tokens, at most a quarter of ``B``) is ``count0 / u`` with ``count0`` the provider's
  count of the history and ``u`` uniform in [1.1, 3.5], so the trigger ``0.92 * E`` is at
  most 84% of the first count and the target ``0.5 * E`` is 14-45% of it (``budget_for``;
  ``B = 800 + count0 / u`` whenever ``E >= 2400``);
- the negotiation runs twice, on two fresh identical managers: skipping on (default) and
  off (``count_every_rung=True``); the transaction is committed.

Reported per set: counts per request (``count_calls``) for each policy, and the final
counted size (``measured_after``) with skipping relative to the count-every-rung one.

Landing (``run_landing``): where a negotiated view lands against its target, per policy -
the default (count skipping), ``count_every_rung`` and the existing module's rule (every
rung exhausts its legal work: ``negotiate(..., exhaust_rungs=True)``, for comparison only).
Every real conversation, whole, at budgets of ``LANDING_FRACTIONS`` of the provider's count
of it, with ``max_tokens`` = ``max_tokens_fallback`` = the provider's hard input limit =
that budget (so the first count is over the limit too); same simulated provider, no
``fit_output``, transaction committed. Per request: the outcome, ``measured_after /
target``, ``count_calls``, and whether the final count is over the limit; a request that
fails closed (``ProviderLimitError``: the protected floor alone is over the limit) is
counted apart. ``below_half`` lists the target-reached requests that kept less than half
of the target, with the conversation's largest message (provider tokens), since one
message larger than half the target can force it.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from amplifier_module_context_simple import ProviderLimitError, SimpleContextManager
from amplifier_module_context_simple.cli import tallied_warnings
from amplifier_module_context_simple.negotiator.driver import negotiate
from benchmarks import histories, real
from benchmarks.provider import Counter

SOURCE = "bench.o200k"
CASES = 240
SEEDS = 3
MIN_MESSAGES, MAX_MESSAGES = 40, 400
REAL_BUDGETS = 8
BUDGET_DIVISOR = (1.1, 3.5)
NOTICE_RESERVE = 800  # the module's default compaction_notice_token_reserve
WITHIN = 0.05
LANDING_FRACTIONS = (0.6, 0.3, 0.1)
POLICIES = ("default", "count_every_rung", "old rule")
FAILED = "failed_closed"


class BpeProvider:
    """The simulated provider: ``benchmarks.provider.Counter`` over the whole request."""

    def __init__(self) -> None:
        self.counter = Counter()
        self.calls = 0

    def count(self, messages: Sequence[dict[str, Any]]) -> int:
        self.calls += 1
        return self.counter.count_request(messages)

    def envelope(self, view: Sequence[dict[str, Any]], budget: int, limit: int) -> dict[str, Any]:
        count = self.count(view)
        return {
            "dispatch": {"messages": len(view)},
            "budget_decision": {
                "estimated_input_tokens": count,
                "input_limit_tokens": limit,
                "context_token_budget": budget,
                "measurement": {"kind": "provider_count", "source": SOURCE, "input_tokens": count},
            },
        }


@dataclass(frozen=True)
class Case:
    index: int
    source: str
    """The content mix (generated) or the conversation's name (real)."""
    messages: int
    budget: int
    history_count: int
    """The provider's count of the history as given (the budget is derived from it)."""
    first_count: int
    """The provider's first count of the negotiation (``measured_before``)."""
    skip_calls: int
    every_calls: int
    skip_final: int
    every_final: int
    skip_outcome: str
    every_outcome: str
    skip_level: int
    every_level: int

    @property
    def ratio(self) -> float:
        return self.skip_final / self.every_final

    @property
    def within(self) -> bool:
        return abs(self.skip_final - self.every_final) <= WITHIN * self.every_final


@dataclass(frozen=True)
class Summary:
    label: str
    cases: list[Case]
    warnings: list[tuple[int, str]] = field(default_factory=list)
    """The module's log warnings: (count, first message) per distinct message."""

    def calls(self, policy: str) -> list[int]:
        return [getattr(c, f"{policy}_calls") for c in self.cases]

    def mean_calls(self, policy: str) -> float:
        return statistics.mean(self.calls(policy))

    def median_calls(self, policy: str) -> float:
        return statistics.median(self.calls(policy))

    def max_calls(self, policy: str) -> int:
        return max(self.calls(policy))

    def histogram(self, policy: str) -> dict[int, int]:
        """Number of requests per count of provider counts."""
        out: dict[int, int] = {}
        for n in self.calls(policy):
            out[n] = out.get(n, 0) + 1
        return dict(sorted(out.items()))

    @property
    def within_fraction(self) -> float:
        return sum(c.within for c in self.cases) / len(self.cases)

    @property
    def mean_ratio(self) -> float:
        return statistics.mean(c.ratio for c in self.cases)

    @property
    def min_ratio(self) -> float:
        return min(c.ratio for c in self.cases)

    @property
    def max_ratio(self) -> float:
        return max(c.ratio for c in self.cases)

    def outcomes(self, policy: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cases:
            key = getattr(c, f"{policy}_outcome")
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    @property
    def same_final(self) -> int:
        return sum(c.skip_final == c.every_final for c in self.cases)

    @property
    def first_differs(self) -> int:
        """Cases whose first count is not the count of the history as given (the module's
        full view differs from it: synthesized answers, dropped orphan results)."""
        return sum(c.first_count != c.history_count for c in self.cases)


def budget_for(effective: int) -> int:
    """The smallest budget ``B`` whose policy budget ``B - reserve`` is ``effective``.

    The reserve mirrors the module's ``notice_reserve``: the configured 800 tokens, at most
    a quarter of the budget. (The policy budget each negotiation reports is checked
    against ``effective``.)
    """
    if effective >= 3 * NOTICE_RESERVE:
        return effective + NOTICE_RESERVE
    budget = effective + effective // 3
    while budget - min(NOTICE_RESERVE, budget // 4) < effective:
        budget += 1
    return budget


async def _negotiate(
    messages: list[dict[str, Any]],
    provider: BpeProvider,
    budget: int,
    limit: int,
    *,
    every: bool,
) -> tuple[dict[str, Any], SimpleContextManager]:
    manager = SimpleContextManager(
        token_meter="actual",
        max_tokens=budget,
        max_tokens_fallback=budget,
        count_every_rung=every,
    )
    await manager.set_messages(messages)

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        await asyncio.sleep(0)  # a provider's count is an await
        return provider.envelope(view, budget, limit)

    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view
    )
    transaction = result["transaction"]
    if transaction is not None:
        committed = await transaction.commit()
        assert committed, "the transaction did not commit"
    return result, manager


async def negotiate_case(
    index: int,
    source: str,
    messages: list[dict[str, Any]],
    provider: BpeProvider,
    rng: random.Random,
) -> Case:
    """Both policies on ``messages`` with a budget drawn from ``rng`` (module docstring)."""
    history = provider.count(messages)
    effective = int(history / rng.uniform(*BUDGET_DIVISOR))
    budget = budget_for(effective)
    limit = 4 * max(budget, history)
    skip, skip_manager = await _negotiate(messages, provider, budget, limit, every=False)
    every, every_manager = await _negotiate(messages, provider, budget, limit, every=True)
    assert skip["measured_before"] == every["measured_before"]
    assert skip["policy_budget"] == effective, (source, skip["policy_budget"], effective)
    for result in (skip, every):
        assert result["outcome"] != "not_needed", (source, result["outcome"])

    def level(manager: SimpleContextManager) -> int:
        stats = manager.last_compaction_stats
        return int(stats["strategy_level"]) if stats else 0

    return Case(
        index=index,
        source=source,
        messages=len(messages),
        budget=budget,
        history_count=history,
        first_count=skip["measured_before"],
        skip_calls=skip["count_calls"],
        every_calls=every["count_calls"],
        skip_final=skip["measured_after"],
        every_final=every["measured_after"],
        skip_outcome=skip["outcome"],
        every_outcome=every["outcome"],
        skip_level=level(skip_manager),
        every_level=level(every_manager),
    )


async def run_case(index: int, provider: BpeProvider) -> Case:
    """Generated case ``index``: a window of a deterministic session."""
    rng = random.Random(f"negotiation/{index}")
    mix = histories.MIXES[index % len(histories.MIXES)]
    seed = 1_000 + (index // len(histories.MIXES)) % SEEDS
    n = rng.randint(MIN_MESSAGES, MAX_MESSAGES)
    messages = histories.window(n, seed, mix, rng, span=120)
    case = await negotiate_case(index, mix.name, messages, provider, rng)
    # a generated history has nothing the module would add or drop
    assert case.first_count == case.history_count, (case.first_count, case.history_count)
    return case


def run(cases: int = CASES) -> Summary:
    """The generated cases."""
    provider = BpeProvider()

    async def main() -> list[Case]:
        return [  # noqa: ASYNC910 - the benchmark's only task: nothing cancels it
            await run_case(i, provider) for i in range(cases)
        ]

    with tallied_warnings() as tally:
        done = asyncio.run(main())
    return Summary("generated", done, list(tally.tally.values()))


def run_real(conversations: Sequence[real.Conversation], budgets: int = REAL_BUDGETS) -> Summary:
    """Every conversation, ``budgets`` times (budgets drawn per conversation and draw)."""
    provider = BpeProvider()

    async def main() -> list[Case]:
        out: list[Case] = []
        for conversation in conversations:
            for draw in range(budgets):
                rng = random.Random(f"negotiation/real/{conversation.name}/{draw}")
                out.append(
                    await negotiate_case(
                        len(out), conversation.name, conversation.messages, provider, rng
                    )
                )
        return out  # noqa: ASYNC910 - the benchmark's only task: nothing cancels it

    with tallied_warnings() as tally:
        done = asyncio.run(main())
    return Summary("real", done, list(tally.tally.values()))


@dataclass(frozen=True)
class Landing:
    """One negotiated request of the landing benchmark (module docstring)."""

    policy: str
    source: str
    fraction: float
    budget: int
    outcome: str
    target: int
    final: int | None
    """``measured_after`` (None when the request failed closed)."""
    counts: int
    largest: int
    """The provider's count of the conversation's largest message."""

    @property
    def landed(self) -> float:
        assert self.final is not None
        return self.final / self.target

    @property
    def over_limit(self) -> bool:
        return self.final is not None and self.final > self.budget


@dataclass(frozen=True)
class LandingSummary:
    """The landing requests of one policy."""

    policy: str
    cases: list[Landing]

    @property
    def reached(self) -> list[Landing]:
        return [c for c in self.cases if c.outcome == "target_reached"]

    def landed(self) -> list[float]:
        return [c.landed for c in self.reached]

    @property
    def counts(self) -> list[int]:
        return [c.counts for c in self.cases if c.outcome != FAILED]

    @property
    def over_limit(self) -> int:
        return sum(c.over_limit for c in self.cases)

    @property
    def below_half(self) -> list[Landing]:
        return [c for c in self.reached if c.landed < 0.5]

    def outcomes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cases:
            out[c.outcome] = out.get(c.outcome, 0) + 1
        return dict(sorted(out.items()))


async def _land(
    messages: list[dict[str, Any]], provider: BpeProvider, budget: int, policy: str
) -> tuple[str, int, int | None, int]:
    """One request under ``policy``: (outcome, target, final count, counts)."""
    manager = SimpleContextManager(
        token_meter="actual",
        max_tokens=budget,
        max_tokens_fallback=budget,
        count_every_rung=policy == "count_every_rung",
    )
    await manager.set_messages(messages)
    calls = 0

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)  # a provider's count is an await
        return provider.envelope(view, budget, budget)

    seam = await manager._open_negotiation(None, [])
    try:
        result = await negotiate(seam, count_view=count_view, exhaust_rungs=policy == "old rule")
    except ProviderLimitError:
        return FAILED, seam.target, None, calls
    transaction = result["transaction"]
    if transaction is not None:
        assert await transaction.commit(), "the transaction did not commit"
    return result["outcome"], result["target"], result["measured_after"], result["count_calls"]


def run_landing(conversations: Sequence[real.Conversation]) -> list[LandingSummary]:
    """Every conversation at every ``LANDING_FRACTIONS`` budget, under every policy."""
    provider = BpeProvider()

    async def main() -> list[Landing]:
        out: list[Landing] = []
        for conversation in conversations:
            messages = conversation.messages
            whole = provider.count(messages)
            largest = max(provider.counter.message_tokens(m) for m in messages)
            for fraction in LANDING_FRACTIONS:
                budget = int(whole * fraction)
                for policy in POLICIES:
                    outcome, target, final, counts = await _land(messages, provider, budget, policy)
                    out.append(
                        Landing(
                            policy,
                            conversation.name,
                            fraction,
                            budget,
                            outcome,
                            target,
                            final,
                            counts,
                            largest,
                        )
                    )
        return out  # noqa: ASYNC910 - the benchmark's only task: nothing cancels it

    with tallied_warnings():
        done = asyncio.run(main())
    return [LandingSummary(p, [c for c in done if c.policy == p]) for p in POLICIES]


__all__ = [
    "BpeProvider",
    "Case",
    "Landing",
    "LandingSummary",
    "Summary",
    "budget_for",
    "negotiate_case",
    "run",
    "run_case",
    "run_landing",
    "run_real",
]
