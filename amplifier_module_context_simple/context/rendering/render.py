"""Rendering a view: the per-request hot path.

A view is system messages first, then the conversation with the sticky decisions applied,
every message a new dict (and a new metadata dict when it has one). What a view *shows*
depends only on the history prefix, the decisions and which protected messages are shown
intact; so the renderer keeps that "what to show" list between requests and extends it
with newly admitted messages. A steady-state request then costs one shallow copy per
message and no per-message policy work.

Rendering is a generator of steps (``slices.py``): the copy pauses every ``_CHUNK``
messages and a long look through the history (a rebuild after new decisions, a large
extension) every ``_CHUNK`` items. A long look works on a private list and replaces the
remembered one only when it is done, so a request paused in the middle never leaves a
half-built list for another request on the same store; a short one (a few new messages)
extends the remembered list in place, in one step, as before.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, overload

from ..counting.estimate import estimate_message
from ..history.history import BODY, HOOK_SYSTEM, SYSTEM, History, copy_message, marker_owner
from ..ladder.decisions import Decisions
from ..ladder.forms import unthought
from ..slices import LIGHT_CHUNK, Steps, chunking, run_through, walking
from .thinking import Ranges, covers

__all__ = (
    "Rendered",
    "Renderer",
    "UnthoughtForms",
)

_CHUNK: Final = LIGHT_CHUNK
"""Messages copied (or history items looked at) between two pause points."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered view and its estimate."""

    messages: list[dict[str, Any]]
    tokens: int
    system_count: int
    system_tokens: int
    synthesized: int = 0
    """How many unanswered calls the view answers with synthesized results."""
    message_tokens: Sequence[int] = ()
    """The estimate of each message of ``messages`` (shared, read-only)."""
    shared: bool = False
    """The body messages are the renderer's own dicts, not copies: read them, never hand
    them out or change them (``Renderer.copying`` makes the copies)."""
    with_metadata: tuple[Sequence[int], int] = ((), 0)
    """Of a shared view: the body positions whose metadata dict a copy copies too (the
    first ``count`` of the renderer's list, which only ever grows)."""
    intact: frozenset[int] = frozenset()
    """The protected messages shown as admitted although a decision reduced or removed
    them."""
    system_key: tuple[object, ...] = ()
    """What the system part shows: the factory text (or None) and the seqs of the stored
    system messages, in order. A change invalidates every thinking block before it."""
    body_seqs: Sequence[int] = ()
    """The seq of each body message (``messages[system_count:]``; a synthesized result
    has its call's), read-only: where the compaction notice goes (``notice_position``)."""

    def prefix_keeping(self, other: Sequence[Mapping[str, Any]]) -> Steps[tuple[int, int | None]]:
        """Tokens of the leading messages ``other`` shows unchanged from this view, and the
        index of the first one it changes (None when ``other`` changes none), as steps."""
        messages, tokens = self.messages, self.message_tokens
        kept = 0

        def differs(index: int) -> bool:
            nonlocal kept
            if index >= len(other) or other[index] != messages[index]:
                return True
            kept += tokens[index]
            return False

        first = yield from walking(range(len(messages)), differs, stride=_CHUNK)
        return kept, first


@dataclass(slots=True)
class _Shown:
    """The forms a view shows for one (epoch, order version, intact set, factory) key."""

    key: tuple[int, int, frozenset[int], bool, Ranges]
    decisions: Decisions
    length: int = 0
    position: int = 0
    """How many ``History.order`` items have been looked at."""
    sealed: bool = False
    """A rebuild skipped an item past ``length``: only this exact length may reuse it."""
    systems: list[dict[str, Any]] = field(default_factory=list)
    system_tokens: int = 0
    body: list[dict[str, Any]] = field(default_factory=list)
    # numbers in arrays: a long view's positions and estimates are nothing for the
    # collector to walk (a list holds an int object per message)
    with_metadata: array[int] = field(default_factory=lambda: array("q"))
    body_tokens: int = 0
    body_token_list: array[int] = field(default_factory=lambda: array("q"))
    body_seq_list: array[int] = field(default_factory=lambda: array("q"))
    system_seq_list: array[int] = field(default_factory=lambda: array("q"))
    system_token_list: array[int] = field(default_factory=lambda: array("q"))
    synthesized: int = 0

    def copy(self) -> _Shown:
        """A private copy to extend (the lists copied, the messages shared)."""
        return dataclasses.replace(
            self,
            systems=list(self.systems),
            body=list(self.body),
            with_metadata=self.with_metadata[:],
            body_token_list=self.body_token_list[:],
            body_seq_list=self.body_seq_list[:],
            system_seq_list=self.system_seq_list[:],
            system_token_list=self.system_token_list[:],
        )


class Renderer:
    """Builds views; remembers what the last view showed so the next one is cheap."""

    def __init__(self) -> None:
        self._shown: _Shown | None = None
        self._factory: tuple[str, int] | None = None
        self._unthought = UnthoughtForms()
        """The forms without thinking of the messages in the unthought ranges."""

    def rendering(
        self,
        history: History,
        length: int,
        *,
        epoch: int,
        decisions: Decisions,
        protected: frozenset[int],
        factory_text: str | None,
        copy: bool = True,
        unthought: Ranges = (),
    ) -> Steps[Rendered]:
        """The view of the first ``length`` entries of ``history`` under ``decisions``.

        Messages follow ``history.order`` (results with their calls, synthesized results
        for calls a later assistant turn left unanswered). Messages in ``protected`` are
        shown as admitted even when a decision reduced or removed them. With a
        ``factory_text``, stored system messages other than hook-sourced ones are replaced
        by that one system prompt.

        As steps (see the module docstring). ``copy=False``: a *shared* view (its body
        is the renderer's own dicts; see ``Rendered.shared``), for a request that only
        reads it and then renders the view it returns. Messages with a seq in one of the
        ``unthought`` ranges are shown without their thinking blocks (``UnthoughtForms``).
        """
        # protected messages a decision removed or reduced: shown as admitted
        intact = (
            protected.intersection(decisions.overrides).union(
                protected.intersection(decisions.removed)
            )
            if protected and not decisions.is_empty
            else frozenset()
        )
        key = (
            epoch,
            history.order_version,
            frozenset(intact),
            factory_text is not None,
            unthought,
        )
        shown = self._shown
        fresh = (
            shown is None
            or shown.key != key
            or shown.decisions is not decisions
            or shown.length > length
            or (shown.sealed and shown.length != length)
        )
        if fresh or shown is None:
            shown = _Shown(key, decisions)
        if shown.length < length:
            factory = factory_text is not None
            forms = self._unthought.within(history, unthought)
            if not fresh and len(history.order) - shown.position <= _CHUNK:
                run_through(
                    self._extend(shown, history, history.order, length, intact, factory, forms)
                )
            else:
                # a long look: on a private list (and a copy of the order, which an
                # admission may insert into meanwhile), remembered once complete
                if not fresh:
                    shown = shown.copy()
                order = history.order[:]
                yield
                yield from self._extend(shown, history, order, length, intact, factory, forms)
                self._shown = shown
        elif fresh:
            self._shown = shown
        systems = [copy_message(message) for message in shown.systems]
        system_tokens = shown.system_tokens
        token_list: Sequence[int] = shown.system_token_list
        if factory_text is not None:
            systems.insert(0, {"role": "system", "content": factory_text})
            factory_tokens = self._factory_tokens(factory_text)
            system_tokens += factory_tokens
            token_list = [factory_tokens, *token_list]
        # What this view shows is fixed now: another request may append to the remembered
        # lists while this one is paused, never change what is already there.
        body = shown.body[:]
        view = Rendered(
            messages=systems + body if systems else body,
            tokens=system_tokens + shown.body_tokens,
            system_count=len(systems),
            system_tokens=system_tokens,
            synthesized=shown.synthesized,
            message_tokens=_Concat(token_list, shown.body_token_list),
            shared=True,
            with_metadata=(shown.with_metadata, len(shown.with_metadata)),
            body_seqs=shown.body_seq_list[: len(body)],
            system_key=(factory_text, tuple(shown.system_seq_list)),
            intact=key[2],
        )
        if not copy:
            return view
        return (yield from self.copying(view))

    @staticmethod
    def copying(view: Rendered) -> Steps[Rendered]:
        """A shared ``view`` with new message dicts (and new metadata dicts), as steps."""
        if not view.shared:
            return view
        messages, offset = view.messages, view.system_count
        copied = messages[:offset]  # (the system messages are copies already)

        positions, count = view.with_metadata

        def copy_chunk(chunk: Sequence[dict[str, Any]], start: int) -> None:
            copied.extend(map(dict.copy, chunk))

        def copy_metadata(index: int) -> None:
            message = copied[offset + positions[index]]
            message["metadata"] = message["metadata"].copy()

        yield from chunking(messages, copy_chunk, size=_CHUNK, start=offset, between=True)
        yield from walking(range(count), copy_metadata, stride=_CHUNK)
        return dataclasses.replace(view, messages=copied, shared=False, with_metadata=((), 0))

    def _factory_tokens(self, text: str) -> int:
        cached = self._factory
        if cached is None or cached[0] != text:
            cached = (text, estimate_message({"role": "system", "content": text}))
            self._factory = cached
        return cached[1]

    @staticmethod
    def _extend(
        shown: _Shown,
        history: History,
        order: Sequence[int],
        length: int,
        intact: frozenset[int],
        factory: bool,
        unthought: Mapping[int, tuple[dict[str, Any] | None, int]],
    ) -> Steps[None]:
        decisions = shown.decisions
        overrides, override_tokens, removed = (
            decisions.overrides,
            decisions.override_tokens,
            decisions.removed,
        )
        entries = history.entries
        publics, kinds, all_tokens = entries.public, entries.kinds, entries.tokens
        with_metadata = entries.has_metadata
        body = shown.body
        # Items past the last look are appended in seq order unless the order version
        # changed (then this is a rebuild from 0): a first item past ``length`` ends the
        # look, except in a rebuild, where later items may still be inside the prefix.
        rebuild = shown.position == 0

        def look(position: int) -> bool:
            """Show the item at ``position``; True: the look ends before it."""
            item = order[position]
            if history.position_seq(item) >= length:
                if not rebuild or all(
                    history.position_seq(later) >= length for later in order[position:]
                ):
                    return True
                shown.sealed = True
                return False
            if item < 0:
                owner = marker_owner(item)
                if owner in removed and owner not in intact:
                    return False  # removed with its call
                synthesized = history.synthesized[owner]
                for message, tokens in zip(
                    synthesized.messages, synthesized.message_tokens, strict=True
                ):
                    shown.with_metadata.append(len(body))
                    body.append(message)
                    shown.body_token_list.append(tokens)
                    shown.body_seq_list.append(owner)
                shown.body_tokens += synthesized.tokens
                shown.synthesized += len(synthesized.call_ids)
                return False
            kind = kinds[item]
            if kind == BODY:
                form = publics[item]
                tokens = all_tokens[item]
                has_metadata = with_metadata[item]
                if item in removed and item not in intact:
                    return False
                if item in overrides and item not in intact:
                    form, tokens = overrides[item], override_tokens[item]
                    has_metadata = "metadata" in form
                elif item in unthought:
                    form, tokens = unthought[item]
                    if form is None:
                        return False  # thinking alone: nothing left to show
                    has_metadata = "metadata" in form
                if has_metadata:
                    shown.with_metadata.append(len(body))
                body.append(form)  # type: ignore[arg-type]  # not SKIP: has a public form
                shown.body_tokens += tokens
                shown.body_token_list.append(tokens)
                shown.body_seq_list.append(item)
            elif (kind == SYSTEM and not factory) or kind == HOOK_SYSTEM:
                shown.systems.append(publics[item])  # type: ignore[arg-type]  # not SKIP
                shown.system_seq_list.append(item)
                shown.system_tokens += all_tokens[item]
                shown.system_token_list.append(all_tokens[item])
            return False

        stopped = yield from walking(range(len(order)), look, stride=_CHUNK, start=shown.position)
        shown.position = len(order) if stopped is None else stopped
        shown.length = length


class UnthoughtForms:
    """The messages in the unthought ranges, shown without their thinking: seq -> (form,
    estimate), form None for a message of thinking alone (a sparse dict: only messages
    with thinking). Filled once per range, for one history object."""

    __slots__ = ("_forms", "_history", "_scanned")

    def __init__(self) -> None:
        self._history: History | None = None
        self._scanned: set[tuple[int, int]] = set()
        self._forms: dict[int, tuple[dict[str, Any] | None, int]] = {}

    def within(
        self, history: History, ranges: Ranges
    ) -> Mapping[int, tuple[dict[str, Any] | None, int]]:
        """The forms of the messages in ``ranges`` that carry thinking."""
        if history is not self._history:
            self._history, self._scanned, self._forms = history, set(), {}
        if not ranges:
            return {}
        publics = history.entries.public
        for lo, hi in ranges:
            if (lo, hi) in self._scanned:
                continue
            for seq in range(lo, min(hi, len(publics))):
                public = publics[seq]
                made = unthought(public) if public is not None else None
                if made is not None:
                    self._forms[seq] = made[:2]
            if hi <= len(publics):
                self._scanned.add((lo, hi))
        return {seq: form for seq, form in self._forms.items() if covers(ranges, seq)}


class _Concat(Sequence[int]):
    """Two lists read as one, without copying either (the renderer keeps them)."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Sequence[int], second: Sequence[int]) -> None:
        self._first, self._second = first, second

    def __len__(self) -> int:
        return len(self._first) + len(self._second)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [*self._first, *self._second][index]
        if index < 0:
            index += len(self)
        head = len(self._first)
        return self._first[index] if index < head else self._second[index - head]
