"""What admission accepts: the shape of a message, checked before anything is stored.

A message is a dict with a non-empty string ``role``; its ``metadata``, when present, is a
dict; its ``content`` a string, a list of blocks or null; a block's ``type`` and tool ids,
when present, are strings; a call in ``tool_calls`` has a non-empty string id (no result
could answer it otherwise, and no provider accepts it). The tool fields of each format, and the roles that may carry
each kind of tool block, are the format classes' rules (``formats/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Final

from ...errors import InvalidMessageError
from ..formats import BLOCK_ID_KEYS, block_field, block_roles_error, message_fields_error

__all__ = ("validate_message",)


_VALID_CONTENT: Final = (str, list)


def validate_message(message: object, index: int | None = None) -> Mapping[str, Any]:
    """Check the shape admission relies on; raise ``InvalidMessageError`` otherwise."""
    if type(message) is not dict and not isinstance(message, Mapping):
        raise InvalidMessageError(
            f"a message must be a dict, got {type(message).__name__}", index=index
        )
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidMessageError(
            f"a message needs a non-empty string 'role', got {role!r}", index=index
        )
    metadata = message.get("metadata")
    if metadata is not None and type(metadata) is not dict and not isinstance(metadata, Mapping):
        raise InvalidMessageError(
            f"'metadata' must be a dict when present, got {type(metadata).__name__}",
            index=index,
        )
    content = message.get("content")
    if content is not None and not isinstance(content, _VALID_CONTENT):
        raise InvalidMessageError(
            f"'content' must be a string, a list of blocks or null, got {type(content).__name__}",
            index=index,
        )
    error = message_fields_error(message)
    if error is not None:
        raise InvalidMessageError(error, index=index)
    if isinstance(content, list):
        kinds = {_validate_block(block, position, index) for position, block in enumerate(content)}
        error = block_roles_error(role, kinds)
        if error is not None:
            raise InvalidMessageError(error, index=index)
    return message


def _validate_block(block: object, position: int, index: int | None) -> str | None:
    """A block's ``type`` and tool ids, when present, are strings (unknown blocks pass);
    returns the type."""
    read = block.get if type(block) is dict else partial(block_field, block)
    kind = read("type")
    if kind is not None and not isinstance(kind, str):
        raise InvalidMessageError(
            f"content block {position}: 'type' must be a string, got {kind!r}", index=index
        )
    for key in BLOCK_ID_KEYS:
        value = read(key)
        if value is not None and not isinstance(value, str):
            raise InvalidMessageError(
                f"content block {position}: {key!r} must be a string, got {value!r}", index=index
            )
    return kind
