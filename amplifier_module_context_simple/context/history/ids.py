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

from collections.abc import Container, Mapping
from typing import Any, Final

from ..formats import rename_calls, rename_results

__all__ = (
    "RENAMED_KEY",
    "fresh_ids",
    "renamed_calls",
    "renamed_results",
)


RENAMED_KEY: Final = "renamed_tool_call_ids"


def fresh_ids(call_ids: tuple[str, ...], taken: Container[str]) -> dict[str, str]:
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


def renamed_calls(message: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``message`` (an assistant turn) with its calls' ids renamed, in every format (the
    format classes say where each keeps its ids); nothing is mutated."""
    renamed = _with_note(message, renames)
    rename_calls(renamed, message, renames)
    return renamed


def renamed_results(message: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``message`` with the ids of the results it carries renamed, in every format;
    nothing is mutated."""
    renamed = _with_note(message, renames)
    rename_results(renamed, message, renames)
    return renamed
