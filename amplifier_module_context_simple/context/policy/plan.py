"""What one request decided before it touched the view: an immutable snapshot, and the
budget arithmetic every path of it reads (``Limits``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import RetainedContentMissingError
from ..config import TOKEN_METER_ACTUAL, ContextConfig
from ..counting.budget import LearnedLimit, apply_learned_limit, derive_budget, window_of
from ..counting.correction import CountCorrection, Reconciler
from ..history.history import History
from ..ladder.decisions import Decisions
from ..rendering.thinking import (
    DEFAULT_RULE,
    PriorThinking,
    Ranges,
    ThinkingRule,
    model_id,
    thinking_rule,
    with_range,
)

__all__ = (
    "Limits",
    "RequestArgs",
    "RequestPlan",
    "derived_budget",
    "notice_reserve",
    "protected_seqs",
)


def notice_reserve(configured: int, budget: int) -> int:
    """The notice reserve for ``budget``: the configured one, scaled down for small budgets.

    A reserve may take at most a quarter of the budget (a larger one would leave the view
    almost nothing); the notice itself is budgeted, within it, when its decision is made
    (``RequestPolicy.noticing``).
    """
    return min(configured, budget // 4)


@dataclass(frozen=True, slots=True)
class Limits:
    """One request's budget arithmetic, computed once (``Limits.of``), with one name per
    quantity. Every path reads it from its plan (``RequestPlan.limits``): the ordinary
    path's trigger and ladder, the negotiated path's trigger and target, the compaction
    stats and the meter stats, the floor mark, and the replay's report (``cli/runs.py``).

    Compaction starts at ``compact_threshold`` x B and goes down to ``target_usage`` x B,
    where B (``policy_budget``) is the budget less the notice reserve.

    Two kinds of units. ``budget``, ``policy_budget`` and ``trigger`` are the provider's
    tokens (what a provider count compares with). Whatever an *estimate* is compared with
    (``target``, ``estimated_budget``, ``ceiling``, and ``reached`` on an estimate) is in
    our estimate's units: the provider's tokens divided by the session's count ``scale``
    (``counting/correction.py``; 1 until the provider reports usage in estimate mode).
    """

    budget: int
    """The whole budget: what a view with its notice must fit. It is the
    ``effective_budget`` of the ``context:budget`` payload (``derive_budget``, after a
    learned provider limit), the only quantity that name means."""
    notice_reserve: int
    """The room kept for the compaction notice (``notice_reserve``: the configured reserve,
    at most a quarter of the budget; 0 when notices are off)."""
    policy_budget: int
    """B = ``budget - notice_reserve``: what the trigger and the target are fractions of
    (the ``policy_budget`` of a negotiated request's result and stats, the ``budget`` of
    the compaction stats and of the meter stats)."""
    compact_threshold: float
    """The trigger as a fraction of B (the configuration key)."""
    trigger: float
    """``compact_threshold`` x B: a provider count at or above it compacts (the negotiated
    path; its result's and stats' ``trigger``)."""
    target: int
    """What a compaction climbs down to, in estimate units: ``target_usage`` x B; for hard
    fit, all of B (``correction.estimated``: no margin)."""
    nominal_target: int
    """``target`` before the count correction: what a floor mark is compared on, so that a
    change of scale alone does not run the ladder again (``Compactor.floor_holds``)."""
    correction: CountCorrection = field(default_factory=CountCorrection)
    """The count correction the request applies (reported in the meter stats)."""
    idle_threshold: float | None = None
    """After an idle gap that outlived the provider's cache, the lower trigger fraction of
    B that compacts now (``compact_threshold`` x ``idle_compact_at``); None: the cache is
    warm, or the rule is off (``reached_idle``)."""

    @classmethod
    def of(
        cls,
        budget: int,
        config: ContextConfig,
        *,
        hard_fit: bool = False,
        correction: CountCorrection | None = None,
        idle: bool = False,
    ) -> Limits:
        """The limits of a request with this ``budget`` under ``config``, read through
        ``correction`` (None: no scale, the configured margin), after an idle gap or not."""
        if correction is None:
            correction = CountCorrection(1.0, config.estimate_margin, 0)
        reserve = 0
        if config.compaction_notice_enabled:
            reserve = notice_reserve(config.compaction_notice_token_reserve, budget)
        policy_budget = budget - reserve
        threshold = config.compact_threshold
        nominal = int(policy_budget * config.target_usage)
        # hard fit: all of B, read through the scale but with no margin (the reference's
        # pinned target: a hard fit with a 1,500 budget targets 1,500)
        target = correction.estimated(policy_budget if hard_fit else nominal)
        return cls(
            budget=budget,
            notice_reserve=reserve,
            policy_budget=policy_budget,
            compact_threshold=threshold,
            trigger=policy_budget * threshold,
            target=target,
            nominal_target=policy_budget if hard_fit else nominal,
            correction=correction,
            idle_threshold=threshold * config.idle_compact_at if idle else None,
        )

    @property
    def estimated_budget(self) -> int:
        """The whole budget in estimate units (``correction.estimated``): the best guess of
        the largest estimate the provider accepts. Errors about required content compare
        with it."""
        return self.correction.estimated(self.budget)

    @property
    def ceiling(self) -> int:
        """The whole budget in estimate units, less the margin (``correction.ceiling``):
        what the rules that let a view come close to the budget (a floor holding, a floor
        over the budget) keep a view under."""
        return self.correction.ceiling(self.budget)

    def reached(self, used: int, *, measured: bool = False) -> bool:
        """Whether ``used`` tokens reach the trigger on the ordinary path (the meter's reading
        or our estimate, ``RequestPolicy.compaction_due``): ``used / B >= compact_threshold``.
        An estimate (``measured`` False) is read through the count scale first.

        The same threshold as ``trigger``, compared as a ratio: where B x threshold rounds
        up (100 x 0.07 is 7.000000000000001) a count of ``trigger_tokens`` reaches it here
        and not on the negotiated path, which compares with ``trigger``.
        """
        return self._at(used, self.compact_threshold, measured)

    def reached_idle(self, used: int, *, measured: bool = False) -> bool:
        """Whether ``used`` tokens reach the idle trigger (``idle_threshold``): False when
        the cache is warm or the rule is off."""
        if self.idle_threshold is None:
            return False
        return self._at(used, self.idle_threshold, measured)

    @property
    def due_at(self) -> float:
        """The provider count at or above which a negotiated request compacts: ``trigger``,
        or after an idle gap that outlived the cache the idle trigger (``idle_threshold``
        x B)."""
        if self.idle_threshold is None:
            return self.trigger
        return self.policy_budget * self.idle_threshold

    def _at(self, used: int, threshold: float, measured: bool) -> bool:
        tokens = used if measured else used * self.correction.scale
        return self.policy_budget > 0 and tokens / self.policy_budget >= threshold

    @property
    def trigger_tokens(self) -> int:
        """The fewest estimated tokens that compact on the ordinary path (``reached``):
        what the replay reports as its trigger."""
        tokens = math.ceil(self.trigger / self.correction.scale)
        while tokens > 0 and self.reached(tokens - 1):
            tokens -= 1
        while tokens < self.policy_budget and not self.reached(tokens):
            tokens += 1
        return tokens

    def over_text(self) -> str:
        """The budget an estimate was found over, for an error message."""
        if self.estimated_budget == self.budget:
            return f"{self.budget:,}"
        return (
            f"{self.estimated_budget:,} estimated tokens: {self.budget:,} provider tokens at "
            f"{self.correction.scale:.3f} per estimated token"
        )


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


def derived_budget(
    config: ContextConfig, token_budget: int | None, provider: Any
) -> dict[str, Any]:
    """The budget's provenance under ``config`` (``derive_budget``; before a learned
    limit).

    Raises:
        ValueError: ``token_budget`` is not a positive integer.
    """
    return derive_budget(
        token_budget=token_budget,
        provider=provider,
        max_tokens=config.max_tokens,
        max_tokens_fallback=config.max_tokens_fallback,
        output_reserve_fraction=config.output_reserve_fraction,
    )


@dataclass(frozen=True, slots=True)
class RequestArgs:
    """What the caller asked of one request, and what the request took from outside the
    store before its snapshot (``ContextStore._request_inputs``): the budget derived for
    it and the system prompt factory's text."""

    provenance: dict[str, Any]
    """The budget's provenance (``derived_budget``), before a learned limit."""
    factory_text: str | None
    """The system prompt factory's text (None: no factory)."""
    token_budget: int | None
    provider: Any
    retain: Sequence[str]
    hard_fit: bool
    derived_under: ContextConfig
    """The configuration ``provenance`` was derived under: while the store's differs, the
    request derives it again before each snapshot."""


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Everything one request decided before touching the view (an immutable snapshot)."""

    provenance: dict[str, Any]
    limits: Limits
    """The request's budget, notice reserve, policy budget, trigger and target."""
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
    count_key: object = None
    """What the count correction is kept per (the budget, the provider's window and the
    model): a view returned under another key starts the correction afresh."""
    idle: bool = False
    """The provider's cache outlived the gap since the previous view (``CacheLife``)."""
    now: float = math.nan
    """The store's clock when the request was planned (nan: not read): the time its view
    is sent, from which the cache lives (``CacheLife.returned``)."""
    uncounted_thinking: Mapping[int, int] = field(default_factory=dict)
    """Seq -> thinking estimate the provider does not count (a model that drops earlier
    turns' thinking: ``thinking.PriorThinking``); the view's estimate leaves it out."""

    @property
    def budget(self) -> int:
        """The whole budget (``Limits.budget``): what a view with its notice must fit."""
        return self.limits.budget

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
        unthought: Ranges = (),
        late_from: int | None = None,
        sent_systems: tuple[object, object] | None = None,
        returned: int = 0,
        prior: PriorThinking | None = None,
        counts: Reconciler | None = None,
        idle: bool = False,
        now: float = math.nan,
    ) -> RequestPlan:
        """The plan of a request asked as ``args`` of a store in this state: its history,
        committed decisions and learned provider limit, and what it remembers of the views
        it returned (the seq ranges shown unthought, a late commit's planned length, the
        last view's system part, how many views it returned, the prior thinking a model
        that drops it does not count), the store's count correction (``counts``, applied in
        estimate mode) and whether the cache expired since the last view (``idle``). See
        the fields.

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
        model = model_id(args.provider)
        key = (budget, window_of(args.provider), model)
        correction = None
        if counts is not None and config.token_meter != TOKEN_METER_ACTUAL:
            correction = counts.correction(key, config.estimate_margin)
        plan = cls(
            provenance=provenance,
            limits=Limits.of(
                budget, config, hard_fit=args.hard_fit, correction=correction, idle=idle
            ),
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
            thinking=thinking_rule(config.preserved_thinking, args.provider, model),
            unthought=unthought
            if late_from is None
            else with_range(unthought, late_from, len(history)),
            sent_systems=sent_systems,
            returned=returned,
            late_from=late_from,
            count_key=key,
            idle=idle,
            now=now,
        )
        if prior is None or plan.thinking.keeps_prior:
            return plan
        uncounted = prior.uncounted(history, plan.length)
        return dataclasses.replace(plan, uncounted_thinking=uncounted) if uncounted else plan
