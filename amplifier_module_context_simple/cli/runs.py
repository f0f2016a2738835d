"""What a replay produces: a ``RequestRecord`` per request and the ``Run`` of a
configuration (or of a baseline trimmer), with its summary figures and its bill."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..context.config import ContextConfig
from ..context.counting.estimate import estimate_message
from ..context.policy.plan import Limits
from ..testing.thinking_oracle import Verdict
from .bill import DEFAULT_PRICES, CacheUse, Measure, Prices, cache_use, dropped_messages

__all__ = ("RequestRecord", "Run", "cumulative_billed", "new_record")


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
    cache: CacheUse = CacheUse(0, 0, 0, 0, 0)  # noqa: RUF009 - frozen, so shareable
    """The view through the simulated prompt cache (against the previous request's view)."""
    dropped_messages: int = 0
    """Messages the previous request's view sent that this one does not
    (``dropped_messages``); positive on a trim."""
    thinking_shown: int = 0
    """Thinking blocks the view sends (``testing.thinking_oracle``)."""
    thinking_invalid: int = 0
    """Of them, blocks sent with another prefix than the request that produced them (or
    after one): a model with preserved thinking rejects the request."""
    thinking_left_out: int = 0
    """Answers shown without their thinking although it could have been sent validly."""


def new_record(
    number: int,
    history_messages: int,
    history_tokens: int,
    keyed: Sequence[tuple[str, int]],
    compaction: dict[str, Any] | None,
    previous: Sequence[tuple[str, int]] | None,
    thinking: Verdict | None = None,
) -> RequestRecord:
    """One replayed request's record: ``keyed`` is the view as (key, tokens) pairs;
    ``thinking`` the preserved-thinking verdict on the view."""
    return RequestRecord(
        number=number,
        history_messages=history_messages,
        history_tokens=history_tokens,
        view_messages=len(keyed),
        view_tokens=sum(tokens for _, tokens in keyed),
        compaction=compaction,
        cache=cache_use(previous, keyed),
        dropped_messages=dropped_messages(previous, keyed),
        thinking_shown=0 if thinking is None else thinking.shown,
        thinking_invalid=0 if thinking is None else len(thinking.invalid),
        thinking_left_out=0 if thinking is None else thinking.left_out,
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
    def limits(self) -> Limits:
        """The budget arithmetic of the run's requests: the store's own (``Limits.of``, as
        ``RequestPlan.taken`` computes it) on the same inputs, the budget the module
        reported and the run's configuration."""
        return Limits.of(self.budget["effective_budget"], self.config)

    @property
    def trigger_tokens(self) -> int:
        """The fewest used tokens that fire compaction (``Limits.trigger_tokens``), for the
        report and the plot."""
        return self.limits.trigger_tokens

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
            "thinking_blocks_sent": sum(r.thinking_shown for r in self.records),
            "thinking_invalid_requests": sum(r.thinking_invalid > 0 for r in self.records),
            "thinking_left_out": sum(r.thinking_left_out for r in self.records),
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


def cumulative_billed(records: Sequence[RequestRecord], prices: Prices) -> list[float]:
    """The running total of the billed input, request by request."""
    out: list[float] = []
    total = 0.0
    for r in records:
        total += prices.billed(r.cache.fresh, r.cache.cache_read, r.cache.cache_write)
        out.append(total)
    return out
