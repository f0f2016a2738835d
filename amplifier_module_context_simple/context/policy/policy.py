"""``RequestPolicy``: how a planned request's view is built, and when it compacts.

The building blocks every request path shares, ordinary and negotiated: rendering a plan
under a set of decisions, the compaction trigger, the ladder over a working view, the
protected floor's reduction, the tail notice and the fit checks. Each rule lives here
once; the store (``store.py``) runs the ordinary path through ``planning`` and hands the
same policy to a negotiated request's seam (``negotiable.py``).

The policy changes nothing it is given: it reads a request's snapshot (its
``RequestPlan``) and returns views and *staged* decisions. Committing them is the store's
(ordinary path) or a transaction's (negotiated path). Its one memory between requests is
the ``Compactor``'s (reduced forms, the floor mark), which the store resets with the
history.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import RequiredContentTooLargeError
from ..config import TOKEN_METER_ACTUAL, ContextConfig
from ..counting.estimate import estimate_message
from ..counting.meter import TokenMeter
from ..ladder.decisions import Decisions
from ..ladder.ladder import Ladder
from ..rendering.notice import notice_message, notice_position
from ..rendering.render import Rendered, Renderer
from ..rendering.thinking import with_range
from ..slices import LIGHT_CHUNK, Steps, chunking
from .compaction import Compactor, FloorMark, omitting_calls
from .plan import RequestPlan

__all__ = ("Planned", "RequestPolicy", "check_retain")


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """What an ordinary request decided, ready for its commit boundary."""

    staged: Decisions | None
    floor: FloorMark | None
    messages: list[dict[str, Any]]
    estimated: int
    synthesized: int
    new_stats: bool
    floor_held: bool
    """The trigger was reached but a reported floor still holds (no ladder ran)."""
    plan: RequestPlan
    """The request's plan as it returned (its thinking floor and system part)."""
    view_tokens: int = 0
    """Our estimate of the view returned, its notice included: what the provider's next
    usage report is compared with (``counting/correction.py``)."""


class RequestPolicy:
    """The request policy over one store's renderer, compactor and meter.

    ``config`` is read on every use (the store may be reconfigured between requests).
    """

    def __init__(
        self,
        config: Callable[[], ContextConfig],
        *,
        renderer: Renderer,
        compactor: Compactor,
        meter: TokenMeter,
    ) -> None:
        self._config = config
        self._renderer = renderer
        self._meter = meter
        self.compactor = compactor
        """Runs the ladder and remembers reduced forms and the floor mark."""

    @property
    def config(self) -> ContextConfig:
        """The store's configuration now."""
        return self._config()

    # -- the view ---------------------------------------------------------------------

    def rendering(
        self, plan: RequestPlan, decisions: Decisions, *, copy: bool = True
    ) -> Steps[Rendered]:
        """The view for ``plan`` under ``decisions`` (copies; system messages first), as steps
        (``copy=False``: a shared view, see ``Rendered.shared``). Its estimate leaves out
        the thinking the provider does not count (``RequestPlan.uncounted_thinking``)."""
        view = yield from self._renderer.rendering(
            plan.history,
            plan.length,
            epoch=plan.epoch,
            decisions=decisions,
            protected=plan.protected,
            factory_text=plan.factory_text,
            copy=copy,
            unthought=plan.unthought,
        )
        uncounted = plan.uncounted_thinking
        if not uncounted:
            return view
        removed = decisions.removed
        left_out = sum(tokens for seq, tokens in uncounted.items() if seq not in removed)
        return dataclasses.replace(view, tokens=view.tokens - left_out)

    def noticing(
        self, plan: RequestPlan, decisions: Decisions, *, before: int, after: int, room: int
    ) -> Steps[Decisions]:
        """``decisions`` (new, staged) with the notice every view built on them shows, as
        steps: the configured verbosity when it fits ``room`` and the notice reserve, else
        the minimal notice, else none. ``before`` and ``after`` are the message counts of
        the view before and after the compaction (the verbose notice says them).

        The notice is made once, here: its text and place stay until the next decision
        (``notice.py``), so every later view extends the one it was first shown in.
        """
        config = self._config()
        if (
            not config.compaction_notice_enabled
            or decisions.level < config.compaction_notice_min_level
        ):
            return dataclasses.replace(decisions, notice=None, notice_at=plan.length)
        omitted = yield from omitting_calls(plan.history, decisions)
        facts = {
            "strategy_level": decisions.level,
            "messages_removed": len(decisions.removed),
            "messages_truncated": len(decisions.truncated),
            "user_messages_stubbed": len(decisions.stubbed),
            "protected_tool_results": config.protected_tool_results,
            "before_messages": before,
            "after_messages": after,
            "omitted_tool_calls": omitted,
        }
        # its room is reserved: a view growing towards the trigger still has it
        room = min(room, plan.limits.notice_reserve)
        notice: tuple[dict[str, Any], int] | None = None
        for verbosity in dict.fromkeys((config.compaction_notice_verbosity, "minimal")):
            notice = _fitting_notice(facts, verbosity, room, config.compaction_notice_token_reserve)
            if notice is not None:
                break
        return dataclasses.replace(decisions, notice=notice, notice_at=plan.length)

    def with_notice(
        self, rendered: Rendered, decisions: Decisions, *, room: int | None
    ) -> tuple[list[dict[str, Any]], int]:
        """The messages of ``rendered`` (its own list, changed) with the notice of
        ``decisions`` at its place (``notice_position``) when it fits ``room`` tokens (None:
        always). Returns the messages and the notice's estimate (0 without one)."""
        messages = rendered.messages
        index = self.notice_index(rendered, decisions)
        if index is None or decisions.notice is None:
            return messages, 0
        notice, tokens = decisions.notice
        if room is not None and tokens > room:
            return messages, 0
        messages.insert(index, {**notice, "metadata": dict(notice["metadata"])})
        return messages, tokens

    @staticmethod
    def notice_index(rendered: Rendered, decisions: Decisions) -> int | None:
        """Where in ``rendered.messages`` the notice of ``decisions`` goes, if it has one
        and its place is in the view."""
        if decisions.notice is None:
            return None
        return notice_position(
            rendered.messages, rendered.body_seqs, rendered.system_count, decisions.notice_at
        )

    def finding_notice_next(self, plan: RequestPlan) -> Steps[int | None]:
        """``notice_next_in`` the request's view under its committed decisions, rendered
        (as steps) only when they have a notice."""
        if plan.decisions.notice is None:
            return None
        rendered = yield from self.rendering(plan, plan.decisions, copy=False)
        return self.notice_next_in(rendered, plan.decisions)

    def notice_next_in(self, rendered: Rendered, decisions: Decisions) -> int | None:
        """The seq of the message right after the notice of ``decisions`` in ``rendered``
        (None: no notice, or at the tail): where a new decision changes the view at the
        latest (the notice goes)."""
        index = self.notice_index(rendered, decisions)
        if index is None or index >= len(rendered.messages):
            return None
        return rendered.body_seqs[index - rendered.system_count]

    def notice_ceiling(self, plan: RequestPlan, rendered: Rendered) -> int:
        """The most a view with its notice may weigh: the budget, and never more than the
        view of the same history with no compaction at all."""
        uncompacted = rendered.system_tokens + plan.history.uncompacted_body_tokens(plan.length)
        return min(plan.limits.estimated_budget, uncompacted)

    def based(self, plan: RequestPlan, rendered: Rendered) -> RequestPlan:
        """``plan`` once its view under the committed decisions is rendered: with what the
        view's base shows (its system part, and the protected messages it shows as
        admitted although a decision reduced them) and, when that differs from the last
        returned view's and the model checks the prefix of thinking, the messages after
        the difference unthought: every earlier thinking block when the system part
        changed, else those after the first message shown otherwise than before."""
        intact = rendered.intact
        shown = (rendered.system_key, intact)
        plan = dataclasses.replace(plan, shown_systems=shown)
        sent = plan.sent_systems
        if not plan.preserved_thinking or sent is None or sent == shown:
            return plan
        if sent[0] != shown[0]:
            first = 0
        else:
            before = sent[1]
            assert isinstance(before, frozenset)
            first = min(before ^ intact)
        unthought = with_range(plan.unthought, first, plan.length)
        return (
            plan if unthought == plan.unthought else dataclasses.replace(plan, unthought=unthought)
        )

    # -- the trigger --------------------------------------------------------------------

    def measured_tokens(self) -> int | None:
        """The figure the trigger compares instead of our estimate: the meter's reading in
        actual mode, if any."""
        if self._config().token_meter == TOKEN_METER_ACTUAL:
            return self._meter.measured
        return None

    def compaction_due(self, plan: RequestPlan, estimated: int) -> bool:
        """Whether a request whose view we estimate at ``estimated`` tokens compacts: the
        trigger (``Limits.reached``: ``compact_threshold`` of the policy budget, on the
        meter's reading in actual mode, else on the estimate read through the count
        scale); after an idle gap that outlived the provider's cache, the lower idle
        trigger (``Limits.reached_idle``: the request writes its whole view anyway, so a
        compaction due soon costs nothing extra now); and always when a retaining or
        hard-fit view is over the policy budget."""
        limits = plan.limits
        measured = self.measured_tokens()
        used = estimated if measured is None else measured
        on_reading = measured is not None
        if limits.reached(used, measured=on_reading):
            return True
        if limits.reached_idle(used, measured=on_reading):
            return True
        over = estimated > limits.correction.estimated(limits.policy_budget)
        return (plan.retained or plan.hard_fit) and over

    # -- the ladder ---------------------------------------------------------------------

    def laddering(
        self,
        plan: RequestPlan,
        decisions: Decisions,
        *,
        target: int,
        extra_protected: frozenset[int] = frozenset(),
    ) -> Steps[Ladder]:
        """A ``Ladder`` over the working view of ``plan`` under ``decisions``, as steps."""
        notice_next = yield from self.finding_notice_next(plan)
        return (
            yield from self.compactor.laddering(
                plan.history,
                plan,
                decisions,
                target=target,
                extra_protected=extra_protected,
                notice_next=notice_next,
            )
        )

    def reducing_floor(self, ladder: Ladder, limit: int) -> Steps[None]:
        """Reduce the protected floor of ``ladder`` to ``limit`` (see ``Ladder.reducing_floor``),
        leaving room for the minimal notice; as steps."""
        compactor = self.compactor
        return compactor.reducing_floor(ladder, limit - compactor.notice_allowance(limit))

    def finding_developers(self, plan: RequestPlan) -> Steps[frozenset[int]]:
        """Seqs of developer messages (protected on the negotiated path only), as steps."""
        entries = plan.history.entries
        developer = [kind.is_developer for kind in entries.kind_table]
        codes = entries.kind_codes
        seqs: set[int] = set()

        def find(chunk: Sequence[int], start: int) -> None:
            seqs.update(seq for seq in chunk if developer[codes[seq]])

        yield from chunking(range(plan.length), find, size=LIGHT_CHUNK)
        return frozenset(seqs)

    # -- fit checks -----------------------------------------------------------------------

    def check_required_floor(self, plan: RequestPlan, rendered: Rendered) -> None:
        """Fail closed before compaction when required content alone cannot fit."""
        if not (plan.retained or plan.hard_fit):
            return
        tokens = plan.history.entries.tokens
        required = rendered.system_tokens + sum(
            tokens[seq] for seq in plan.protected if seq < plan.length
        )
        if required > plan.limits.estimated_budget:
            raise RequiredContentTooLargeError(
                "Context cannot fit the current injections and protected conversation "
                f"({required:,} estimated tokens) within the budget "
                f"({plan.limits.over_text()}); "
                "shorten the active instructions or use a larger context window. "
                "Required content was not discarded.",
                budget=plan.budget,
                required=required,
            )

    def check_final_fit(self, plan: RequestPlan, total: int) -> None:
        """Fail closed when the final, notice-inclusive view exceeds the whole budget."""
        if total > plan.limits.estimated_budget:
            raise RequiredContentTooLargeError(
                "Context cannot fit the current injections and protected conversation "
                f"within the estimated input budget ({total:,} > "
                f"{plan.limits.over_text()}); shorten "
                "the active instructions or use a larger context window. "
                "Required content was not discarded.",
                budget=plan.budget,
                required=total,
                rung=plan.decisions.level,
                reason="final_over_budget",
            )

    # -- the ordinary path ------------------------------------------------------------------

    def planning(self, plan: RequestPlan, floor: FloorMark | None) -> Steps[Planned]:
        """The planning of an ordinary, retaining or hard-fit request, as steps: the view,
        the compaction it needs (staged, not committed) and the notice. Changes nothing.

        Raises:
            RequiredContentTooLargeError: required content cannot fit (retaining and
                hard-fit requests).
        """
        # read only (shared): the view returned is rendered, or copied, below
        rendered = yield from self.rendering(plan, plan.decisions, copy=False)
        based = self.based(plan, rendered)
        if based.unthought != plan.unthought:
            rendered = yield from self.rendering(based, based.decisions, copy=False)
        plan = based
        self.check_required_floor(plan, rendered)
        estimated = rendered.tokens
        staged: Decisions | None = None
        should = self.compaction_due(plan, estimated)
        held = should and self.compactor.floor_holds(floor, plan, rendered)
        if should and not held:
            # (``rendered`` is the view under the committed decisions: no second render)
            notice_next = self.notice_next_in(rendered, plan.decisions)
            staged, floor = yield from self.compactor.compacting(
                plan.history, plan, rendered, notice_next=notice_next
            )
        decisions = staged if staged is not None else plan.decisions
        if staged is not None:
            view = yield from self.rendering(plan, decisions)
        else:
            view = yield from self._renderer.copying(rendered)
        if (
            staged is not None
            and staged.stats is not None
            and staged.stats is not (plan.decisions.stats)
        ):
            # what the compaction kept of the cached prefix (its cost in a prompt cache)
            kept = yield from rendered.prefix_keeping(view.messages)
            stats = staged.stats.with_prefix(*kept)
            staged = decisions = dataclasses.replace(staged, stats=stats)
        # The notice is part of the view: it must fit the budget and may not make a
        # compacted view larger than the view the compaction started from.
        ceiling = self.notice_ceiling(plan, rendered)
        if staged is not None:
            # ... nor larger than the view it started from, with that view's own notice
            before_notice = 0
            if self.notice_index(rendered, plan.decisions) is not None:
                assert plan.decisions.notice is not None
                before_notice = plan.decisions.notice[1]
                if rendered.tokens + before_notice > ceiling:
                    before_notice = 0
            ceiling = min(ceiling, rendered.tokens + before_notice)
            staged = decisions = yield from self.noticing(
                plan,
                staged,
                before=len(rendered.messages),
                after=len(view.messages),
                room=ceiling - view.tokens,
            )
        messages, notice_tokens = self.with_notice(view, decisions, room=ceiling - view.tokens)
        if plan.retained or plan.hard_fit:
            self.check_final_fit(plan, view.tokens + notice_tokens)
        new_stats = staged is not None and staged.stats is not plan.decisions.stats
        return Planned(
            staged,
            floor,
            messages,
            estimated,
            view.synthesized,
            new_stats,
            held,
            plan,
            view.tokens + notice_tokens,
        )


def _fitting_notice(
    facts: dict[str, Any], verbosity: str, room: int, reserve: int
) -> tuple[dict[str, Any], int] | None:
    """The notice of ``verbosity`` within ``room`` tokens, and its estimate, or None. The
    verbose notice's list of omitted calls takes what room its other lines leave (at most
    the configured reserve, at ~3 characters a token), fewer calls until it fits."""
    facts_chars = 0
    if verbosity == "verbose":
        bare = estimate_message(notice_message(facts, verbosity, facts_chars=0))
        facts_chars = 3 * max(0, min(reserve, room - bare))
    while True:
        message = notice_message(facts, verbosity, facts_chars=facts_chars)
        tokens = estimate_message(message)
        if tokens <= room:
            return message, tokens
        if facts_chars == 0:
            return None
        facts_chars //= 2


def check_retain(retain_contents: Sequence[str]) -> tuple[str, ...]:
    """Validate ``retain_contents`` (a list of strings) and drop repeats, keeping order."""
    if isinstance(retain_contents, str) or not all(isinstance(b, str) for b in retain_contents):
        raise TypeError("retain_contents must be a list of strings")
    return tuple(dict.fromkeys(retain_contents))
