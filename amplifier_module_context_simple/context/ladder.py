"""The eight-level compaction ladder, over an immutable snapshot of the working view.

The same eight rungs serve both paths:

====  ==========================================================================
rung  what it does
====  ==========================================================================
1     truncate the oldest quarter of tool results
2     truncate the second quarter
3     removal pass protecting the most recent ``protected_recent`` of messages
4     truncate the third quarter (positions recomputed on the shrunk view)
5     removal pass protecting ``protected_recent * 0.6``
6     truncate every unprotected tool result
7     removal pass protecting ``protected_recent * 0.3``
8     stub machine-written user envelopes, then drop old stubs
====  ==========================================================================

Every rung works oldest first and stops as soon as the view fits ``target``. The ordinary
path climbs rung by rung to its target. The negotiated path applies one rung at a time
with a target in our estimate's units (the provider's target over the calibrated count /
estimate ratio) and, when the provider's count of the result is still above it, lowers
the target and applies the same rung again: the rung continues from where it stopped.
What a rung may touch is frozen when it is first applied (its result quarter, its
protected window as seqs, rung 8's boundary), so a rung applied in pieces touches exactly
a prefix, oldest first, of what it touches applied whole. A target of -1 lets a rung
exhaust its legal work (the existing module's rule, kept for comparison).

What never changes: system messages (they are not in the working list), request-protected
messages (first and latest human prompt, retained envelopes, and whatever else the caller
protects), loaded-tool state (never removed), the last ``protected_tool_results`` results
and, through them, their whole tool groups. A removal pass removes a tool group as one
unit and only when every call in it has a result; user turns are never removed by a pass,
only stubbed (rung 8 may drop a stub). Every decision is recorded by sequence id so the
store can reapply it to later views.

Nothing here awaits or touches the store: ``Ladder`` works on its own copy and reports
what it decided. Every rung is a generator of steps (``slices.py``) that pauses every
``STRIDE`` items, so a paced request can yield to the event loop inside a rung;
``climb`` and ``apply`` run them through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .classify import MessageInfo
from .slices import HEAVY_STRIDE, STRIDE, Steps, run_through

__all__ = (
    "RUNG_COUNT",
    "Form",
    "FormName",
    "Item",
    "Ladder",
    "LadderParams",
)


Form = tuple[dict[str, Any], int]
"""A reduced message and its token estimate."""
FormName = Literal["full", "truncated", "stubbed"]
"""How an item is shown: as admitted, or in one of the reduced forms."""

RUNG_COUNT: Final = 8

_CHUNK: Final = 8 * STRIDE
"""Items a cheap whole-list pass (a filter, an index) handles between two pause points."""

_DROPPED: Final[dict[str, Any]] = {}
"""The message of a removed item: nothing shows it, and a scope that still lists it must
not keep its reduced form alive (``Ladder._drop``)."""


@dataclass(slots=True)
class Item:
    """One message of the working view, in its current form."""

    seq: int
    info: MessageInfo
    """What kind of message it is (its tool ids may be left out: see ``has_calls``)."""
    message: dict[str, Any]
    tokens: int
    group: int
    form: FormName = "full"
    synthesized: int = 0
    """Synthesized results shown with this call message (counted in ``tokens``)."""
    reduced: Form | None = None
    """The ``(message, tokens)`` pair of the reduced form shown (shared with the
    decisions, so that merging allocates nothing per message)."""
    has_calls: bool = False
    """The message declares tool calls (the ladder needs no more of its ids)."""
    has_results: bool = False
    """The message answers tool calls."""


@dataclass(slots=True)
class _Scope:
    """What one rung may touch, frozen when the rung is first applied, and how far it got.

    A rung is one or two phases; each phase is prepared once (``items``, the candidates it
    walks oldest first, and what it protects) and run from ``cursor``.
    """

    phase: int = 0
    prepared: bool = False
    cursor: int = 0
    items: list[Item] = field(default_factory=list)
    keep: frozenset[int] = frozenset()
    """Seqs the phase protects (a removal pass's window, rung 8's human bounds)."""
    groups: dict[int, list[Item]] = field(default_factory=dict)
    last_user: int | None = None
    """Rung 8: the seq of the last user turn (never stubbed)."""
    boundary: int = 0
    """Rung 8: how many of the oldest items its second half may drop stubs from."""

    def next_phase(self) -> None:
        """Move on to the next phase, releasing the finished one's items and groups (its
        items keep their reduced forms alive: several megabytes of text at 16k messages).
        ``keep`` stays: rung 8's second phase reads the bounds its first phase froze."""
        self.phase += 1
        self.prepared = False
        self.cursor = 0
        self.items = []
        self.groups = {}


_Phase = tuple[Callable[[_Scope], Steps[None]], Callable[[_Scope], Steps[bool]]]
"""A rung's phase: prepare its scope (once), then run it (True: it went through it all)."""


@dataclass(frozen=True, slots=True)
class LadderParams:
    protected_recent: float
    protected_tool_results: int


@dataclass(slots=True)
class Ladder:
    """Mutable working state of one compaction run (local to the run).

    Args:
        items: the working view without system messages, sticky decisions applied.
        total: tokens of the whole view including system messages.
        target: stop when ``total <= target``; a negative target exhausts every rung.
        protected: seqs that must stay complete (request-protected, developer, ...).
        incomplete_groups: group ids with an unanswered call (never removable).
        truncate: ``(item) -> Form | None``, the truncated form if it shrinks the item.
        stub: ``(item) -> Form | None``, the stubbed form if it shrinks the item.
    """

    items: list[Item]
    total: int
    target: int
    protected: frozenset[int]
    incomplete_groups: frozenset[int]
    params: LadderParams
    truncate: Callable[[Item], Form | None]
    stub: Callable[[Item], Form | None]
    level: int = 0
    removed: set[int] = field(default_factory=set)
    truncated: set[int] = field(default_factory=set)
    stubbed: set[int] = field(default_factory=set)
    truncate_protected: Callable[[Item], Form | None] | None = None
    """``(item) -> Form | None``: the marked truncated form of a protected tool result,
    used only by ``reducing_floor``."""
    floor_truncated: set[int] = field(default_factory=set)
    """Protected tool results ``reducing_floor`` truncated."""
    floor_removed: int = 0
    """Messages ``reducing_floor`` removed or stubbed."""
    edits: int = 0
    """Reductions made so far (a removal that supersedes a reduced form counts too)."""
    _scopes: dict[int, _Scope] = field(default_factory=dict)
    """Each applied rung's frozen scope and progress."""

    @property
    def fits(self) -> bool:
        return self.total <= self.target

    @property
    def changes(self) -> int:
        return len(self.removed) + len(self.truncated) + len(self.stubbed)

    # -- drivers ---------------------------------------------------------------

    def climb(self, start: int = 1) -> None:
        """Ordinary path: apply rungs ``start..8`` in order until the view fits."""
        run_through(self.climbing(start))

    def climbing(self, start: int = 1) -> Steps[None]:
        """``climb`` as steps."""
        for rung in range(start, RUNG_COUNT + 1):
            if self.fits:
                return
            yield from self.applying(rung)
            yield

    def apply(self, rung: int) -> bool:
        """Apply one rung (or continue it); return whether it changed anything."""
        return run_through(self.applying(rung))

    def applying(self, rung: int) -> Steps[bool]:
        """``apply`` as steps.

        A rung works oldest first and stops as soon as the view fits ``target``. What it
        may touch is frozen when it is first applied (``_Scope``); applying it again
        continues from where it stopped, within that scope, so a rung applied in pieces
        (the target lowered between them) touches exactly a prefix of what it touches
        applied whole. A rung that went through its whole scope is ``exhausted`` and
        applying it again changes nothing.
        """
        if rung not in range(1, RUNG_COUNT + 1):
            raise ValueError(f"unknown compaction rung {rung!r}; rungs are 1..{RUNG_COUNT}")
        before = self.edits
        self.level = max(self.level, rung)
        scope = self._scopes.setdefault(rung, _Scope())
        phases = self._phases(rung)
        while scope.phase < len(phases):
            prepare, run = phases[scope.phase]
            if not scope.prepared:
                yield from prepare(scope)
                scope.prepared = True
            if not (yield from run(scope)):
                break  # stopped at the target; the scope stays for a continuation
            scope.next_phase()
        return self.edits != before

    def exhausted(self, rung: int) -> bool:
        """Whether ``rung`` went through everything it may touch (so applying it again
        changes nothing)."""
        scope = self._scopes.get(rung)
        return scope is not None and scope.phase >= len(self._phases(rung))

    def _phases(self, rung: int) -> tuple[_Phase, ...]:
        """The phases of ``rung``: each a ``(prepare, run)`` pair (module docstring)."""
        fraction = self.params.protected_recent
        waves = {1: (0.0, 0.25), 2: (0.25, 0.50), 4: (0.50, 0.75), 6: (0.0, 1.0)}
        if rung in waves:
            lo, hi = waves[rung]
            return ((lambda scope: self._wave_scope(scope, lo, hi), self._truncate_wave),)
        if rung != RUNG_COUNT:
            recent = fraction * {3: 1.0, 5: 0.6, 7: 0.3}[rung]
            return (
                (lambda scope: self._removal_scope(scope, recent), self._removal_pass),
                (lambda scope: self._stub_scope(scope, recent), self._stub_pass),
            )
        return (
            (self._envelope_scope, self._stub_envelopes),
            (self._old_stub_scope, self._drop_old_stubs),
        )

    def reducing_floor(self, limit: int) -> Steps[None]:
        """Past the eight rungs, when the view is over the whole ``limit``: reduce the floor.

        The protected floor is there to keep recent work intact, not to strand a session:
        tool output can be fetched again (the truncation note says how), instructions
        cannot. In this order, each step only while the view is over ``limit``:

        1. truncate tool results, largest first, the protected ones included;
        2. remove tool groups and assistant turns, oldest first (a group whole, never one
           with a call still pending);
        3. stub user turns oldest first, then drop those stubs and the user turns that have
           no smaller stub.

        Request-protected messages (system messages, which are not items, the first and
        latest human prompts, retained reminders, and whatever the caller protects),
        loaded-tool state and groups with a pending call are never touched. ``fits`` is
        judged against ``limit`` from here on.
        """
        self.target = limit
        if self.total <= limit:
            return
        self.level = RUNG_COUNT
        # Messages removed or stubbed here (a truncated result that is truncated again, or
        # removed with its group, must not count against them).
        before = len(self.removed) + len(self.stubbed)
        yield from self._truncate_largest_results()
        groups = yield from self._groups()
        yield from self._remove_oldest(groups)
        for index, item in enumerate(self.items):
            if index % HEAVY_STRIDE == HEAVY_STRIDE - 1:
                yield
            if self.fits:
                break
            if self._is_user_turn(item) and item.seq not in self.protected and item.form == "full":
                self._stub(item)
        doomed: set[int] = set()
        groups = yield from self._groups()
        for index, item in enumerate(self.items):
            if index % STRIDE == STRIDE - 1:
                yield
            if self.fits:
                break
            if item.seq in doomed or not self._is_user_turn(item) or self._untouchable(item):
                continue
            members = groups.get(item.group, [item]) if item.has_results else [item]
            if item.has_results and item.group in self.incomplete_groups:
                continue
            if any(self._untouchable(m) for m in members if m is not item):
                continue
            self._drop(members, doomed)
        yield from self._compact(doomed)
        self.floor_removed = len(self.removed) + len(self.stubbed) - before

    def _untouchable(self, item: Item) -> bool:
        """What ``reducing_floor`` never removes."""
        return item.seq in self.protected or item.info.has_loaded_tool_state

    def _truncate_largest_results(self) -> Steps[None]:
        reduce = self.truncate_protected
        if reduce is None:
            return
        results = [
            item
            for item in self.items
            if item.info.is_result_carrier and item.seq not in self.protected
        ]
        yield
        results.sort(key=lambda item: item.tokens, reverse=True)
        for index, item in enumerate(results):
            if index % HEAVY_STRIDE == HEAVY_STRIDE - 1:
                yield
            if self.fits:
                return
            form = reduce(item)
            if form is not None and form[1] < item.tokens:
                self._replace(item, form, "truncated")
                self.truncated.add(item.seq)
                self.floor_truncated.add(item.seq)

    def _remove_oldest(self, groups: dict[int, list[Item]]) -> Steps[None]:
        doomed: set[int] = set()
        for index, item in enumerate(self.items):
            if index % STRIDE == STRIDE - 1:
                yield
            if self.fits:
                break
            if item.seq in doomed or self._untouchable(item) or self._is_user_turn(item):
                continue
            if item.has_calls or item.has_results:
                members = groups.get(item.group, [item])
                if item.group in self.incomplete_groups or any(
                    self._untouchable(m) for m in members
                ):
                    continue
                self._drop(members, doomed)
            elif item.info.role == "assistant":
                self._drop([item], doomed)
        yield from self._compact(doomed)

    # -- protection ------------------------------------------------------------

    def _result_positions(self) -> Steps[list[int]]:
        positions: list[int] = []
        for start in range(0, len(self.items), _CHUNK):
            positions.extend(
                i
                for i, item in enumerate(self.items[start : start + _CHUNK], start)
                if item.info.is_result_carrier
            )
            yield
        return positions

    def _protected_results(self, positions: list[int]) -> set[int]:
        keep = self.params.protected_tool_results
        return set(positions[-keep:]) if keep > 0 else set()

    def _human_bounds(self) -> set[int]:
        items = self.items
        first = next((i for i, item in enumerate(items) if item.info.is_human), None)
        if first is None:
            return set()
        last = next(i for i in range(len(items) - 1, -1, -1) if items[i].info.is_human)
        return {first, last}

    def _protected_positions(self, fraction: float) -> Steps[set[int]]:
        items = self.items
        recent_start = int(len(items) * (1 - fraction))
        protected = set(range(recent_start, len(items)))
        protected |= self._human_bounds()
        positions = yield from self._result_positions()
        protected |= self._protected_results(positions)
        marked = self.protected
        for start in range(0, len(items), _CHUNK):
            protected.update(
                i
                for i, item in enumerate(items[start : start + _CHUNK], start)
                if item.seq in marked or item.info.has_loaded_tool_state
            )
            yield
        return protected

    # -- operations ------------------------------------------------------------

    def _replace(self, item: Item, form: tuple[dict[str, Any], int], kind: FormName) -> None:
        message, tokens = form
        self.edits += 1
        self.total += tokens - item.tokens
        item.message, item.tokens, item.form, item.reduced = message, tokens, kind, form

    # -- the rungs' phases: a scope frozen at the first application, then a run ------

    def _wave_scope(self, scope: _Scope, lo: float, hi: float) -> Steps[None]:
        """A truncation wave may touch the unprotected results of its quarter(s) of the
        result positions, as they are when the rung is first applied."""
        positions = yield from self._result_positions()
        n = len(positions)
        protected_results = self._protected_results(positions)
        items = self.items
        scope.items = [
            items[index]
            for index in positions[int(n * lo) : int(n * hi)]
            if index not in protected_results and items[index].seq not in self.protected
        ]

    def _walk(self, scope: _Scope, act: Callable[[Item], None]) -> Steps[bool]:
        """``act`` on the scope's items from its cursor on, oldest first, until the view
        fits (the cursor is kept for a continuation: False) or the scope is through
        (True); pausing every ``HEAVY_STRIDE`` items."""
        for index in range(scope.cursor, len(scope.items)):
            if index % HEAVY_STRIDE == HEAVY_STRIDE - 1:
                yield
            if self.fits:
                scope.cursor = index
                return False
            act(scope.items[index])
        return True

    def _truncate_wave(self, scope: _Scope) -> Steps[bool]:
        def truncate(item: Item) -> None:
            if item.form != "full":
                return
            form = self.truncate(item)
            if form is not None:
                self._replace(item, form, "truncated")
                self.truncated.add(item.seq)

        return self._walk(scope, truncate)

    def _groups(self) -> Steps[dict[int, list[Item]]]:
        """The items of each tool group, by group id, in view order."""
        groups: dict[int, list[Item]] = {}
        for index, item in enumerate(self.items):
            if index % _CHUNK == _CHUNK - 1:
                yield
            if item.has_calls or item.has_results:
                groups.setdefault(item.group, []).append(item)
        return groups

    def _keep_seqs(self, fraction: float) -> Steps[frozenset[int]]:
        """The seqs of the items ``_protected_positions(fraction)`` protects now."""
        positions = yield from self._protected_positions(fraction)
        items = self.items
        return frozenset(items[index].seq for index in positions)

    def _removal_scope(self, scope: _Scope, fraction: float) -> Steps[None]:
        """A removal pass may remove what lies outside the recent window and the other
        protections as they are when the rung is first applied (kept as seqs, so a
        continuation after some removals does not move the window)."""
        scope.keep = yield from self._keep_seqs(fraction)
        scope.groups = yield from self._groups()
        scope.items = list(self.items)

    def _removal_pass(self, scope: _Scope) -> Steps[bool]:
        keep, groups, removed = scope.keep, scope.groups, self.removed
        doomed: set[int] = set()
        done = True
        for index in range(scope.cursor, len(scope.items)):
            if index % STRIDE == STRIDE - 1:
                yield
            if self.fits:
                scope.cursor, done = index, False
                break
            item = scope.items[index]
            if item.seq in keep or item.seq in removed or self._is_user_turn(item):
                continue  # user turns are stubbed, never removed by a pass
            if item.has_calls or item.has_results:
                members = groups.get(item.group, [item])
                if (
                    item.group in self.incomplete_groups
                    or any(m.seq in keep for m in members)
                    or any(self._is_user_turn(m) for m in members)
                ):
                    continue  # a group holding a user's own words stays whole, in place
                self._drop(members, doomed)
            else:
                self._drop([item], doomed)
        yield from self._compact(doomed)
        return done

    def _stub_scope(self, scope: _Scope, fraction: float) -> Steps[None]:
        """A removal pass's stubs: the user turns outside the same window, recomputed on
        the view its removals left (as when the pass runs whole)."""
        scope.keep = yield from self._keep_seqs(fraction)
        scope.items = list(self.items)

    def _stub_pass(self, scope: _Scope) -> Steps[bool]:
        def stub(item: Item) -> None:
            if item.seq not in scope.keep and item.form == "full" and self._is_user_turn(item):
                self._stub(item)

        return self._walk(scope, stub)

    @staticmethod
    def _is_user_turn(item: Item) -> bool:
        """A user message that is more than tool results (never removed by a pass)."""
        return item.info.role == "user" and not item.info.is_result_carrier

    def _drop(self, items: Iterable[Item], doomed: set[int]) -> None:
        """Remove ``items`` (their seqs join ``doomed``, for ``_compact``)."""
        for item in items:
            doomed.add(item.seq)
            self.edits += 1
            self.total -= item.tokens
            item.message, item.reduced = _DROPPED, None
            self.removed.add(item.seq)
            # removal supersedes an earlier reduced form of the same message
            self.truncated.discard(item.seq)
            self.stubbed.discard(item.seq)
            self.floor_truncated.discard(item.seq)

    def _compact(self, doomed: set[int]) -> Steps[None]:
        """Take the items whose seqs are in ``doomed`` out of the working list."""
        if not doomed:
            return
        items = self.items
        kept: list[Item] = []
        for start in range(0, len(items), _CHUNK):
            kept.extend(item for item in items[start : start + _CHUNK] if item.seq not in doomed)
            yield
        self.items = kept

    def _stub(self, item: Item) -> None:
        form = self.stub(item)
        if form is not None:
            self._replace(item, form, "stubbed")
            self.stubbed.add(item.seq)

    def _last_user_position(self) -> int | None:
        for index in range(len(self.items) - 1, -1, -1):
            info = self.items[index].info
            if info.role == "user" and not info.is_result_carrier:
                return index
        return None

    def _envelope_scope(self, scope: _Scope) -> Steps[None]:
        """Rung 8 may stub the machine-written user turns before the last user turn, and
        then drop stubs before the narrowest recent window; both as the view is when the
        rung is first applied (stubbing leaves the list's length as it is)."""
        last_user = self._last_user_position()
        keep = self._human_bounds()
        if last_user is not None:
            keep.add(last_user)
        items = self.items
        scope.keep = frozenset(items[index].seq for index in keep)
        scope.last_user = None if last_user is None else items[last_user].seq
        scope.boundary = int(len(items) * (1 - self.params.protected_recent * 0.3))
        scope.items = list(items)
        yield

    def _stub_envelopes(self, scope: _Scope) -> Steps[bool]:
        """Rung 8, first half: stub machine-written user turns that nobody retains."""

        def stub(item: Item) -> None:
            info = item.info
            if not (
                info.role != "user"
                or info.is_human
                or info.is_result_carrier
                or item.seq == scope.last_user
                or item.seq in self.protected
                or item.form != "full"
            ):
                self._stub(item)

        return self._walk(scope, stub)

    def _old_stub_scope(self, scope: _Scope) -> Steps[None]:
        """Rung 8, second half: the items before the boundary frozen at its first
        application."""
        scope.items = self.items[: min(scope.boundary, len(self.items))]
        yield

    def _drop_old_stubs(self, scope: _Scope) -> Steps[bool]:
        """Rung 8, second half: drop stubs older than the narrowest recent window."""
        doomed: set[int] = set()
        done = True
        for index in range(scope.cursor, len(scope.items)):
            if index % STRIDE == STRIDE - 1:
                yield
            if self.fits:
                scope.cursor, done = index, False
                break
            item = scope.items[index]
            if (
                item.form == "stubbed"
                and item.seq not in scope.keep
                and item.seq not in self.protected
                and item.seq not in self.removed
            ):
                self._drop([item], doomed)
        yield from self._compact(doomed)
        return done
