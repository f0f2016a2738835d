"""The negotiated (measured) request path: the async driver of ``RequestTransaction``.

``negotiate`` proposes the notice-inclusive candidate view of a planned request (a
``Negotiable``, the store's seam) to the orchestrator's ``count_view``, which builds and
counts the complete request with the provider; when the count is over the trigger, it
reduces the candidate with the eight legal rungs until a count fits the target, then
offers ``fit_output`` once when the request is still over the provider's hard limit,
and finally reduces the protected floor itself.

Rungs stop at the target: each rung works oldest first and stops once the candidate's
calibrated prediction (our estimate, notice included, times the last count's
``count / estimate``) reaches the target - or the provider's hard limit, when that is
lower. A counted candidate still above it continues the same rung, recalibrated, before
the next rung; a rung that has nothing left moves on. ``negotiate(...,
exhaust_rungs=True)`` keeps the existing module's rule, every rung exhausting its legal
work, for comparison (the benchmarks); it is not a configuration key.

It awaits only through its seams (``count_view``, ``fit_output`` and the return
boundary's event delivery) and between the
slices of the work that grows with the history (each rung, each candidate, the final
stats: ``Negotiable.pace``). Everything it keeps is staged in the transaction, whose
REDUCE and FINISH entries check, like a count's, that the history was not replaced while
the candidate was built; any exception or cancellation before the result is returned
rolls the transaction back.

Fewer counts: a count is a network round trip. After the first measured count the
driver calibrates its own estimate against the provider (``count / estimate``) and does
not count a candidate whose calibrated prediction stays above the target by more than
``SKIP_MARGIN`` (a rung that exhausted its work short of it); it always counts the
candidate it returns. ``count_every_rung: true``
turns skipping off (count every candidate that changed something, as the existing module
counts every rung). Either way there are at most ``MAX_COUNTS`` (nine) base counts, plus
at most ``FLOOR_COUNTS`` while the floor is reduced: the last base count is always of the
candidate the rungs return, so with one left the remaining rungs (the current one
included) exhaust their work uncounted and only their result is counted - an honest
``target_reached`` or ``protected_floor``, at the price of a view that may land below
the target in that rare case.

This module knows views, estimates and the seam; it imports nothing else from
``context``. What the orchestrator's seams return is read in ``envelopes.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ..context.policy.negotiable import FLOOR_RUNG, Candidate, Negotiable
from ..errors import ProviderLimitError
from .envelopes import (
    Attempt,
    CountView,
    Decision,
    FitOutput,
    Measured,
    read_decision,
    read_fitted,
)
from .transaction import RequestTransaction, _Machine

__all__ = ("MAX_COUNTS", "Negotiation", "Outcome", "negotiate")
Outcome = Literal[
    "not_needed", "target_reached", "protected_floor", "reduced_output", "measurement_unavailable"
]

MAX_COUNTS: Final = 9
"""Base counts per request at most: the first and eight more (the floor's are apart)."""

FLOOR_COUNTS: Final = 3
"""Counts spent at most on reducing the protected floor below the provider's limit."""

SKIP_MARGIN: Final = 0.10
"""Skip counting a rung only when its calibrated prediction exceeds target by this much."""

CANNOT_FIT: Final = "Context cannot fit protected content within the provider input limit"


# -- the driver --------------------------------------------------------------------------


@dataclass(slots=True)
class _Climb:
    """Where the rungs stand: the last counted attempt, its measurement, the calibration
    (``count / estimate``) and the staged candidate not yet counted, if any."""

    last: Attempt
    measured: Measured
    ratio: float
    pending: Candidate | None = None


class Negotiation:
    """One run of the negotiated path over a planned request (used once)."""

    def __init__(
        self,
        seam: Negotiable,
        count_view: CountView,
        fit_output: FitOutput | None,
        *,
        exhaust_rungs: bool = False,
    ):
        self.seam = seam
        self.exhaust_rungs = exhaust_rungs
        """Each rung exhausts its legal work: the existing module's rule, for comparison
        (benchmarks); not a configuration key."""
        self.count_view = count_view
        self.fit_output = fit_output
        self._machine = _Machine(seam)
        self.count_calls = 0
        self.oversized: list[Decision] = []
        """The decisions of the counts known to exceed the provider's limit."""
        self.final = seam.base
        """The candidate the result returns (for the meter stats)."""
        self.floor_held = False
        """No rung ran: a reported floor holds (``Negotiable.floor_holds``)."""

    async def count(self, candidate: Candidate) -> Attempt:
        """Count ``candidate`` through the orchestrator's seam."""
        self._machine.counting()
        envelope = await self.count_view(candidate.view)
        self.count_calls += 1
        self._machine.counted()
        attempt = Attempt(candidate, envelope, read_decision(envelope))
        if attempt.oversize:
            self.oversized.append(attempt.decision)
        return attempt

    def result(
        self,
        attempt: Attempt,
        outcome: Outcome,
        *,
        before: int | None,
        after: int | None,
        count_calls: int | None = None,
        envelope: Any = None,
    ) -> dict[str, Any]:
        self.final = attempt.candidate
        transaction: RequestTransaction | None = RequestTransaction(self._machine)
        if not self._machine.has_changes:
            self._machine.rollback()
            transaction = None
        seam = self.seam
        return {
            "base_view": attempt.view,
            "final_attempt": attempt.envelope if envelope is None else envelope,
            "outcome": outcome,
            "measured_before": before,
            "measured_after": after,
            "policy_budget": seam.policy_budget,
            "trigger": seam.trigger,
            "target": seam.target,
            "count_calls": self.count_calls if count_calls is None else count_calls,
            "transaction": transaction,
        }

    async def run(self) -> dict[str, Any]:
        """The whole request, its return boundary included: anything that raises before
        the result is returned rolls the transaction back."""
        try:
            result = await self._run()
            await self.seam.close(self.final, result["measured_after"], floor_held=self.floor_held)
        except BaseException:
            self._machine.rollback()
            raise
        return result

    async def _run(self) -> dict[str, Any]:
        initial = await self.count(self.seam.base)
        if not isinstance(initial.decision, Measured):
            return await self._unavailable(initial)
        first = initial.decision
        if first.count < self.seam.trigger and not first.oversize:
            return self.result(initial, "not_needed", before=first.count, after=first.count)
        if self.seam.floor_holds(first.count) and not first.oversize:
            # A reported floor stands while the request fits the budget: the rungs could
            # only shave what the history added since, rewriting the cached view for it.
            self.floor_held = True
            return self.result(initial, "protected_floor", before=first.count, after=first.count)
        estimate = initial.candidate.estimate
        climb = _Climb(initial, first, first.count / estimate if estimate > 0 else 1.0)
        for rung in self.seam.rungs:
            done = await self._climb(rung, climb, initial, first)
            if done is not None:
                return done
        last, measured = climb.last, climb.measured
        if climb.pending is not None:  # predicted above target; count it anyway
            last = await self.count(climb.pending)
            if not isinstance(last.decision, Measured):
                return self._recount_unavailable(initial)
            measured = last.decision
            if measured.count <= self.seam.target and not measured.oversize:
                return await self._finish(initial, first, last, measured, "target_reached")
        if measured.oversize:
            return await self._fit(initial, first, last, measured)
        if not self._machine.has_changes:
            return self.result(initial, "protected_floor", before=first.count, after=first.count)
        return await self._finish(initial, first, last, measured, "protected_floor")

    async def _climb(
        self, rung: int, climb: _Climb, initial: Attempt, first: Measured
    ) -> dict[str, Any] | None:
        """Apply ``rung`` (and continue it while a count lands above the target); the
        result when the request is decided, None to go on with the next rung."""
        target = self.seam.target
        while True:
            # The last base count is the returned candidate's: with one left, every
            # remaining rung exhausts its work and only the result is counted.
            closing = self.count_calls >= MAX_COUNTS - 1
            aim = None if self.exhaust_rungs or closing else _aim(target, climb.measured)
            goal = None if aim is None else aim / climb.ratio
            staged = await self.seam.pace(self.seam.stepping(rung, goal))
            if staged is None:
                return None
            self._machine.stage(staged)
            climb.pending = staged
            done = goal is None or self.seam.exhausted(rung)
            if closing or (
                self.seam.skip_counts
                and rung < self.seam.rungs[-1]
                and staged.estimate * climb.ratio > target * (1 + SKIP_MARGIN)
            ):
                if done:  # predicted to stay above target: don't spend a round trip
                    return None
                continue
            climb.last = last = await self.count(staged)
            climb.pending = None
            if not isinstance(last.decision, Measured):
                return self._recount_unavailable(initial)
            climb.measured = measured = last.decision
            if staged.estimate > 0:
                climb.ratio = measured.count / staged.estimate
            if measured.count <= target and not measured.oversize:
                return await self._finish(initial, first, last, measured, "target_reached")
            if done:
                return None  # above target with this rung's work done: the next rung
            # above target: the same rung continues, recalibrated

    async def _finish(
        self,
        initial: Attempt,
        first: Measured,
        last: Attempt,
        measured: Measured,
        outcome: Outcome,
        count_calls: int | None = None,
    ) -> dict[str, Any]:
        """Stage ``last``'s candidate with its stats as the result (READY)."""
        final = await self.seam.pace(
            self.seam.finalising(
                last.candidate,
                measurement_kind="provider_count",
                measurement_source=measured.source,
                measured_before=first.count,
                measured_after=measured.count,
                outcome=outcome,
                count_calls=self.count_calls if count_calls is None else count_calls,
            )
        )
        self._machine.finish(final)
        return self.result(
            Attempt(final, last.envelope, last.decision),
            outcome,
            before=first.count,
            after=measured.count,
        )

    def _recount_unavailable(self, initial: Attempt) -> dict[str, Any]:
        """A recount lost its measurement: keep nothing, fail closed if known oversize."""
        self._machine.rollback()
        oversize = self.oversized
        if oversize:
            raise ProviderLimitError(
                f"{CANNOT_FIT}: the provider recount became unavailable after a request known "
                "to exceed the provider input limit.",
                reason="recount_unavailable",
                estimated=oversize[-1].estimated,
                limit=oversize[-1].limit,
                rung=self.seam.ladder.level,
            )
        return self.result(
            initial, "measurement_unavailable", before=initial.count, after=initial.count
        )

    async def _fit(
        self, initial: Attempt, first: Measured, last: Attempt, measured: Measured
    ) -> dict[str, Any]:
        """All rungs applied and still over the hard limit: offer ``fit_output`` once.

        When the orchestrator offers no ``fit_output``, or it finds no output reduction
        that fits, the protected floor is reduced instead (``_reduce_floor``).
        """
        if self.fit_output is None:
            return await self._reduce_floor(initial, first, last, measured)
        self._machine.fitting()
        result = await self.fit_output(last.view, last.envelope)
        if result is None:
            self._machine.no_fit()
            return await self._reduce_floor(initial, first, last, measured)
        fitted = read_fitted(result)
        if fitted.measured.oversize:  # the "fitted" request is still over the limit
            self._machine.no_fit()
            return await self._reduce_floor(initial, first, last, measured, fit_calls=fitted.calls)
        total_calls = self.count_calls + fitted.calls
        final = last.candidate
        if self.seam.changed(final):
            final = await self.seam.pace(
                self.seam.finalising(
                    final,
                    measurement_kind="provider_count",
                    measurement_source=fitted.measured.source,
                    measured_before=first.count,
                    measured_after=fitted.measured.count,
                    outcome="reduced_output",
                    count_calls=total_calls,
                )
            )
        self._machine.fitted(final)
        return self.result(
            Attempt(final, last.envelope, last.decision),
            "reduced_output",
            before=first.count,
            after=fitted.measured.count,
            count_calls=total_calls,
            envelope=result,
        )

    async def _reduce_floor(
        self,
        initial: Attempt,
        first: Measured,
        last: Attempt,
        measured: Measured,
        *,
        fit_calls: int = 0,
    ) -> dict[str, Any]:
        """Past the rungs and ``fit_output``: reduce the protected floor until a count fits.

        The provider's limit (or the target, when that is lower: a floor reduced only just
        under the limit would be reduced again, with another rewrite of the cached view,
        on the next request) is translated into our estimate's units with the last
        count's calibration (its hard-safe estimate over our estimate) and a margin; each
        reduction is counted, at most ``FLOOR_COUNTS`` times.

        Raises:
            ProviderLimitError: only the irreducible content (system messages, first and
                latest human prompt, retained reminders) is left and it is over the limit.
        """
        for _ in range(FLOOR_COUNTS):
            estimate = last.candidate.estimate
            ratio = measured.estimated / estimate if estimate > 0 else 1.0
            goal = min(measured.limit, self.seam.target)
            limit = int(goal / max(ratio, 1e-9) * (1 - SKIP_MARGIN))
            candidate = await self.seam.pace(self.seam.reducing_floor(limit))
            if candidate is None:
                break
            self._machine.stage(candidate)
            last = await self.count(candidate)
            if not isinstance(last.decision, Measured):
                return self._recount_unavailable(initial)
            measured = last.decision
            if not measured.oversize:
                return await self._finish(
                    initial,
                    first,
                    last,
                    measured,
                    "protected_floor",
                    count_calls=self.count_calls + fit_calls,
                )
        raise ProviderLimitError(
            f"{CANNOT_FIT}: the request is still {measured.estimated:,} > {measured.limit:,} "
            "input tokens after the protected floor was reduced to the system messages, the "
            "first and latest request and retained reminders; required content was not "
            "discarded.",
            reason="irreducible_over_limit",
            estimated=measured.estimated,
            limit=measured.limit,
            rung=FLOOR_RUNG,
        )

    async def _unavailable(self, initial: Attempt) -> dict[str, Any]:
        """No usable first count: fall back to the estimate-driven ladder, then recount once."""
        if initial.oversize:
            raise _unmeasured_oversize(initial, rung=0)
        candidate = await self.seam.pace(self.seam.falling_back())
        if candidate is None:
            return self.result(  # noqa: ASYNC910 - the caller awaited count_view just before
                initial, "measurement_unavailable", before=None, after=None
            )
        self._machine.stage(candidate)
        fallback = await self.count(candidate)
        if fallback.oversize:
            raise _unmeasured_oversize(fallback, rung=self.seam.ladder.level)
        final = await self.seam.pace(
            self.seam.finalising(
                candidate,
                measurement_kind="estimate",
                measurement_source=None,
                measured_before=None,
                measured_after=fallback.count,
                outcome="measurement_unavailable",
                count_calls=self.count_calls,
            )
        )
        self._machine.finish(final)
        return self.result(
            Attempt(final, fallback.envelope, fallback.decision),
            "measurement_unavailable",
            before=None,
            after=None,
        )


def _aim(target: int, measured: Measured) -> float:
    """Where a rung stops, in the provider's counts: the target, or the provider's hard
    limit when that is lower (in the count's units: ``count / estimated`` of it)."""
    if measured.estimated <= 0:
        return target
    return min(target, measured.limit * measured.count / measured.estimated)


def _unmeasured_oversize(attempt: Attempt, *, rung: int) -> ProviderLimitError:
    return ProviderLimitError(
        f"{CANNOT_FIT}.",
        reason="oversize_unmeasured",
        estimated=attempt.decision.estimated,
        limit=attempt.decision.limit,
        rung=rung,
    )


async def negotiate(
    seam: Negotiable,
    *,
    count_view: CountView,
    fit_output: FitOutput | None = None,
    exhaust_rungs: bool = False,
) -> dict[str, Any]:
    """Run the negotiated path over one planned request; see
    ``SimpleContextManager.get_measured_request_view``.

    ``exhaust_rungs=True``: every rung exhausts its legal work, with no target check
    inside a rung - the existing module's rule, for comparison (the benchmarks use it);
    it is not a configuration key. The caller has checked the seams (``check_seams``).
    """
    return await Negotiation(seam, count_view, fit_output, exhaust_rungs=exhaust_rungs).run()
