"""Anthropic Messages: ``tool_use`` blocks answered by ``tool_result`` blocks.

A call is a ``{"type": "tool_use", "id", "name", "input"}`` block of an assistant
message's content. A result is a ``{"type": "tool_result", "tool_use_id", "content",
"is_error"?}`` block of a later user message, whose ``content`` is a string or a list of
blocks; amplifier-core's result block has the same type with ``tool_call_id`` and
``output``, and this class reads both (the block type is this format's carrier). Results
may share a message with other content (a person's text); the API requires them first.
The missing results of one message are answered by one user message of ``tool_result``
blocks with ``is_error: true``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from .base import Counter, Note, ToolFormat

__all__ = ("ANTHROPIC", "AnthropicFormat", "count_call_block")


def count_call_block(counter: Counter, block: Mapping[str, Any]) -> None:
    """A call block's framing, id, name and arguments (``input``, else ``arguments``)."""
    counter.call()
    counter.call_id(block.get("id"))
    counter.value(block.get("name"))
    arguments = block.get("input")
    counter.value(block.get("arguments") if arguments is None else arguments)


class AnthropicFormat(ToolFormat):
    """``tool_use`` and ``tool_result`` content blocks."""

    name: ClassVar[str] = "anthropic"
    call_block_types: ClassVar[frozenset[str]] = frozenset({"tool_use"})
    result_block_types: ClassVar[frozenset[str]] = frozenset({"tool_result"})
    # Anthropic accepts results in user turns only; OpenAI's adapters send a tool
    # message's block content as it is.
    result_block_roles: ClassVar[tuple[str, ...]] = ("user", "tool")
    result_id_keys: ClassVar[tuple[str, ...]] = ("tool_use_id", "tool_call_id")
    block_clip_kind: ClassVar[str] = "tool_result_blocks"

    def synthesized(self, answers: Sequence[tuple[str, str]], note: Note) -> list[dict[str, Any]]:
        """One user message of ``tool_result`` error blocks, in call order."""
        return [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "is_error": True,
                        "content": text,
                    }
                    for call_id, text in answers
                ],
                "metadata": note([call_id for call_id, _ in answers]),
            }
        ]

    def count_block(self, counter: Counter, block: Mapping[str, Any], depth: int) -> None:
        """A call block as a call; a result block as its id and its content (``content``,
        else amplifier-core's ``output``), one level deeper."""
        if block.get("type") in self.call_block_types:
            count_call_block(counter, block)
            return
        call_id = block.get("tool_use_id")
        counter.call_id(block.get("tool_call_id") if call_id is None else call_id)
        inner = block.get("content")
        counter.content(block.get("output") if inner is None else inner, depth + 1)


ANTHROPIC: Final = AnthropicFormat()
