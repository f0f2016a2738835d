"""What one request decided before it touched the view: an immutable snapshot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...errors import RetainedContentMissingError
from ..config import ContextConfig
from ..counting.budget import LearnedLimit, apply_learned_limit, window_of
from ..history.history import History
from ..ladder.decisions import Decisions
from ..rendering.thinking import DEFAULT_RULE, Ranges, ThinkingRule, thinking_rule

__all__ = ("RequestArgs", "RequestPlan", "notice_reserve", "protected_seqs")


def notice_reserve(configured: int, budget: int) -> int:
    """The notice reserve for ``budget``: the configured one, scaled down for small budgets.

    A reserve may take at most a quarter of the budget (a larger one would leave the view
    almost nothing); the notice itself is budgeted, within it, when its decision is made
    (``RequestPolicy.noticing``).
    """
    return min(configured, budget // 4)


def protected_seqs(history: History, retain: Sequence[str]) -> frozenset[int]:
    """Seqs every view of a request keeps complete: the first and latest human prompts and
    the newest reminder envelope of each retained body.

    Raises:
        RetainedContentMissingError: a retained body is not in the admitted history.
    """
    protected = {seq for seq in (history.first_human, history.last_human) if seq is not None}
    for body in retain:
        seq = history.latest_envelope.get(body)
        if seq is None:
            raise RetainedContentMissingError(
                "Requested retained injection is not in admitted history: no persisted "
                f"reminder envelope has this content ({len(body)} characters)"
            )
        protected.add(seq)
    return frozenset(protected)


class RequestArgs(NamedTuple):
    """What the caller asked of one request, with the budget derived for it."""

    provenance: dict[str, Any]
    """The budget's provenance (``derive_budget``), before a learned limit."""
    factory_text: str | None
    token_budget: int | None
    provider: Any
    retain: Sequence[str]
    hard_fit: bool


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Everything one request decided before touching the view (an immutable snapshot)."""

    provenance: dict[str, Any]
    budget: int
    effective: int
    """The budget compaction works against: ``budget`` minus the notice reserve."""
    factory_text: str | None
    history: History
    """The history the request sees (its first ``length`` entries). Planning reads this
    object, never the store's current one: a plan paused between slices stays consistent
    even when ``set_messages`` or ``clear`` replaces the store's history meanwhile."""
    length: int
    """Number of history entries the request sees."""
    epoch: int
    version: tuple[int, int]
    """The store's (history epoch, commit version) when planned: a commit must match it."""
    decisions: Decisions
    protected: frozenset[int]
    retained: bool
    hard_fit: bool
    limit: LearnedLimit | None = None
    """The learned provider limit this request leaves for later ones (``budget.py``)."""
    thinking: ThinkingRule = DEFAULT_RULE
    """The model's thinking rule (``thinking.py``): with a prefix check, a compaction
    leaves out the thinking after its first change."""

    unthought: Ranges = ()
    """Seq ranges shown without their thinking: a change before them that their own
    decisions did not make (the system part changed; a transaction planned before them
    committed after they were answered) invalidated it (``docs/thinking.md``)."""
    returned: int = 0
    """How many views requests of the store had returned when this one was planned."""
    late_from: int | None = None
    """The planned length of a transaction committed after other views were returned
    (``ContextStore._commit``): this request shows ``[late_from, length)`` unthought."""
    sent_systems: tuple[object, object] | None = None
    """``shown_systems`` of the last view a request of this history returned (None: none
    yet): a view whose base differs leaves out the thinking after the difference."""
    shown_systems: tuple[object, object] | None = None
    """What this request's view shows of its base, once rendered: the system part and the
    protected messages shown as admitted although reduced (``RequestPolicy.based``; what
    the store records as ``sent_systems`` when the request returns)."""
    uncounted_thinking: Mapping[int, int] = field(default_factory=dict)
    """Seq -> thinking estimate the provider does not count (a model that drops earlier
    turns' thinking: ``thinking.PriorThinking``); the view's estimate leaves it out."""

    @property
    def preserved_thinking(self) -> bool:
        return self.thinking.preserved

    @classmethod
    def taken(
        cls,
        args: RequestArgs,
        *,
        config: ContextConfig,
        learned: LearnedLimit | None,
        history: History,
        epoch: int,
        version: tuple[int, int],
        decisions: Decisions,
    ) -> RequestPlan:
        """The plan of a request asked as ``args`` of a store in this state (its history,
        committed decisions and learned provider limit).

        A hard-fit request with an explicit budget is a provider-directed rebuild: its
        budget is the provider's real limit, learned for later requests. A request with no
        explicit budget applies the learned limit (forgotten when the provider reports
        another window).

        Raises:
            RetainedContentMissingError: a retained body is not in the admitted history.
        """
        provenance, limit = args.provenance, learned
        if config.learn_provider_limits:
            window = window_of(args.provider)
            if args.hard_fit and args.token_budget is not None:
                limit = LearnedLimit(provenance["effective_budget"], window)
            elif args.token_budget is None:
                provenance = apply_learned_limit(provenance, learned, window)
                if limit is not None and limit.window != window:
                    limit = None
        budget: int = provenance["effective_budget"]
        effective = budget
        if config.compaction_notice_enabled:
            effective = budget - notice_reserve(config.compaction_notice_token_reserve, budget)
        return cls(
            provenance=provenance,
            budget=budget,
            effective=effective,
            factory_text=args.factory_text,
            history=history,
            length=len(history),
            epoch=epoch,
            version=version,
            decisions=decisions,
            protected=protected_seqs(history, args.retain),
            retained=bool(args.retain),
            hard_fit=args.hard_fit,
            limit=limit,
            thinking=thinking_rule(config.preserved_thinking, args.provider),
        )
