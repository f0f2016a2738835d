"""Amplifier's own shape: amplifier-core's ``tool_call`` blocks.

amplifier-core records an assistant's call twice: as an entry of the message's
``tool_calls`` list (``{"id", "tool", "arguments"}``, read by ``openai.py``, whose carrier
that list is) and as a ``{"type": "tool_call", "id", "name", "input"}`` block of its
content. A provider is sent each call once, so a block whose id the list holds is not
counted again. Its results are ``role: "tool"`` messages (or ``tool_result`` blocks
naming the call by ``tool_call_id``, read by ``anthropic.py``), and a missing one is
answered the same way: by a ``role: "tool"`` message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

from .anthropic import count_call_block
from .base import Counter, ToolFormat, is_mapping
from .openai import OPENAI

__all__ = ("AMPLIFIER", "AmplifierFormat")


class AmplifierFormat(ToolFormat):
    """amplifier-core's ``tool_call`` content blocks."""

    name: ClassVar[str] = "amplifier"
    call_block_types: ClassVar[frozenset[str]] = frozenset({"tool_call"})

    @property
    def answered_by(self) -> ToolFormat:
        return OPENAI

    def listed_call_ids(self, message: Mapping[str, Any]) -> frozenset[str]:
        """The string ids of the message's ``tool_calls`` entries, when its content may
        hold ``tool_call`` blocks (a list): the calls its blocks record a second time."""
        calls = message.get("tool_calls")  # the list ``openai.py`` reads
        content = message.get("content")
        if not isinstance(calls, list) or content is None or type(content) is str:
            return frozenset()
        return frozenset(
            call_id
            for call in calls
            if is_mapping(call) and isinstance(call_id := call.get("id"), str)
        )

    def count_block(self, counter: Counter, block: Mapping[str, Any], depth: int) -> None:
        """A block the ``tool_calls`` list does not hold, as a call (the list's entries
        are counted there)."""
        if block.get("id") not in counter.listed_calls:
            count_call_block(counter, block)


AMPLIFIER: Final = AmplifierFormat()
