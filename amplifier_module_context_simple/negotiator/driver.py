"""The negotiated (measured) request path: the async driver of ``RequestTransaction``.

``negotiate`` proposes the notice-inclusive candidate view to the orchestrator's
``count_view`` (which builds and counts the complete request with the provider), and,
when the provider's count says the request is over the trigger, reduces the candidate
with the eight legal rungs until a count fits the target. It awaits only through its
seams: the system-prompt factory (once, while planning), ``count_view``, ``fit_output``
and event delivery. Everything it decides is staged in the transaction; any exception or
cancellation rolls the transaction back before it propagates.

Fewer counts: a count is a network round trip. After the first measured count the
driver calibrates its own estimate against the provider (``count / estimate``) and does
not count a rung whose calibrated prediction stays above the target by more than
``SKIP_MARGIN``; it always counts the candidate it returns. ``count_every_rung: true``
turns skipping off (count every rung that changed something, as the existing module
does). Either way there are at most nine base counts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from ..context.config import TOKEN_METER_ACTUAL
from ..context.ladder import RUNG_COUNT, Ladder
from ..errors import ContextLengthError, CountContractError, TransactionConflictError
from .transaction import RequestTransaction, TxnEvent, TxnState

if TYPE_CHECKING:
    from ..context.decisions import Decisions
    from ..context.manager import SimpleContextManager
    from ..context.plan import RequestPlan

CountView = Callable[[list[dict[str, Any]]], Awaitable[Any]]
FitOutput = Callable[[list[dict[str, Any]], Any], Awaitable[Any]]

FLOOR_COUNTS: Final = 3
"""Counts spent at most on reducing the protected floor below the provider's limit."""

SKIP_MARGIN: Final = 0.10
"""Skip counting a rung only when its calibrated prediction exceeds target by this much."""

CANNOT_FIT: Final = "Context cannot fit protected content within the provider input limit."


@dataclass(frozen=True, slots=True)
class Attempt:
    """One counted candidate: the exact view and envelope, and what the provider said."""

    view: list[dict[str, Any]]
    envelope: Any
    count: int | None
    """The provider's input count, or None when the measurement is unusable."""
    estimated: int | None
    """The provider's hard-safe input estimate (``estimated_input_tokens``)."""
    limit: int | None
    source: str | None
    own_estimate: int
    """Our estimator's figure for ``view`` (used to calibrate predictions)."""

    @property
    def usable(self) -> bool:
        return self.count is not None

    @property
    def oversize(self) -> bool:
        """Known to exceed the provider's hard input limit."""
        return self.estimated is not None and self.limit is not None and self.estimated > self.limit


def _non_negative_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def read_decision(envelope: object) -> tuple[int | None, int | None, int | None, str | None]:
    """Validate a ``{dispatch, budget_decision}`` envelope.

    Returns ``(count, estimated, limit, source)``; ``count`` is None when the measurement
    is unusable, all four are None when there is no decision.

    Raises:
        CountContractError: the envelope or decision is malformed (a ``TypeError``).
    """
    if not isinstance(envelope, Mapping) or "dispatch" not in envelope:
        raise CountContractError("count_view must return {dispatch, budget_decision}")
    decision = envelope.get("budget_decision")
    if decision is None:
        return None, None, None, None
    if not isinstance(decision, Mapping):
        raise CountContractError(
            f"budget_decision must be a dict or None, got {type(decision).__name__}"
        )
    estimated = _non_negative_int(decision.get("estimated_input_tokens"))
    limit = _non_negative_int(decision.get("input_limit_tokens"))
    if estimated is None or limit is None:
        raise CountContractError(
            "estimated_input_tokens and input_limit_tokens must be non-negative integers, got "
            f"{decision.get('estimated_input_tokens')!r} and {decision.get('input_limit_tokens')!r}"
        )
    measurement = decision.get("measurement")
    if not isinstance(measurement, Mapping) or measurement.get("kind") != "provider_count":
        return None, estimated, limit, None
    source = measurement.get("source")
    count = _non_negative_int(measurement.get("input_tokens"))
    if not isinstance(source, str) or not source or count is None or estimated < count:
        return None, estimated, limit, None
    return count, estimated, limit, source


def read_fitted(result: object) -> tuple[int, int, int, str, int]:
    """Validate a ``fit_output`` result; return ``(count, estimated, limit, source, calls)``.

    Raises:
        CountContractError: malformed result or unusable measurement.
        ContextLengthError: the fitted request is still over the provider's limit.
    """
    if not isinstance(result, Mapping) or "dispatch" not in result:
        raise CountContractError("fit_output must return {dispatch, budget_decision, count_calls}")
    calls = result.get("count_calls")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls <= 0:
        raise CountContractError(f"fit_output count_calls must be a positive integer: {calls!r}")
    count, estimated, limit, source = read_decision(result)
    if count is None or estimated is None or limit is None or source is None:
        raise CountContractError("fit_output must return a usable provider_count measurement")
    if estimated > limit:
        raise ContextLengthError(
            f"{CANNOT_FIT[:-1]}: the fitted request is still {estimated:,} > {limit:,}."
        )
    return count, estimated, limit, source, calls


def _calls(result: object) -> int:
    """``count_calls`` of a ``fit_output`` result already validated by ``read_fitted``."""
    calls = result.get("count_calls") if isinstance(result, Mapping) else None
    return calls if isinstance(calls, int) and not isinstance(calls, bool) else 0


class Negotiation:
    """One run of the negotiated path over a planned request (used once)."""

    def __init__(
        self,
        store: SimpleContextManager,
        plan: RequestPlan,
        count_view: CountView,
        fit_output: FitOutput | None,
    ) -> None:
        self.store = store
        self.plan = plan
        self.count_view = count_view
        self.fit_output = fit_output
        config = store.config
        self.trigger = plan.effective * config.compact_threshold
        self.target = int(plan.effective * config.target_usage)
        self.skip_counts = not config.count_every_rung
        self.txn = RequestTransaction(store, plan.decisions, store.version)
        self.count_calls = 0
        self.attempts: list[Attempt] = []
        self.final_estimate = 0
        """Our estimate of the view the result returns (for the meter stats)."""
        self.developers = store.developer_seqs(plan)
        self.base_tokens = 0
        """Our estimate of the view under the committed decisions, notice included (set by
        ``candidate``): no reduced candidate may be larger."""
        self.synthesized = 0
        """Synthesized results in the latest candidate (for the meter stats)."""
        self.limit_ceiling = plan.budget
        """While the floor is reduced: the provider's limit in our estimate's units."""

    # -- seams -------------------------------------------------------------------

    def candidate(self, decisions: Decisions) -> tuple[list[dict[str, Any]], int]:
        """The notice-inclusive public view under ``decisions`` and our estimate of it.

        The notice is budgeted: it must fit the policy budget and may not make a reduced
        candidate larger than the view the negotiation started from.
        """
        rendered = self.store.render(self.plan, decisions)
        self.synthesized = rendered.synthesized
        ceiling = min(self.store.notice_ceiling(self.plan, rendered), self.limit_ceiling)
        if decisions is not self.plan.decisions:
            ceiling = min(ceiling, self.base_tokens)
        view, notice = self.store.with_notice(
            rendered.messages, decisions, room=ceiling - rendered.tokens
        )
        if decisions is self.plan.decisions:
            self.base_tokens = rendered.tokens + notice
        return view, rendered.tokens + notice

    async def count(self, decisions: Decisions) -> Attempt:
        """Count the candidate under ``decisions`` through the orchestrator's seam."""
        view, own = self.candidate(decisions)
        self.txn.fire(TxnEvent.COUNT)
        envelope = await self.count_view(view)
        self.count_calls += 1
        self.check_snapshot()
        count, estimated, limit, source = read_decision(envelope)
        self.txn.fire(TxnEvent.RECORD)
        attempt = Attempt(view, envelope, count, estimated, limit, source, own)
        self.attempts.append(attempt)
        return attempt

    def check_snapshot(self) -> None:
        """Stop, typed, when the history was replaced while a seam was awaited.

        The plan is a snapshot of a history prefix; ``set_messages`` or ``clear`` during a
        count invalidates it (appends do not: the prefix is unchanged).

        Raises:
            TransactionConflictError: the store's history epoch moved; nothing is staged.
        """
        if self.store.version[0] != self.plan.epoch:
            raise TransactionConflictError(
                "the context history was replaced (set_messages or clear) while this "
                "request was being counted; nothing was applied"
            )

    # -- stats and results ----------------------------------------------------------

    def staged_stats(
        self,
        ladder: Ladder,
        staged: Decisions,
        before: Attempt,
        after: Attempt,
        outcome: str,
        count_calls: int,
    ) -> dict[str, Any]:
        rendered = self.store.render(self.plan, self.plan.decisions)
        stats = self.store.compaction_stats(self.plan, rendered, ladder, staged, self.target)
        stats["before_tokens"] = before.own_estimate
        stats.update(
            measurement_kind="provider_count",
            measurement_source=after.source or before.source,
            measured_before=before.count,
            measured_after=after.count,
            trigger=self.trigger,
            policy_budget=self.plan.effective,
            outcome=outcome,
            count_calls=count_calls,
        )
        return stats

    def result(
        self,
        attempt: Attempt,
        outcome: str,
        *,
        before: int | None,
        after: int | None,
        count_calls: int | None = None,
        envelope: Any = None,
    ) -> dict[str, Any]:
        self.final_estimate = attempt.own_estimate
        txn: RequestTransaction | None = self.txn
        if not self.txn.has_changes:
            self.txn.rollback()
            txn = None
        elif self.txn.state is not TxnState.READY:
            self.txn.fire(TxnEvent.FINISH)
        return {
            "base_view": attempt.view,
            "final_attempt": attempt.envelope if envelope is None else envelope,
            "outcome": outcome,
            "measured_before": before,
            "measured_after": after,
            "policy_budget": self.plan.effective,
            "trigger": self.trigger,
            "target": self.target,
            "count_calls": self.count_calls if count_calls is None else count_calls,
            "transaction": txn,
        }

    # -- the driver -------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        try:
            return await self._run()
        except BaseException:
            self.txn.rollback()
            raise

    async def _run(self) -> dict[str, Any]:
        initial = await self.count(self.plan.decisions)
        if not initial.usable:
            return await self._unavailable(initial)
        before = initial.count
        assert before is not None
        if before < self.trigger and not initial.oversize:
            return self.result(initial, "not_needed", before=before, after=before)
        ladder = self.store.ladder_for(
            self.plan, self.plan.decisions, target=-1, extra_protected=self.developers
        )
        ratio = before / initial.own_estimate if initial.own_estimate > 0 else 1.0
        last = initial
        staged = self.plan.decisions
        pending = False  # the staged candidate has not been counted
        for rung in range(1, RUNG_COUNT + 1):
            if not ladder.apply(rung):
                continue
            staged = self.plan.decisions.merged(ladder)
            self.txn.fire(TxnEvent.REDUCE)
            self.txn.stage(staged)
            pending = True
            if self.skip_counts and rung < RUNG_COUNT:
                _, own = self.candidate(staged)
                if own * ratio > self.target * (1 + SKIP_MARGIN):
                    continue  # predicted to stay above target: don't spend a round trip
            last = await self.count(staged)
            pending = False
            if not last.usable:
                return self._recount_unavailable(initial)
            assert last.count is not None
            if last.own_estimate > 0:
                ratio = last.count / last.own_estimate
            if last.count <= self.target and not last.oversize:
                return self._finish(ladder, staged, initial, last, "target_reached")
        if pending:  # the last changed rung was predicted above target; count it anyway
            last = await self.count(staged)
            if not last.usable:
                return self._recount_unavailable(initial)
            assert last.count is not None
            if last.count <= self.target and not last.oversize:
                return self._finish(ladder, staged, initial, last, "target_reached")
        if last.oversize:
            return await self._fit(ladder, staged, initial, last)
        if not self.txn.has_changes:
            return self.result(initial, "protected_floor", before=before, after=before)
        return self._finish(ladder, staged, initial, last, "protected_floor")

    def _finish(
        self,
        ladder: Ladder,
        staged: Decisions,
        initial: Attempt,
        last: Attempt,
        outcome: str,
    ) -> dict[str, Any]:
        stats = self.staged_stats(ladder, staged, initial, last, outcome, self.count_calls)
        self.txn.stage(replace(staged, stats=stats))
        return self.result(last, outcome, before=initial.count, after=last.count)

    def _recount_unavailable(self, initial: Attempt) -> dict[str, Any]:
        """A recount lost its measurement: keep nothing, fail closed if known oversize."""
        self.txn.rollback()
        if any(attempt.oversize for attempt in self.attempts):
            raise ContextLengthError(
                "Context cannot fit protected content: the provider recount became "
                "unavailable after a request known to exceed the provider input limit."
            )
        return self.result(
            initial, "measurement_unavailable", before=initial.count, after=initial.count
        )

    async def _fit(
        self, ladder: Ladder, staged: Decisions, initial: Attempt, last: Attempt
    ) -> dict[str, Any]:
        """All rungs applied and still over the hard limit: offer ``fit_output`` once.

        When the orchestrator offers no ``fit_output``, or it finds no output reduction
        that fits, the protected floor is reduced instead (``_reduce_floor``).
        """
        if self.fit_output is None:
            return await self._reduce_floor(ladder, initial, last)
        self.txn.fire(TxnEvent.FIT)
        fitted = await self.fit_output(last.view, last.envelope)
        self.check_snapshot()
        if fitted is None:
            return await self._reduce_floor(ladder, initial, last)
        try:
            count, _, _, source, calls = read_fitted(fitted)
        except ContextLengthError:  # the "fitted" request is still over the limit
            return await self._reduce_floor(ladder, initial, last, fit_calls=_calls(fitted))
        total_calls = self.count_calls + calls
        if self.txn.has_changes:
            fitted_attempt = replace(last, count=count, source=source)
            stats = self.staged_stats(
                ladder, staged, initial, fitted_attempt, "reduced_output", total_calls
            )
            self.txn.stage(replace(staged, stats=stats))
        self.txn.fire(TxnEvent.FITTED)
        return self.result(
            last,
            "reduced_output",
            before=initial.count,
            after=count,
            count_calls=total_calls,
            envelope=fitted,
        )

    async def _reduce_floor(
        self, ladder: Ladder, initial: Attempt, last: Attempt, *, fit_calls: int = 0
    ) -> dict[str, Any]:
        """Past the rungs and ``fit_output``: reduce the protected floor until a count fits.

        The provider's limit is translated into our estimate's units with the last
        count's calibration (its hard-safe estimate over our estimate) and a margin; each
        reduction is counted, at most ``FLOOR_COUNTS`` times.

        Raises:
            ContextLengthError: only the irreducible content (system messages, first and
                latest human prompt, retained reminders) is left and it is over the limit.
        """
        for _ in range(FLOOR_COUNTS):
            assert last.estimated is not None and last.limit is not None
            ratio = last.estimated / last.own_estimate if last.own_estimate > 0 else 1.0
            limit = int(last.limit / max(ratio, 1e-9) * (1 - SKIP_MARGIN))
            self.limit_ceiling = limit  # the notice must fit under the limit too
            before = ladder.changes
            self.store.reduce_floor(ladder, limit)
            if ladder.changes == before:
                break
            staged = self.plan.decisions.merged(ladder)
            self.txn.fire(TxnEvent.REDUCE)
            self.txn.stage(staged)
            last = await self.count(staged)
            if not last.usable:
                return self._recount_unavailable(initial)
            if not last.oversize:
                self.count_calls += fit_calls
                return self._finish(ladder, staged, initial, last, "protected_floor")
        raise ContextLengthError(
            f"{CANNOT_FIT[:-1]}: the request is still {last.estimated:,} > {last.limit:,} "
            "input tokens after the protected floor was reduced to the system messages, the "
            "first and latest request and retained reminders; required content was not "
            "discarded."
        )

    async def _unavailable(self, initial: Attempt) -> dict[str, Any]:
        """No usable first count: fall back to the estimate-driven ladder, then recount once."""
        if initial.oversize:
            raise ContextLengthError(CANNOT_FIT)
        plan = self.plan
        store = self.store
        estimate = initial.own_estimate
        used = store.used_tokens(estimate)
        should = plan.effective > 0 and used / plan.effective >= store.compact_threshold
        if plan.retained and estimate > plan.effective:
            should = True
        if not should:  # (the caller awaited count_view just before: no checkpoint needed)
            return self.result(  # noqa: ASYNC910
                initial, "measurement_unavailable", before=None, after=None
            )
        ladder = store.ladder_for(
            plan,
            plan.decisions,
            target=store.ordinary_target(plan),
            extra_protected=self.developers,
        )
        ladder.climb()
        if ladder.total > plan.budget:
            store.reduce_floor(ladder, plan.budget)
        if ladder.changes == 0:
            return self.result(  # noqa: ASYNC910
                initial, "measurement_unavailable", before=None, after=None
            )
        staged = plan.decisions.merged(ladder)
        self.txn.fire(TxnEvent.REDUCE)
        self.txn.stage(staged)
        fallback = await self.count(staged)
        if fallback.oversize:
            raise ContextLengthError(CANNOT_FIT)
        rendered = store.render(plan, plan.decisions)
        stats = store.compaction_stats(plan, rendered, ladder, staged, ladder.target)
        stats.update(
            measurement_kind="estimate",
            measurement_source=None,
            measured_before=None,
            measured_after=fallback.count,
            trigger=self.trigger,
            policy_budget=plan.effective,
            outcome="measurement_unavailable",
            count_calls=self.count_calls,
        )
        self.txn.stage(replace(staged, stats=stats))
        return self.result(fallback, "measurement_unavailable", before=None, after=None)


async def negotiate(
    store: SimpleContextManager,
    *,
    provider: Any,
    retain_contents: Sequence[str],
    count_view: CountView,
    fit_output: FitOutput | None = None,
) -> dict[str, Any]:
    """Run the negotiated path; see ``SimpleContextManager.get_measured_request_view``."""
    if store.token_meter != TOKEN_METER_ACTUAL:
        raise RuntimeError("measured request views require token_meter='actual'")
    if not callable(count_view):
        raise TypeError("count_view must be an async callable")
    if fit_output is not None and not callable(fit_output):
        raise TypeError("fit_output must be an async callable or None")
    if isinstance(retain_contents, str) or not all(isinstance(b, str) for b in retain_contents):
        raise TypeError("retain_contents must be a list of strings")
    plan = await store.plan_request(
        token_budget=None,
        provider=provider,
        retain=tuple(dict.fromkeys(retain_contents)),
        hard_fit=False,
    )
    negotiation = Negotiation(store, plan, count_view, fit_output)
    result = await negotiation.run()
    try:
        await store.emit_budget(plan.provenance)
    except BaseException:
        transaction = result["transaction"]
        if transaction is not None:
            transaction.rollback()
        raise
    # The return boundary: nothing awaits after this, so a request that raised above
    # leaves the meter stats of the last request that returned.
    store.publish_measured(
        negotiation.final_estimate,
        plan.effective,
        result["measured_after"],
        synthesized=negotiation.synthesized,
    )
    return result


__all__ = ("Attempt", "Negotiation", "negotiate", "read_decision", "read_fitted")
