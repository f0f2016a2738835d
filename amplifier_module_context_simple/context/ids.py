"""Reused tool-call ids, made unique in views.

Some agents reuse a tool-call id in a later turn (real transcripts do: six of the
tau-bench trajectories in ``tests/data/real``). OpenAI accepts that; the Anthropic
Messages API does not (``tool_use`` ids must be unique in a request), so a view that an
Amplifier provider converts for Anthropic would be rejected. Views therefore show a
reused id under a fresh name, ``<id>~<n>``, in the call and in every result of its run
alike; the message's ``metadata["renamed_tool_call_ids"]`` maps each shown id back to
the stored one. The stored history keeps the ids as they were given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .classify import block_field, block_type

__all__ = (
    "RENAMED_KEY",
    "fresh_ids",
    "renamed_calls",
    "renamed_results",
)


RENAMED_KEY: Final = "renamed_tool_call_ids"


def fresh_ids(call_ids: tuple[str, ...], taken: set[str]) -> dict[str, str]:
    """New names for the ids in ``call_ids`` that are already ``taken`` (others keep theirs)."""
    renames: dict[str, str] = {}
    for call_id in call_ids:
        if call_id not in taken:
            continue
        suffix = 2
        while f"{call_id}~{suffix}" in taken or f"{call_id}~{suffix}" in renames.values():
            suffix += 1
        renames[call_id] = f"{call_id}~{suffix}"
    return renames


def _with_note(message: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    metadata = message.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    metadata[RENAMED_KEY] = {new: old for old, new in renames.items()}
    return {**message, "metadata": metadata}


def _renamed_block(block: object, keys: tuple[str, ...], renames: Mapping[str, str]) -> object:
    if not isinstance(block, Mapping):
        update = {
            key: renames[value]
            for key in keys
            if isinstance(value := block_field(block, key), str) and value in renames
        }
        copy = getattr(block, "model_copy", None)
        return copy(update=update) if update and callable(copy) else block
    changed = {key: renames[block[key]] for key in keys if block.get(key) in renames}
    return {**block, **changed} if changed else block


def renamed_calls(message: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``message`` (an assistant turn) with its calls' ids renamed; nothing is mutated."""
    renamed = _with_note(message, renames)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        renamed["tool_calls"] = [
            _renamed_block(call, ("id", "tool_call_id"), renames) for call in calls
        ]
    content = message.get("content")
    if isinstance(content, list):
        renamed["content"] = [
            _renamed_block(block, ("id",), renames)
            if block_type(block) in ("tool_use", "tool_call")
            else block
            for block in content
        ]
    return renamed


def renamed_results(message: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``message`` with the ids of the results it carries renamed; nothing is mutated."""
    renamed = _with_note(message, renames)
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str) and call_id in renames:
        renamed["tool_call_id"] = renames[call_id]
    content = message.get("content")
    if isinstance(content, list):
        renamed["content"] = [
            _renamed_block(block, ("tool_use_id", "tool_call_id"), renames)
            if block_type(block) == "tool_result"
            else block
            for block in content
        ]
    return renamed
