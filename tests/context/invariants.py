"""The view invariant oracle (RELIABILITY.md section 7, items 1-4, 6, 7, and 9).

``check_view_invariants(history, view, ...)`` checks a returned view against the history it
was built from, given as the messages the caller admitted (the arguments of
``add_message``/``set_messages``, in order; for a request that raced an admission, the
prefix it saw): a view shows a message as the caller gave it, minus the history-only
``amplifier_public_*`` keys (the store's own ``_seq`` and stamped timestamp stay in
``get_messages()``). It is written from the contract - the providers' own tool-use rules
(OpenAI Chat Completions, Anthropic Messages) - independently of the package's own
classification and ordering code (and of ``testing.check_view_invariants``).

The expected view, computed from the history alone (``expected_layout``):

- **runs**: an assistant message's calls are answered by the results admitted before the
  next assistant message, or before a person's own turn (a user message neither
  machine-written - ``source: hook``, ephemeral - nor made of results only; a turn mixing
  results with typed text closes the run after answering). A result answering a still
  unanswered id of the open run is linked; any other result is an *orphan* (its call never
  made, made in an earlier run or only in a reference-only row, admitted before its call,
  or a second result for an answered id). A ``tool`` message or a message of nothing but
  results that answers nothing never reaches a view; a block list loses its orphan
  ``tool_result`` blocks (the message disappears if nothing is left). Rows that never
  reach a view change no run.
- **tidied result carriers**: a block list keeps its linked ``tool_result`` blocks only
  (orphans, blocks naming no valid id and a second block for an id already answered in
  the same message are dropped) and shows them first, in their order, before every other
  block (Anthropic: a turn answering calls begins with its results).
- **reused ids**: a call id an earlier shown call message declared is shown renamed
  ``<id>~<n>`` (smallest free n >= 2) in its call and its run's results, whose metadata
  gets ``renamed_tool_call_ids`` (shown id -> stored id).
- **display order** (a sort key per message): system messages first; a message outside
  any run in admission order; in a run, the call message, then its synthesized results,
  then the *pure* result carriers (``tool`` messages, messages of nothing but
  ``tool_result`` blocks), then messages mixing results with other content, then every
  other message of the run, each group in admission order.
- **held notes**: a message admitted while the open run still has unanswered ids that
  answers none of them and is no person's turn, assistant or system message (a
  machine-written note: hook, ephemeral or persisted envelope, developer message, ...)
  is held: it is shown among the run's other messages once the run is answered
  completely or closed (after the synthesized results, before the closing message), and
  never while the run is pending; a history that ends with the run pending shows it
  nowhere (``Layout.held``). A note admitted when no id is pending is placed as usual.
- **synthesized results**: a run closed with ids unanswered owes them right after the
  call: ``{"role": "tool", "tool_call_id", "content"}`` per id
  of a ``tool_calls`` entry or ``tool_call`` block, then one user message of ``tool_result``
  blocks with ``is_error: True`` for its ``tool_use`` ids; each says no result was
  recorded and has ``metadata == {"compaction": {"form": "synthesized", "tool_call_ids":
  [...]}}``. They are shown exactly when their call message is.
- **pending tail**: a run still open at the end of the history (no later assistant
  message or person's turn) shows its missing results as absent.

Checked:

1. tool pairing both ways, by id (never adjacency), on the view itself: every result has a
   call of its own run earlier in the view (no assistant message in between), answered
   once; every call has results for all of its ids before the next assistant message,
   except the history's pending tail; and through the history: a call shown has all of its
   results shown, a result its call, synthesized results travel with their call;
2. protected content verbatim: system messages (or the factory prompt plus hook-sourced
   system messages), the first and latest human prompts, loaded-tool state, and the newest
   envelope of every retained body - except a held note, which is not shown;
3. order: system messages first; the rest is a subsequence of the display order (a held
   note is shown nowhere);
4. no invention: every non-system message equals the provider-facing form of a history
   message, or is a traceable reduced form of one (``metadata["compaction"]``, only ever
   smaller: a stubbed user message; a truncated result with string or block-list content,
   in a ``tool`` message or ``tool_result`` blocks, ``"protected": True`` for the
   last-resort form of a protected result), or is an owed synthesized result, or is the
   single tail compaction notice (normal or minimal text) in a view that leaves no call
   unanswered;
9. ``json.dumps(view)`` works; no ``_seq`` or ``amplifier_public_*`` key leaks.

Items 6 and 7 (canonical unchanged, isolation) need the store; ``assert_isolated`` does 7.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from amplifier_module_context_simple.context.estimate import estimate_message

NOTICE_METADATA = {"source": "context-compaction", "ephemeral": True}
NOTICE_PREFIX = '<system-reminder source="context-compaction">'
HIDDEN_METADATA = (
    "_seq",
    "amplifier_public_message",
    "amplifier_public_copy_source",
    "amplifier_public_reference_only",
)
LOADED_TOOL_STATE = "openai:tool_search_items"
TEXT_BLOCKS = ("text", "input_text", "output_text")

EXAMPLES: Counter[str] = Counter()
"""Tallies of what the context property tests exercised (printed by ``conftest.py``)."""


class InvariantError(AssertionError):
    """A view broke an invariant; the message says which and where."""


# -- independent classification -------------------------------------------------------


def _field(block: object, key: str) -> Any:
    return block.get(key) if isinstance(block, Mapping) else getattr(block, key, None)


def _id(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def metadata(message: Mapping[str, Any]) -> Mapping[str, Any]:
    value = message.get("metadata")
    return value if isinstance(value, Mapping) else {}


def declared_calls(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(id, format)`` of the calls an assistant message declares, first statement wins:
    format ``"tool"`` (answered by a ``tool`` message: ``tool_calls`` entries and
    ``tool_call`` blocks) or ``"block"`` (``tool_use`` blocks, answered by ``tool_result``
    blocks)."""
    if message.get("role") != "assistant":
        return []
    found: dict[str, str] = {}
    for call in message.get("tool_calls") or []:
        call_id = _id(_field(call, "id")) or _id(_field(call, "tool_call_id"))
        if call_id and call_id not in found:
            found[call_id] = "tool"
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            kind = _field(block, "type")
            call_id = _id(_field(block, "id"))
            if kind in ("tool_use", "tool_call") and call_id and call_id not in found:
                found[call_id] = "block" if kind == "tool_use" else "tool"
    return list(found.items())


def call_ids(message: Mapping[str, Any]) -> list[str]:
    """Call ids an assistant message declares, in all three formats."""
    return [call_id for call_id, _ in declared_calls(message)]


def result_refs(message: Mapping[str, Any]) -> list[object]:
    """The id of every result a message carries, as given (maybe missing or junk)."""
    if message.get("role") == "tool":
        return [message.get("tool_call_id")]
    content = message.get("content")
    if message.get("role") == "assistant" or not isinstance(content, list):
        return []
    return [
        _id(_field(b, "tool_use_id")) or _field(b, "tool_call_id")
        for b in content
        if _field(b, "type") == "tool_result"
    ]


def result_ids(message: Mapping[str, Any]) -> list[str]:
    """Result ids a message carries (a tool message, or tool_result blocks)."""
    return [ref for ref in result_refs(message) if isinstance(ref, str) and ref]


def pure_carrier(message: Mapping[str, Any]) -> bool:
    """A ``tool`` message, or non-empty block content made of tool_result blocks only."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return (
        message.get("role") != "assistant"
        and isinstance(content, list)
        and bool(content)
        and all(_field(b, "type") == "tool_result" for b in content)
    )


def only_results(message: Mapping[str, Any]) -> bool:
    """True for a message that carries tool results and nothing else."""
    return pure_carrier(message) and bool(result_ids(message))


def is_human(message: Mapping[str, Any]) -> bool:
    meta = metadata(message)
    return (
        message.get("role") == "user"
        and not meta.get("ephemeral")
        and meta.get("source") not in ("hook", "context-compaction")
        and not only_results(message)
    )


def is_envelope(message: Mapping[str, Any]) -> bool:
    meta = metadata(message)
    return (
        message.get("role") == "user"
        and meta.get("ephemeral") is True
        and meta.get("persisted") is True
        and isinstance(message.get("content"), str)
    )


def is_notice(message: Mapping[str, Any]) -> bool:
    return (
        message.get("role") == "user"
        and message.get("metadata") == NOTICE_METADATA
        and isinstance(message.get("content"), str)
        and message["content"].startswith(NOTICE_PREFIX)
    )


def reduced_kind(message: Mapping[str, Any]) -> str | None:
    note = metadata(message).get("compaction")
    return note.get("form") if isinstance(note, Mapping) else None


def has_list_result(message: Mapping[str, Any]) -> bool:
    """Whether a message carries a tool result whose content is a list of blocks."""
    content = message.get("content")
    if message.get("role") == "tool":
        return isinstance(content, list)
    return bool(result_ids(message)) and any(
        _field(b, "type") == "tool_result" and isinstance(_field(b, "content"), list)
        for b in content or []
    )


def unanswered_at_end(view: Sequence[Mapping[str, Any]]) -> list[str]:
    """Ids of the last assistant message's calls with no result after it in ``view``."""
    answered: set[str] = set()
    for message in reversed(view):
        if message.get("role") == "assistant":
            return [call_id for call_id in call_ids(message) if call_id not in answered]
        answered.update(result_ids(message))
    return []


def tail_is_safe(view: Sequence[Mapping[str, Any]]) -> bool:
    """No call of the view is left unanswered at its end (where a notice may go)."""
    return not unanswered_at_end(view)


# -- the history as views must show it ------------------------------------------------


@dataclass
class Row:
    """One history message as a view may show it."""

    index: int
    stored: Mapping[str, Any]
    public: dict[str, Any] | None  # None: never in a view (reference-only, orphan-only)
    owners: dict[str, int] = field(default_factory=dict)  # linked result id -> call index
    key: tuple[int, int, int] = (0, 0, 0)
    """Sort key of the display order: (run, rank, admission)."""


@dataclass
class Synthesized:
    """A synthesized result a view owes right after the call message ``owner``."""

    owner: int
    ids: list[str]
    block: bool  # a user message of tool_result blocks (else a tool message, one id)
    key: tuple[int, int, int]


@dataclass
class Layout:
    rows: list[Row]
    synthesized: list[Synthesized]
    order: list[Row | Synthesized]
    """The non-system messages views may show, in display order."""
    results: dict[tuple[int, str], list[int]]
    """(call index, id) -> indexes of the linked results."""
    pending_tail: tuple[int, set[str]] | None
    """The call index of a run open at the end of the history, and its unanswered ids."""
    held: set[int] = field(default_factory=set)
    """Indexes of the notes that run holds back: in no view of this history."""


# ranks within a run
OWNER, SYNTHESIZED, PURE, MIXED, OTHER = range(5)
RENAMED = "renamed_tool_call_ids"


def fresh_names(ids: Sequence[str], taken: set[str]) -> dict[str, str]:
    """Views show a call id declared before under ``<id>~<n>``, the smallest free n >= 2."""
    names: dict[str, str] = {}
    for call_id in ids:
        if call_id in taken:
            n = 2
            while f"{call_id}~{n}" in taken | set(names.values()):
                n += 1
            names[call_id] = f"{call_id}~{n}"
    return names


def renamed(message: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``message`` with the call/result ids in ``names`` shown renamed, and the
    ``renamed_tool_call_ids`` note (shown -> stored) in its metadata."""
    out = dict(message)
    out["metadata"] = {**metadata(message), RENAMED: {new: old for old, new in names.items()}}
    assistant = message.get("role") == "assistant"
    keys = ("id", "tool_call_id") if assistant else ("tool_use_id", "tool_call_id")
    types = ("tool_use", "tool_call") if assistant else ("tool_result",)

    def rename(block: Any, check_type: bool = True) -> Any:
        if not isinstance(block, Mapping) or (check_type and block.get("type") not in types):
            return block
        return {
            k: names.get(v, v) if k in keys and isinstance(v, str) else v for k, v in block.items()
        }

    if assistant and isinstance(message.get("tool_calls"), list):
        out["tool_calls"] = [rename(call, check_type=False) for call in message["tool_calls"]]
    if not assistant and isinstance(message.get("tool_call_id"), str):
        out["tool_call_id"] = names.get(message["tool_call_id"], message["tool_call_id"])
    if isinstance(message.get("content"), list):
        out["content"] = [rename(block) for block in message["content"]]
    return out


def expected_layout(history: Sequence[Mapping[str, Any]]) -> Layout:
    """Provider-facing forms, links, synthesized results and display order (docstring)."""
    rows: list[Row] = []
    synthesized: list[Synthesized] = []
    results: dict[tuple[int, str], list[int]] = {}
    taken: set[str] = set()  # every call id a shown call message declared, and new names
    held: set[int] = set()  # notes held by the open run while an id is pending
    owner: int | None = None  # the open run's call message
    waiting: list[tuple[str, str]] = []  # its unanswered (id, format), in call order
    names: dict[str, str] = {}  # its renamed ids

    def close() -> None:
        held.clear()  # released: their OTHER keys place them after the run's results
        if owner is None or not waiting:
            return
        tools = [names.get(c, c) for c, fmt in waiting if fmt == "tool"]
        blocks = [names.get(c, c) for c, fmt in waiting if fmt == "block"]
        for n, call_id in enumerate(tools):
            synthesized.append(Synthesized(owner, [call_id], False, (owner, SYNTHESIZED, n)))
        if blocks:
            synthesized.append(Synthesized(owner, blocks, True, (owner, SYNTHESIZED, len(tools))))

    for index, stored in enumerate(history):
        row = Row(index, stored, None, key=(index, OWNER, index))
        rows.append(row)
        if metadata(stored).get("amplifier_public_reference_only") is True:
            continue
        public: dict[str, Any] = dict(stored)
        meta = stored.get("metadata")
        if isinstance(meta, Mapping):
            public["metadata"] = {k: v for k, v in meta.items() if k not in HIDDEN_METADATA}
        role = stored.get("role")
        open_ids = {call_id for call_id, _ in waiting}
        linked: list[str] = []
        if role == "tool":
            ref = _id(stored.get("tool_call_id"))
            if ref is None or ref not in open_ids:
                continue  # an orphan: never in a view
            linked = [ref]
        elif role not in ("assistant", "system") and isinstance(stored.get("content"), list):
            content = stored["content"]
            if any(_field(b, "type") == "tool_result" for b in content):
                answers, others = [], []
                for block in content:
                    ref = _id(_field(block, "tool_use_id")) or _id(_field(block, "tool_call_id"))
                    if _field(block, "type") != "tool_result":
                        others.append(block)
                    elif ref in open_ids and ref not in linked:
                        linked.append(ref)
                        answers.append(block)
                if not answers and not others:
                    continue  # nothing but orphan results
                public["content"] = answers + others  # results first
        row.public = public
        if role == "system":
            continue
        if role == "assistant":
            close()
            calls = declared_calls(stored)
            new = fresh_names([c for c, _ in calls], taken)
            taken.update(c for c, _ in calls)
            taken.update(new.values())
            if new:
                row.public = renamed(public, new)
            owner, waiting, names = (index, calls, new) if calls else (None, [], {})
            continue
        if owner is None:
            continue
        if linked:
            waiting = [(call_id, fmt) for call_id, fmt in waiting if call_id not in linked]
            shown_as = {c: names[c] for c in linked if c in names}
            if shown_as:
                row.public = renamed(public, shown_as)
            for call_id in linked:
                row.owners[names.get(call_id, call_id)] = owner
                results.setdefault((owner, names.get(call_id, call_id)), []).append(index)
            row.key = (owner, PURE if pure_carrier(stored) else MIXED, index)
            if not waiting:
                held.clear()  # answered completely: the held notes are released
        else:
            row.key = (owner, OTHER, index)
            if waiting and not is_human(stored):
                held.add(index)  # a note while calls are running
        if is_human(stored) and not pure_carrier(stored):
            close()  # a person's own turn closes the run too
            owner, waiting, names = None, [], {}
    tail = (owner, {names.get(c, c) for c, _ in waiting}) if owner is not None else None
    shown = [
        r
        for r in rows
        if r.public is not None and r.stored.get("role") != "system" and r.index not in held
    ]
    order: list[Row | Synthesized] = [*shown, *synthesized]
    order.sort(key=lambda item: item.key)
    return Layout(rows, synthesized, order, results, tail, held)


def public_rows(history: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Provider-facing forms: hidden metadata keys dropped, orphan results dropped."""
    return expected_layout(history).rows


def _first_last_human(rows: Sequence[Row]) -> list[Row]:
    humans = [r for r in rows if r.public is not None and is_human(r.stored)]
    return [humans[0], humans[-1]] if humans else []


def _clip_keeps(original: object, reduced: object, keep: int | None) -> bool:
    """``reduced`` is one result's content (string or block list) clipped to ``keep``
    characters of text (``keep`` None: any amount, the last-resort protected form)."""
    if isinstance(original, str):
        return isinstance(reduced, str) and (keep is None or original[:keep] in reduced)
    if not (isinstance(original, list) and isinstance(reduced, list)):
        return False
    if len(reduced) > len(original) + 1:  # at most a lead-in block more
        return False
    shown: list[str] = []
    for block in reduced:
        if _field(block, "type") in TEXT_BLOCKS and isinstance(_field(block, "text"), str):
            shown.append(_field(block, "text"))
        elif block not in original:  # non-text blocks are kept as they were or replaced
            return False
    if keep is None:
        return True
    remaining = keep
    for block in original:
        text = _field(block, "text")
        if _field(block, "type") in TEXT_BLOCKS and isinstance(text, str):
            piece = text[:remaining]
            remaining -= len(piece)
            if piece and not any(piece in s for s in shown):
                return False
    return True


def _is_reduced_form(
    view_message: Mapping[str, Any], public: Mapping[str, Any], truncate_chars: int | None
) -> bool:
    kind = reduced_kind(view_message)
    if kind not in ("truncated", "stubbed"):
        return False
    note = metadata(view_message)["compaction"]
    shell = {k: v for k, v in view_message.items() if k not in ("content", "metadata")}
    if shell != {k: v for k, v in public.items() if k not in ("content", "metadata")}:
        return False
    view_meta = {k: v for k, v in metadata(view_message).items() if k != "compaction"}
    if view_meta != dict(metadata(public)):
        return False
    if estimate_message(view_message) >= estimate_message(public):
        return False  # a reduced form only ever shrinks
    original, reduced = public.get("content"), view_message.get("content")
    if kind == "stubbed":
        return (
            public.get("role") == "user"
            and isinstance(original, str)
            and isinstance(reduced, str)
            and note.get("original_chars") == len(original)
            and " ".join(original[:50].split()) in reduced
        )
    if not only_results(public):
        return False
    if note.get("original_tokens") != estimate_message(public):
        return False
    if set(note) - {"form", "original_tokens", "protected"} or note.get("protected") not in (
        None,
        True,
    ):
        return False
    keep = None if note.get("protected") else truncate_chars
    if public.get("role") == "tool":
        return _clip_keeps(original, reduced, keep)
    if not (isinstance(original, list) and isinstance(reduced, list)):
        return False
    if len(original) != len(reduced):
        return False
    for old, new in zip(original, reduced, strict=True):
        if old == new:
            continue
        if _field(old, "type") != "tool_result" or not isinstance(new, Mapping):
            return False
        if {k: v for k, v in old.items() if k != "content"} != {
            k: v for k, v in new.items() if k != "content"
        }:
            return False
        if not _clip_keeps(old.get("content"), new.get("content"), keep):
            return False
    return True


def _is_synthesized(message: Mapping[str, Any], owed: Synthesized) -> bool:
    """``message`` is exactly the synthesized result ``owed``."""

    def says_no_result(text: object) -> bool:
        return isinstance(text, str) and "no result" in text.lower()

    if message.get("metadata") != {
        "compaction": {"form": "synthesized", "tool_call_ids": owed.ids}
    }:
        return False
    if not owed.block:
        return (
            sorted(message) == ["content", "metadata", "role", "tool_call_id"]
            and message["role"] == "tool"
            and message["tool_call_id"] == owed.ids[0]
            and says_no_result(message["content"])
        )
    blocks = message.get("content")
    return (
        sorted(message) == ["content", "metadata", "role"]
        and message["role"] == "user"
        and isinstance(blocks, list)
        and [b.get("tool_use_id") if isinstance(b, dict) else None for b in blocks] == owed.ids
        and all(
            sorted(b) == ["content", "is_error", "tool_use_id", "type"]
            and b["type"] == "tool_result"
            and b["is_error"] is True
            and says_no_result(b["content"])
            for b in blocks
        )
    )


@dataclass
class ViewReport:
    """What the oracle found in a valid view."""

    systems: int
    mapping: list[int]
    """History index of every non-system, non-notice view message, in view order (the call
    message's index for a synthesized result)."""
    notice: bool
    truncated: int
    stubbed: int
    pending: set[str]
    """Call ids shown without results because the history has none yet."""
    synthesized: set[str] = field(default_factory=set)
    """Call ids answered by synthesized results in the view."""
    list_results: int = 0
    """Results shown whose content is a list of blocks."""
    held: set[int] = field(default_factory=set)
    """History indexes of the notes held back by the pending tail's run (never shown)."""


def _view_runs(view: Sequence[Mapping[str, Any]], fail: Callable[[str], InvariantError]) -> None:
    """Item 1 on the view alone: results answer the run they are in, once; a run closed by
    a later assistant message has all of its results."""
    calls: list[str] = []
    answered: set[str] = set()
    for position, message in enumerate(view):
        if message.get("role") == "assistant":
            missing = [c for c in calls if c not in answered]
            if missing:
                raise fail(f"calls {missing} have no result before view[{position}] (assistant)")
            calls, answered = call_ids(message), set()
        for ref in result_refs(message):
            if not _id(ref) or ref not in calls:
                raise fail(f"view[{position}] carries result {ref!r} outside its call's run")
            if ref in answered:
                raise fail(f"view[{position}] answers {ref!r} a second time")
            answered.add(ref)


def check_view_invariants(
    history: Sequence[Mapping[str, Any]],
    view: Sequence[Mapping[str, Any]],
    *,
    factory_text: str | None = None,
    truncate_chars: int | None = None,
    retained: Iterable[str] = (),
    protected: Iterable[Mapping[str, Any]] = (),
    budget: int | None = None,
) -> ViewReport:
    """Raise ``InvariantError`` unless ``view`` is a valid view of ``history``.

    Args:
        history: the messages admitted, as the caller gave them, in admission order.
        view: the returned view.
        factory_text: the system prompt factory's text, when one is set.
        truncate_chars: the manager's setting (to trace truncated forms).
        retained: bodies retained for this request (their newest envelope is verbatim).
        protected: further provider-facing messages that must appear verbatim.
        budget: when given, the view's estimate must not exceed it (retention/hard fit).
    """

    def fail(what: str) -> InvariantError:
        return InvariantError(f"{what}\n  view roles: {[m.get('role') for m in view]}")

    # 9: serialisable, nothing internal leaks
    try:
        json.dumps(view)
    except (TypeError, ValueError) as exc:
        raise fail(f"view is not JSON-serialisable: {exc}") from exc
    for position, message in enumerate(view):
        if not isinstance(message, dict):
            raise fail(f"view[{position}] is not a dict")
        leaked = [k for k in HIDDEN_METADATA if k in metadata(message)]
        if leaked:
            raise fail(f"view[{position}] leaks history-only metadata {leaked}")

    layout = expected_layout(history)
    rows = layout.rows

    # 3 + 2: system messages first, exactly the expected ones
    systems = 0
    while systems < len(view) and view[systems].get("role") == "system":
        systems += 1
    if any(m.get("role") == "system" for m in view[systems:]):
        raise fail("a system message appears after a non-system message")
    stored_systems = [
        r.public for r in rows if r.public is not None and r.stored.get("role") == "system"
    ]
    if factory_text is not None:
        expected = [{"role": "system", "content": factory_text}]
        expected += [s for s in stored_systems if metadata(s).get("source") == "hook"]
    else:
        expected = stored_systems
    if list(view[:systems]) != expected:
        raise fail(f"system messages differ: {view[:systems]!r} != {expected!r}")

    # 1: pairing by id on the view alone (runs)
    _view_runs(view, fail)

    # 4: the tail notice is the only invented message, and only where no call is unanswered
    body = list(view[systems:])
    notice = bool(body) and is_notice(body[-1])
    if notice:
        body.pop()
        if not tail_is_safe(list(view[:-1])):
            raise fail("compaction notice placed while a tool call is unanswered")

    # 3 + 4: subsequence of the display order; each message verbatim, a traceable reduced
    # form, or the synthesized result owed at that place
    mapping: list[int] = []
    shown_rows: set[int] = set()
    shown_synthesized: set[int] = set()  # positions in layout.synthesized
    truncated = stubbed = list_results = 0
    cursor = 0
    for position, message in enumerate(body):
        while cursor < len(layout.order):
            item = layout.order[cursor]
            cursor += 1
            if isinstance(item, Synthesized):
                if _is_synthesized(message, item):
                    mapping.append(item.owner)
                    shown_synthesized.add(layout.synthesized.index(item))
                    break
                continue
            assert item.public is not None
            if message == item.public:
                mapping.append(item.index)
                shown_rows.add(item.index)
                break
            if _is_reduced_form(message, item.public, truncate_chars):
                mapping.append(item.index)
                shown_rows.add(item.index)
                if reduced_kind(message) == "truncated":
                    truncated += 1
                else:
                    stubbed += 1
                break
        else:
            for index in sorted(layout.held):
                public = rows[index].public
                assert public is not None
                if message == public or _is_reduced_form(message, public, truncate_chars):
                    raise fail(
                        f"view[{systems + position}] shows history[{index}], a note held "
                        f"while the calls of its run are running (the history ends first)"
                    )
            raise fail(
                f"view[{systems + position}] is neither a history message (in display order), "
                f"nor a traceable reduced form of one, nor an owed synthesized result: "
                f"{json.dumps(message)[:300]}"
            )
        if has_list_result(message):
            list_results += 1

    # 1: synthesized results travel with their call
    synthesized: set[str] = set()
    for n, owed in enumerate(layout.synthesized):
        if (n in shown_synthesized) != (owed.owner in shown_rows):
            raise fail(
                f"synthesized result for {owed.ids} shown={n in shown_synthesized} but its call "
                f"(history[{owed.owner}]) shown={owed.owner in shown_rows}"
            )
        if n in shown_synthesized:
            synthesized.update(owed.ids)

    # 1: pairing through the history: a call shown has all of its results shown
    pending: set[str] = set()
    for index in shown_rows:
        for cid in call_ids(rows[index].public or {}):
            answers = layout.results.get((index, cid), [])
            missing = [a for a in answers if a not in shown_rows]
            if missing:
                raise fail(f"call {cid!r} (history[{index}]) shown without its results {missing}")
            tail = layout.pending_tail
            if not answers and cid not in synthesized:
                if tail is None or tail[0] != index or cid not in tail[1]:
                    raise fail(f"call {cid!r} (history[{index}]) answered by nothing")
                pending.add(cid)
        for rid, owner in rows[index].owners.items():
            if owner not in shown_rows:
                raise fail(f"result {rid!r} (history[{index}]) shown without history[{owner}]")
    if set(unanswered_at_end(view)) != pending:
        raise fail(f"unanswered at the end {unanswered_at_end(view)} != pending tail {pending}")

    # 2: protected content verbatim
    must: list[Mapping[str, Any]] = [
        r.public for r in _first_last_human(rows) if r.public is not None
    ]
    must += [
        r.public
        for r in rows
        if r.public is not None
        and r.stored.get("role") != "system"
        and metadata(r.stored).get(LOADED_TOOL_STATE)
        and r.index not in layout.held  # a held note is not shown yet
    ]
    for text in retained:
        newest = [r for r in rows if r.public is not None and is_envelope(r.stored)]
        newest = [r for r in newest if r.stored.get("content") == text]
        if not newest:
            raise fail(f"retained body not in history: {text[:60]!r}")
        envelope = newest[-1].public
        if envelope is not None and newest[-1].index not in layout.held:
            must.append(envelope)  # (a held envelope is not shown yet)
    must += list(protected)
    for message in must:
        if message not in view:
            raise fail(f"protected message missing or altered: {json.dumps(message)[:200]}")

    if budget is not None:
        total = sum(estimate_message(m) for m in view)
        if total > budget:
            raise fail(f"view estimate {total} exceeds the budget {budget}")

    return ViewReport(
        systems,
        mapping,
        notice,
        truncated,
        stubbed,
        pending,
        synthesized,
        list_results,
        set(layout.held),
    )


# -- the providers' own rules ------------------------------------------------------------


def _as_given(message: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> bool:
    """``message`` is a history message shown exactly as the caller gave it."""
    return any(message == row.public for row in expected_layout(history).rows)


def _text_parts(content: object) -> object:
    if not isinstance(content, list):
        return content
    return [part for part in content if _field(part, "type") == "text"]


def without_media(message: Mapping[str, Any]) -> dict[str, Any]:
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


def check_provider_rules(
    view: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]]
) -> None:
    """``check_provider_valid(view, dialect)`` for OpenAI and Anthropic (``provider_rules``,
    an independent oracle), raising its first ``ProviderRuleError``.

    What the caller's own results bring is tallied instead of raised: a result the caller
    gave with non-text parts (an image) is shown verbatim, and OpenAI takes only text parts
    in tool messages (an adapter moves an Anthropic result's image to a user message after
    the tool messages, which splits a run whose results are spread over several
    messages). The module passes the caller's content through (it does not know the
    provider; its reduced forms replace such parts by text). So for OpenAI, the view with
    the non-text parts of its verbatim results dropped must be valid.
    """
    from amplifier_module_context_simple.provider_rules import provider_violations

    for error in provider_violations(view, "anthropic"):
        raise error
    if not provider_violations(view, "openai"):
        return
    stripped = [without_media(m) if _as_given(m, history) else m for m in view]
    for error in provider_violations(stripped, "openai"):
        raise error
    EXAMPLES["views valid for OpenAI once the caller's images are dropped (tolerated)"] += 1


def strip_notice(view: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The view without its trailing compaction notice."""
    return list(view[:-1]) if view and is_notice(view[-1]) else list(view)


MUTATION_MARK = "mutated-by-the-test"


def mutate_view(view: list[dict[str, Any]]) -> None:
    """Set, replace and delete keys of every view message and of its metadata."""
    for message in view:
        message["content"] = MUTATION_MARK
        message[MUTATION_MARK] = True
        message.pop("tool_call_id", None)
        meta = message.get("metadata")
        if isinstance(meta, dict):
            meta[MUTATION_MARK] = True
            meta.pop("timestamp", None)
            meta.pop("source", None)
        else:
            message["metadata"] = {MUTATION_MARK: True}
    view.append({"role": "user", "content": MUTATION_MARK})


async def assert_isolated(
    manager: Any,
    view: list[dict[str, Any]],
    next_view: Callable[[], Awaitable[list[dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """Item 7: mutating a returned view changes neither the history nor the next view.

    The next view must carry no trace of the mutation; when the next request commits no
    new compaction (same stats object), it must equal the view as it was returned.
    Returns the next view.
    """
    stored = copy.deepcopy(await manager.get_messages())
    expected = copy.deepcopy(view)
    stats = manager.last_compaction_stats
    mutate_view(view)
    if await manager.get_messages() != stored:
        raise InvariantError("mutating a view changed the canonical history")
    again = await next_view()
    if MUTATION_MARK in json.dumps(again, default=str):
        raise InvariantError("mutating a view leaked into the next view")
    if manager.last_compaction_stats is stats and again != expected:
        raise InvariantError("the next view differs although no compaction was committed")
    return again


# -- store helpers ---------------------------------------------------------------------


class RecordingHooks:
    """A minimal hook registry: records every ``emit(event, data)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        self.events.append((event, data))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [data for name, data in self.events if name == event]


@dataclass(frozen=True)
class StoreState:
    """What a request that leaves no trace must leave exactly as it was."""

    stats: Any
    removed: frozenset[int]
    truncated: frozenset[int]
    stubbed: frozenset[int]
    level: int
    meter: Any

    @classmethod
    def of(cls, manager: Any) -> StoreState:
        return cls(
            manager.last_compaction_stats,
            frozenset(manager._removed_seqs),
            frozenset(manager._truncated_seqs),
            frozenset(manager._stubbed_seqs),
            manager._sticky_level,
            manager.last_token_meter_stats,
        )

    def assert_unchanged(self, manager: Any) -> None:
        """Same stats and meter objects (identity), same decisions and level."""
        now = StoreState.of(manager)
        assert now.stats is self.stats, "last_compaction_stats object changed"
        assert now.meter is self.meter, "last_token_meter_stats object changed"
        assert (now.removed, now.truncated, now.stubbed, now.level) == (
            self.removed,
            self.truncated,
            self.stubbed,
            self.level,
        ), "sticky decisions changed"
