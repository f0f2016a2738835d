"""Message classification: pure functions over one admitted message.

Everything the ladder needs to know about a message is decided once, at admission, and
kept in a frozen ``MessageInfo``. Classification reads roles and metadata only; message
text never changes a message's class (quoting ``<system-reminders>`` XML in a human
prompt does not make it a reminder).

Tool calls and results are recognised in all three formats the ecosystem stores:

- OpenAI style: ``assistant.tool_calls[].id`` answered by ``{"role": "tool", "tool_call_id"}``;
- Amplifier's stored calls: ``assistant.tool_calls[] = {"id", "tool", "arguments"}``, answered
  the same way;
- Anthropic style content blocks: ``{"type": "tool_use", "id"}`` (or amplifier-core's
  ``tool_call`` block) in assistant content, answered by ``{"type": "tool_result",
  "tool_use_id"}`` (or ``tool_call_id``) blocks in a later message.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Final, NamedTuple, TypeGuard

__all__ = (
    "LOADED_TOOL_STATE_METADATA_KEYS",
    "NOTICE_SOURCE",
    "PUBLIC_METADATA_KEYS",
    "MessageInfo",
    "block_field",
    "block_id",
    "block_type",
    "carried_result_ids",
    "classify",
    "declared_call_ids",
    "has_anonymous_results",
    "is_mapping",
    "metadata_of",
)


NOTICE_SOURCE: Final = "context-compaction"
LOADED_TOOL_STATE_METADATA_KEYS: Final = frozenset({"openai:tool_search_items"})
PUBLIC_METADATA_KEYS: Final = frozenset(
    {
        "amplifier_public_message",
        "amplifier_public_copy_source",
        "amplifier_public_reference_only",
    }
)
_NO_METADATA: Final[Mapping[str, Any]] = MappingProxyType({})
_CALL_BLOCK_TYPES: Final = frozenset({"tool_use", "tool_call"})
_RESULT_BLOCK_TYPES: Final = frozenset({"tool_result"})


class MessageInfo(NamedTuple):
    """What the policy needs to know about one message, decided at admission.

    A named tuple: immutable, and built once per admitted message at a fraction of a
    frozen dataclass's cost (a session resume builds thousands).
    """

    role: str
    is_system: bool = False
    is_hook_system: bool = False
    is_human: bool = False
    is_envelope: bool = False
    is_notice: bool = False
    is_developer: bool = False
    has_loaded_tool_state: bool = False
    reference_only: bool = False
    call_ids: tuple[str, ...] = ()
    result_ids: tuple[str, ...] = ()
    # True when the message is nothing but tool results (a ``tool`` message, or a user
    # message whose every content block is a tool_result); such messages travel with
    # their call group and are never treated as a human or reminder turn.
    is_result_carrier: bool = False


_make_info: Final = partial(tuple.__new__, MessageInfo)
"""``MessageInfo`` from all its fields in order: without ``__new__``'s keyword binding."""


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, with plain dicts (nearly every value) checked first:
    an ABC check costs several times a type comparison, per block of every message."""
    return type(value) is dict or isinstance(value, Mapping)


def block_field(block: object, key: str) -> Any:
    """Read ``key`` from a content block given as a dict or as a model object."""
    if type(block) is dict or isinstance(block, Mapping):
        return block.get(key)
    return getattr(block, key, None)


def block_type(block: object) -> str | None:
    """A content block's ``type`` when it is a string (junk types read as None)."""
    value = block_field(block, "type")
    return value if isinstance(value, str) else None


def block_id(block: object, *keys: str) -> str | None:
    """The first non-empty string among ``keys`` of a block (junk ids read as None)."""
    if type(block) is dict:
        for key in keys:
            value = block.get(key)
            if isinstance(value, str) and value:
                return value
        return None
    for key in keys:
        value = block_field(block, key)
        if isinstance(value, str) and value:
            return value
    return None


def metadata_of(message: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = message.get("metadata")
    return metadata if metadata is not None and is_mapping(metadata) else _NO_METADATA


def declared_call_ids(message: Mapping[str, Any]) -> tuple[str, ...]:
    """Ids of the tool calls an assistant message declares, in every format, in order."""
    if message.get("role") != "assistant":
        return ()
    ids: list[str] = []
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            call_id = block_id(call, "id", "tool_call_id")
            if call_id is not None:
                ids.append(call_id)
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if block_type(block) in _CALL_BLOCK_TYPES:
                call_id = block_id(block, "id")
                if call_id is not None:
                    ids.append(call_id)
    return tuple(dict.fromkeys(ids))


def carried_result_ids(message: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    """Ids of the tool results a message carries, and whether it carries nothing else."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        return ((call_id,) if isinstance(call_id, str) and call_id else ()), True
    content = message.get("content")
    if role == "assistant" or not isinstance(content, list) or not content:
        return (), False
    ids: list[str] = []
    only_results = True
    for block in content:
        if block_type(block) in _RESULT_BLOCK_TYPES:
            call_id = block_id(block, "tool_use_id", "tool_call_id")
            if call_id is not None:
                ids.append(call_id)
        else:
            only_results = False
    return tuple(dict.fromkeys(ids)), only_results


def has_anonymous_results(message: Mapping[str, Any]) -> bool:
    """Whether a message carries a tool result that names no call (it answers nothing)."""
    if message.get("role") == "tool":
        return not carried_result_ids(message)[0]
    content = message.get("content")
    return isinstance(content, list) and any(
        block_type(block) in _RESULT_BLOCK_TYPES
        and block_id(block, "tool_use_id", "tool_call_id") is None
        for block in content
    )


def classify(message: Mapping[str, Any]) -> MessageInfo:
    """Classify one well-formed message (a dict with a string ``role``)."""
    role = message["role"]
    call_ids: tuple[str, ...] = ()
    if role == "assistant":
        call_ids = declared_call_ids(message)
        result_ids: tuple[str, ...] = ()
        is_result_carrier = False
    else:
        result_ids, is_result_carrier = carried_result_ids(message)
    is_user = role == "user"
    metadata = metadata_of(message)
    if not metadata:  # what the general case below gives for no metadata, for less
        return _make_info(
            (
                role,
                role == "system",  # is_system
                False,  # is_hook_system
                is_user and not is_result_carrier,  # is_human
                False,  # is_envelope
                False,  # is_notice
                role == "developer",  # is_developer
                False,  # has_loaded_tool_state
                False,  # reference_only
                call_ids,
                result_ids,
                is_result_carrier,
            )
        )
    source = metadata.get("source")
    return MessageInfo(
        role=role,
        is_system=role == "system",
        is_hook_system=role == "system" and source == "hook",
        is_human=(
            is_user
            and not metadata.get("ephemeral")
            and source not in ("hook", NOTICE_SOURCE)
            and not is_result_carrier
        ),
        is_envelope=(
            is_user
            and metadata.get("ephemeral") is True
            and metadata.get("persisted") is True
            and isinstance(message.get("content"), str)
        ),
        is_notice=is_user and source == NOTICE_SOURCE,
        is_developer=role == "developer",
        has_loaded_tool_state=any(metadata.get(k) for k in LOADED_TOOL_STATE_METADATA_KEYS),
        reference_only=metadata.get("amplifier_public_reference_only") is True,
        call_ids=call_ids,
        result_ids=result_ids,
        is_result_carrier=is_result_carrier,
    )
