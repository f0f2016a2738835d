"""The tool-result ingress cap: oversized tool text is clipped before admission.

Only ``role == "tool"`` messages are considered. String content, and direct text blocks of
list content (dicts ``{"type": "text", "text": str}`` or amplifier-core ``TextBlock``
objects), count toward the cap; image, audio, unknown and nested blocks are never read or
sliced. Bytes are UTF-8 with lone surrogates counted as replaced (one byte each), so an
ill-formed string under the cap is kept byte for byte, while a clipped prefix is always
valid UTF-8. An oversized result keeps a prefix and exactly one marker that carries the
original byte count and the retrieval guidance; the original text is kept nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .classify import block_field
from .config import INGRESS_MARKER_TEMPLATE

RETRIEVAL_GUIDANCE: Final = (
    "retrieve missing content using narrower read/query parameters; "
    "do not repeat state-changing actions just to recover output."
)
INGRESS_EVENT: Final = "context:tool_result_ingress_truncated"


@dataclass(frozen=True, slots=True)
class IngressClip:
    """The numbers reported for one clipped tool result (never its content)."""

    tool_name: object
    tool_call_id: object
    original_text_utf8_bytes: int
    stored_text_utf8_bytes: int
    max_tool_result_bytes: int
    content_kind: str

    def payload(self) -> dict[str, Any]:
        return {
            "tool_name": self.tool_name if isinstance(self.tool_name, str) else None,
            "tool_call_id": self.tool_call_id if isinstance(self.tool_call_id, str) else None,
            "original_text_utf8_bytes": self.original_text_utf8_bytes,
            "stored_text_utf8_bytes": self.stored_text_utf8_bytes,
            "max_tool_result_bytes": self.max_tool_result_bytes,
            "content_kind": self.content_kind,
        }


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
    return isinstance(block, Mapping) or callable(getattr(block, "model_copy", None))


def _with_text(block: object, text: str) -> object:
    if isinstance(block, Mapping):
        return {**block, "text": text}
    return block.model_copy(update={"text": text})  # type: ignore[attr-defined]


def cap_tool_result(
    message: Mapping[str, Any], max_bytes: int
) -> tuple[Mapping[str, Any], IngressClip | None]:
    """Return ``message`` clipped to ``max_bytes`` of text, and what was clipped.

    The input is never mutated; an under-cap message is returned as the same object.
    """
    if message.get("role") != "tool":
        return message, None
    content = message.get("content")
    if isinstance(content, str):
        original = utf8_size(content)
        if original <= max_bytes:
            return message, None
        tail = marker(original)
        clipped = utf8_prefix(content, max_bytes - utf8_size(tail)) + tail
        clip = _clip(message, original, utf8_size(clipped), max_bytes, "string")
        return {**message, "content": clipped}, clip
    if isinstance(content, list):
        return _cap_blocks(message, content, max_bytes)
    return message, None


def _cap_blocks(
    message: Mapping[str, Any], blocks: list[Any], max_bytes: int
) -> tuple[Mapping[str, Any], IngressClip | None]:
    sizes = [utf8_size(block_field(b, "text")) if _is_text_block(b) else None for b in blocks]
    original = sum(s for s in sizes if s is not None)
    if original <= max_bytes:
        return message, None
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
            kept.append(_with_text(block, text))
            stored += utf8_size(text)
            clipped = True
    clip = _clip(message, original, stored, max_bytes, "text_blocks")
    return {**message, "content": kept}, clip


def _clip(
    message: Mapping[str, Any], original: int, stored: int, cap: int, kind: str
) -> IngressClip:
    return IngressClip(
        tool_name=message.get("name"),
        tool_call_id=message.get("tool_call_id"),
        original_text_utf8_bytes=original,
        stored_text_utf8_bytes=stored,
        max_tool_result_bytes=cap,
        content_kind=kind,
    )
