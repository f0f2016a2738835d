"""OpenAI Chat Completions: ``tool_calls`` on the assistant, ``role: "tool"`` results.

A call is an entry of the assistant message's ``tool_calls`` list, ``{"id", "type":
"function", "function": {"name", "arguments"}}``; Amplifier stores its calls in the same
list as ``{"id", "tool", "arguments"}`` (an id may be under ``tool_call_id`` too), and
this class reads both shapes: the list is this format's carrier. A result is a message
of its own, ``{"role": "tool", "tool_call_id", "content"}`` (Amplifier adds the tool's
``name``), whose content is a string or a list of text blocks. A missing result is
answered by such a message, one per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from .base import Counter, Note, ToolFormat, as_plain, block_field, is_mapping

__all__ = ("OPENAI", "OpenAIFormat")


class OpenAIFormat(ToolFormat):
    """The ``tool_calls`` list and the ``role: "tool"`` message."""

    name: ClassVar[str] = "openai"
    calls_key: ClassVar[str | None] = "tool_calls"
    result_role: ClassVar[str | None] = "tool"
    result_id_key: ClassVar[str | None] = "tool_call_id"
    call_id_keys: ClassVar[tuple[str, ...]] = ("id", "tool_call_id")

    def call_fact(self, call: object) -> tuple[object, object]:
        """An OpenAI entry's ``function`` name and arguments; Amplifier's ``tool`` and
        ``arguments`` when the entry has no ``function``."""
        function = block_field(call, "function")
        if function is not None:
            return block_field(function, "name"), block_field(function, "arguments")
        return block_field(call, "tool"), block_field(call, "arguments")

    def synthesized(self, answers: Sequence[tuple[str, str]], note: Note) -> list[dict[str, Any]]:
        """One ``role: "tool"`` message per answered call."""
        return [
            {"role": "tool", "tool_call_id": call_id, "content": text, "metadata": note([call_id])}
            for call_id, text in answers
        ]

    def count_message_fields(self, counter: Counter, message: Mapping[str, Any]) -> None:
        counter.call_id(message.get("tool_call_id"))

    def count_calls(self, counter: Counter, message: Mapping[str, Any]) -> None:
        """Each entry: its framing, id, name (``function.name``, else ``tool``) and
        arguments (``arguments``, else ``input``); junk entries as their JSON."""
        calls = as_plain(message.get("tool_calls"))
        if calls is None:
            return
        if not isinstance(calls, list | tuple):
            counter.value(calls)
            return
        for call in calls:
            call = as_plain(call)
            if type(call) is not dict and not isinstance(call, Mapping):
                counter.value(call)
                continue
            counter.call()
            counter.call_id(call.get("id"))
            function = as_plain(call.get("function"))
            source = function if function is not None and is_mapping(function) else call
            name = source.get("name")
            if name is None:
                name = call.get("tool")
            arguments = source.get("arguments")
            if arguments is None:
                arguments = source.get("input")
            counter.value(name)
            counter.value(arguments)

    def check_message_fields(self, message: Mapping[str, Any]) -> str | None:
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(map(is_mapping, calls))):
            return "'tool_calls' must be a list of dicts when present"
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            return f"'tool_call_id' must be a string, got {type(call_id).__name__}"
        for call in calls or ():
            for key in self.call_id_keys:
                value = call.get(key)
                if value is not None and not isinstance(value, str):
                    return f"tool call {key!r} must be a string"
            if not any(call.get(key) for key in self.call_id_keys):
                # no result can answer it, and no provider accepts a call without an id
                return "a tool call in 'tool_calls' needs a non-empty string 'id'"
        return None


OPENAI: Final = OpenAIFormat()
