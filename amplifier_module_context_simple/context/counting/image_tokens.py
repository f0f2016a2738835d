"""Image estimates: what one image block costs, never by its base64 length.

Declared sizes win; else the size is read from the header of inline base64 data (PNG,
JPEG, GIF, WebP); else the largest image either major provider bills.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["IMAGE_TOKENS_DEFAULT", "IMAGE_TOKENS_LOW_DETAIL", "estimate_image"]


IMAGE_TOKENS_DEFAULT: Final = 1600
"""An image whose size is neither declared nor cheaply readable from its header.

The largest image either major provider bills: Anthropic resizes to at most ~1.15
megapixels (~1,550 tokens at 750 pixels per token); OpenAI high detail tops out at
85 + 170 * 8 tiles = 1,445 tokens."""

IMAGE_TOKENS_LOW_DETAIL: Final = 85
"""OpenAI ``detail: "low"`` images cost a flat 85 tokens."""

_B64_HEAD_CHARS: Final = 4096
"""Base64 characters decoded at most to find a JPEG frame header (3 KiB of image)."""


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 0 < value < 1_000_000:
        return value
    if isinstance(value, float) and 0 < value < 1_000_000:
        return int(value)
    return None


def _image_tokens_for_size(width: int, height: int) -> int:
    """The larger of the OpenAI (high detail tiles) and Anthropic (pixels/750) costs."""
    w, h = float(width), float(height)
    # OpenAI: fit in 2048x2048, then shortest side to 768, then 512px tiles.
    scale = min(1.0, 2048 / max(w, h))
    ow, oh = w * scale, h * scale
    scale = min(1.0, 768 / min(ow, oh))
    ow, oh = ow * scale, oh * scale
    openai = 85 + 170 * math.ceil(ow / 512) * math.ceil(oh / 512)
    # Anthropic: long edge at most 1568 and at most ~1.15 megapixels; w*h/750 tokens.
    scale = min(1.0, 1568 / max(w, h), math.sqrt(1_150_000 / (w * h)))
    anthropic = math.ceil(w * scale * h * scale / 750)
    return max(openai, anthropic, IMAGE_TOKENS_LOW_DETAIL)


def _png_jpeg_gif_webp_size(head: bytes) -> tuple[int, int] | None:
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        kind = head[12:16]
        if kind == b"VP8X":
            w = int.from_bytes(head[24:27], "little") + 1
            return w, int.from_bytes(head[27:30], "little") + 1
        if kind == b"VP8 ":
            w = int.from_bytes(head[26:28], "little") & 0x3FFF
            return w, int.from_bytes(head[28:30], "little") & 0x3FFF
        if kind == b"VP8L":
            bits = int.from_bytes(head[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        return None
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                return None
            marker = head[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
                i += 1 if marker == 0xFF else 2
                continue
            length = int.from_bytes(head[i + 2 : i + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h = int.from_bytes(head[i + 5 : i + 7], "big")
                return int.from_bytes(head[i + 7 : i + 9], "big"), h
            i += 2 + length
    return None


def _b64_decode_head(data: str, chars: int) -> bytes:
    head = data[:chars].strip()
    try:
        return base64.b64decode(head[: len(head) - len(head) % 4])
    except (binascii.Error, ValueError):
        return b""


def _b64_image_size(data: str) -> tuple[int, int] | None:
    if data.startswith("data:"):
        comma = data.find(",", 0, 256)
        if comma < 0 or ";base64" not in data[:comma]:
            return None
        data = data[comma + 1 :]
    head = _b64_decode_head(data, 64)  # PNG, GIF and WebP sizes are in the first 30 bytes
    if head[:2] == b"\xff\xd8":  # JPEG: the frame header follows EXIF and other segments
        head = _b64_decode_head(data, _B64_HEAD_CHARS)
    return _png_jpeg_gif_webp_size(head)


def estimate_image(block: Mapping[str, Any]) -> int:
    """Tokens for one image block (``image``, ``image_url`` or ``input_image``).

    Declared ``width``/``height`` (on the block, its ``source`` or its ``image_url``) win;
    else the size is read from the PNG/JPEG/GIF/WebP header of inline base64 data (only
    the first 3 KiB are decoded); else ``IMAGE_TOKENS_DEFAULT``. OpenAI ``detail: "low"``
    costs ``IMAGE_TOKENS_LOW_DETAIL``. Never proportional to the base64 length, never 0.
    """
    try:
        return _estimate_image(block)
    except Exception:
        return IMAGE_TOKENS_DEFAULT


def _estimate_image(block: Mapping[str, Any]) -> int:
    holders: list[Mapping[str, Any]] = [block]
    data: str | None = None
    for key in ("source", "image_url"):
        inner = block.get(key)
        if isinstance(inner, Mapping):
            holders.append(inner)
        elif isinstance(inner, str):
            data = inner
    for holder in holders:
        if holder.get("detail") == "low":
            return IMAGE_TOKENS_LOW_DETAIL
    for holder in holders:
        w, h = _positive_int(holder.get("width")), _positive_int(holder.get("height"))
        if w and h:
            return _image_tokens_for_size(w, h)
    for holder in holders[1:]:
        for key in ("data", "url"):
            value = holder.get(key)
            if isinstance(value, str):
                data = value
    if data is not None:
        size = _b64_image_size(data)
        if size is not None:
            w, h = _positive_int(size[0]), _positive_int(size[1])
            if w and h:
                return _image_tokens_for_size(w, h)
    return IMAGE_TOKENS_DEFAULT
