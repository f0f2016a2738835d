"""Message shapes: what the loop stores in the context, and what it sends to a provider.

Storage contract (the loop chooses the format by the tool-call id, the providers' own
convention): ids starting with ``toolu_`` are stored Anthropic style, everything else
OpenAI style.

- OpenAI style: ``{"role": "assistant", "content": text, "tool_calls": [{"id", "type":
  "function", "function": {"name", "arguments": <json string>}}]}`` followed by one
  ``{"role": "tool", "tool_call_id", "name", "content"}`` per call.
- Anthropic style: ``{"role": "assistant", "content": [{"type": "text"}, {"type":
  "tool_use", "id", "name", "input"}...]}`` followed by one user message whose content is
  ``[{"type": "tool_result", "tool_use_id", "content"}...]``.

Request contract (``to_message`` / ``build_request``): top-level keys starting with ``_``
(context-internal markers such as ``_truncated``) and ``_``-prefixed metadata keys are
dropped; assistant ``content: None`` becomes ``""``; Anthropic ``tool_use`` /
``tool_result`` blocks become the kernel's typed ``tool_call`` / ``tool_result`` blocks,
because ``Message`` validates blocks against a closed set of types. Input dicts are never
mutated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from amplifier_core.message_models import ChatRequest, Message, ToolCall

ANTHROPIC_ID_PREFIX = "toolu_"


def is_anthropic_call(call_id: str) -> bool:
    """Whether a tool call with this id is stored Anthropic style."""
    return call_id.startswith(ANTHROPIC_ID_PREFIX)


def assistant_message(
    text: str, calls: Sequence[ToolCall], thinking: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The assistant message to store for a reply with ``calls`` (may be empty) and
    ``thinking`` blocks (kept first, exactly as returned: a model with preserved thinking
    checks them against the request that produced them)."""
    thought = [dict(block) for block in thinking]
    if not calls:
        if thought:
            return {"role": "assistant", "content": [*thought, {"type": "text", "text": text}]}
        return {"role": "assistant", "content": text}
    if is_anthropic_call(calls[0].id):
        blocks: list[dict[str, Any]] = [*thought]
        if text:
            blocks.append({"type": "text", "text": text})
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
            for call in calls
        )
        return {"role": "assistant", "content": blocks}
    return {
        "role": "assistant",
        "content": [*thought, {"type": "text", "text": text}] if thought else text,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(dict(call.arguments), ensure_ascii=False),
                },
            }
            for call in calls
        ],
    }


def result_messages(calls: Sequence[ToolCall], outputs: Sequence[str]) -> list[dict[str, Any]]:
    """The messages carrying ``outputs`` (one per call, same order) in the calls' format."""
    if not calls:
        return []
    if is_anthropic_call(calls[0].id):
        blocks = [
            {"type": "tool_result", "tool_use_id": call.id, "content": output}
            for call, output in zip(calls, outputs, strict=True)
        ]
        return [{"role": "user", "content": blocks}]
    return [
        {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": output}
        for call, output in zip(calls, outputs, strict=True)
    ]


def _block(block: Any) -> Any:
    """One content block in the kernel's typed vocabulary."""
    if not isinstance(block, Mapping):
        return block
    kind = block.get("type")
    if kind == "tool_use":
        return {
            "type": "tool_call",
            "id": block.get("id", ""),
            "name": block.get("name", ""),
            "input": dict(block.get("input") or {}),
        }
    if kind == "tool_result" and "tool_call_id" not in block:
        return {
            "type": "tool_result",
            "tool_call_id": block.get("tool_use_id", ""),
            "output": block.get("content", block.get("output", "")),
        }
    return block


def to_message(message: Mapping[str, Any]) -> Message:
    """Validate one stored/view message dict as a provider-facing ``Message``."""
    clean = {key: value for key, value in message.items() if not key.startswith("_")}
    metadata = clean.get("metadata")
    if isinstance(metadata, Mapping):
        clean["metadata"] = {k: v for k, v in metadata.items() if not str(k).startswith("_")}
    content = clean.get("content")
    if content is None:
        clean["content"] = ""
    elif isinstance(content, list):
        clean["content"] = [_block(block) for block in content]
    return Message.model_validate(clean)


def build_request(
    view: Sequence[Mapping[str, Any]], *, max_output_tokens: int | None = None
) -> ChatRequest:
    """A ``ChatRequest`` carrying ``view`` (see the module contract)."""
    return ChatRequest(
        messages=[to_message(message) for message in view],
        max_output_tokens=max_output_tokens,
    )


def rough_estimate(view: Sequence[Mapping[str, Any]]) -> int:
    """A cheap character-based token estimate (4 chars per token plus framing)."""
    total = 0
    for message in view:
        content = message.get("content")
        text = (
            content
            if isinstance(content, str)
            else json.dumps(content, default=str, ensure_ascii=False)
        )
        calls = message.get("tool_calls")
        if calls:
            text += json.dumps(calls, default=str, ensure_ascii=False)
        total += 4 + len(text) // 4
    return total
