"""The tool-call formats, each in one place, and the lookups the rest of the package asks.

Three wire formats carry tool calls and results (``openai.py``, ``anthropic.py``,
``amplifier.py``; ``base.py`` has what they share). Each *carrier* - a message-level list
of calls, a role whose message is a result, a content block type - has exactly one owning
format; one history, and even one message, may mix formats. The functions here walk a
message once, in its own order (message-level carriers first, then content blocks in
content order), and hand each call or result to its format. Nothing outside this package
branches on a format's keys: to add a format, write its class and add it to ``FORMATS``.

``FORMATS``' order is significant in two places: the synthesized results of one call
message come in that order (``role: "tool"`` messages before a user message of result
blocks, as both providers accept them), and so do the block types named in validation
errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from .amplifier import AMPLIFIER, AmplifierFormat
from .anthropic import ANTHROPIC, AnthropicFormat
from .base import (
    Counter,
    Note,
    ToolFormat,
    as_plain,
    block_field,
    block_id,
    block_type,
    is_mapping,
    rebuildable,
    renamed_block,
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
    "answered_calls",
    "as_plain",
    "block_field",
    "block_format",
    "block_id",
    "block_roles_error",
    "block_type",
    "call_block_format",
    "called_tools",
    "calls_in",
    "carried_result_ids",
    "count_calls",
    "count_message_fields",
    "declared_call_ids",
    "has_anonymous_results",
    "has_call_lists",
    "is_mapping",
    "listed_call_ids",
    "message_fields_error",
    "rebuildable",
    "rename_calls",
    "rename_results",
    "renamed_block",
    "result_block_format",
    "results_first",
    "same_tool_fields",
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


# -- lookups ----------------------------------------------------------------------------


def whole_result_format(message: Mapping[str, Any]) -> ToolFormat | None:
    """The format whose result ``message`` is as a whole (by its role), or None."""
    role = message.get("role")
    return _RESULT_ROLES.get(role) if isinstance(role, str) else None


def result_block_format(block: object) -> ToolFormat | None:
    """The format whose result block ``block`` is, or None."""
    return _RESULT_BLOCKS.get(block_type(block))


def call_block_format(block: object) -> ToolFormat | None:
    """The format whose call block ``block`` is, or None."""
    return _CALL_BLOCKS.get(block_type(block))


def block_format(kind: Any) -> ToolFormat | None:
    """The format owning content blocks of type ``kind`` (calls or results), or None.

    Raises:
        TypeError: ``kind`` is unhashable (the estimator's caller handles that).
    """
    return _BLOCKS.get(kind)


# -- ids ----------------------------------------------------------------------------------


def calls_in(message: Mapping[str, Any]) -> Iterator[tuple[ToolFormat, object]]:
    """Every call ``message`` holds, with its format: list entries, then call blocks."""
    for fmt in _LIST_FORMATS:
        calls = message.get(fmt.calls_key)  # type: ignore[arg-type]  # set for these
        if isinstance(calls, list):
            for call in calls:
                yield fmt, call
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            owner = call_block_format(block)
            if owner is not None:
                yield owner, block


def declared_call_ids(message: Mapping[str, Any]) -> tuple[str, ...]:
    """Ids of the tool calls an assistant message declares, in every format, in order."""
    if message.get("role") != "assistant":
        return ()
    ids = [call_id for fmt, call in calls_in(message) if (call_id := fmt.call_id(call))]
    return tuple(dict.fromkeys(ids))


def carried_result_ids(message: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    """Ids of the tool results a message carries, and whether it carries nothing else."""
    whole = whole_result_format(message)
    if whole is not None:
        call_id = whole.message_result_id(message)
        return ((call_id,) if call_id is not None else ()), True
    content = message.get("content")
    if message.get("role") == "assistant" or not isinstance(content, list) or not content:
        return (), False
    ids: list[str] = []
    only_results = True
    for block in content:
        fmt = result_block_format(block)
        if fmt is None:
            only_results = False
            continue
        call_id = fmt.result_block_id(block)
        if call_id is not None:
            ids.append(call_id)
    return tuple(dict.fromkeys(ids)), only_results


def has_anonymous_results(message: Mapping[str, Any]) -> bool:
    """Whether a message carries a tool result that names no call (it answers nothing)."""
    if whole_result_format(message) is not None:
        return not carried_result_ids(message)[0]
    content = message.get("content")
    return isinstance(content, list) and any(
        (fmt := result_block_format(block)) is not None and fmt.result_block_id(block) is None
        for block in content
    )


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
            if (owner := call_block_format(block)) is not None
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


# -- what the rest of the package asks of calls and results ---------------------------------


def answered_calls(
    call_message: Mapping[str, Any], missing: Iterable[str]
) -> list[tuple[ToolFormat, list[tuple[str, str | None]]]]:
    """The calls of ``call_message`` among ``missing`` ids, as (id, tool name) pairs, under
    the format that answers them, formats in ``FORMATS`` order and calls in message order
    (an id held twice is answered once, at its first place)."""
    wanted = set(missing)
    groups: dict[ToolFormat, list[tuple[str, str | None]]] = {}
    for fmt, call in calls_in(call_message):
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
        owner = call_block_format(block)
        if owner is not None and block_field(block, "id") not in listed:
            called.append(owner.call_fact(block))
    return called


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


# -- estimates ------------------------------------------------------------------------------


def count_message_fields(counter: Counter, message: Mapping[str, Any]) -> None:
    """Count the message-level result ids of every format."""
    for fmt in FORMATS:
        fmt.count_message_fields(counter, message)


def count_calls(counter: Counter, message: Mapping[str, Any]) -> None:
    """Count the message-level call lists of every format."""
    for fmt in FORMATS:
        fmt.count_calls(counter, message)


def listed_call_ids(message: Mapping[str, Any]) -> frozenset[str]:
    """Ids of calls a message lists whose call blocks are not counted again."""
    return AMPLIFIER.listed_call_ids(message)


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
