"""The tool-call formats, each in one place, and what the rest of the package asks of them.

Three wire formats carry tool calls and results (``openai.py``, ``anthropic.py``,
``amplifier.py``; ``base.py`` has what they share). Each *carrier* - a message-level list
of calls, a role whose message is a result, a content block type - has exactly one owning
format; one history, and even one message, may mix formats. The functions here walk a
message once, in its own order (message-level carriers first, then content blocks in
content order), and hand each call or result to its format. Nothing outside this package
branches on a format's keys: to add a format, write its class and add it to ``FORMATS``.

The API, one function per question asked of a message (docs/design.md section 6):

- what it declares and carries: ``tool_ids(message) -> ToolIds(calls, results,
  only_results)``, the ids of the calls an assistant message declares, the ids of the
  results any other message carries, and whether it is nothing but results; what its
  calls say: ``called_tools`` (name and arguments, for the notice) and ``answered_calls``
  (the format that answers each missing one, for synthesized results);
- which format owns a carrier: ``whole_result_format(message)``,
  ``result_block_format(block)``, ``block_format(block type)``; the owner then reads and
  rebuilds the carrier itself (``ToolFormat``'s methods);
- its views' rewrites: ``rename_calls``, ``rename_results`` (reused ids), ``results_first``
  (a turn that answers calls begins with its results);
- its estimate: ``count_message`` (its message-level result ids, its content through the
  counter, its call lists), ``has_call_lists`` and ``same_tool_fields`` (the estimator's
  shortcuts; ``RESULT_ID_KEYS``);
- its validation: ``message_fields_error``, ``block_roles_error`` (and ``BLOCK_ID_KEYS``).

The block readers (``as_plain``, ``block_field``, ``block_type``, ``is_mapping``,
``rebuildable``, ``with_field``: dicts and model objects alike) are ``base.py``'s,
re-exported here for the modules that reduce blocks in place.

``FORMATS``' order is significant in two places: the synthesized results of one call
message come in that order (``role: "tool"`` messages before a user message of result
blocks, as both providers accept them), and so do the block types named in validation
errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, NamedTuple

from .amplifier import AMPLIFIER, AmplifierFormat
from .anthropic import ANTHROPIC, AnthropicFormat
from .base import (
    Counter,
    Note,
    ToolFormat,
    as_plain,
    block_field,
    block_type,
    is_mapping,
    rebuildable,
    with_field,
)
from .openai import OPENAI, OpenAIFormat

__all__ = (
    "AMPLIFIER",
    "ANTHROPIC",
    "BLOCK_ID_KEYS",
    "CALL_BLOCK_TYPES",
    "CALL_LIST_KEYS",
    "FORMATS",
    "OPENAI",
    "RESULT_ID_KEYS",
    "AmplifierFormat",
    "AnthropicFormat",
    "Counter",
    "Note",
    "OpenAIFormat",
    "ToolFormat",
    "ToolIds",
    "answered_calls",
    "as_plain",
    "block_field",
    "block_format",
    "block_roles_error",
    "block_type",
    "called_tools",
    "count_message",
    "has_call_lists",
    "is_mapping",
    "message_fields_error",
    "rebuildable",
    "rename_calls",
    "rename_results",
    "result_block_format",
    "results_first",
    "same_tool_fields",
    "tool_ids",
    "whole_result_format",
    "with_field",
)


FORMATS: Final[tuple[ToolFormat, ...]] = (OPENAI, ANTHROPIC, AMPLIFIER)

_LIST_FORMATS: Final = tuple(f for f in FORMATS if f.calls_key is not None)
_RESULT_ROLES: Final[Mapping[str, ToolFormat]] = {
    f.result_role: f for f in FORMATS if f.result_role is not None
}
_CALL_BLOCKS: Final[Mapping[str | None, ToolFormat]] = {
    kind: f for f in FORMATS for kind in sorted(f.call_block_types)
}
_RESULT_BLOCKS: Final[Mapping[str | None, ToolFormat]] = {
    kind: f for f in FORMATS for kind in sorted(f.result_block_types)
}
_BLOCKS: Final[Mapping[Any, ToolFormat]] = {**_CALL_BLOCKS, **_RESULT_BLOCKS}

CALL_LIST_KEYS: Final[tuple[str, ...]] = tuple(f.calls_key for f in _LIST_FORMATS if f.calls_key)
"""Message-level keys holding lists of calls."""
RESULT_ID_KEYS: Final[tuple[str, ...]] = tuple(
    f.result_id_key for f in FORMATS if f.result_id_key is not None
)
"""Message-level keys naming the call a message answers."""
CALL_BLOCK_TYPES: Final[tuple[str, ...]] = tuple(k for k in _CALL_BLOCKS if k is not None)
BLOCK_ID_KEYS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(
        key
        for f in FORMATS
        for key in (f.call_id_keys if f.call_block_types else ()) + f.result_id_keys
    )
)
"""Every key under which some format's content block holds a call id."""


# -- which format owns a carrier ---------------------------------------------------------


def whole_result_format(message: Mapping[str, Any]) -> ToolFormat | None:
    """The format whose result ``message`` is as a whole (by its role), or None."""
    role = message.get("role")
    return _RESULT_ROLES.get(role) if isinstance(role, str) else None


def result_block_format(block: object) -> ToolFormat | None:
    """The format whose result block ``block`` is, or None."""
    return _RESULT_BLOCKS.get(block_type(block))


def _call_block_format(block: object) -> ToolFormat | None:
    """The format whose call block ``block`` is, or None."""
    return _CALL_BLOCKS.get(block_type(block))


def block_format(kind: Any) -> ToolFormat | None:
    """The format owning content blocks of type ``kind`` (calls or results), or None.

    Raises:
        TypeError: ``kind`` is unhashable (the estimator's caller handles that).
    """
    return _BLOCKS.get(kind)


# -- what a message declares and carries --------------------------------------------------


class ToolIds(NamedTuple):
    """The tool ids of one message, in every format (``tool_ids``)."""

    calls: tuple[str, ...]
    """The ids of the calls an assistant message declares, in order, each once (list
    entries first, then call blocks in content order); empty for any other role."""
    results: tuple[str, ...]
    """The ids of the results a non-assistant message carries, in order, each once (a
    whole-message result's id, or its result blocks' ids); empty for an assistant."""
    only_results: bool
    """Whether the message is nothing but tool results: a whole-message result (a
    ``tool`` message, named id or not), or a non-assistant message with a non-empty block
    list of result blocks only (they may name no call)."""


_NO_IDS: Final = ToolIds((), (), False)
_new: Final = tuple.__new__
"""``_new(ToolIds, (calls, results, only_results))``: a ``ToolIds`` without ``__new__``'s
argument binding (``tool_ids`` runs on every admission)."""


def _calls(message: Mapping[str, Any]) -> Iterator[tuple[ToolFormat, object]]:
    """Every call ``message`` holds, with its format: list entries, then call blocks."""
    for fmt in _LIST_FORMATS:
        calls = message.get(fmt.calls_key)  # type: ignore[arg-type]  # set for these
        if isinstance(calls, list):
            for call in calls:
                yield fmt, call
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            owner = _call_block_format(block)
            if owner is not None:
                yield owner, block


def tool_ids(message: Mapping[str, Any]) -> ToolIds:
    """The ids of the calls ``message`` declares and of the results it carries, and whether
    it carries nothing but results (``ToolIds``). Junk ids (not a non-empty string) are
    not ids."""
    if message.get("role") == "assistant":
        ids = [call_id for fmt, call in _calls(message) if (call_id := fmt.call_id(call))]
        return _new(ToolIds, (tuple(dict.fromkeys(ids)), (), False)) if ids else _NO_IDS
    whole = whole_result_format(message)
    if whole is not None:
        call_id = whole.message_result_id(message)
        return _new(ToolIds, ((), (call_id,) if call_id is not None else (), True))
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return _NO_IDS
    results: list[str] = []
    only_results = True
    for block in content:
        fmt = result_block_format(block)
        if fmt is None:
            only_results = False
            continue
        call_id = fmt.result_block_id(block)
        if call_id is not None:
            results.append(call_id)
    if not results and not only_results:
        return _NO_IDS
    return _new(ToolIds, ((), tuple(dict.fromkeys(results)), only_results))


# -- what a view rewrites ---------------------------------------------------------------------


def rename_calls(
    renamed: dict[str, Any], message: Mapping[str, Any], renames: Mapping[str, str]
) -> None:
    """Rename, in ``renamed`` (a copy of ``message``), the ids of the calls it holds."""
    for fmt in _LIST_FORMATS:
        key = fmt.calls_key
        calls = message.get(key)  # type: ignore[arg-type]  # set for these
        if isinstance(calls, list) and key is not None:
            renamed[key] = [fmt.renamed_call(call, renames) for call in calls]
    content = message.get("content")
    if isinstance(content, list):
        renamed["content"] = [
            owner.renamed_call(block, renames)
            if (owner := _call_block_format(block)) is not None
            else block
            for block in content
        ]


def rename_results(
    renamed: dict[str, Any], message: Mapping[str, Any], renames: Mapping[str, str]
) -> None:
    """Rename, in ``renamed`` (a copy of ``message``), the ids its results answer."""
    for fmt in FORMATS:
        fmt.rename_message_result(renamed, message, renames)
    content = message.get("content")
    if isinstance(content, list):
        renamed["content"] = [
            owner.renamed_result_block(block, renames)
            if (owner := result_block_format(block)) is not None
            else block
            for block in content
        ]


def results_first(blocks: list[Any], drop: frozenset[str]) -> list[Any] | None:
    """``blocks`` with result blocks that answer nothing (their id is in ``drop``, they
    name no call, or they repeat an id already answered) dropped and the remaining results
    first; None if that changes nothing. A turn that answers calls must begin with its
    results (Anthropic), and a result without its call is rejected."""
    results: list[Any] = []
    others: list[Any] = []
    seen: set[str] = set()
    changed = False
    for block in blocks:
        fmt = result_block_format(block)
        if fmt is None:
            others.append(block)
            continue
        call_id = fmt.result_block_id(block)
        if call_id is None or call_id in drop or call_id in seen:
            changed = True
            continue
        seen.add(call_id)
        if others:
            changed = True  # a result after other content: move it up
        results.append(block)
    return results + others if changed else None


# -- what a message's calls say -------------------------------------------------------------


def answered_calls(
    call_message: Mapping[str, Any], missing: Iterable[str]
) -> list[tuple[ToolFormat, list[tuple[str, str | None]]]]:
    """The calls of ``call_message`` among ``missing`` ids, as (id, tool name) pairs, under
    the format that answers them, formats in ``FORMATS`` order and calls in message order
    (an id held twice is answered once, at its first place)."""
    wanted = set(missing)
    groups: dict[ToolFormat, list[tuple[str, str | None]]] = {}
    for fmt, call in _calls(call_message):
        call_id = fmt.call_id(call)
        if call_id in wanted:
            assert call_id is not None
            wanted.discard(call_id)
            groups.setdefault(fmt.answered_by, []).append((call_id, fmt.call_name(call)))
    return [(fmt, groups[fmt]) for fmt in FORMATS if fmt in groups]


def called_tools(message: Mapping[str, Any]) -> list[tuple[object, object]]:
    """(name, arguments) of each call ``message`` declares, in every format; a call block
    whose id a call list holds too (Amplifier records calls twice) is listed once."""
    called: list[tuple[object, object]] = []
    listed: set[object] = set()
    for fmt in _LIST_FORMATS:
        calls = message.get(fmt.calls_key)  # type: ignore[arg-type]  # set for these
        if isinstance(calls, list):
            called.extend(fmt.call_fact(call) for call in calls)
            listed.update(block_field(call, "id") for call in calls)
    content = message.get("content")
    for block in content if isinstance(content, list) else ():
        owner = _call_block_format(block)
        if owner is not None and block_field(block, "id") not in listed:
            called.append(owner.call_fact(block))
    return called


# -- estimates ------------------------------------------------------------------------------


def count_message(counter: Counter, message: Mapping[str, Any]) -> None:
    """Feed ``counter`` what a provider is sent of ``message``: the message-level result ids
    of every format, then its content (``counter.content``), then the message-level call
    lists of every format. A call recorded twice (an Amplifier ``tool_calls`` entry and a
    ``tool_call`` block) is sent once: ``counter.listed_calls`` is set first to the ids
    whose blocks are not counted again."""
    counter.listed_calls = AMPLIFIER.listed_call_ids(message)
    for fmt in FORMATS:
        fmt.count_message_fields(counter, message)
    counter.content(message.get("content"), 0)
    for fmt in FORMATS:
        fmt.count_calls(counter, message)


def has_call_lists(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` has a message-level call list (of any value)."""
    return any(message.get(key) is not None for key in CALL_LIST_KEYS)


def same_tool_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``a`` and ``b`` hold the same message-level call lists (the same objects)
    and result ids: with the same content, they are estimated alike."""
    return all(a.get(key) is b.get(key) for key in CALL_LIST_KEYS) and all(
        a.get(key) == b.get(key) for key in RESULT_ID_KEYS
    )


# -- validation -----------------------------------------------------------------------------


def message_fields_error(message: Mapping[str, Any]) -> str | None:
    """What is wrong with a message's message-level tool fields, or None."""
    for fmt in FORMATS:
        error = fmt.check_message_fields(message)
        if error is not None:
            return error
    return None


def block_roles_error(role: str, kinds: set[str | None]) -> str | None:
    """What is wrong with a ``role`` message carrying blocks of ``kinds``, or None."""
    if role == "system" and not kinds.isdisjoint(_BLOCKS):
        # system messages are hoisted to the front of every view: a tool block there
        # would stand before the call it answers (or answer nothing)
        return "a system message cannot carry tool_use/tool_result blocks"
    for fmt in FORMATS:
        # a result answers a call from the caller's side of the turn; in any other role
        # no view could show it as the answer to its call
        if role not in fmt.result_block_roles and not kinds.isdisjoint(fmt.result_block_types):
            only = " or ".join(repr(r) for r in fmt.result_block_roles)
            kinds_named = "/".join(sorted(fmt.result_block_types))
            return f"a {role!r} message cannot carry {kinds_named} blocks (only {only})"
    if role != "assistant" and not kinds.isdisjoint(CALL_BLOCK_TYPES):
        # only the model calls tools: a call in any other turn is one no provider accepts
        named = "/".join(CALL_BLOCK_TYPES)
        return f"a {role!r} message cannot carry {named} blocks (only 'assistant')"
    return None
