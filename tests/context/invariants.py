"""The view invariant oracle (RELIABILITY.md section 7, items 1-4, 6, 7, and 9).

``check_view_invariants(history, view, ...)`` checks a returned view against the history it
was built from, given as the messages the caller admitted (the arguments of
``add_message``/``set_messages``, in order): a view shows a message as the caller gave it,
minus the history-only ``amplifier_public_*`` keys (the store's own ``_seq`` and stamped
timestamp stay in ``get_messages()``). It is written from
the contract, independently of the package's own classification code:

1. tool pairing both ways, by id (never adjacency): every result in the view has its call
   earlier in the view; every call in the view has all of its history results in the view,
   unless the history itself has not answered it yet (the pending tail);
2. protected content verbatim: system messages (or the factory prompt plus hook-sourced
   system messages), the first and latest human prompts, loaded-tool state, and the newest
   envelope of every retained body;
3. order: system messages first; the rest is a subsequence of the history;
4. no invention: every non-system message equals the provider-facing form of a history
   message, or is a traceable reduced form of one (``metadata["compaction"]``, only ever
   smaller), or is the single tail compaction notice placed where no call is unanswered;
9. ``json.dumps(view)`` works; no ``_seq`` or ``amplifier_public_*`` key leaks.

Items 6 and 7 (canonical unchanged, isolation) need the store; ``assert_isolated`` does 7.
"""

from __future__ import annotations

import copy
import json
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


class InvariantError(AssertionError):
    """A view broke an invariant; the message says which and where."""


# -- independent classification -------------------------------------------------------


def _field(block: object, key: str) -> Any:
    return block.get(key) if isinstance(block, Mapping) else getattr(block, key, None)


def metadata(message: Mapping[str, Any]) -> Mapping[str, Any]:
    value = message.get("metadata")
    return value if isinstance(value, Mapping) else {}


def call_ids(message: Mapping[str, Any]) -> list[str]:
    """Call ids an assistant message declares, in all three formats."""
    if message.get("role") != "assistant":
        return []
    ids = []
    for call in message.get("tool_calls") or []:
        call_id = _field(call, "id") or _field(call, "tool_call_id")
        if call_id:
            ids.append(call_id)
    content = message.get("content")
    if isinstance(content, list):
        ids.extend(
            _field(b, "id")
            for b in content
            if _field(b, "type") in ("tool_use", "tool_call") and _field(b, "id")
        )
    return ids


def result_ids(message: Mapping[str, Any]) -> list[str]:
    """Result ids a message carries (a tool message, or tool_result blocks)."""
    if message.get("role") == "tool":
        return [message["tool_call_id"]] if message.get("tool_call_id") else []
    content = message.get("content")
    if message.get("role") == "assistant" or not isinstance(content, list):
        return []
    return [
        _field(b, "tool_use_id") or _field(b, "tool_call_id")
        for b in content
        if _field(b, "type") == "tool_result"
        and (_field(b, "tool_use_id") or _field(b, "tool_call_id"))
    ]


def only_results(message: Mapping[str, Any]) -> bool:
    """True for a message that carries tool results and nothing else."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return (
        message.get("role") != "assistant"
        and isinstance(content, list)
        and bool(content)
        and all(_field(b, "type") == "tool_result" for b in content)
        and bool(result_ids(message))
    )


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


def tail_is_safe(view: Sequence[Mapping[str, Any]]) -> bool:
    """No call of the last non-result message is left unanswered by what follows it."""
    answered: set[str] = set()
    for message in reversed(view):
        if only_results(message):
            answered.update(result_ids(message))
            continue
        return all(call_id in answered for call_id in call_ids(message))
    return True


# -- the provider-facing form of history ----------------------------------------------


@dataclass
class Row:
    """One history message as a view may show it."""

    index: int
    stored: Mapping[str, Any]
    public: dict[str, Any] | None  # None: never in a view (reference-only, orphan-only)
    owners: dict[str, int] = field(default_factory=dict)  # result id -> owner index


def public_rows(history: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Provider-facing forms: hidden metadata keys dropped, orphan results dropped."""
    rows: list[Row] = []
    declared: dict[str, int] = {}
    for index, stored in enumerate(history):
        public: dict[str, Any] | None = dict(stored)
        meta = stored.get("metadata")
        if isinstance(meta, Mapping):
            public["metadata"] = {k: v for k, v in meta.items() if k not in HIDDEN_METADATA}
        owners = {rid: declared[rid] for rid in result_ids(stored) if rid in declared}
        orphan = [rid for rid in result_ids(stored) if rid not in declared]
        if (
            metadata(stored).get("amplifier_public_reference_only") is True
            or (orphan and only_results(stored) and not owners)
            or (orphan and stored.get("role") == "tool")
        ):
            public = None
        elif orphan:
            public["content"] = [
                b
                for b in stored["content"]
                if (_field(b, "tool_use_id") or _field(b, "tool_call_id")) not in orphan
            ]
        if public is not None:  # a call that never reaches a view answers nothing
            for call_id in call_ids(stored):
                declared[call_id] = index
        rows.append(Row(index, stored, public, owners))
    return rows


def _first_last_human(rows: Sequence[Row]) -> list[Row]:
    humans = [r for r in rows if r.public is not None and is_human(r.stored)]
    return [humans[0], humans[-1]] if humans else []


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
    if not (public.get("role") == "tool" or only_results(public)):
        return False
    if note.get("original_tokens") != estimate_message(public):
        return False
    if isinstance(original, str):
        keep = original[:truncate_chars] if truncate_chars is not None else ""
        return isinstance(reduced, str) and keep in reduced
    if not (isinstance(original, list) and isinstance(reduced, list)):
        return False
    if len(original) != len(reduced):
        return False
    for old, new in zip(original, reduced, strict=True):
        if old == new:
            continue
        if {k: v for k, v in old.items() if k != "content"} != {
            k: v for k, v in new.items() if k != "content"
        }:
            return False
        inner, clipped = old.get("content"), new.get("content")
        if not (isinstance(inner, str) and isinstance(clipped, str)):
            return False
        if truncate_chars is not None and inner[:truncate_chars] not in clipped:
            return False
    return True


@dataclass
class ViewReport:
    """What the oracle found in a valid view."""

    systems: int
    mapping: list[int]
    """History index of every non-system, non-notice view message, in view order."""
    notice: bool
    truncated: int
    stubbed: int
    pending: set[str]
    """Call ids shown without results because the history has none yet."""


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

    rows = public_rows(history)

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

    # 4: the tail notice is the only invented message, and only at a safe tail
    body = list(view[systems:])
    notice = bool(body) and is_notice(body[-1])
    if notice:
        body.pop()
        if not tail_is_safe(list(view[:-1])):
            raise fail("compaction notice placed after an unanswered tool call")

    # 3 + 4: subsequence of history; each message verbatim or a traceable reduced form
    candidates = [r for r in rows if r.public is not None and r.stored.get("role") != "system"]
    mapping: list[int] = []
    truncated = stubbed = 0
    cursor = 0
    for position, message in enumerate(body):
        while cursor < len(candidates):
            row = candidates[cursor]
            cursor += 1
            assert row.public is not None
            if message == row.public:
                mapping.append(row.index)
                break
            if _is_reduced_form(message, row.public, truncate_chars):
                mapping.append(row.index)
                if reduced_kind(message) == "truncated":
                    truncated += 1
                else:
                    stubbed += 1
                break
        else:
            raise fail(
                f"view[{systems + position}] is neither a history message (in order) nor a "
                f"traceable reduced form of one: {json.dumps(message)[:300]}"
            )

    # 1: pairing by id, mapping-free: every result has its call earlier in the view
    declared: set[str] = set()
    for position, message in enumerate(view):
        for rid in result_ids(message):
            if rid not in declared:
                raise fail(f"view[{position}] carries result {rid!r} without its call before it")
        declared.update(call_ids(message))

    # 1: pairing by id through the mapping: a call shown has all of its results shown
    shown = set(mapping)
    results_of: dict[tuple[int, str], list[int]] = {}
    for row in rows:
        for rid, owner in row.owners.items():
            if row.public is not None:
                results_of.setdefault((owner, rid), []).append(row.index)
    pending: set[str] = set()
    for index in mapping:
        for cid in call_ids(history[index]):
            answers = results_of.get((index, cid), [])
            if not answers:
                pending.add(cid)
                continue
            missing = [a for a in answers if a not in shown]
            if missing:
                raise fail(f"call {cid!r} (history[{index}]) shown without its results {missing}")
        for rid, owner in rows[index].owners.items():
            if owner not in shown:
                raise fail(f"result {rid!r} (history[{index}]) shown without history[{owner}]")

    # 2: protected content verbatim
    must = [r.public for r in _first_last_human(rows) if r.public is not None]
    must += [
        r.public
        for r in rows
        if r.public is not None
        and r.stored.get("role") != "system"
        and metadata(r.stored).get(LOADED_TOOL_STATE)
    ]
    for text in retained:
        newest = [r for r in rows if r.public is not None and is_envelope(r.stored)]
        newest = [r for r in newest if r.stored.get("content") == text]
        if not newest:
            raise fail(f"retained body not in history: {text[:60]!r}")
        must.append(newest[-1].public)  # type: ignore[arg-type]
    must += list(protected)
    for message in must:
        if message not in view:
            raise fail(f"protected message missing or altered: {json.dumps(message)[:200]}")

    if budget is not None:
        total = sum(estimate_message(m) for m in view)
        if total > budget:
            raise fail(f"view estimate {total} exceeds the budget {budget}")

    return ViewReport(systems, mapping, notice, truncated, stubbed, pending)


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
