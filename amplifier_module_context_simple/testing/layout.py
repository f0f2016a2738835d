"""The history as views must show it: provider-facing forms, runs, display order.

``display_order(history)`` is the order in which views show the conversation (system
messages aside), computed from the history alone by the rules ``check_view_invariants``
states; the oracle embeds each view in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .messages import (
    _block_result_id,
    _call_formats,
    _carries_only_results,
    _get,
    _is_human,
    _meta,
    _result_blocks,
    _valid_id,
)

__all__ = ("Slot", "display_order")


@dataclass
class _Row:
    index: int
    public: dict[str, Any] | None
    """What a view shows for the message (None: never shown)."""
    owners: dict[str, int]
    """Result id -> index of the history message whose call it answers."""


@dataclass(frozen=True)
class Slot:
    """One place in the expected display order of the conversation."""

    index: int
    """The history index of the message (of the call message, for a synthesized result)."""
    synthesized: tuple[str, ...] = ()
    """For a synthesized result: the call ids it answers."""
    anthropic: bool = False
    """For a synthesized result: a user message of ``tool_result`` blocks."""
    renamed: tuple[tuple[str, str], ...] = ()
    """For a synthesized result: (shown id, stored id) of each of its ids views rename."""


_RENAMED: Final = "renamed_tool_call_ids"


@dataclass
class _Run:
    """An assistant message with calls and what was admitted before the run closed."""

    owner: int
    pending: list[str]
    """Its call ids (as stored) not answered yet, in call order."""
    formats: dict[str, bool]
    renames: dict[str, str]
    """Stored id -> the fresh id views show for it (reused ids only)."""
    pure: list[int] = field(default_factory=list)
    mixed: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    """Notes admitted while ids were pending: shown once the run is answered or closed."""
    others: list[int] = field(default_factory=list)

    def shown(self, call_id: str) -> str:
        return self.renames.get(call_id, call_id)

    def slots(self, closed: bool) -> list[Slot]:
        """The run in display order; ``closed``: a later turn closed it (else the history
        ends with it). Held notes are left out of a run that ends the history pending."""
        out = [Slot(self.owner), *map(Slot, self.pure)]
        if closed and self.pending:
            tool = [c for c in self.pending if not self.formats[c]]
            blocks = [c for c in self.pending if self.formats[c]]
            out += [Slot(self.owner, (self.shown(c),), renamed=self._renamed([c])) for c in tool]
            if blocks:
                shown = tuple(map(self.shown, blocks))
                out.append(Slot(self.owner, shown, anthropic=True, renamed=self._renamed(blocks)))
        held = self.held if closed or not self.pending else []
        out += [Slot(index) for index in (*self.mixed, *held, *self.others)]
        return out

    def _renamed(self, call_ids: list[str]) -> tuple[tuple[str, str], ...]:
        return tuple((self.renames[c], c) for c in call_ids if c in self.renames)


@dataclass
class _Layout:
    """The history as views must show it (see ``check_view_invariants``)."""

    rows: list[_Row]
    slots: list[Slot]
    """The conversation (system messages aside) in display order."""
    results_of: dict[tuple[int, str], list[int]]
    """(call message index, call id as shown) -> indexes of the messages carrying its result."""
    synthesized: dict[int, list[int]]
    """Call message index -> positions in ``slots`` of its synthesized results."""
    tail: int | None
    """Index of the call message of a run still open at the end (the pending tail)."""
    tail_pending: frozenset[str]
    """Its call ids (as shown) without a result."""
    held: frozenset[int] = frozenset()
    """Indexes of the notes of the pending tail's run: never shown (no slot)."""


def _renamed(value: object, renames: Mapping[str, str]) -> object:
    return renames[value] if isinstance(value, str) and value in renames else value


def _with_renames(
    message: dict[str, Any], renames: Mapping[str, str], id_keys: tuple[str, ...]
) -> dict[str, Any]:
    """``message`` showing ``renames`` (stored id -> shown id) wherever ``id_keys`` of its
    calls (``tool_calls`` entries, ``tool_use``/``tool_call`` blocks) or results (the
    message's ``tool_call_id``, ``tool_result`` blocks) hold a renamed id, with the
    ``renamed_tool_call_ids`` note (shown id -> stored id) in its metadata."""
    out = dict(message)
    metadata = out.get("metadata")
    note = {new: old for old, new in renames.items()}
    out["metadata"] = {**(metadata if isinstance(metadata, Mapping) else {}), _RENAMED: note}

    def block(value: object, kinds: tuple[str, ...] | None) -> object:
        if not isinstance(value, Mapping) or (
            kinds is not None and _get(value, "type") not in kinds
        ):
            return value
        changed = {k: _renamed(value.get(k), renames) for k in id_keys if value.get(k) in renames}
        return {**value, **changed} if changed else value

    if message.get("role") == "assistant":
        if isinstance(message.get("tool_calls"), list):
            out["tool_calls"] = [block(call, None) for call in message["tool_calls"]]
        kinds: tuple[str, ...] = ("tool_use", "tool_call")
    else:
        out["tool_call_id"] = _renamed(message.get("tool_call_id"), renames)
        if "tool_call_id" not in message:
            del out["tool_call_id"]
        kinds = ("tool_result",)
    if isinstance(message.get("content"), list):
        out["content"] = [block(b, kinds) for b in message["content"]]
    return out


def _public_form(
    message: Mapping[str, Any], run: _Run | None
) -> tuple[dict[str, Any] | None, list[str]]:
    """What a view shows for a non-assistant ``message`` admitted while ``run`` is open, and
    the ids (as stored) it answers.

    A result answers a still unanswered id of the open run; any other result is an orphan
    (a block with no valid id, or a second block for an id answered earlier in the same
    message, included): a ``tool`` message or a pure carrier left with no result is never
    shown, a block list loses its orphan ``tool_result`` blocks (and is never shown if
    nothing is left), and its remaining ``tool_result`` blocks come first, in their order,
    before every other block (Anthropic requires a turn answering calls to begin with its
    results). A result of a call whose id views rename shows the new id.
    """
    role = message["role"]
    open_ids = run.pending if run is not None else []
    linked: list[str] = []
    if role == "tool":
        ref = message.get("tool_call_id")
        if not (_valid_id(ref) and ref in open_ids):
            return None, []
        public = dict(message)
        linked = [ref]
    elif role == "system" or not _result_blocks(message):
        return dict(message), []
    else:
        answers: list[object] = []
        others: list[object] = []
        for block in message["content"]:
            if _get(block, "type") != "tool_result":
                others.append(block)
                continue
            ref = _block_result_id(block)
            if _valid_id(ref) and ref in open_ids and ref not in linked:
                linked.append(ref)
                answers.append(block)
        if not answers and not others:
            return None, []
        # a turn that answers calls begins with its results (Anthropic Messages)
        public = {**message, "content": [*answers, *others]}
    if run is None:
        return public, linked
    renames = {c: run.renames[c] for c in linked if c in run.renames}
    if renames:
        public = _with_renames(public, renames, ("tool_use_id", "tool_call_id"))
    return public, linked


def _layout(history: Sequence[object]) -> _Layout:
    """Compute, from the history alone, the rows, the runs and the expected display order.

    Runs: an assistant message with calls opens a run; the next assistant message closes
    it, and so does a person's own turn (a user message that is not machine-written - no
    ``source: hook``, not ephemeral - nor a pure result carrier), after its own results are
    linked. Within a run the call message comes first, then the pure result carriers, then
    (once the run is closed with calls unanswered) their synthesized results, then
    messages mixing results with other content, then everything else, each group in
    admission order. A message answering none of the run's ids that is not a person's turn
    (a note: hook, ephemeral, developer, ...) admitted while an id is pending is *held*: it
    takes its place among "everything else" once the run is answered or closed, and has no
    place at all (``_Layout.held``) when the history ends with the run pending. A message
    no view shows (reference-only row, orphan) changes nothing.
    A call id declared again after an earlier call message showed it is renamed
    ``<id>~<n>`` (the smallest n >= 2 not taken) in the call and in its run's results.
    """
    rows: list[_Row] = []
    slots: list[Slot] = []
    results_of: dict[tuple[int, str], list[int]] = {}
    taken: set[str] = set()
    run: _Run | None = None

    def close(closed: bool) -> None:
        if run is not None:
            slots.extend(run.slots(closed))

    for index, message in enumerate(history):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or _meta(message).get("amplifier_public_reference_only") is True
        ):
            rows.append(_Row(index, None, {}))
            continue
        owners: dict[str, int] = {}
        if message["role"] == "assistant":
            close(closed=True)
            formats = _call_formats(message)
            renames: dict[str, str] = {}
            for call_id in formats:
                if call_id in taken:
                    n = 2
                    while f"{call_id}~{n}" in taken or f"{call_id}~{n}" in renames.values():
                        n += 1
                    renames[call_id] = f"{call_id}~{n}"
            taken.update(formats)
            taken.update(renames.values())
            public: dict[str, Any] | None = dict(message)
            if renames:
                public = _with_renames(dict(message), renames, ("id", "tool_call_id"))
            rows.append(_Row(index, public, owners))
            run = _Run(index, list(formats), formats, renames) if formats else None
            if run is None:
                slots.append(Slot(index))
            continue
        public, linked = _public_form(message, run)
        rows.append(_Row(index, public, owners))
        if public is None or message["role"] == "system":
            continue
        human = _is_human(message) and not _carries_only_results(message)
        if run is None:
            slots.append(Slot(index))
            continue
        for call_id in linked:
            run.pending.remove(call_id)
            owners[run.shown(call_id)] = run.owner
            results_of.setdefault((run.owner, run.shown(call_id)), []).append(index)
        if linked and _carries_only_results(message):
            run.pure.append(index)
        elif linked:
            run.mixed.append(index)
        elif run.pending and not human:
            run.held.append(index)  # a note while calls are running: shown after them
        else:
            run.others.append(index)
        if human:
            close(closed=True)
            run = None
    close(closed=False)
    synthesized: dict[int, list[int]] = {}
    for position, slot in enumerate(slots):
        if slot.synthesized:
            synthesized.setdefault(slot.index, []).append(position)
    tail = run.owner if run is not None else None
    pending = frozenset(run.shown(c) for c in run.pending) if run is not None else frozenset()
    held = frozenset(run.held) if run is not None and run.pending else frozenset()
    return _Layout(rows, slots, results_of, synthesized, tail, pending, held)


def display_order(history: Sequence[object]) -> list[Slot]:
    """The non-system messages of ``history`` that views may show, and the synthesized
    results they owe, in display order (see ``check_view_invariants``)."""
    return list(_layout(history).slots)
