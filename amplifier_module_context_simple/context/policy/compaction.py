"""Running the ladder for a request, and what that remembers between requests.

``Compactor`` builds a ``Ladder`` over a request's working view, runs it for ordinary,
retaining and hard-fit requests, and keeps one thing between requests: the mark of a
reported protected floor (the storm guard). The reduced forms a ladder computes live with
that ladder; the decisions a commit keeps hold the forms they use. It never touches the
committed decisions: it returns staged ones, and the store commits them at its commit
boundary.

Its work grows with the history, so it is written as generators of steps (``slices.py``):
``laddering``, ``compacting``, ``reducing_floor`` and ``stating`` pause as they go (every
``STRIDE`` items of a long loop); the store runs them paced (``Pacer.run``) or, for a plan
that may not pause, through (``run_through``). A paused run reads only its request's snapshot
(the history object and decisions of the plan), and its forms are its own, so a run
whose history was replaced meanwhile shares nothing with the new one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ...errors import RequiredContentTooLargeError
from ..config import ContextConfig
from ..counting.estimate import estimate_message
from ..history.facts import call_facts
from ..history.history import History, marker_owner
from ..history.ingress import RETRIEVAL_GUIDANCE
from ..ladder.decisions import Decisions
from ..ladder.forms import stubbed_form, truncated_form, unthought
from ..ladder.ladder import Ladder, LadderParams
from ..ladder.rows import Form, FormName, Rows
from ..ladder.rungs import FLOOR_RUNG
from ..rendering.notice import notice_message
from ..rendering.render import Rendered
from ..rendering.thinking import covers
from ..slices import HEAVY_STRIDE, Steps, walking
from ..stats import CompactionStats
from .plan import RequestPlan

__all__ = (
    "Compactor",
    "FloorMark",
)


logger = logging.getLogger(__name__)

_Forms = set[tuple[int, str, int]]
"""The reductions a ladder found would not shrink their message: (seq, kind, chars)."""


@dataclass(frozen=True, slots=True)
class FloorMark:
    """A reported protected floor: what it was reported for, and how large it was."""

    epoch: int
    policy_budget: int
    """The policy budget of the request that reported it (``Limits.policy_budget``)."""
    target: int
    """Its target before the count correction (``Limits.nominal_target``)."""
    tokens: int
    """The view's estimate at the floor."""
    length: int
    """History entries the request saw."""


MAX_OMITTED_CALLS: Final = 100
"""The most omitted calls the stats keep (the most recent ones)."""


def omitting_calls(history: History, decisions: Decisions) -> Steps[tuple[str, ...]]:
    """Facts of the calls ``decisions`` remove, or whose results they shorten, as steps."""
    entries = history.entries
    owners = set(decisions.removed)
    owners.update(history.group_of(seq) for seq in decisions.truncated)
    yield
    facts: list[str] = []

    def gather(seq: int) -> None:
        public = entries.public[seq]
        if public is not None and seq in entries.call_ids:
            facts.extend(call_facts(public))

    yield from walking(sorted(owners), gather, stride=HEAVY_STRIDE)
    return tuple(dict.fromkeys(facts))[-MAX_OMITTED_CALLS:]


class Compactor:
    """Ladder runs for one store; ``config`` returns the store's current configuration."""

    def __init__(self, config: Callable[[], ContextConfig]) -> None:
        self._config = config
        self._minimal_notice: int | None = None
        self.floor: FloorMark | None = None
        """The mark of the last reported protected floor, or None."""

    def reset(self) -> None:
        """Forget everything (the history was replaced or cleared)."""
        self.floor = None

    def laddering(
        self,
        history: History,
        plan: RequestPlan,
        decisions: Decisions,
        *,
        target: int,
        extra_protected: frozenset[int],
        notice_next: int | None = None,
    ) -> Steps[Ladder]:
        """A ``Ladder`` over the working view of ``plan`` under ``decisions``, as steps.

        ``notice_next``: the seq of the message the committed notice precedes (the view
        changes there at the latest when a new decision replaces the notice); with
        preserved thinking, the ladder leaves out the thinking from the first change on.
        """
        entries = history.entries
        kinds, kind_codes = entries.kind_table, entries.kind_codes
        publics, all_tokens = entries.public, entries.tokens
        call_ids, result_ids = entries.call_ids, entries.result_ids
        protected = plan.protected | extra_protected
        overrides, override_tokens = decisions.overrides, decisions.override_tokens
        removed = decisions.removed
        uncounted = plan.uncounted_thinking
        rows = Rows()
        calls: dict[int, int] = {}  # call messages' rows by seq (see the markers below)
        system_tokens = 0
        if plan.factory_text is not None:
            system_tokens += estimate_message({"role": "system", "content": plan.factory_text})
        # a copy: an admission while this run is paused may insert into the order
        order = history.order[:]

        def add(position_item: int) -> None:
            nonlocal system_tokens
            if history.position_seq(position_item) >= plan.length:
                return
            if position_item < 0:
                # Synthesized results travel with their call: they count in its row (which
                # comes before them, its recorded results possibly in between), and the
                # renderer shows them exactly when it shows the call.
                synthesized = history.synthesized[marker_owner(position_item)]
                owner = calls.get(synthesized.owner)
                if owner is not None:
                    rows.add_synthesized(owner, synthesized.tokens, len(synthesized.call_ids))
                return
            seq = position_item
            kind = kinds[kind_codes[seq]]
            if kind.is_system:
                if plan.factory_text is None or kind.is_hook_system:
                    system_tokens += all_tokens[seq]
                return
            has_calls = seq in call_ids
            message, tokens = publics[seq], all_tokens[seq] - uncounted.get(seq, 0)
            form: FormName = "full"
            if plan.unthought and message is not None and covers(plan.unthought, seq):
                made = unthought(message)
                if made is not None:
                    if made[0] is None:
                        return  # thinking alone, unthought: not in the view
                    message, tokens = made[0], made[1]
            if seq not in plan.protected:
                if seq in removed:
                    return
                if seq in overrides:
                    message, tokens = overrides[seq], override_tokens[seq]
                    if seq in decisions.truncated:
                        form = "truncated"
                    elif seq in decisions.stubbed:
                        form = "stubbed"
                    # (else an assistant message shown without its thinking: "full", a
                    # form a later rung may remove but never makes again)
            assert message is not None
            row = rows.append(
                seq,
                kind,
                message,
                tokens,
                history.group_of(seq),
                form,
                has_calls=has_calls,
                has_results=seq in result_ids,
            )
            if has_calls:
                calls[seq] = row

        yield from walking(order, add)
        # A group is complete only if its results are inside the request's snapshot: a
        # result admitted after it (a negotiation awaits between plan and ladder) is not in
        # this view, so its call must not be removed as if it were answered here. A call
        # that a later assistant turn closed unanswered is complete (synthesized results).
        incomplete = history.pending_groups(plan.length)
        yield
        config = self._config()
        # A form lives in the ladder that made it while the message shows it, and goes when
        # a later rung removes the message: nothing else keeps one (the decisions a commit
        # keeps hold the forms they use; a session-long cache held thousands for messages
        # long removed). What this ladder remembers is which reductions gave nothing, so a
        # later pass over the same message does not compute them again.
        forms: _Forms = set()
        # One width for the whole run: a reduced form is made again when the decisions
        # take it (``Ladder._form``), and must come out the same.
        chars = config.truncate_chars
        notice_row = None
        if notice_next is not None:
            notice_row = next(
                (row for row in range(len(rows)) if rows.seq[row] == notice_next), None
            )
        return Ladder(
            rows=rows,
            total=system_tokens + sum(rows.tokens),
            target=target,
            protected=protected,
            incomplete_groups=incomplete,
            params=LadderParams(config.protected_recent, config.protected_tool_results),
            truncate=lambda seq: self._truncated(history, forms, seq, chars),
            stub=lambda seq: self._stubbed(history, forms, seq),
            truncate_protected=lambda seq: self._truncated(
                history, forms, seq, chars, protected=True
            ),
            unthink=unthought if plan.preserved_thinking else None,
            notice_row=notice_row,
        )

    @staticmethod
    def _truncated(
        history: History, forms: _Forms, seq: int, chars: int, *, protected: bool = False
    ) -> Form | None:
        kind = "protected" if protected else "truncated"
        key = (seq, kind, chars)
        if key in forms:
            return None
        entries = history.entries
        public = entries.public[seq]
        assert public is not None
        form = truncated_form(public, entries.tokens[seq], chars, protected=protected)
        if form is None:
            forms.add(key)
        return form

    @staticmethod
    def _stubbed(history: History, forms: _Forms, seq: int) -> Form | None:
        key = (seq, "stubbed", 0)
        if key in forms:
            return None
        entries = history.entries
        public = entries.public[seq]
        assert public is not None
        form = stubbed_form(public, entries.tokens[seq])
        if form is None:
            forms.add(key)
        return form

    def compacting(
        self,
        history: History,
        plan: RequestPlan,
        before: Rendered,
        *,
        notice_next: int | None = None,
    ) -> Steps[tuple[Decisions | None, FloorMark | None]]:
        """Run the ladder for an ordinary/retaining request (the caller has checked that no
        reported floor holds: ``floor_holds``).

        Returns the staged decisions (None when the run changed nothing and has nothing
        new to report) and the floor mark to remember (None when the view fits).

        No storms, and compactions worth the cache they break. When the protected floor
        alone is above the target, the first run reports it (one ``context:compaction``
        carrying ``floor_tokens``, one warning) and that decision is reused: the ladder runs
        again only once the view no longer fits the budget (``floor_holds``). Re-running it
        sooner, as the view creeps past the trigger, could only shave what the history
        added since (the floor is still there) while rewriting the whole cached view after
        its first change, request after request. When the floor is over the whole budget,
        it is reduced to the target, not merely under the budget: a floor left just under
        the budget would be reduced again, with another rewrite, on the next request.
        Hard-fit requests always run, and reduce only as far as the budget.
        """
        target = plan.limits.target
        ladder = yield from self.laddering(
            history,
            plan,
            plan.decisions,
            target=target,
            extra_protected=frozenset(),
            notice_next=notice_next,
        )
        yield from ladder.climbing()
        over = not ladder.fits
        # the committed notice stays in the view while its decision does: room for it
        notice = plan.decisions.notice
        shown_notice = 0 if notice is None else notice[1]
        ceiling = plan.limits.ceiling
        if ladder.total + shown_notice > ceiling:
            # The floor is over the whole budget (less the margin for our estimate's error),
            # not merely the target: reduce it, leaving room for the minimal notice (the
            # model should know its context was cut), and (but for hard fit) as far as the
            # target (see the docstring).
            limit = ceiling - self.notice_allowance(plan.budget)
            if not plan.hard_fit:
                limit = min(limit, target)
            yield from self.reducing_floor(ladder, limit)
        if plan.hard_fit and ladder.total > plan.limits.estimated_budget:
            raise RequiredContentTooLargeError(
                f"Hard-fit compaction cannot reach the budget: {ladder.total:,} estimated "
                f"tokens remain above {plan.limits.over_text()} with only the system "
                "messages, the "
                "first and latest request and retained reminders left intact. "
                "Required content was not discarded.",
                budget=plan.budget,
                required=ladder.total,
                rung=FLOOR_RUNG if ladder.floor_truncated or ladder.floor_removed else ladder.level,
                reason="hard_fit_over_budget",
            )
        mark = (
            FloorMark(
                plan.epoch,
                plan.limits.policy_budget,
                plan.limits.nominal_target,
                ladder.total,
                plan.length,
            )
            if over
            else None
        )
        reported = plan.decisions.floor_reported
        if ladder.changes == 0 and (not over or reported):
            return None, mark
        ladder.replacing_notice()
        staged = yield from plan.decisions.merging(ladder)
        stats = yield from self.stating(history, plan, before, ladder, staged, target)
        if over:
            self._warn_floor(stats, first=not reported)
        return dataclasses.replace(staged, stats=stats, floor_reported=over), mark

    def notice_allowance(self, budget: int) -> int:
        """Room the floor reduction leaves for the minimal notice (0 when notices are off)."""
        config = self._config()
        if not config.compaction_notice_enabled:
            return 0
        if self._minimal_notice is None:
            self._minimal_notice = estimate_message(notice_message({}, "minimal"))
        return min(self._minimal_notice, budget // 4)

    def reducing_floor(self, ladder: Ladder, limit: int) -> Steps[None]:
        """Run ``Ladder.reducing_floor`` and say once what it had to do, as steps."""
        yield from ladder.reducing_floor(limit)
        if ladder.floor_truncated or ladder.floor_removed:
            logger.warning(
                "context-simple: the protected floor was over the whole budget (%s tokens): "
                "%d protected tool results were truncated in the view and %d more messages "
                "were removed or shortened (the stored history is unchanged; %s)",
                f"{limit:,}",
                len(ladder.floor_truncated),
                ladder.floor_removed,
                RETRIEVAL_GUIDANCE,
            )

    def floor_holds(self, floor: FloorMark | None, plan: RequestPlan, before: Rendered) -> bool:
        """Whether the reported ``floor`` still stands for this request, so the ladder is
        skipped (see ``compacting``). Never for hard fit, which always runs.

        It stands for the same history and budget (a climb from a climb's result could
        otherwise shrink the recent window again) while the view, with room for the minimal
        notice, still fits the budget: only then must it shrink, and a compaction then
        frees what the history added since the floor was reported.
        """
        if floor is None or plan.hard_fit:
            return False
        limits = plan.limits
        if (floor.epoch, floor.policy_budget, floor.target) != (
            plan.epoch,
            limits.policy_budget,
            limits.nominal_target,
        ):
            return False
        if floor.length == plan.length:
            return True
        # room for the notice the view shows (made with the decision), or the minimal one
        notice = plan.decisions.notice
        allowance = self.notice_allowance(plan.budget) if notice is None else notice[1]
        return before.tokens <= limits.ceiling - allowance

    def stating(
        self,
        history: History,
        plan: RequestPlan,
        before: Rendered,
        ladder: Ladder,
        staged: Decisions,
        target: int,
    ) -> Steps[CompactionStats]:
        """The stats of ``staged`` (counts are cumulative over the decisions), as steps."""
        omitted = yield from omitting_calls(history, staged)
        yield
        system_count = before.system_count
        config = self._config()
        previous = plan.decisions.stats
        return CompactionStats(
            before_tokens=before.tokens,
            after_tokens=ladder.total,
            before_messages=len(before.messages),
            after_messages=system_count + ladder.count,
            messages_removed=len(staged.removed),
            messages_truncated=len(staged.truncated),
            user_messages_stubbed=len(staged.stubbed),
            system_messages_preserved=system_count,
            strategy_level=staged.level,
            budget=plan.limits.policy_budget,
            target_tokens=target,
            protected_recent=config.protected_recent,
            protected_tool_results=config.protected_tool_results,
            floor_tokens=ladder.total if ladder.total > target else None,
            changes=ladder.changes,
            results_synthesized=ladder.synthesized,
            protected_results_truncated=len(ladder.floor_truncated)
            + (previous.protected_results_truncated if previous is not None else 0),
            thinking_blocks_omitted=sum(staged.thoughtless.values()),
            thinking_messages_omitted=len(staged.thoughtless),
            thinking_omitted_reason="prefix_changed" if staged.thoughtless else None,
            preserved_thinking=plan.thinking.preserved,
            thinking_rule_source=plan.thinking.source,
            omitted_tool_calls=omitted,
        )

    def _warn_floor(self, stats: CompactionStats, *, first: bool) -> None:
        """Warn once per floor episode; later floor runs of the episode log at INFO."""
        (logger.warning if first else logger.info)(
            "context-simple: compaction finished above its target at level %d: %s tokens "
            "remain for a target of %s (budget %s). The protected floor (system prompt, "
            "first and latest request, retained reminders, recent tool results) is larger "
            "than the target; this decision is kept until the history changes.",
            stats.strategy_level,
            f"{stats.after_tokens:,}",
            f"{stats.target_tokens:,}",
            f"{stats.budget:,}",
        )
