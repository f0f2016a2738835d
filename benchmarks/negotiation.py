"""Provider counts per negotiated request: count skipping (default) vs ``count_every_rung``.

Each case is one compacting negotiation through ``get_measured_request_view`` on a
``token_meter: "actual"`` manager:

- a history of 40-400 messages, a window of a deterministic session
  (``histories.window``) of one of the content mixes in ``histories.MIXES`` and one of a
  few session seeds, starting at a random user prompt;
- a simulated provider: ``count_view(view)`` returns the o200k_base BPE count (toktok) of
  the provider-visible text of the view - the texts ``estimate.provider_texts`` names
  for each message (string content, text blocks, tool-call names and arguments,
  tool-result content), each tokenized as the separate field it is - plus
  ``PROVIDER_MESSAGE_OVERHEAD`` tokens per message. Counts are cached per text. The
  envelope is ``{dispatch, budget_decision: {estimated_input_tokens, input_limit_tokens,
  context_token_budget, measurement: {kind: "provider_count", source: "bench.o200k",
  input_tokens}}}`` with ``estimated_input_tokens`` = the count and a hard input limit
  far above the view (the limit never binds: this measures the rung search, not
  ``fit_output``);
- a budget ``B`` (``max_tokens`` and ``max_tokens_fallback``) chosen so the first count is
  above the trigger: ``B = 800 + count0 / u`` with ``u`` uniform in [1.1, 3.5], so the
  trigger ``0.92 * (B - 800)`` is at most 84% of the first count and the target
  ``0.5 * (B - 800)`` is 14-45% of it;
- the negotiation runs twice, on two fresh identical managers: skipping on (default) and
  off (``count_every_rung=True``); the transaction is committed.

Reported: counts per request (``count_calls``) for each policy, and the final counted size
(``measured_after``) with skipping relative to the count-every-rung one.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amplifier_module_context_simple.context import estimate
from amplifier_module_context_simple.context.manager import SimpleContextManager
from benchmarks import histories

ENCODING = "o200k_base"
SOURCE = "bench.o200k"
PROVIDER_MESSAGE_OVERHEAD = 4
CASES = 240
SEEDS = 3
MIN_MESSAGES, MAX_MESSAGES = 40, 400
BUDGET_DIVISOR = (1.1, 3.5)
NOTICE_RESERVE = 800  # the module's default compaction_notice_token_reserve
WITHIN = 0.05


class BpeProvider:
    """The simulated provider's counter: o200k BPE of the provider-visible text."""

    def __init__(self) -> None:
        import toktok  # type: ignore[import-untyped]

        self._batch_count = toktok.batch_count
        self._cache: dict[str, int] = {}
        self.calls = 0

    def count(self, messages: Sequence[dict[str, Any]]) -> int:
        per_message: list[list[str]] = []
        missing: dict[str, None] = {}
        cache = self._cache
        for message in messages:
            texts, _ = estimate.provider_texts(message)
            per_message.append(texts)
            for text in texts:
                if text not in cache:
                    missing[text] = None
        if missing:
            texts = list(missing)
            for text, n in zip(texts, self._batch_count(texts, ENCODING), strict=True):
                cache[text] = n
        self.calls += 1
        return sum(
            PROVIDER_MESSAGE_OVERHEAD + sum(cache[t] for t in texts) for texts in per_message
        )

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
    mix: str
    messages: int
    budget: int
    first_count: int
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
    cases: list[Case]

    def calls(self, policy: str) -> list[int]:
        return [getattr(c, f"{policy}_calls") for c in self.cases]

    def mean_calls(self, policy: str) -> float:
        return statistics.mean(self.calls(policy))

    def median_calls(self, policy: str) -> float:
        return statistics.median(self.calls(policy))

    def max_calls(self, policy: str) -> int:
        return max(self.calls(policy))

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
        return provider.envelope(view, budget, limit)

    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view
    )
    transaction = result["transaction"]
    if transaction is not None:
        committed = await transaction.commit()
        assert committed, "the transaction did not commit"
    return result, manager


async def run_case(index: int, provider: BpeProvider) -> Case:
    rng = random.Random(f"negotiation/{index}")
    mix = histories.MIXES[index % len(histories.MIXES)]
    seed = 1_000 + (index // len(histories.MIXES)) % SEEDS
    n = rng.randint(MIN_MESSAGES, MAX_MESSAGES)
    messages = histories.window(n, seed, mix, rng, span=120)
    first = provider.count(messages)
    budget = NOTICE_RESERVE + int(first / rng.uniform(*BUDGET_DIVISOR))
    limit = 4 * max(budget, first)
    skip, skip_manager = await _negotiate(messages, provider, budget, limit, every=False)
    every, every_manager = await _negotiate(messages, provider, budget, limit, every=True)
    for result in (skip, every):
        assert result["measured_before"] == first, (result["measured_before"], first)
        assert result["outcome"] != "not_needed", result["outcome"]

    def level(manager: SimpleContextManager) -> int:
        stats = manager.last_compaction_stats
        return int(stats["strategy_level"]) if stats else 0

    return Case(
        index=index,
        mix=mix.name,
        messages=n,
        budget=budget,
        first_count=first,
        skip_calls=skip["count_calls"],
        every_calls=every["count_calls"],
        skip_final=skip["measured_after"],
        every_final=every["measured_after"],
        skip_outcome=skip["outcome"],
        every_outcome=every["outcome"],
        skip_level=level(skip_manager),
        every_level=level(every_manager),
    )


def run(cases: int = CASES) -> Summary:
    provider = BpeProvider()

    async def main() -> list[Case]:
        return [await run_case(i, provider) for i in range(cases)]

    return Summary(asyncio.run(main()))


__all__ = ["BpeProvider", "Case", "Summary", "run", "run_case"]
