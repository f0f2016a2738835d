"""The view oracle (docs/design.md section 10): is a view a valid view of its history?

``check_view_invariants(history, view, ...)`` computes, from the history alone, how views
must show it (``layout.py``) and checks the view against it: tool pairing by id in the
three formats, protected content, order, no invention, the budget, the canonical history,
isolation, serialisability, and the providers' own tool-use rules (``provider_rules``).
``check_isolation`` checks that mutating a returned view changes neither the store nor
the next view.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..context.counting.estimate import estimate_message
from .layout import Slot, _Layout, _layout
from .messages import (
    _HIDDEN,
    LOADED_TOOL_STATE,
    _get,
    _is_envelope,
    _is_human,
    _is_reduced_form,
    _is_synthesized,
    _meta,
    _result_refs,
    _same_message,
    _valid_id,
    call_ids,
    is_notice,
    reduced_kind,
)
from .provider_rules import Dialect, provider_violations
from .state import freeze, snapshot

if TYPE_CHECKING:
    from ..context.store import ContextStore

__all__ = (
    "DIALECTS",
    "MUTATION_MARK",
    "ViewInvariantError",
    "ViewReport",
    "check_isolation",
    "check_view_invariants",
    "mutate_view",
)


class ViewInvariantError(AssertionError):
    """A view broke an invariant of ``check_view_invariants`` (``item`` says which)."""

    def __init__(self, item: int, code: str, detail: str, position: int | None = None) -> None:
        super().__init__(f"view invariant {item} ({code}): {detail}")
        self.item = item
        self.code = code
        self.detail = detail
        self.position = position
        """Index of the offending view message, when one message is at fault."""


@dataclass(frozen=True)
class ViewReport:
    """What the oracle found in a valid view."""

    systems: int
    mapping: tuple[int, ...]
    """History index of every non-system, non-notice view message that is not a synthesized
    result, in view order."""
    reduced: tuple[int, ...]
    """History indexes shown in a reduced (truncated/stubbed) form."""
    notice: bool
    pending: frozenset[str]
    """Call ids shown without results because the history has none yet (the pending tail)."""
    synthesized: frozenset[str] = frozenset()
    """Call ids the view answers with synthesized results."""
    held: frozenset[int] = frozenset()
    """History indexes of the notes held back because the history ends while the calls of
    their run are still running (never shown by this view)."""
    truncated: int = 0
    """View messages shown truncated."""
    stubbed: int = 0
    """View messages shown stubbed."""
    list_results: int = 0
    """View messages carrying a tool result whose content is a list of blocks."""
    media_dropped: bool = False
    """The view is valid for OpenAI only once the non-text parts of the caller's own
    results are dropped (what an adapter does; see item 1)."""


DIALECTS: Final[tuple[Dialect, ...]] = ("openai", "anthropic")
"""The providers whose tool-use rules ``check_view_invariants`` applies by default."""


def _text_parts(content: object) -> object:
    if not isinstance(content, list):
        return content
    return [part for part in content if _get(part, "type") == "text"]


def _without_media(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` with the non-text parts (images, documents) of its results dropped."""
    out = dict(message)
    if message.get("role") == "tool":
        out["content"] = _text_parts(message.get("content"))
    elif isinstance(message.get("content"), list):
        out["content"] = [
            {**block, "content": _text_parts(block.get("content"))}
            if isinstance(block, Mapping) and block.get("type") == "tool_result"
            else block
            for block in message["content"]
        ]
    return out


def _provider_rules(
    messages: Sequence[Mapping[str, Any]], verbatim: Collection[int], dialects: Iterable[Dialect]
) -> bool:
    """Raise the first violation of each dialect's rules; True when the view is valid for
    OpenAI only once the non-text parts of the caller's own results are dropped."""
    media_dropped = False
    for dialect in dialects:
        errors = provider_violations(list(messages), dialect)
        if errors and dialect == "openai":
            # OpenAI takes only text parts in a tool message; the module passes the caller's
            # content through (its own reduced forms replace such parts by text), and an
            # adapter moves an image of an Anthropic-style result to a user message.
            stripped = [
                _without_media(m) if position in verbatim else m
                for position, m in enumerate(messages)
            ]
            errors = provider_violations(stripped, dialect)
            media_dropped = not errors
        for error in errors:
            raise ViewInvariantError(
                1,
                f"provider-{dialect}",
                f"the {dialect} API would reject the view ({error.code}): {error.detail}",
                error.position,
            ) from error
    return media_dropped


def _has_list_result(message: Mapping[str, Any]) -> bool:
    """Whether a message carries a tool result whose content is a list of blocks."""
    content = message.get("content")
    if message.get("role") == "tool":
        return isinstance(content, list)
    return isinstance(content, list) and any(
        _get(block, "type") == "tool_result" and isinstance(_get(block, "content"), list)
        for block in content
    )


def _json_ok(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _runs_in_view(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[int | None, frozenset[str]] | ViewInvariantError:
    """Pairing on the view alone: every result answers a call of the same run (the latest
    assistant message before it, nothing else assistant in between), at most once; a run
    closed by a later assistant message has all of its results.

    Returns the view position of the last call message and its ids left unanswered at the
    end of the view (allowed only for the history's pending tail), or the error.
    """
    owner: int | None = None
    wanted: list[str] = []
    answered: set[str] = set()
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            missing = [call_id for call_id in wanted if call_id not in answered]
            if missing:
                return ViewInvariantError(
                    1,
                    "call-without-results",
                    f"view[{owner}] calls {missing} without results before the next assistant "
                    f"message (view[{position}])",
                    owner,
                )
            wanted = call_ids(message)
            owner = position if wanted else None
            answered = set()
        for ref in _result_refs(message):
            if not _valid_id(ref):
                detail = f"view[{position}] carries a result id {ref!r}"
                return ViewInvariantError(1, "result-without-id", detail, position)
            assert isinstance(ref, str)
            if ref not in wanted:
                detail = f"view[{position}] answers {ref!r}, which no call of its run declares"
                return ViewInvariantError(1, "result-without-call", detail, position)
            if ref in answered:
                detail = f"view[{position}] answers {ref!r} a second time"
                return ViewInvariantError(1, "duplicate-result", detail, position)
            answered.add(ref)
    return owner, frozenset(call_id for call_id in wanted if call_id not in answered)


def _embed(
    body: Sequence[Mapping[str, Any]],
    layout: _Layout,
    truncate_chars: int | None,
    offset: int,
    *,
    reverse: bool,
) -> tuple[list[int], list[int]] | ViewInvariantError:
    """Map each view message to a slot of the display order, in order (greedy from the left
    or right): verbatim, a traceable reduced form, or exactly the synthesized result.

    Returns ``(chosen, reduced)`` (slot positions in view order; history indexes shown
    reduced), or the error for the first view message that does not fit (``held-note``
    when it is a note the history's pending tail holds back).
    """
    order = range(len(body) - 1, -1, -1) if reverse else range(len(body))
    positions = list(range(len(layout.slots)))
    if reverse:
        positions.reverse()
    chosen: list[int] = []
    reduced: list[int] = []
    cursor = 0

    def match(message: Mapping[str, Any], slot: Slot) -> str | None:
        if slot.synthesized:
            if _is_synthesized(message, slot.synthesized, slot.anthropic, slot.renamed):
                return "same"
            return None
        public = layout.rows[slot.index].public
        assert public is not None
        if _same_message(message, public):
            return "same"
        if _is_reduced_form(message, public, truncate_chars):
            return "reduced"
        return None

    for position in order:
        message = body[position]
        while cursor < len(positions):
            slot_position = positions[cursor]
            cursor += 1
            how = match(message, layout.slots[slot_position])
            if how is not None:
                chosen.append(slot_position)
                if how == "reduced":
                    reduced.append(layout.slots[slot_position].index)
                break
        else:
            where = offset + position
            held = [i for i in sorted(layout.held) if match(message, Slot(i)) is not None]
            if held:
                return ViewInvariantError(
                    3,
                    "held-note",
                    f"view[{where}] shows history[{held[0]}], a note admitted while calls of "
                    f"history[{layout.tail}] were running: it is held until they are answered "
                    f"or the run is closed, and the history ends first: {message!r:.300}",
                    where,
                )
            if any(match(message, slot) is not None for slot in layout.slots):
                return ViewInvariantError(
                    3,
                    "out-of-order",
                    f"view[{where}] is a history message out of the display order (results "
                    f"right after their call, other messages of the run after them): "
                    f"{message!r:.300}",
                    where,
                )
            return ViewInvariantError(
                4,
                "invented",
                f"view[{where}] is neither a history message nor a traceable reduced form of "
                f"one nor a synthesized result owed by the view: {message!r:.300}",
                where,
            )
    if reverse:
        chosen.reverse()
        reduced.reverse()
    return chosen, reduced


def _pairing(
    layout: _Layout,
    chosen: Sequence[int],
    tail: tuple[int | None, frozenset[str]],
    offset: int,
) -> tuple[frozenset[str], frozenset[str]] | ViewInvariantError:
    """Pairing through the embedding. Returns (pending ids, synthesized ids) or the error.

    Synthesized results are shown exactly when their call message is; a call shown has all
    of its history results shown; a result shown has its call shown; ids left unanswered at
    the end of the view belong to the history's pending tail.
    """
    shown_slots = set(chosen)
    shown = {layout.slots[k].index for k in chosen if not layout.slots[k].synthesized}
    synthesized: set[str] = set()
    for owner, positions in layout.synthesized.items():
        present = [k in shown_slots for k in positions]
        if owner in shown and not all(present):
            return ViewInvariantError(
                1,
                "synthesized-missing",
                f"the call message history[{owner}] is shown without the synthesized results "
                "its unanswered calls are owed",
            )
        if owner not in shown and any(present):
            return ViewInvariantError(
                1,
                "synthesized-without-call",
                f"synthesized results for history[{owner}] are shown without their call",
            )
        if owner in shown:
            for k in positions:
                synthesized.update(layout.slots[k].synthesized)
    for index in sorted(shown):
        row = layout.rows[index]
        assert row.public is not None
        for call_id in call_ids(row.public):
            answers = layout.results_of.get((index, call_id), [])
            missing = [a for a in answers if a not in shown]
            if missing:
                return ViewInvariantError(
                    1,
                    "call-without-results",
                    f"call {call_id!r} of history[{index}] shown without its results {missing}",
                )
        for rid, owner in row.owners.items():
            if owner not in shown:
                return ViewInvariantError(
                    1,
                    "result-without-call",
                    f"result {rid!r} of history[{index}] shown without its call (history[{owner}])",
                )
    position, unanswered = tail
    if unanswered:
        assert position is not None
        slot = layout.slots[chosen[position - offset]]
        if slot.synthesized or slot.index != layout.tail or not unanswered <= layout.tail_pending:
            return ViewInvariantError(
                1,
                "call-without-results",
                f"view[{position}] (history[{slot.index}]) leaves {sorted(unanswered)} "
                "unanswered but is not the history's pending tail",
                position,
            )
    return frozenset(unanswered), frozenset(synthesized)


def check_view_invariants(
    history: Sequence[object],
    view: object,
    *,
    factory_text: str | None = None,
    retained: Iterable[str] = (),
    protected: Iterable[Mapping[str, Any]] = (),
    truncate_chars: int | None = None,
    canonical: Sequence[object] | None = None,
    budget: int | None = None,
    dialects: Iterable[Dialect] = DIALECTS,
) -> ViewReport:
    """Raise ``ViewInvariantError`` unless ``view`` is a valid view of ``history``.

    ``history`` is the canonical history: the messages as admitted (what the caller gave
    ``add_message``/``set_messages``) or as stored (``get_messages()``; the store's ``_seq``
    and admission timestamp are then allowed to be absent from the view). A view of a
    history *prefix* (a request that raced an admission) must be checked against that
    prefix. The expected view is computed from the history alone, by these rules (the
    providers' own: OpenAI Chat Completions and Anthropic Messages):

    - **runs**: an assistant message's calls (``tool_calls``, ``tool_use``/``tool_call``
      blocks) are answered by the results (``tool`` messages, ``tool_result`` blocks)
      admitted before the next assistant message or a person's own turn (a user message
      neither machine-written - ``source: hook``, ephemeral - nor made of results only; a
      turn mixing results with typed text closes the run after answering). A result that
      answers a still unanswered id of the open run is linked to it; any other (call never
      made, made in an earlier run or only in a reference-only row, admitted before its
      call, or a second result for an answered id) is an orphan: a ``tool`` message or a
      message of nothing but results is then never shown, a block list loses its orphan
      blocks (and is never shown if nothing is left). Reference-only rows and orphans
      change no run;
    - **tidied result carriers**: in a list of blocks the orphan ``tool_result`` blocks
      (no valid id, an id the open run does not wait for, or an id answered by an earlier
      block of the same message) are left out, and the remaining ``tool_result`` blocks
      come first, in their order, before every other block (a turn answering calls begins
      with its results: Anthropic Messages);
    - **reused ids**: a call id that an earlier shown call message declared is shown as
      ``<id>~<n>`` (the smallest n >= 2 not taken) in its call and in its run's results,
      whose metadata gets ``renamed_tool_call_ids`` (shown id -> stored id);
    - **display order** (``display_order``): system messages first; then, within a run,
      the call message, then the *pure* result carriers (a ``tool`` message, a message of
      nothing but ``tool_result`` blocks) in admission order, then the run's synthesized
      results, then messages mixing results with other content, then every other message
      of the run, in admission order;
    - **held notes**: a message admitted while the open run has ids still unanswered that
      answers none of them and is neither a person's turn, an assistant message nor a
      system message (a machine-written note: ``source: hook``, an ephemeral or persisted
      envelope, a developer message, ...) is *held*: shown in its place among the run's
      other messages once the run is answered completely or closed (after the synthesized
      results, before the closing message), never while the run is pending - a history
      ending with the run pending never shows it (``ViewReport.held``). A note admitted
      when no id is pending is placed as usual;
    - **synthesized results**: when a run closes with ids unanswered, the view answers
      them after the run's pure result carriers and before its messages mixing results
      with other content, in the call's format: one ``{"role": "tool", "tool_call_id",
      "content"}`` per id declared in ``tool_calls`` or as a ``tool_call`` block, then one
      user message of ``tool_result`` blocks (``is_error: True``) for the ``tool_use``
      ids, each with a text saying no result was recorded and ``metadata ==
      {"compaction": {"form": "synthesized", "tool_call_ids": [...]}}`` (ids as shown),
      plus ``"renamed_tool_call_ids"`` (shown id -> stored id) when it answers a renamed
      id. They are shown exactly when their call message is;
    - **pending tail**: a run still open at the end of the history shows no results for
      the ids it has not received.

    Items checked:

    1. tool pairing by id, both ways, in all three formats, on the view itself: every
       result has a valid id, declared by the latest assistant message before it (no other
       assistant message in between), answered once; every call shown has results for all
       of its ids before the next assistant message, except the history's pending tail;
       and through the history: a call shown has all of its results shown (synthesized
       ones included), a result shown has its call shown. And the providers' own rules:
       for each of ``dialects`` (``provider_rules.provider_violations``), the API would
       accept the view (code ``provider-<dialect>``). The caller's own result content is
       passed through verbatim, so for OpenAI, which takes only text parts in a tool
       message, the non-text parts of verbatim results are dropped first, as a provider
       adapter does (``ViewReport.media_dropped``); pass ``dialects=()`` for a history
       whose content a provider would reject anyway;
    2. protected content, verbatim: system messages (or ``factory_text`` plus hook-sourced
       system messages), the first and the latest human prompt, every message carrying
       loaded-tool state (``metadata["openai:tool_search_items"]``), the newest envelope of
       every ``retained`` body, and every message in ``protected`` - except a held note,
       which is not shown yet;
    3. order: system messages first; the rest is a subsequence of the display order above
       (a held note is shown nowhere: ``held-note``), plus at most one compaction notice
       (exactly ``NOTICE_METADATA``, text beginning with ``NOTICE_PREFIX``), never where
       a call before it is left unanswered (it stays where it was first shown, at the tail
       of the view its decision was made for);
    4. no invention: each message equals a history message (minus store bookkeeping), is
       a reduced form traceable to one (``metadata["compaction"]``, smaller by the
       module's estimate: a stubbed user message with ``original_chars``; a truncated
       result - string content or a block list, in a ``tool`` message or in
       ``tool_result`` blocks, with ``original_tokens`` and ``"protected": True`` for the
       last-resort form of a protected result; an assistant message without its thinking
       blocks, ``thoughtless``), or is a synthesized result the rules
       above owe; no ``_seq`` or ``amplifier_public_*`` key leaks;
    5. when ``budget`` is given, the view's estimate (``estimate_message``, the counter
       the module budgets with) does not exceed it;
    6. when ``canonical`` (the history read again after the call) is given, it equals
       ``history``;
    7. isolation: the view is a new list of new message and metadata dicts (no object of
       ``history`` is shared, no message dict appears twice);
    9. ``json.dumps(view)`` succeeds whenever ``json.dumps(history)`` does.
    """

    def fail(item: int, code: str, detail: str, position: int | None = None) -> ViewInvariantError:
        return ViewInvariantError(item, code, detail, position)

    if not isinstance(view, list):
        raise fail(4, "not-a-list", f"a view must be a list, got {type(view).__name__}")
    messages: list[Mapping[str, Any]] = []
    for position, message in enumerate(view):
        if not isinstance(message, dict):
            raise fail(4, "not-a-dict", f"view[{position}] is {type(message).__name__}")
        messages.append(message)

    # 9: serialisable (for a serialisable history)
    if _json_ok(list(history)) and not _json_ok(view):
        raise fail(9, "json", "json.dumps(view) fails for a JSON-serialisable history")

    # 4: no bookkeeping leaks
    for position, message in enumerate(messages):
        leaked = sorted(key for key in _meta(message) if key in _HIDDEN)
        if leaked:
            raise fail(4, "bookkeeping-leak", f"view[{position}] carries {leaked}")

    # 7: isolation by identity
    history_objects = {id(m) for m in history} | {
        id(m.get("metadata")) for m in history if isinstance(m, Mapping) and m.get("metadata")
    }
    seen: set[int] = set()
    if view is history:
        raise fail(7, "shared-list", "the view is the history list itself")
    for position, message in enumerate(messages):
        metadata = message.get("metadata")
        if id(message) in history_objects or (
            isinstance(metadata, dict) and metadata and id(metadata) in history_objects
        ):
            raise fail(7, "shared-dict", f"view[{position}] shares a dict with the history")
        if id(message) in seen:
            raise fail(7, "repeated-dict", f"view[{position}] is the same dict as another")
        seen.add(id(message))

    # 3: system messages first
    systems = 0
    while systems < len(messages) and messages[systems].get("role") == "system":
        systems += 1
    late = [i for i in range(systems, len(messages)) if messages[i].get("role") == "system"]
    if late:
        raise fail(3, "system-late", f"system message at view[{late[0]}] after the conversation")

    layout = _layout(history)
    rows = layout.rows
    stored_notices = [r.public for r in rows if r.public is not None and is_notice(r.public)]
    placed = [
        i
        for i in range(systems, len(messages))
        if is_notice(messages[i]) and not any(_same_message(messages[i], n) for n in stored_notices)
    ]

    # 1: pairing by id, on the view alone (runs; positions as if the notice were not shown)
    tail = _runs_in_view([m for i, m in enumerate(messages) if i not in placed])
    if isinstance(tail, ViewInvariantError):
        raise tail

    # 2 + 3: the system block
    stored_systems: list[Mapping[str, Any]] = [
        r.public for r in rows if r.public is not None and r.public["role"] == "system"
    ]
    if factory_text is not None:
        expected: list[Mapping[str, Any]] = [{"role": "system", "content": factory_text}]
        expected += [s for s in stored_systems if _meta(s).get("source") == "hook"]
    else:
        expected = stored_systems
    shown_systems = messages[:systems]
    if len(shown_systems) != len(expected) or not all(
        _same_message(a, b) for a, b in zip(shown_systems, expected, strict=False)
    ):
        raise fail(2, "systems", f"system block {shown_systems!r:.300} != {expected!r:.300}")

    # 3 + 4: at most one notice, never between a call and its results
    body = messages[systems:]
    placed = [i - systems for i in placed]
    if len(placed) > 1:
        raise fail(3, "notice-twice", f"{len(placed)} compaction notices in one view")
    notice = bool(placed)
    if notice:
        at = placed[0]
        before_notice = _runs_in_view(messages[: systems + at])
        assert not isinstance(before_notice, ViewInvariantError)
        if before_notice[1]:
            raise fail(
                3,
                "notice-unsafe",
                f"compaction notice between calls {sorted(before_notice[1])} and their results",
            )
        body = body[:at] + body[at + 1 :]

    # 3 + 4: a subsequence of the display order, each message verbatim, a traceable reduced
    # form or an owed synthesized result. Equal messages (a duplicated row) make the
    # embedding ambiguous, so pairing is judged on the leftmost and on the rightmost
    # embedding; the view passes if either is consistent.
    leftmost = _embed(body, layout, truncate_chars, systems, reverse=False)
    if isinstance(leftmost, ViewInvariantError):
        raise leftmost
    rightmost = _embed(body, layout, truncate_chars, systems, reverse=True)
    assert not isinstance(rightmost, ViewInvariantError)

    # 1: pairing by id, through the embedding
    chosen, reduced = leftmost
    pairing = _pairing(layout, chosen, tail, systems)
    if isinstance(pairing, ViewInvariantError):
        second = _pairing(layout, rightmost[0], tail, systems)
        if isinstance(second, ViewInvariantError):
            raise pairing
        pairing = second
        chosen, reduced = rightmost
    pending, synthesized = pairing
    mapping = [layout.slots[k].index for k in chosen if not layout.slots[k].synthesized]

    # 2: protected content, verbatim
    must: list[Mapping[str, Any]] = []
    humans = [r.public for r in rows if r.public is not None and _is_human(r.public)]
    if humans:
        must += [humans[0], humans[-1]]
    must += [
        r.public
        for r in rows
        if r.public is not None
        and r.public["role"] != "system"
        and _meta(r.public).get(LOADED_TOOL_STATE)
        and r.index not in layout.held  # a held note is not shown yet
    ]
    for text in retained:
        envelopes = [
            r
            for r in rows
            if r.public is not None and _is_envelope(r.public) and r.public["content"] == text
        ]
        if not envelopes:
            raise fail(2, "retained-missing", f"no envelope in the history carries {text[:60]!r}")
        newest = envelopes[-1]
        if newest.index not in layout.held:  # a held envelope is not shown yet
            assert newest.public is not None
            must.append(newest.public)
    must += list(protected)
    for message in must:
        if not any(_same_message(shown_message, message) for shown_message in body):
            raise fail(2, "protected", f"missing or altered: {message!r:.300}")

    # 1: the providers' own rules
    # (positions in the view as sent: past the notice, one further)
    verbatim = {
        systems + offset + (1 if notice and offset >= placed[0] else 0)
        for offset, k in enumerate(chosen)
        if not layout.slots[k].synthesized and reduced_kind(body[offset]) is None
    }
    media_dropped = _provider_rules(messages, verbatim, dialects)

    # 5: the budget
    if budget is not None:
        total = sum(estimate_message(m) for m in messages)
        if total > budget:
            raise fail(5, "over-budget", f"the view's estimate {total} exceeds the budget {budget}")

    # 6: canonical unchanged
    if canonical is not None and [freeze(m) for m in canonical] != [freeze(m) for m in history]:
        raise fail(6, "canonical-changed", "the canonical history changed")

    kinds = [reduced_kind(m) for m in body]
    return ViewReport(
        systems=systems,
        mapping=tuple(mapping),
        reduced=tuple(reduced),
        notice=notice,
        pending=pending,
        synthesized=synthesized,
        held=layout.held,
        truncated=kinds.count("truncated"),
        stubbed=kinds.count("stubbed"),
        list_results=sum(1 for m in body if _has_list_result(m)),
        media_dropped=media_dropped,
    )


MUTATION_MARK: Final = "mutated-by-the-test"
"""What ``mutate_view`` writes: a view that later carries it leaked a mutation."""


def mutate_view(view: list[dict[str, Any]]) -> None:
    """Set, replace and delete keys of every view message and of its metadata; append one."""
    for message in view:
        message["content"] = MUTATION_MARK
        message[MUTATION_MARK] = True
        message.pop("tool_call_id", None)
        metadata = message.get("metadata")
        if isinstance(metadata, dict):
            metadata[MUTATION_MARK] = True
            metadata.pop("timestamp", None)
            metadata.pop("source", None)
        else:
            message["metadata"] = {MUTATION_MARK: True}
    view.append({"role": "user", "content": MUTATION_MARK})


async def check_isolation(
    manager: ContextStore,
    view: list[dict[str, Any]],
    next_view: Callable[[], Awaitable[list[dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """Item 7: mutating ``view`` (``mutate_view``) changes neither the store nor the next view.

    ``next_view`` rebuilds the view (e.g. the same request again). The store's observable
    state must not change when the view is mutated; the next view must carry no trace of
    the mutation; and when that next request committed nothing new (the store's version
    did not move), it must equal ``view`` as it was returned. Returns the next view.
    """
    before = snapshot(manager)
    expected = freeze(view)
    mutate_view(view)
    if snapshot(manager) != before:
        raise ViewInvariantError(7, "isolation", "mutating a view changed the store")
    again = await next_view()
    if MUTATION_MARK in json.dumps(again, default=str):
        raise ViewInvariantError(7, "isolation", "mutating a view leaked into the next view")
    if manager.version == before.version and freeze(again) != expected:
        raise ViewInvariantError(
            7, "isolation", "the next view differs although nothing new was committed"
        )
    return again
