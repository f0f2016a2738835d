"""The tool-result ingress cap: oversized tool text is clipped before admission.

Every carrier of tool results is capped, each result on its own (the format classes in
``formats/`` say where each format's results live and how a clipped one is put back):

- a ``role == "tool"`` message (OpenAI, or Amplifier's stored form with ``name``): its
  string content, or the direct text blocks of its list content;
- each ``tool_result`` block of any other non-assistant message (Anthropic style, usually
  ``role == "user"``): its string ``content``, or the direct text blocks of its list
  ``content``. Other blocks of the message (a human's text next to the results) are not
  tool output and are never capped.

A direct text block is a dict ``{"type": "text", "text": str}`` or an object with that
shape and ``model_copy`` (amplifier-core ``TextBlock``); a ``tool_result`` block may be a
dict or such an object. Image, audio, document, unknown and nested blocks are never read
or sliced (they stay the same objects). Bytes are UTF-8 with lone surrogates counted as
replaced (one byte each), so an ill-formed string under the cap is kept byte for byte,
while a clipped prefix is always valid UTF-8.

A result whose text exceeds ``max_bytes`` keeps a prefix and exactly one marker (``marker``:
the original byte count and the retrieval guidance), all within ``max_bytes``; text blocks
after the one that carries the marker are dropped. The same output gets the same stored
text and the same byte figures in all four shapes (``tool`` string, ``tool`` text blocks,
``tool_result`` string, ``tool_result`` text blocks). The original text is kept nowhere.

One ``IngressClip`` (one ``context:tool_result_ingress_truncated`` event) is reported per
clipped *message*, numbers and identities only, never content. For a message with several
clipped ``tool_result`` blocks its byte figures are sums over the clipped results and its
``tool_call_id`` is the first clipped result's id. ``content_kind`` is ``"string"`` or
``"text_blocks"`` for a ``tool`` message and ``"tool_result_blocks"`` for ``tool_result``
carriers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..config import INGRESS_MARKER_TEMPLATE
from ..formats import (
    block_field,
    rebuildable,
    result_block_format,
    whole_result_format,
    with_field,
)

__all__ = (
    "INGRESS_EVENT",
    "RETRIEVAL_GUIDANCE",
    "IngressClip",
    "cap_tool_result",
    "marker",
    "utf8_prefix",
    "utf8_size",
)


RETRIEVAL_GUIDANCE: Final = (
    "retrieve missing content using narrower read/query parameters; "
    "do not repeat state-changing actions just to recover output."
)
INGRESS_EVENT: Final = "context:tool_result_ingress_truncated"


@dataclass(frozen=True, slots=True)
class IngressClip:
    """The numbers reported for one clipped message (never its content)."""

    tool_name: object
    tool_call_id: object
    original_text_utf8_bytes: int
    stored_text_utf8_bytes: int
    max_tool_result_bytes: int
    content_kind: str

    def payload(self) -> dict[str, Any]:
        return {
            "tool_name": self.tool_name if isinstance(self.tool_name, str) else None,
            # the event's own field name (its published payload), not a message key
            "tool_call_id": self.tool_call_id if isinstance(self.tool_call_id, str) else None,
            "original_text_utf8_bytes": self.original_text_utf8_bytes,
            "stored_text_utf8_bytes": self.stored_text_utf8_bytes,
            "max_tool_result_bytes": self.max_tool_result_bytes,
            "content_kind": self.content_kind,
        }


@dataclass(frozen=True, slots=True)
class _Capped:
    """One clipped result: its new content and its text bytes before and after."""

    content: str | list[Any]
    original: int
    stored: int


def utf8_size(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", errors="replace"))


def utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest valid UTF-8 prefix of ``text`` within ``max_bytes`` bytes."""
    if max_bytes <= 0:
        return ""
    data = text.encode("utf-8", errors="replace")[:max_bytes]
    return data.decode("utf-8", errors="ignore")


def marker(original_bytes: int) -> str:
    return INGRESS_MARKER_TEMPLATE.format(original=original_bytes)


def _is_text_block(block: object) -> bool:
    if block_field(block, "type") != "text" or not isinstance(block_field(block, "text"), str):
        return False
    return rebuildable(block)


def cap_tool_result(
    message: Mapping[str, Any], max_bytes: int
) -> tuple[Mapping[str, Any], IngressClip | None]:
    """Return ``message`` with each tool result clipped to ``max_bytes`` of text, and the clip.

    The input is never mutated; an under-cap message is returned as the same object, and
    so is every block that is not clipped. See the module docstring for the contract.
    """
    whole = whole_result_format(message)
    if whole is not None:
        content = whole.message_result_content(message)
        if type(content) is str and len(content) * 4 <= max_bytes:
            return message, None  # the commonest result: within the cap, however encoded
        capped = _cap_content(content, max_bytes)
        if capped is None:
            return message, None
        clip = IngressClip(
            tool_name=whole.message_result_name(message),
            tool_call_id=whole.message_result_id_field(message),
            original_text_utf8_bytes=capped.original,
            stored_text_utf8_bytes=capped.stored,
            max_tool_result_bytes=max_bytes,
            content_kind=whole.message_clip_kind(content),
        )
        return whole.with_message_result_content(message, capped.content), clip
    content = message.get("content")
    if message.get("role") == "assistant" or not isinstance(content, list):
        return message, None
    return _cap_result_blocks(message, content, max_bytes)


def _cap_result_blocks(
    message: Mapping[str, Any], blocks: list[Any], max_bytes: int
) -> tuple[Mapping[str, Any], IngressClip | None]:
    """Cap each ``tool_result`` block of a carrier on its own; one clip for the message."""
    kept: list[Any] = []
    first: object = None
    first_format = None
    original = stored = 0
    for block in blocks:
        capped = None
        fmt = result_block_format(block)
        if fmt is not None and rebuildable(block):
            capped = _cap_content(fmt.block_result_content(block), max_bytes)
        if capped is None or fmt is None:
            kept.append(block)
            continue
        if first is None:
            first, first_format = block, fmt
        original += capped.original
        stored += capped.stored
        kept.append(fmt.with_block_result_content(block, capped.content))
    if first is None or first_format is None:
        return message, None
    clip = IngressClip(
        tool_name=first_format.block_result_name(first),
        tool_call_id=first_format.result_block_id(first),
        original_text_utf8_bytes=original,
        stored_text_utf8_bytes=stored,
        max_tool_result_bytes=max_bytes,
        content_kind=first_format.block_clip_kind,
    )
    return {**message, "content": kept}, clip


def _cap_content(content: object, max_bytes: int) -> _Capped | None:
    """One result's content capped (string or list of blocks), or None if within the cap."""
    if isinstance(content, str):
        return _cap_string(content, max_bytes)
    if isinstance(content, list):
        return _cap_blocks(content, max_bytes)
    return None


def _cap_string(content: str, max_bytes: int) -> _Capped | None:
    if len(content) * 4 <= max_bytes:
        return None  # no character takes more than 4 UTF-8 bytes: no need to count them
    original = utf8_size(content)
    if original <= max_bytes:
        return None
    tail = marker(original)
    clipped = utf8_prefix(content, max_bytes - utf8_size(tail)) + tail
    return _Capped(clipped, original, utf8_size(clipped))


def _cap_blocks(blocks: list[Any], max_bytes: int) -> _Capped | None:
    sizes = [utf8_size(block_field(b, "text")) if _is_text_block(b) else None for b in blocks]
    original = sum(s for s in sizes if s is not None)
    if original <= max_bytes:
        return None
    tail = marker(original)
    remaining = max_bytes - utf8_size(tail)
    kept: list[Any] = []
    stored = 0
    clipped = False
    for block, size in zip(blocks, sizes, strict=True):
        if size is None:
            kept.append(block)  # non-text blocks are never read or sliced
        elif clipped:
            continue  # text after the marker is dropped
        elif size <= remaining:
            kept.append(block)
            remaining -= size
            stored += size
        else:
            text = utf8_prefix(block_field(block, "text"), remaining) + tail
            kept.append(with_field(block, "text", text))
            stored += utf8_size(text)
            clipped = True
    return _Capped(kept, original, stored)
