"""The working view of a compaction run, and the mutations every reduction makes.

A ladder (``ladder.py``: the rungs and the floor reduction) decides what to reduce; this
is what it reduces and how: ``WorkingView`` holds the view (its rows, the live order, the
running total against the target, what was removed, truncated and stubbed) and makes the
changes every reduction shares: a row shown reduced (``_replace``, ``_stub``), rows
removed (``_drop``, then ``_compact`` out of the live order), and, with preserved
thinking, the thinking cut every change implies (``_changing``: the thinking of every row
from the first change on is left out). It also answers what the view protects and where
(the result positions, the recent window, the human bounds, the tool groups) for the
rungs to freeze into their scopes. Nothing here awaits or touches the store.

The working view is held as columns (``Rows``: arrays of seqs, tokens, groups and form
codes, one list of messages and one of kinds), not an object per message: a compacting
request at 16k messages used to allocate 16k ladder items and a list per tool group, all
tracked by the cyclic collector and alive for the whole request, which made the
collector's full passes during a compaction twice as long as over the history alone. A
rung's scope is an array of row numbers; the tool groups are one flat array of rows with
int offsets (``Groups``). ``Item`` is a record built on access (``view_items``), for tests
and diagnostics.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..slices import Steps, chunking
from .forms import Unthought
from .rows import (
    CALLS,
    FORM_NAMES,
    PROTECTED,
    REMOVED,
    RESULTS,
    STUBBED,
    TRUNCATED,
    Form,
    Groups,
    Item,
    Rows,
)

__all__ = (
    "LadderParams",
    "Reduce",
    "WorkingView",
)


Reduce = Callable[[int], Form | None]
"""``(seq) -> Form | None``: a reduced form of the message with that seq, if it shrinks it."""

_DROPPED: Final[dict[str, Any]] = {}
"""The message of a removed row: nothing shows it, and a scope that still lists the row
must not keep its reduced form alive (``WorkingView._drop``)."""


@dataclass(frozen=True, slots=True)
class LadderParams:
    protected_recent: float
    protected_tool_results: int


@dataclass(slots=True)
class WorkingView:
    """The working view of one compaction run and its mutations (local to the run).

    Args:
        rows: the working view without system messages, sticky decisions applied.
        total: tokens of the whole view including system messages.
        target: stop when ``total <= target``; a negative target exhausts every rung.
        protected: seqs that must stay complete (request-protected, developer, ...).
        incomplete_groups: group ids with an unanswered call (never removable).
        truncate: ``(seq) -> Form | None``, the truncated form if it shrinks the message.
        stub: ``(seq) -> Form | None``, the stubbed form if it shrinks the message.
    """

    rows: Rows
    total: int
    target: int
    protected: frozenset[int]
    incomplete_groups: frozenset[int]
    params: LadderParams
    truncate: Reduce
    stub: Reduce
    level: int = 0
    removed: set[int] = field(default_factory=set)
    truncated: set[int] = field(default_factory=set)
    stubbed: set[int] = field(default_factory=set)
    truncate_protected: Reduce | None = None
    """``(seq) -> Form | None``: the marked truncated form of a protected tool result,
    used only by ``reducing_floor``."""
    floor_truncated: set[int] = field(default_factory=set)
    """Protected tool results ``reducing_floor`` truncated."""
    floor_removed: int = 0
    """Messages ``reducing_floor`` removed or stubbed."""
    unthink: Callable[[dict[str, Any]], Unthought | None] | None = None
    """With preserved thinking: a message without its thinking blocks, if it has any. The
    thinking of every row from the first one this ladder changes is left out (its prefix
    changed: the provider would reject it); None keeps all thinking."""
    notice_row: int | None = None
    """The row the committed notice precedes: a change anywhere moves the notice, so the
    first change is there at the latest."""
    cut: int = -1
    """The first row this ladder changed (the number of rows while it changed none)."""
    thoughtless: dict[int, tuple[dict[str, Any] | None, int, int]] = field(default_factory=dict)
    """Seq -> (form, estimate, thinking blocks left out) of each message this ladder shows
    without its thinking (form None: the message is left out)."""
    edits: int = 0
    """Reductions made so far (a removal that supersedes a reduced form counts too)."""
    live: array[int] = field(init=False)
    """The rows still in the view, in view order (positions index this)."""
    _reduced: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Seq -> the reduced message of a message this ladder reduced and still shows, once
    a merge (or ``view_items``) asked for it; shared with the decisions from then on.

    A rung keeps only a reduced message's estimate: its form is made again when the
    decisions take it (``_form``). A compacting request at 16k messages truncates
    thousands of old results that a later rung of the same request removes; kept, their
    forms (three tracked objects each) lived through the request's collections and grew
    each full pass that fell inside it, for nothing."""

    def __post_init__(self) -> None:
        self.live = array("q", range(len(self.rows)))
        self.cut = len(self.rows)

    @property
    def fits(self) -> bool:
        return self.total <= self.target

    @property
    def changes(self) -> int:
        return len(self.removed) + len(self.truncated) + len(self.stubbed)

    @property
    def count(self) -> int:
        """Messages left in the view (system messages excepted)."""
        return len(self.live)

    @property
    def synthesized(self) -> int:
        """Synthesized results the view shows with the calls left in it."""
        form = self.rows.form
        return sum(n for row, n in self.rows.synthesized.items() if form[row] != REMOVED)

    def reduced_forms(self) -> Iterator[tuple[int, dict[str, Any], int]]:
        """``(seq, message, tokens)`` of every message this ladder truncated or stubbed
        and still shows, in view order: its reduced message and that message's estimate."""
        rows, truncated, stubbed = self.rows, self.truncated, self.stubbed
        seqs, tokens = rows.seq, rows.tokens
        for row in self.live:
            seq = seqs[row]
            if seq in truncated or seq in stubbed:
                yield seq, self._form(row), tokens[row]

    def _form(self, row: int) -> dict[str, Any]:
        """The reduced message at ``row``, made again by the reduction that made it (the
        reductions are pure functions of the admitted message) and kept from then on; the
        row's message when none is known."""
        rows = self.rows
        seq = rows.seq[row]
        message = self._reduced.get(seq)
        if message is not None:
            return message
        code = rows.form[row]
        make = {TRUNCATED: self.truncate, STUBBED: self.stub, PROTECTED: self.truncate_protected}
        reduce = make.get(code)
        form = None if reduce is None else reduce(seq)
        if form is None:  # (a row given to the ladder already reduced, as tests build)
            return rows.message[row]
        if form[1] != rows.tokens[row]:
            raise AssertionError(f"the reduction of seq {seq} made another form the second time")
        message = self._reduced[seq] = form[0]
        return message

    def view_items(self) -> list[Item]:
        """The view's messages as ``Item`` records, built on access (tests, diagnostics:
        the ladder's own work never builds them)."""
        rows, made = self.rows, self._made
        items = []
        for row in self.live:
            reduced = (self._form(row), rows.tokens[row]) if rows.seq[row] in made else None
            items.append(
                Item(
                    rows.seq[row],
                    rows.info[row],
                    rows.message[row] if reduced is None else reduced[0],
                    rows.tokens[row],
                    rows.group[row],
                    FORM_NAMES[rows.form[row]],
                    rows.synthesized.get(row, 0),
                    reduced,
                    has_calls=bool(rows.flags[row] & CALLS),
                    has_results=bool(rows.flags[row] & RESULTS),
                )
            )
        return items

    @property
    def _made(self) -> set[int]:
        """Seqs this ladder reduced and still shows."""
        return self.truncated | self.stubbed

    def _until_fits(self, act: Callable[[int], object]) -> Callable[[int], object]:
        """``act``, for a walk that stops at the first row it meets once the view fits."""
        return lambda row: self.fits or act(row)

    # -- the thinking cut ----------------------------------------------------------

    def replacing_notice(self) -> None:
        """The run's decisions replace the committed ones (and their notice) even if no
        rung changed a message (a floor reported anew): the view changes at the notice."""
        if self.notice_row is not None:
            self._changing(self.notice_row)

    def _changing(self, row: int) -> None:
        """``row`` is about to change: with preserved thinking, leave out the thinking of
        every row from the first change on (the rows before it keep their prefix)."""
        if self.unthink is None:
            return
        first = row if self.notice_row is None else min(row, self.notice_row)
        if first >= self.cut:
            return
        rows = self.rows
        for later in range(first, self.cut):
            if rows.form[later] == REMOVED:
                continue
            made = self.unthink(rows.message[later])
            if made is None:
                continue
            form, tokens, saved, omitted = made
            self.total -= saved
            rows.tokens[later] -= saved
            if form is not None:
                rows.message[later] = form
            self.thoughtless[rows.seq[later]] = (form, tokens, omitted)
        self.cut = first

    # -- mutations every reduction makes -------------------------------------------

    def _replace(self, row: int, form: Form, code: int) -> None:
        """Show the message at ``row`` reduced (``code``) to ``form``: its estimate is kept,
        the form itself only when the decisions ask for it (``_reduced``)."""
        self._changing(row)
        rows = self.rows
        tokens = form[1]
        self.edits += 1
        self.total += tokens - rows.tokens[row]
        rows.tokens[row], rows.form[row] = tokens, code
        self._reduced.pop(rows.seq[row], None)

    def _drop(self, rows: Iterable[int], doomed: set[int]) -> None:
        """Remove the messages at ``rows`` (they join ``doomed``, for ``_compact``)."""
        columns = self.rows
        for row in rows:
            self._changing(row)
            seq = columns.seq[row]
            self.thoughtless.pop(seq, None)
            doomed.add(row)
            self.edits += 1
            self.total -= columns.tokens[row]
            columns.message[row] = _DROPPED
            columns.form[row] = REMOVED
            self._reduced.pop(seq, None)
            self.removed.add(seq)
            # removal supersedes an earlier reduced form of the same message
            self.truncated.discard(seq)
            self.stubbed.discard(seq)
            self.floor_truncated.discard(seq)

    def _stub(self, row: int) -> None:
        seq = self.rows.seq[row]
        form = self.stub(seq)
        if form is not None:
            self._replace(row, form, STUBBED)
            self.stubbed.add(seq)

    def _compact(self, doomed: set[int]) -> Steps[None]:
        """Take the rows in ``doomed`` out of the live order."""
        if not doomed:
            return
        kept = array("q")

        def keep(chunk: Sequence[int], offset: int) -> None:
            kept.extend(row for row in chunk if row not in doomed)

        yield from chunking(self.live, keep)
        self.live = kept

    # -- what the view protects, and where -----------------------------------------

    def _is_user_turn(self, row: int) -> bool:
        """A user message that is more than tool results (never removed by a pass)."""
        info = self.rows.info[row]
        return info.role == "user" and not info.is_result_carrier

    def _human_bounds(self) -> set[int]:
        live, infos = self.live, self.rows.info
        first = next((i for i, row in enumerate(live) if infos[row].is_human), None)
        if first is None:
            return set()
        last = next(i for i in range(len(live) - 1, -1, -1) if infos[live[i]].is_human)
        return {first, last}

    def _result_positions(self) -> Steps[list[int]]:
        infos = self.rows.info
        positions: list[int] = []

        def index(chunk: Sequence[int], offset: int) -> None:
            positions.extend(
                i for i, row in enumerate(chunk, offset) if infos[row].is_result_carrier
            )

        yield from chunking(self.live, index)
        return positions

    def _protected_results(self, positions: list[int]) -> set[int]:
        keep = self.params.protected_tool_results
        return set(positions[-keep:]) if keep > 0 else set()

    def _protected_positions(self, fraction: float) -> Steps[set[int]]:
        live = self.live
        seqs, infos = self.rows.seq, self.rows.info
        recent_start = int(len(live) * (1 - fraction))
        protected = set(range(recent_start, len(live)))
        protected |= self._human_bounds()
        positions = yield from self._result_positions()
        protected |= self._protected_results(positions)
        marked = self.protected

        def protect(chunk: Sequence[int], offset: int) -> None:
            protected.update(
                i
                for i, row in enumerate(chunk, offset)
                if seqs[row] in marked or infos[row].has_loaded_tool_state
            )

        yield from chunking(live, protect)
        return protected

    def _keep_seqs(self, fraction: float) -> Steps[frozenset[int]]:
        """The seqs of the rows ``_protected_positions(fraction)`` protects now."""
        positions = yield from self._protected_positions(fraction)
        live, seqs = self.live, self.rows.seq
        return frozenset(seqs[live[index]] for index in positions)

    def _groups(self) -> Steps[Groups]:
        """The live rows of each tool group, by group id, in view order."""
        flags, group = self.rows.flags, self.rows.group
        live = self.live
        sizes: dict[int, int] = {}

        def measure(chunk: Sequence[int], offset: int) -> None:
            for row in chunk:
                if flags[row]:
                    g = group[row]
                    sizes[g] = sizes.get(g, 0) + 1

        yield from chunking(live, measure)
        begin: dict[int, int] = {}
        end: dict[int, int] = {}
        offset = 0
        for g, size in sizes.items():
            begin[g] = end[g] = offset
            offset += size
        flat = array("q", bytes(8 * offset))

        def place(chunk: Sequence[int], offset: int) -> None:
            for row in chunk:
                if flags[row]:
                    g = group[row]
                    flat[end[g]] = row
                    end[g] += 1

        yield from chunking(live, place)
        return Groups(begin, end, flat)
