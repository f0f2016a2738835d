"""Message classification: pure functions over one admitted message.

Everything the ladder needs to know about a message is decided once, at admission, and
kept in a frozen ``MessageInfo``. Classification reads roles and metadata only; message
text never changes a message's class (quoting ``<system-reminders>`` XML in a human
prompt does not make it a reminder).

Tool calls and results are recognised in every format the ecosystem stores, by the
format classes (``formats/``): a message's ids are ``formats.tool_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from ..formats import is_mapping, tool_ids

__all__ = (
    "LOADED_TOOL_STATE_METADATA_KEYS",
    "NOTICE_SOURCE",
    "PUBLIC_METADATA_KEYS",
    "MessageInfo",
    "classify",
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


def without_ids(info: MessageInfo) -> MessageInfo:
    """``info`` with no call or result ids: what a kind of message shares."""
    if not info.call_ids and not info.result_ids:
        return info
    return _make_info((*info[:9], (), (), info.is_result_carrier))


def with_ids(
    kind: MessageInfo, call_ids: tuple[str, ...], result_ids: tuple[str, ...]
) -> MessageInfo:
    """The ``MessageInfo`` of kind ``kind`` (``without_ids``) carrying these ids."""
    if not call_ids and not result_ids:
        return kind
    return _make_info((*kind[:9], call_ids, result_ids, kind.is_result_carrier))


def metadata_of(message: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = message.get("metadata")
    return metadata if metadata is not None and is_mapping(metadata) else _NO_METADATA


def classify(message: Mapping[str, Any]) -> MessageInfo:
    """Classify one well-formed message (a dict with a string ``role``)."""
    role = message["role"]
    call_ids, result_ids, is_result_carrier = tool_ids(message)
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
