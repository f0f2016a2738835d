"""The seam between the store and the negotiator: one planned request, handed out whole.

A negotiated request needs, from the store: the candidate views of one planned request,
rung by rung, with our estimate of each; the compaction stats of the one it keeps; one
commit; and the request's return boundary (budget event, meter stats). A ``Negotiable``
is exactly that, built by the store for one request and used once. It is made of two
narrow, typed parts and nothing else:

- the ``RequestPolicy`` (``policy.py``): the rules every request path shares (rendering,
  the trigger, the ladder, the floor, the notice), on the request's own snapshot (its
  ``RequestPlan``);
- a ``StoreLink``: the store's own bound methods for what only the store can do (its
  history's epoch, the version check, the one commit, the deliveries, the meter stats).

The negotiator (``negotiator/``) sees views, estimates and ``Candidate`` values, never the
store, its history, its ladder or a message's internals; ``context`` does not import
``negotiator`` at all (the package's ``manager.py`` composes the two). The commit is not
a method of the seam: ``claim_commit`` hands it out once, to the request's transaction
(``negotiator/transaction.py``), which claims it when it is created; nothing else can
commit a negotiated request's decisions.

Nothing here awaits except ``pace`` (planning work in slices, ``slices.py``) and the two
deliveries (``deliver_compaction``, ``close``). The work that grows with the history is
written as steps (``preparing``, ``stepping``, ``reducing_floor``, ``falling_back``,
``finalising``): the negotiator runs them through ``pace``, which yields to the event loop
between slices (``base`` and ``ladder``, which the driver reads between them, run theirs
through without pausing). Every candidate is built from the request's snapshot, so a
paused one stays consistent; whether the store moved meanwhile is the transaction's check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ...errors import TransactionStateError
from ..ladder.decisions import Decisions
from ..ladder.ladder import RUNG_COUNT, Ladder
from ..ladder.rungs import FLOOR_RUNG
from ..slices import Pacer, Steps, run_through
from .plan import RequestPlan
from .policy import RequestPolicy

__all__ = ("FLOOR_RUNG", "Candidate", "Commit", "Negotiable", "StoreLink")

RUNGS: Final = range(1, RUNG_COUNT + 1)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate view of a negotiated request (opaque to the negotiator but for these
    fields)."""

    view: list[dict[str, Any]]
    """The complete, notice-inclusive view (new dicts every time)."""
    estimate: int
    """Our estimate of ``view``."""
    decisions: Decisions
    synthesized: int
    """Unanswered calls the view answers with synthesized results."""

    @property
    def stats(self) -> dict[str, Any] | None:
        """The ``context:compaction`` payload this candidate carries, once finalised."""
        stats = self.decisions.stats
        return None if stats is None else stats.to_event()


Commit = Callable[["Candidate"], None]
"""A negotiated request's one commit (synchronous): make the candidate's decisions the
store's, or raise ``TransactionConflictError`` with nothing applied."""


@dataclass(frozen=True, slots=True)
class StoreLink:
    """What a negotiated request needs of the store itself: the store's own bound methods,
    handed to the request's seam (the store builds one per request)."""

    pacer: Pacer
    """Runs planning steps in slices, yielding to the event loop between them."""
    epoch: Callable[[], int]
    """The history's epoch now (``set_messages``/``clear`` move it)."""
    check_version: Callable[[tuple[int, int]], None]
    """Raise ``TransactionConflictError`` unless the store is still at the version."""
    commit: Callable[[Decisions, tuple[int, int], tuple[int, int] | None], None]
    """The store's one commit primitive: check the version, then swap the decisions (the
    third argument: the planned length and returned views, when the model checks the
    prefix of thinking)."""
    deliver_compaction: Callable[[dict[str, Any]], Awaitable[None]]
    """Deliver ``context:compaction`` (a failing hook is logged, never raised)."""
    close: Callable[[RequestPlan, int, int, bool, int | None], Awaitable[None]]
    """The return boundary: emit ``context:budget`` (on change), then publish the meter
    stats (plan, final estimate, synthesized results, floor held, provider count)."""


class Negotiable:
    """One planned negotiated request: candidates, stats, commit and return boundary."""

    rungs: Final = RUNGS

    def __init__(self, policy: RequestPolicy, link: StoreLink, plan: RequestPlan) -> None:
        self._policy = policy
        self._link = link
        self._plan = plan
        self._claimed = False
        limits = plan.limits
        self.trigger: float = limits.due_at
        """Counts at or above this compact (``Limits.due_at``: the trigger, or the idle
        trigger after a gap that outlived the provider's cache)."""
        self.target: int = limits.target
        """What the rungs aim a count at (``Limits.target``)."""
        self.policy_budget: int = limits.policy_budget
        """B, the budget less the notice reserve (``Limits.policy_budget``)."""
        self.skip_counts: bool = not policy.config.count_every_rung
        self._developers: frozenset[int] = frozenset()
        self._ladder: Ladder | None = None
        self._stats_target = self.target
        self._base_tokens = 0
        self._base_messages = 0
        self._limit = plan.budget
        self._base: Candidate | None = None
        self._notice = 0
        """A candidate's estimate less the ladder's total (its tail notice), last seen."""

    @property
    def base(self) -> Candidate:
        """The view under the committed decisions (what the negotiation starts from)."""
        if self._base is None:
            run_through(self.preparing())
        assert self._base is not None
        return self._base

    def preparing(self) -> Steps[None]:
        """The request's protected developer messages and its base candidate, as steps
        (``ContextStore._open_negotiation`` paces them)."""
        if self._base is not None:
            return
        self._developers = yield from self._policy.finding_developers(self._plan)
        rendered = yield from self._policy.rendering(self._plan, self._plan.decisions, copy=False)
        self._plan = self._policy.based(self._plan, rendered)
        self._base = yield from self._candidate(self._plan.decisions)

    async def pace(self, steps: Steps[T]) -> T:
        """Run ``steps`` (one of this seam's) in slices, yielding to the event loop
        between them; its result."""
        return await self._link.pacer.run(steps)

    # -- candidates ----------------------------------------------------------------

    def _candidate(self, decisions: Decisions) -> Steps[Candidate]:
        """The notice-inclusive view under ``decisions``: the notice of new decisions is
        made here (``RequestPolicy.noticing``), to fit the policy budget (and, while the
        floor is reduced, the provider's limit) without making a reduced candidate larger
        than the view the negotiation started from."""
        policy, plan = self._policy, self._plan
        rendered = yield from policy.rendering(plan, decisions)
        ceiling = min(policy.notice_ceiling(plan, rendered), self._limit)
        if decisions is not plan.decisions:
            ceiling = min(ceiling, self._base_tokens)
            decisions = yield from policy.noticing(
                plan,
                decisions,
                before=self._base_messages,
                after=len(rendered.messages),
                room=ceiling - rendered.tokens,
            )
        # The committed notice stays where it is shown: the provider's count of the whole
        # view (notice included) decides whether the view must shrink, not our estimate.
        room = ceiling - rendered.tokens if decisions is not plan.decisions else None
        view, notice = policy.with_notice(rendered, decisions, room=room)
        if decisions is plan.decisions:
            self._base_tokens = rendered.tokens + notice
            self._base_messages = len(rendered.messages) - (1 if notice else 0)
        return Candidate(view, rendered.tokens + notice, decisions, rendered.synthesized)

    def floor_holds(self, count: int) -> bool:
        """Whether the committed decisions reported a protected floor above the target and
        a request of ``count`` tokens still fits the budget: then no rung runs (the storm
        guard of the ordinary path, ``Compactor.floor_holds``, on provider counts)."""
        return self._plan.decisions.floor_reported and count <= self._plan.budget

    def changed(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` differs from the committed decisions."""
        return candidate.decisions is not self._plan.decisions

    @property
    def ladder(self) -> Ladder:
        return run_through(self._laddered())

    def _laddered(self) -> Steps[Ladder]:
        """The working ladder (built on first use), as steps."""
        if self._ladder is None:
            yield from self.preparing()  # (the developer messages are protected)
            self._ladder = yield from self._policy.laddering(
                self._plan, self._plan.decisions, target=-1, extra_protected=self._developers
            )
            self._notice = self.base.estimate - self._ladder.total
        return self._ladder

    def stepping(self, rung: int, goal: float | None = None) -> Steps[Candidate | None]:
        """Apply (or continue) one rung of the working ladder; the new candidate, or None
        if nothing changed; as steps.

        ``goal`` is the most the candidate may weigh in our estimate's units, its notice
        included (the target over the calibrated count / estimate ratio): the rung works
        oldest first and stops once the candidate is predicted at or under it, and a
        later call continues it from there (``exhausted`` says when it has nothing left).
        ``goal=None`` lets the rung exhaust its legal work (the existing module's rule).
        """
        ladder = yield from self._laddered()
        before = ladder.edits
        candidate: Candidate | None = None
        while True:
            # The ladder's total leaves out the tail notice a candidate carries: take the
            # notice as large as on the last candidate, then check on the new one.
            ladder.target = -1 if goal is None else math.floor(goal) - self._notice
            yield from ladder.applying(rung)
            if ladder.edits == before:
                return candidate
            before = ladder.edits
            merged = yield from self._plan.decisions.merging(ladder)
            candidate = yield from self._candidate(merged)
            self._notice = candidate.estimate - ladder.total
            if goal is None or candidate.estimate <= goal or ladder.exhausted(rung):
                return candidate

    def exhausted(self, rung: int) -> bool:
        """Whether ``rung`` went through everything it may touch on the working ladder."""
        return self._ladder is not None and self._ladder.exhausted(rung)

    def reducing_floor(self, limit: int) -> Steps[Candidate | None]:
        """Reduce the protected floor below ``limit`` (our estimate's units); the notice
        must fit under it too. The new candidate, or None when nothing is left to reduce;
        as steps."""
        ladder = yield from self._laddered()
        before = ladder.changes
        self._limit = limit
        yield from self._policy.reducing_floor(ladder, limit)
        if ladder.changes == before:
            return None
        merged = yield from self._plan.decisions.merging(ladder)
        return (yield from self._candidate(merged))

    def falling_back(self) -> Steps[Candidate | None]:
        """No usable first count: the estimate-driven ladder, as an ordinary request would
        climb it. The candidate, or None when the estimate needs no compaction; as steps."""
        policy, plan = self._policy, self._plan
        if not policy.compaction_due(plan, self.base.estimate):
            return None
        target = plan.limits.target
        ladder = yield from policy.laddering(
            plan, plan.decisions, target=target, extra_protected=self._developers
        )
        yield from ladder.climbing()
        if ladder.total > plan.budget:
            yield from policy.reducing_floor(ladder, plan.budget)
        if ladder.changes == 0:
            return None
        self._ladder = ladder
        self._stats_target = target
        merged = yield from plan.decisions.merging(ladder)
        return (yield from self._candidate(merged))

    def finalising(self, candidate: Candidate, **measurement: Any) -> Steps[Candidate]:
        """``candidate`` with its ``context:compaction`` stats: the stats of the ladder
        that produced it, plus ``measurement`` (outcome, counts, sources); as steps."""
        policy, plan = self._policy, self._plan
        rendered = yield from policy.rendering(plan, plan.decisions, copy=False)
        ladder = yield from self._laddered()
        stats = yield from policy.compactor.stating(
            plan.history, plan, rendered, ladder, candidate.decisions, self._stats_target
        )
        kept = yield from rendered.prefix_keeping(candidate.view)
        stats = stats.measured(
            self.base.estimate,
            trigger=self.trigger,
            policy_budget=self.policy_budget,
            **measurement,
        ).with_prefix(*kept)
        decisions = dataclasses.replace(
            candidate.decisions,
            stats=stats,
            floor_reported=ladder.total > self._stats_target,
        )
        return dataclasses.replace(candidate, decisions=decisions)

    # -- the transaction's seam -----------------------------------------------------

    @property
    def committed(self) -> Candidate:
        return self.base

    def history_replaced(self) -> bool:
        """Whether ``set_messages``/``clear`` replaced the history since planning (an
        append does not: the planned prefix is unchanged)."""
        return self._link.epoch() != self._plan.epoch

    def claim_commit(self) -> Commit:
        """The request's one commit, handed out once: the transaction claims it when it is
        created (``negotiator/transaction.py``).

        The commit makes a candidate's decisions the store's, synchronously; it raises
        ``TransactionConflictError``, with nothing applied, when the store moved (another
        commit, ``set_messages``, ``clear``) since planning.

        Raises:
            TransactionStateError: the commit was claimed already.
        """
        if self._claimed:
            raise TransactionStateError("claim the commit", "CLAIMED")
        self._claimed = True
        commit, version = self._link.commit, self._plan.version
        plan = self._plan
        planned = (plan.length, plan.returned) if plan.preserved_thinking else None

        def committing(candidate: Candidate) -> None:
            commit(candidate.decisions, version, planned)

        return committing

    def check_current(self) -> None:
        """Raise ``TransactionConflictError`` when the store moved since planning."""
        self._link.check_version(self._plan.version)

    async def deliver_compaction(self, stats: dict[str, Any]) -> None:
        await self._link.deliver_compaction(stats)

    # -- the return boundary --------------------------------------------------------

    async def close(
        self, final: Candidate, measured: int | None, *, floor_held: bool = False
    ) -> None:
        """Emit ``context:budget`` (on change), then refresh the meter stats
        (``floor_held``: no rung ran because a reported floor holds, ``floor_holds``).

        A delivery that raises leaves no trace: the meter stats stay those of the last
        request that returned and the budget is emitted again by the next request.
        """
        await self._link.close(self._plan, final.estimate, final.synthesized, floor_held, measured)
