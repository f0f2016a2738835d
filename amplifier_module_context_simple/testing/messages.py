"""How the view oracle reads a message: tool calls and results in the three formats,
people's turns, envelopes, the compaction notice, reduced forms and synthesized results.

Written from the providers' tool-use rules (OpenAI Chat Completions, Anthropic Messages)
and the module's documented message shapes, independently of the module's own
classification code (``context/history/classify.py``). The public helpers (``call_ids``,
``result_ids``, ``is_notice``, ``strip_notice``, ``tail_is_safe``, ``reduced_kind``) are
what a test needs to read a view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from ..context.counting.estimate import estimate_message

__all__ = (
    "LOADED_TOOL_STATE",
    "NOTICE_METADATA",
    "NOTICE_PREFIX",
    "call_ids",
    "is_notice",
    "notice_index",
    "reduced_kind",
    "result_ids",
    "strip_notice",
    "tail_is_safe",
)

_SEQ: Final = "_seq"
_HIDDEN: Final = frozenset(
    {
        _SEQ,
        "amplifier_public_message",
        "amplifier_public_copy_source",
        "amplifier_public_reference_only",
    }
)
"""History-only metadata keys: never in a view."""
_NOTICE_SOURCE: Final = "context-compaction"
NOTICE_METADATA: Final = {"source": _NOTICE_SOURCE, "ephemeral": True}
"""The metadata of the tail compaction notice, exactly."""
NOTICE_PREFIX: Final = f'<system-reminder source="{_NOTICE_SOURCE}">'
"""How the notice's text begins."""
LOADED_TOOL_STATE: Final = "openai:tool_search_items"
"""Metadata key of a message carrying loaded-tool state: shown verbatim in every view."""
_TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})

M = TypeVar("M", bound=Mapping[str, Any])


def _get(obj: object, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _meta(message: Mapping[str, Any]) -> Mapping[str, Any]:
    value = message.get("metadata")
    return value if isinstance(value, Mapping) else {}


def _call_formats(message: Mapping[str, Any]) -> dict[str, bool]:
    """Call id -> whether it is an Anthropic ``tool_use`` block, in declaration order.

    An assistant message declares calls in ``tool_calls`` (OpenAI and Amplifier) and in
    ``tool_use``/``tool_call`` content blocks; an id stated twice is one call, in the form
    met first (``tool_calls`` before the content).
    """
    if message.get("role") != "assistant":
        return {}
    formats: dict[str, bool] = {}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            value = _get(call, "id")
            if not _valid_id(value):
                value = _get(call, "tool_call_id")
            if _valid_id(value):
                formats.setdefault(value, False)
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            kind = _get(block, "type")
            if kind in ("tool_use", "tool_call") and _valid_id(_get(block, "id")):
                formats.setdefault(_get(block, "id"), kind == "tool_use")
    return formats


def call_ids(message: Mapping[str, Any]) -> list[str]:
    """Call ids an assistant message declares (all three formats), in order, unique."""
    return list(_call_formats(message))


def _result_blocks(message: Mapping[str, Any]) -> list[object]:
    content = message.get("content")
    if message.get("role") in ("assistant", "tool") or not isinstance(content, list):
        return []
    return [block for block in content if _get(block, "type") == "tool_result"]


def _block_result_id(block: object) -> object:
    value = _get(block, "tool_use_id")
    return value if _valid_id(value) else _get(block, "tool_call_id")


def _result_refs(message: Mapping[str, Any]) -> list[object]:
    """The raw id of every result a message carries (possibly missing or not a string)."""
    if message.get("role") == "tool":
        return [message.get("tool_call_id")]
    return [_block_result_id(block) for block in _result_blocks(message)]


def result_ids(message: Mapping[str, Any]) -> list[str]:
    """Result ids a message carries (a ``tool`` message, ``tool_result`` blocks)."""
    return [ref for ref in _result_refs(message) if isinstance(ref, str) and ref]


def _carries_only_results(message: Mapping[str, Any]) -> bool:
    """A *pure* result carrier: a ``tool`` message, or non-empty block content that is
    nothing but ``tool_result`` blocks (whatever their ids)."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return (
        message.get("role") != "assistant"
        and isinstance(content, list)
        and bool(content)
        and len(_result_blocks(message)) == len(content)
    )


def _only_results(message: Mapping[str, Any]) -> bool:
    """A pure result carrier that answers at least one id."""
    return _carries_only_results(message) and bool(result_ids(message))


def _is_human(message: Mapping[str, Any]) -> bool:
    metadata = _meta(message)
    return (
        message.get("role") == "user"
        and not metadata.get("ephemeral")
        and metadata.get("source") not in ("hook", _NOTICE_SOURCE)
        and not _only_results(message)
    )


def _is_envelope(message: Mapping[str, Any]) -> bool:
    metadata = _meta(message)
    return (
        message.get("role") == "user"
        and metadata.get("ephemeral") is True
        and metadata.get("persisted") is True
        and isinstance(message.get("content"), str)
    )


_THINKING = frozenset({"thinking", "redacted_thinking"})


def is_notice(message: Mapping[str, Any]) -> bool:
    """The tail compaction notice: a user message with exactly ``NOTICE_METADATA`` whose
    text begins with ``NOTICE_PREFIX``."""
    content = message.get("content")
    return (
        message.get("role") == "user"
        and message.get("metadata") == NOTICE_METADATA
        and isinstance(content, str)
        and content.startswith(NOTICE_PREFIX)
    )


def strip_notice(view: Sequence[M]) -> list[M]:
    """``view`` without its compaction notice (wherever it is shown)."""
    return [message for message in view if not is_notice(message)]


def notice_index(view: Sequence[Mapping[str, Any]]) -> int | None:
    """The position of the compaction notice in ``view``, or None."""
    return next((i for i, message in enumerate(view) if is_notice(message)), None)


def unanswered_at_end(view: Sequence[Mapping[str, Any]]) -> list[str]:
    """Ids of the last assistant message's calls with no result after it in ``view``."""
    answered: set[str] = set()
    for message in reversed(view):
        if message.get("role") == "assistant":
            return [call_id for call_id in call_ids(message) if call_id not in answered]
        answered.update(result_ids(message))
    return []


def tail_is_safe(view: Sequence[Mapping[str, Any]]) -> bool:
    """No call of ``view`` is left unanswered at its end (where a notice may go)."""
    return not unanswered_at_end(view)


def reduced_kind(message: Mapping[str, Any]) -> str | None:
    """The reduced form a view message is shown in (``metadata["compaction"]["form"]``:
    ``truncated``, ``stubbed`` or ``synthesized``), or None."""
    note = _meta(message).get("compaction")
    form = _get(note, "form")
    return form if isinstance(form, str) else None


def _normal(message: Mapping[str, Any], *, drop_time: bool) -> dict[str, Any]:
    """``message`` without store bookkeeping; empty or missing metadata read as absent."""
    out = dict(message)
    metadata = out.pop("metadata", None)
    if isinstance(metadata, Mapping):
        kept = {
            k: v
            for k, v in metadata.items()
            if k not in _HIDDEN and not (drop_time and k == "timestamp")
        }
        if kept:
            out["metadata"] = kept
    elif metadata is not None:
        out["metadata"] = metadata
    return out


def _same_message(shown: Mapping[str, Any], public: Mapping[str, Any]) -> bool:
    """``shown`` is ``public`` as a view shows it (the store's timestamp may be absent)."""
    drop_time = "timestamp" not in _meta(shown)
    return _normal(shown, drop_time=False) == _normal(public, drop_time=drop_time)


def _text_hint(content: object) -> str:
    """The first words of a message's text (how a stub is traced to its source)."""
    if isinstance(content, str):
        return " ".join(content[:50].split())
    return ""


def _kept_pieces(blocks: list[Any], keep: int) -> list[str]:
    """The text each direct text block keeps when ``keep`` characters are kept in total,
    earlier text first."""
    pieces: list[str] = []
    remaining = keep
    for block in blocks:
        text = _get(block, "text")
        if _get(block, "type") in _TEXT_TYPES and isinstance(text, str):
            piece = text[:remaining]
            remaining -= len(piece)
            pieces.append(piece)
    return pieces


def _reduced_content(before: object, after: object, keep: int | None) -> bool:
    """``after`` is one tool result's content (a string or a block list) reduced.

    A string keeps its first ``keep`` characters; a block list becomes a list of at most one
    more block (a lead-in) in which every block is an original block or a text block, and
    which keeps the first ``keep`` characters of the original's text (non-text blocks give
    way to short text placeholders). ``keep`` None: the amount kept is not checked.
    """
    if isinstance(before, str):
        return isinstance(after, str) and (keep is None or before[:keep] in after)
    if not (isinstance(before, list) and isinstance(after, list)):
        return False
    if len(after) > len(before) + 1:
        return False
    texts: list[str] = []
    for block in after:
        text = _get(block, "text")
        if _get(block, "type") in _TEXT_TYPES and isinstance(text, str):
            texts.append(text)
        elif not any(block == old for old in before):
            return False
    joined = "\n".join(texts)
    return keep is None or all(piece in joined for piece in _kept_pieces(before, keep))


_TRUNCATED_NOTE: Final = frozenset({"form", "original_tokens", "protected"})


def _is_thoughtless(shown: Mapping[str, Any], public: Mapping[str, Any]) -> bool:
    """``shown`` is the assistant message ``public`` without its thinking blocks, every
    other block and key as they were (what a view shows after a compaction changed the
    prefix that thinking was produced with)."""
    before = public.get("content")
    if public.get("role") != "assistant" or not isinstance(before, list):
        return False
    kept = [b for b in before if not (isinstance(b, Mapping) and b.get("type") in _THINKING)]
    if len(kept) == len(before):
        return False
    return _same_message(shown, {**public, "content": kept})


def _is_reduced_form(
    shown: Mapping[str, Any], public: Mapping[str, Any], truncate_chars: int | None
) -> bool:
    """``shown`` is a reduced form of ``public`` (a history message as views show it).

    It keeps everything but the content, carries ``metadata["compaction"]`` (the message's
    own metadata unchanged besides), is smaller by the module's estimate (a reduced form
    only ever shrinks), and is traceable: a *stub* (a user message with string content)
    keeps the first words and states ``original_chars``; a *truncated* result (a ``tool``
    message or ``tool_result`` blocks, string or block-list content) keeps the first
    ``truncate_chars`` characters of its text (the last-resort form of a protected result,
    ``"protected": True``, may keep less) and states ``original_tokens``, the estimate of
    the message it reduces.
    """
    if _is_thoughtless(shown, public):
        return True
    note = _meta(shown).get("compaction")
    form = _get(note, "form")
    if form not in ("truncated", "stubbed") or not isinstance(note, Mapping):
        return False
    shell = {k: v for k, v in shown.items() if k not in ("content", "metadata")}
    if shell != {k: v for k, v in public.items() if k not in ("content", "metadata")}:
        return False
    shown_meta = {k: v for k, v in _meta(shown).items() if k != "compaction"}
    drop_time = "timestamp" not in shown_meta
    as_shown = _normal(public, drop_time=drop_time)
    if _normal({"metadata": shown_meta}, drop_time=False).get("metadata", {}) != as_shown.get(
        "metadata", {}
    ):
        return False
    original_tokens = estimate_message(as_shown)
    if estimate_message(shown) >= original_tokens:
        return False  # a reduced form only ever shrinks
    before, after = public.get("content"), shown.get("content")
    if form == "stubbed":
        return (
            public.get("role") == "user"
            and isinstance(before, str)
            and isinstance(after, str)
            and note.get("original_chars") == len(before)
            and _text_hint(before) in after
        )
    if not _only_results(public):
        return False
    if not _TRUNCATED_NOTE.issuperset(note) or note.get("original_tokens") != original_tokens:
        return False
    protected = _get(note, "protected")
    if protected not in (None, True):
        return False
    # the last-resort form of a protected result may keep less than ``truncate_chars``
    keep = None if protected else truncate_chars
    if public.get("role") == "tool" or not isinstance(before, list):
        return _reduced_content(before, after, keep)
    if not (isinstance(after, list) and len(before) == len(after)):
        return False
    for old, new in zip(before, after, strict=True):
        if old == new:
            continue
        if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
            return False
        if _get(old, "type") != "tool_result":
            return False
        if {k: v for k, v in old.items() if k != "content"} != {
            k: v for k, v in new.items() if k != "content"
        }:
            return False
        if not _reduced_content(old.get("content"), new.get("content"), keep):
            return False
    return True


def _says_no_result(text: object) -> bool:
    return isinstance(text, str) and "no result" in text.lower()


def _is_synthesized(
    shown: Mapping[str, Any],
    ids: tuple[str, ...],
    anthropic: bool,
    renamed: tuple[tuple[str, str], ...] = (),
) -> bool:
    """``shown`` is exactly the synthesized result the view owes for ``ids`` (as shown;
    ``renamed``: (shown id, stored id) of those views rename)."""
    note: dict[str, Any] = {"compaction": {"form": "synthesized", "tool_call_ids": list(ids)}}
    if renamed:
        note["renamed_tool_call_ids"] = dict(renamed)
    if shown.get("metadata") != note:
        return False
    content = shown.get("content")
    if not anthropic:
        return (
            set(shown) == {"role", "tool_call_id", "content", "metadata"}
            and shown["role"] == "tool"
            and shown["tool_call_id"] == ids[0]
            and _says_no_result(content)
        )
    return (
        set(shown) == {"role", "content", "metadata"}
        and shown["role"] == "user"
        and isinstance(content, list)
        and len(content) == len(ids)
        and all(
            isinstance(block, Mapping)
            and set(block) == {"type", "tool_use_id", "is_error", "content"}
            and block["type"] == "tool_result"
            and block["tool_use_id"] == call_id
            and block["is_error"] is True
            and _says_no_result(block["content"])
            for block, call_id in zip(content, ids, strict=True)
        )
    )
