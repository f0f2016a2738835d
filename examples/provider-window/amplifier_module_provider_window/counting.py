"""What a provider sees of a request, and its token count with the real o200k BPE.

Contract:

- ``message_texts(message)`` lists every provider-visible string of one ``Message``: string
  content; text, thinking and tool-result blocks (a result's images count as images,
  ``IMAGE_TOKENS`` each, never as the text of their base64 data); tool-call names and arguments (typed
  ``tool_call`` blocks and OpenAI-style ``tool_calls`` carried as extra fields); the
  message ``name``. Metadata is never provider-visible and is not counted.
- ``count_request(request)`` counts all of them in one ``toktok.batch_count`` call and adds
  ``MESSAGE_OVERHEAD_TOKENS`` per message (role and framing), ``REQUEST_OVERHEAD_TOKENS``
  per request (reply priming) and the JSON of any tool specs. The result is exact for this
  provider: it is the number ``complete`` enforces.
- Counting is pure (no state, no I/O) and deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import toktok
from amplifier_core.message_models import (
    ChatRequest,
    ImageBlock,
    Message,
    ReasoningBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)

ENCODING = "o200k_base"
MESSAGE_OVERHEAD_TOKENS = 4
REQUEST_OVERHEAD_TOKENS = 3
IMAGE_TOKENS = 765


@dataclass(frozen=True)
class RequestCount:
    """The count of one request.

    ``total`` is what the provider enforces. ``per_message[i]`` is message ``i``'s share
    (overhead included); ``fingerprints[i]`` identifies its provider-visible text, so two
    requests can be compared for a common (cacheable) prefix.
    """

    total: int
    per_message: tuple[int, ...]
    fingerprints: tuple[int, ...]

    @property
    def message_tokens(self) -> int:
        """Tokens that belong to messages (the rest is request framing and tool specs)."""
        return sum(self.per_message)


def _dump(value: Any) -> str:
    """Render a non-string payload the way a provider would serialise it."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _call_texts(call: Any) -> list[str]:
    """Name and arguments of an OpenAI-style or Amplifier-style tool call dict."""
    if not isinstance(call, Mapping):
        return [_dump(call)]
    function = call.get("function")
    if isinstance(function, Mapping):
        return [str(function.get("name") or ""), _dump(function.get("arguments") or "")]
    name = call.get("name") or call.get("tool") or ""
    return [str(name), _dump(call.get("arguments") or call.get("input") or "")]


def _is_image(part: Any) -> bool:
    kind = part.get("type") if isinstance(part, Mapping) else getattr(part, "type", None)
    return kind == "image" or isinstance(part, ImageBlock)


def _output_texts(output: Any) -> list[str]:
    """Provider-visible strings of a tool result's output: its text, not image bytes.

    A provider sees an image inside a result as an image (``IMAGE_TOKENS``, counted by
    ``_image_count``), never as the text of its base64 data.
    """
    if isinstance(output, list):
        texts: list[str] = []
        for part in output:
            if _is_image(part):
                continue
            text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
            texts.append(text if isinstance(text, str) else _dump(part))
        return texts
    return [_dump(output)]


def _block_texts(block: Any) -> list[str]:
    """Provider-visible strings of one typed content block."""
    if isinstance(block, TextBlock):
        return [block.text]
    if isinstance(block, ThinkingBlock):
        return [block.thinking]
    if isinstance(block, RedactedThinkingBlock):
        return [block.data]
    if isinstance(block, ToolCallBlock):
        return [block.name, _dump(block.input)]
    if isinstance(block, ToolResultBlock):
        return _output_texts(block.output)
    if isinstance(block, ReasoningBlock):
        return [_dump(block.summary)]
    if isinstance(block, ImageBlock):
        return []
    return [_dump(block)]


def message_texts(message: Message) -> list[str]:
    """Every provider-visible string of ``message`` (see the module contract)."""
    texts: list[str] = []
    if message.name:
        texts.append(message.name)
    if isinstance(message.content, str):
        texts.append(message.content)
    else:
        for block in message.content:
            texts.extend(_block_texts(block))
    calls = (message.model_extra or {}).get("tool_calls") or []
    for call in calls:
        texts.extend(_call_texts(call))
    return texts


def _image_count(message: Message) -> int:
    """Images in ``message``: image blocks, and images inside tool-result outputs."""
    if isinstance(message.content, str):
        return 0
    count = 0
    for block in message.content:
        if isinstance(block, ImageBlock):
            count += 1
        elif isinstance(block, ToolResultBlock) and isinstance(block.output, list):
            count += sum(1 for part in block.output if _is_image(part))
    return count


def count_messages(messages: Sequence[Message]) -> tuple[list[int], list[int]]:
    """Per-message token counts and text fingerprints, using one batched BPE call."""
    texts: list[str] = []
    owners: list[int] = []
    fingerprints: list[int] = []
    for index, message in enumerate(messages):
        pieces = message_texts(message)
        texts.extend(pieces)
        owners.extend([index] * len(pieces))
        fingerprints.append(hash((message.role, *pieces)))
    counts = [
        MESSAGE_OVERHEAD_TOKENS + IMAGE_TOKENS * _image_count(message) for message in messages
    ]
    for owner, tokens in zip(owners, toktok.batch_count(texts, ENCODING), strict=True):
        counts[owner] += tokens
    return counts, fingerprints


def _tool_spec_tokens(request: ChatRequest) -> int:
    if not request.tools:
        return 0
    specs = [_dump(spec.model_dump(exclude_none=True)) for spec in request.tools]
    return sum(toktok.batch_count(specs, ENCODING))


def count_request(request: ChatRequest) -> RequestCount:
    """Count ``request`` exactly as this provider enforces it."""
    per_message, fingerprints = count_messages(request.messages)
    total = REQUEST_OVERHEAD_TOKENS + sum(per_message) + _tool_spec_tokens(request)
    return RequestCount(total, tuple(per_message), tuple(fingerprints))


def common_prefix_tokens(previous: RequestCount | None, current: RequestCount) -> int:
    """Tokens of the longest run of leading messages ``current`` shares with ``previous``."""
    if previous is None:
        return 0
    shared = 0
    for before, now, tokens in zip(
        previous.fingerprints, current.fingerprints, current.per_message, strict=False
    ):
        if before != now:
            break
        shared += tokens
    return shared


def count_texts(texts: Iterable[str]) -> int:
    """Total o200k tokens of ``texts`` (no overheads)."""
    return sum(toktok.batch_count(list(texts), ENCODING))
