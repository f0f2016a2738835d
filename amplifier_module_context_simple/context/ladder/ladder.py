"""The compaction ladder, over an immutable snapshot of the working view.

The same rungs serve both paths. What each rung does is one table, ``rungs.RUNGS``
(docs/design.md section 4.1 shows it): this module dispatches on a rung's action and reads
its share from there.

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
``STRIDE`` items (``slices.walking``), so a paced request can yield to the event loop
inside a rung; a caller runs them paced or through (``slices.run_through``).

The working view and the mutations every reduction makes (replace, drop, stub, the
thinking cut) are ``WorkingView`` (``working.py``); a ``Ladder`` is one with the rungs and
the floor reduction on top.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from ..slices import HEAVY_STRIDE, STRIDE, Steps, walking
from .forms import Unthought
from .rows import (
    FULL,
    PROTECTED,
    RESULTS,
    STUBBED,
    TRUNCATED,
    Groups,
)
from .rungs import ENVELOPES, RUNG_COUNT, RUNGS, TRUNCATE
from .working import LadderParams, WorkingView

__all__ = (
    "RUNG_COUNT",
    "Ladder",
    "LadderParams",
    "Unthought",
)


@dataclass(slots=True)
class _Scope:
    """What one rung may touch, frozen when the rung is first applied, and how far it got.

    A rung is one or two phases; each phase is prepared once (``rows``, the candidates it
    walks oldest first, and what it protects) and run from ``cursor``.
    """

    phase: int = 0
    prepared: bool = False
    cursor: int = 0
    rows: array[int] = field(default_factory=lambda: array("q"))
    keep: frozenset[int] = frozenset()
    """Seqs the phase protects (a removal pass's window, rung 8's human bounds)."""
    groups: Groups | None = None
    last_user: int | None = None
    """Rung 8: the seq of the last user turn (never stubbed)."""
    boundary: int = 0
    """Rung 8: how many of the oldest items its second half may drop stubs from."""

    def next_phase(self) -> None:
        """Move on to the next phase, releasing the finished one's rows and groups.
        ``keep`` stays: rung 8's second phase reads the bounds its first phase froze."""
        self.phase += 1
        self.prepared = False
        self.cursor = 0
        self.rows = array("q")
        self.groups = None


_Phase = tuple[Callable[[_Scope], Steps[None]], Callable[[_Scope], Steps[bool]]]
"""A rung's phase: prepare its scope (once), then run it (True: it went through it all)."""


@dataclass(slots=True)
class Ladder(WorkingView):
    """One compaction run: the rungs and the floor reduction over its working view
    (``WorkingView``: the fields, listed there, and the mutations)."""

    _scopes: dict[int, _Scope] = field(default_factory=dict)
    """Each applied rung's frozen scope and progress."""

    # -- drivers ---------------------------------------------------------------

    def climbing(self, start: int = 1) -> Steps[None]:
        """Ordinary path: apply rungs ``start..8`` in order until the view fits, as steps."""
        for rung in range(start, RUNG_COUNT + 1):
            if self.fits:
                return
            yield from self.applying(rung)
            yield

    def applying(self, rung: int) -> Steps[bool]:
        """Apply one rung (or continue it), as steps; whether it changed anything.

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
        spec = RUNGS[rung - 1]
        if spec.action == TRUNCATE:
            lo, hi = spec.results
            return ((lambda scope: self._wave_scope(scope, lo, hi), self._truncate_wave),)
        recent = self.params.protected_recent * spec.recent
        if spec.action == ENVELOPES:
            return (
                (lambda scope: self._envelope_scope(scope, recent), self._stub_envelopes),
                (self._old_stub_scope, self._drop_old_stubs),
            )
        return (
            (lambda scope: self._removal_scope(scope, recent), self._removal_pass),
            (lambda scope: self._stub_scope(scope, recent), self._stub_pass),
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
        yield from self._stub_user_turns()
        groups = yield from self._groups()
        yield from self._drop_user_turns(groups)
        self.floor_removed = len(self.removed) + len(self.stubbed) - before

    def _untouchable(self, row: int) -> bool:
        """What ``reducing_floor`` never removes."""
        return self.rows.seq[row] in self.protected or self.rows.info[row].has_loaded_tool_state

    def _truncate_largest_results(self) -> Steps[None]:
        reduce = self.truncate_protected
        if reduce is None:
            return
        rows = self.rows
        seqs, infos, tokens = rows.seq, rows.info, rows.tokens
        results = [
            row
            for row in self.live
            if infos[row].is_result_carrier and seqs[row] not in self.protected
        ]
        yield
        results.sort(key=tokens.__getitem__, reverse=True)

        def truncate(row: int) -> None:
            form = reduce(seqs[row])
            if form is not None and form[1] < tokens[row]:
                self._replace(row, form, PROTECTED)
                self.truncated.add(seqs[row])
                self.floor_truncated.add(seqs[row])

        yield from walking(results, self._until_fits(truncate), stride=HEAVY_STRIDE)

    def _remove_oldest(self, groups: Groups) -> Steps[None]:
        rows = self.rows
        flags, group = rows.flags, rows.group
        doomed: set[int] = set()

        def remove(row: int) -> None:
            if row in doomed or self._untouchable(row) or self._is_user_turn(row):
                return
            if flags[row]:
                members = groups.members(group[row], row)
                if group[row] in self.incomplete_groups or any(
                    self._untouchable(m) for m in members
                ):
                    return
                self._drop(members, doomed)
            elif rows.info[row].role == "assistant":
                self._drop((row,), doomed)

        yield from walking(self.live, self._until_fits(remove))
        yield from self._compact(doomed)

    def _stub_user_turns(self) -> Steps[None]:
        rows = self.rows
        seqs, forms = rows.seq, rows.form

        def stub(row: int) -> None:
            if self._is_user_turn(row) and seqs[row] not in self.protected and forms[row] == FULL:
                self._stub(row)

        yield from walking(self.live, self._until_fits(stub), stride=HEAVY_STRIDE)

    def _drop_user_turns(self, groups: Groups) -> Steps[None]:
        rows = self.rows
        doomed: set[int] = set()

        def drop(row: int) -> None:
            if row in doomed or not self._is_user_turn(row) or self._untouchable(row):
                return
            results = bool(rows.flags[row] & RESULTS)
            members = groups.members(rows.group[row], row) if results else (row,)
            if results and rows.group[row] in self.incomplete_groups:
                return
            if any(self._untouchable(m) for m in members if m != row):
                return
            self._drop(members, doomed)

        yield from walking(self.live, self._until_fits(drop))
        yield from self._compact(doomed)

    # -- the rungs' phases: a scope frozen at the first application, then a run ------

    def _wave_scope(self, scope: _Scope, lo: float, hi: float) -> Steps[None]:
        """A truncation wave may touch the unprotected results of its quarter(s) of the
        result positions, as they are when the rung is first applied."""
        positions = yield from self._result_positions()
        n = len(positions)
        protected_results = self._protected_results(positions)
        live, seqs = self.live, self.rows.seq
        scope.rows = array(
            "q",
            (
                live[index]
                for index in positions[int(n * lo) : int(n * hi)]
                if index not in protected_results and seqs[live[index]] not in self.protected
            ),
        )

    def _walk(
        self, scope: _Scope, act: Callable[[int], None], stride: int = HEAVY_STRIDE
    ) -> Steps[bool]:
        """``act`` on the scope's rows from its cursor on, oldest first, until the view
        fits (the cursor is kept for a continuation: False) or the scope is through
        (True); pausing every ``stride`` rows (``walking``)."""
        stopped = yield from walking(
            scope.rows, self._until_fits(act), stride=stride, start=scope.cursor
        )
        if stopped is None:
            return True
        scope.cursor = stopped
        return False

    def _truncate_wave(self, scope: _Scope) -> Steps[bool]:
        rows = self.rows

        def truncate(row: int) -> None:
            if rows.form[row] != FULL:
                return
            seq = rows.seq[row]
            form = self.truncate(seq)
            if form is not None:
                self._replace(row, form, TRUNCATED)
                self.truncated.add(seq)

        return self._walk(scope, truncate)

    def _removal_scope(self, scope: _Scope, fraction: float) -> Steps[None]:
        """A removal pass may remove what lies outside the recent window and the other
        protections as they are when the rung is first applied (kept as seqs, so a
        continuation after some removals does not move the window)."""
        scope.keep = yield from self._keep_seqs(fraction)
        scope.groups = yield from self._groups()
        scope.rows = self.live[:]

    def _removal_pass(self, scope: _Scope) -> Steps[bool]:
        keep, groups, removed = scope.keep, scope.groups, self.removed
        assert groups is not None  # prepared by _removal_scope
        rows = self.rows
        seqs, flags, group = rows.seq, rows.flags, rows.group
        doomed: set[int] = set()

        def remove(row: int) -> None:
            if seqs[row] in keep or seqs[row] in removed or self._is_user_turn(row):
                return  # user turns are stubbed, never removed by a pass
            if flags[row]:
                members = groups.members(group[row], row)
                if (
                    group[row] in self.incomplete_groups
                    or any(seqs[m] in keep for m in members)
                    or any(self._is_user_turn(m) for m in members)
                ):
                    return  # a group holding a user's own words stays whole, in place
                self._drop(members, doomed)
            else:
                self._drop((row,), doomed)

        done = yield from self._walk(scope, remove, STRIDE)
        yield from self._compact(doomed)
        return done

    def _stub_scope(self, scope: _Scope, fraction: float) -> Steps[None]:
        """A removal pass's stubs: the user turns outside the same window, recomputed on
        the view its removals left (as when the pass runs whole)."""
        scope.keep = yield from self._keep_seqs(fraction)
        scope.rows = self.live[:]

    def _stub_pass(self, scope: _Scope) -> Steps[bool]:
        rows = self.rows

        def stub(row: int) -> None:
            if (
                rows.seq[row] not in scope.keep
                and rows.form[row] == FULL
                and self._is_user_turn(row)
            ):
                self._stub(row)

        return self._walk(scope, stub)

    def _last_user_position(self) -> int | None:
        live = self.live
        for index in range(len(live) - 1, -1, -1):
            if self._is_user_turn(live[index]):
                return index
        return None

    def _envelope_scope(self, scope: _Scope, fraction: float) -> Steps[None]:
        """Rung 8 may stub the machine-written user turns before the last user turn, and
        then drop stubs before the recent window of ``fraction``; both as the view is when
        the rung is first applied (stubbing leaves the live order's length as it is)."""
        last_user = self._last_user_position()
        keep = self._human_bounds()
        if last_user is not None:
            keep.add(last_user)
        live, seqs = self.live, self.rows.seq
        scope.keep = frozenset(seqs[live[index]] for index in keep)
        scope.last_user = None if last_user is None else seqs[live[last_user]]
        scope.boundary = int(len(live) * (1 - fraction))
        scope.rows = live[:]
        yield

    def _stub_envelopes(self, scope: _Scope) -> Steps[bool]:
        """Rung 8, first half: stub machine-written user turns that nobody retains."""
        rows = self.rows

        def stub(row: int) -> None:
            info, seq = rows.info[row], rows.seq[row]
            if not (
                info.role != "user"
                or info.is_human
                or info.is_result_carrier
                or seq == scope.last_user
                or seq in self.protected
                or rows.form[row] != FULL
            ):
                self._stub(row)

        return self._walk(scope, stub)

    def _old_stub_scope(self, scope: _Scope) -> Steps[None]:
        """Rung 8, second half: the rows before the boundary frozen at its first
        application."""
        scope.rows = self.live[: min(scope.boundary, len(self.live))]
        yield

    def _drop_old_stubs(self, scope: _Scope) -> Steps[bool]:
        """Rung 8, second half: drop stubs older than the narrowest recent window."""
        rows = self.rows
        doomed: set[int] = set()

        def drop(row: int) -> None:
            seq = rows.seq[row]
            if (
                rows.form[row] == STUBBED
                and seq not in scope.keep
                and seq not in self.protected
                and seq not in self.removed
            ):
                self._drop((row,), doomed)

        done = yield from self._walk(scope, drop, STRIDE)
        yield from self._compact(doomed)
        return done
