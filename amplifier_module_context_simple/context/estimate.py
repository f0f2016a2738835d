"""Per-message token estimates: content-based, script-aware, calibrated against o200k_base.

Interface used by the rest of the package:

- ``estimate_text(text) -> int``: estimated o200k tokens for a piece of text.
- ``estimate_message(message) -> int``: tokens one provider-facing message costs, computed
  once at admission and cached by the store. Never raises.
- ``estimate_image(block) -> int``: the explicit estimate for one image block.
- ``provider_texts(message) -> (texts, fixed_tokens)``: exactly what ``estimate_message``
  counts (used by the calibration benchmark to tokenize the same text).

How text is estimated
---------------------
A BPE tokenizer first splits text into "pre-tokens" (a word with its leading space or
punctuation mark, a group of at most three digits, a run of punctuation, a newline run, an
indentation run) and then spends one or a few tokens on each. The estimator counts those
pre-token boundaries directly with a handful of bit-parallel operations over the UTF-8
bytes - one ``bytes.translate`` to a one-hot class per byte, one big-integer view, then
shifts, ANDs and ``int.bit_count``; there is no per-character Python loop. Features:

- ``letters``, ``upper``: ASCII letters and upper-case letters (long and rare words cost more).
- ``digits``, ``digit_runs``: a number of L digits is ceil(L/3) tokens, i.e. about
  digits/3 + 2/3 per run (fixed structurally, not fitted).
- ``word_runs``: runs of letters (non-ASCII bytes count as letters for runs).
- ``camel``: lower-to-upper transitions (``getUserName``, base64).
- ``punct_runs`` and ``punct_merged``: punctuation runs, and the single marks that merge
  into the following word (``.append``, ``_name``).
- ``indent_runs``: runs of two or more spaces/tabs (indentation, column padding).
- ``space_digit``: a space before a digit is a token of its own in o200k.
- One per-character weight per UTF-8 lead-byte range for non-ASCII text, which separates
  scripts for free: Latin-1/extended, Greek, Cyrillic, Hebrew/Armenian, Arabic, Indic/Thai
  (U+0800-0FFF), U+1000-1FFF (Hangul jamo, Georgian, Vietnamese), symbols and general
  punctuation (U+2000-2FFF), kana and CJK punctuation (U+3000-3FFF), Han ideographs
  (U+4000-9FFF), Hangul syllables (U+A000-DFFF), full-width forms (U+E000-FFFF) and
  astral characters (emoji).

The weights below are a least-squares fit (relative error, every class weighted equally)
on the deterministic corpus of ``benchmarks/corpus.py`` (seed 7, 200 samples per class),
produced by ``python -m benchmarks.calibrate --fit``, then multiplied by
``SAFETY_MARGIN`` so that budgets err on the side of compacting slightly early.

Calibration (``python -m benchmarks.calibrate``: held-out corpus, seed 20250101, 120
samples per class; reference = toktok o200k_base on exactly the text counted here, plus the
same fixed per-message/per-call constants; ratio = estimated / reference):

    (table filled in from the calibration run - see CALIBRATION below)

Messages
--------
A message costs ``MESSAGE_OVERHEAD_TOKENS`` plus the text a provider tokenizes: string
content; ``text``/``input_text``/``output_text``/``thinking`` text of content blocks;
``tool_use`` name and input (as JSON); ``tool_result`` content (recursively); tool calls
(OpenAI ``{"function": {"name", "arguments"}}`` and Amplifier ``{"tool", "arguments"}``
with dict or JSON-string arguments) at ``TOOL_CALL_OVERHEAD_TOKENS`` each plus name and
arguments. ``metadata`` is never sent to a provider and is not counted. Blocks of unknown
type are counted as their JSON. Images are never counted by their base64 length: see
``estimate_image``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "IMAGE_TOKENS_DEFAULT",
    "IMAGE_TOKENS_LOW_DETAIL",
    "MESSAGE_OVERHEAD_TOKENS",
    "TOOL_CALL_OVERHEAD_TOKENS",
    "estimate_image",
    "estimate_message",
    "estimate_text",
    "provider_texts",
]

MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Role marker and message framing (ChatML-style formats spend 3-4 tokens per message)."""

TOOL_CALL_OVERHEAD_TOKENS: Final = 4
"""Framing of one tool call or tool_use block (call id, wrapper), on top of name and args."""

IMAGE_TOKENS_DEFAULT: Final = 1600
"""An image whose size is neither declared nor cheaply readable from its header.

The largest image either major provider bills: Anthropic resizes to at most ~1.15
megapixels (~1,550 tokens at 750 pixels per token); OpenAI high detail tops out at
85 + 170 * 8 tiles = 1,445 tokens."""

IMAGE_TOKENS_LOW_DETAIL: Final = 85
"""OpenAI ``detail: "low"`` images cost a flat 85 tokens."""

SAFETY_MARGIN: Final = 1.03
"""Multiplier applied to the fitted weights (see the module docstring)."""

_CHUNK: Final = 16384
"""Bytes processed per big-integer pass (the masks below are this long)."""

_IMAGE_TYPES: Final = frozenset({"image", "image_url", "input_image"})
_TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})
_MAX_DEPTH: Final = 6
_B64_HEAD_CHARS: Final = 4096
"""Base64 characters decoded to read an image header (3 KiB of image)."""

# ---------------------------------------------------------------------------------------
# Byte classes (one-hot per byte) and masks
# ---------------------------------------------------------------------------------------

_LOWER: Final = 0x01
_UPPER: Final = 0x02
_DIGIT: Final = 0x04
_SPACE: Final = 0x08
_NEWLINE: Final = 0x10
_PUNCT: Final = 0x20
_NONASCII: Final = 0x40


def _byte_class(i: int) -> int:
    if i >= 0x80:
        return _NONASCII
    c = chr(i)
    if "a" <= c <= "z":
        return _LOWER
    if "A" <= c <= "Z":
        return _UPPER
    if "0" <= c <= "9":
        return _DIGIT
    if c in " \t\x0b\x0c":
        return _SPACE
    if c in "\r\n":
        return _NEWLINE
    return _PUNCT


_CLASS_TABLE: Final = bytes(_byte_class(i) for i in range(256))


def _mask(bit: int) -> int:
    return int.from_bytes(bytes([bit]) * _CHUNK, "little")


_M_LOWER: Final = _mask(_LOWER)
_M_UPPER: Final = _mask(_UPPER)
_M_LETTER: Final = _mask(_LOWER | _UPPER)
_M_DIGIT: Final = _mask(_DIGIT)
_M_SPACE: Final = _mask(_SPACE)
_M_PUNCT: Final = _mask(_PUNCT)

# Non-ASCII characters by UTF-8 lead byte: (name, first lead byte, last lead byte).
_SCRIPTS: Final[tuple[tuple[str, int, int], ...]] = (
    ("latin_ext", 0xC2, 0xCB),
    ("greek", 0xCC, 0xCF),
    ("cyrillic", 0xD0, 0xD4),
    ("hebrew", 0xD5, 0xD7),
    ("arabic", 0xD8, 0xDF),
    ("indic_thai", 0xE0, 0xE0),
    ("u1000", 0xE1, 0xE1),
    ("symbols", 0xE2, 0xE2),
    ("kana", 0xE3, 0xE3),
    ("han", 0xE4, 0xE9),
    ("hangul", 0xEA, 0xED),
    ("fullwidth", 0xEE, 0xEF),
    ("astral", 0xF0, 0xFF),
)
_THAI: Final = (b"\xe0\xb8", b"\xe0\xb9")  # U+0E00-0E7F, split out of "indic_thai" below
_INDIC: Final = 5  # index of "indic_thai" in _SCRIPTS


def _lead_table() -> tuple[bytes, bytes]:
    table = bytearray(256)
    for index, (_, lo, hi) in enumerate(_SCRIPTS):
        for i in range(lo, hi + 1):
            table[i] = index
    # ASCII and continuation bytes are deleted before the mapping; C0/C1 never occur in UTF-8.
    delete = bytes(range(0xC0)) + b"\xc0\xc1"
    return bytes(table), delete


_LEAD_TABLE, _LEAD_DELETE = _lead_table()

FEATURES: Final[tuple[str, ...]] = (
    "letters",
    "upper",
    "digits",
    "digit_runs",
    "word_runs",
    "camel",
    "punct_runs",
    "punct_merged",
    "indent_runs",
    "space_digit",
    *(name for name, _, _ in _SCRIPTS),
    "thai",
)
"""Names of the values ``text_features`` returns, in order (weights align with these)."""

FIXED_WEIGHTS: Final[Mapping[str, float]] = {"digits": 1 / 3, "digit_runs": 2 / 3}
"""Structural weights the calibration does not fit (a run of L digits is ceil(L/3) tokens)."""

# Fitted by ``python -m benchmarks.calibrate --fit`` (before SAFETY_MARGIN).
FITTED_WEIGHTS: Final[Mapping[str, float]] = {
    "letters": 0.0915,
    "upper": 0.1214,
    "digits": 1 / 3,
    "digit_runs": 2 / 3,
    "word_runs": 0.6177,
    "camel": 1.6660,
    "punct_runs": 1.0546,
    "punct_merged": -0.7108,
    "indent_runs": 1.2761,
    "space_digit": 0.8910,
    "latin_ext": 0.7058,
    "greek": 0.2784,
    "cyrillic": 0.1976,
    "hebrew": 0.3240,
    "arabic": 0.1840,
    "indic_thai": 0.2080,
    "u1000": 0.0432,
    "symbols": 1.4864,
    "kana": 0.6552,
    "han": 0.6703,
    "hangul": 0.4158,
    "fullwidth": 0.4622,
    "astral": 1.2234,
    "thai": 0.3575,
}

_W: Final[tuple[float, ...]] = tuple(FITTED_WEIGHTS[name] * SAFETY_MARGIN for name in FEATURES)
_N_ASCII: Final = 10
_W_ASCII: Final = _W[:_N_ASCII]
_W_SCRIPT: Final = _W[_N_ASCII : _N_ASCII + len(_SCRIPTS)]
_W_THAI: Final = _W[-1]


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return text.encode("utf-8", "surrogatepass")


def _chunk_features(chunk: bytes, out: list[int]) -> None:
    v = int.from_bytes(chunk.translate(_CLASS_TABLE), "little")
    p = v << 8  # byte i of p is the class of byte i - 1
    starts = v ^ (v & p)  # class bit set where a run of that class begins
    word = (v | (v >> 1) | (v >> 6)) & _M_LOWER  # letter or non-ASCII, in bit 0
    spaces2 = v & p & _M_SPACE  # a space preceded by a space
    out[0] += (v & _M_LETTER).bit_count()
    out[1] += (v & _M_UPPER).bit_count()
    out[2] += (v & _M_DIGIT).bit_count()
    out[3] += (starts & _M_DIGIT).bit_count()
    out[4] += (word ^ (word & (word << 8))).bit_count()
    out[5] += (((p & _M_LOWER) << 1) & v).bit_count()
    punct_starts = starts & _M_PUNCT
    out[6] += punct_starts.bit_count()
    out[7] += (punct_starts & (word >> 3)).bit_count()  # next byte is a letter
    out[8] += (spaces2 ^ (spaces2 & (spaces2 << 8))).bit_count()
    out[9] += (((p & _M_SPACE) >> 1) & v).bit_count()


def text_features(text: str) -> list[int]:
    """The feature counts of ``text``, aligned with ``FEATURES``."""
    data = _encode(text)
    out = [0] * len(FEATURES)
    for start in range(0, len(data), _CHUNK):
        _chunk_features(data[start : start + _CHUNK], out)
    if not text.isascii():
        leads = data.translate(_LEAD_TABLE, _LEAD_DELETE)
        for index in range(len(_SCRIPTS)):
            out[_N_ASCII + index] = leads.count(index)
        if out[_N_ASCII + _INDIC]:
            thai = data.count(_THAI[0]) + data.count(_THAI[1])
            out[_N_ASCII + _INDIC] -= thai
            out[-1] = thai
    return out


def estimate_text(text: str) -> int:
    """Estimated o200k_base tokens for ``text`` (0 for the empty string, else >= 1)."""
    if not text:
        return 0
    data = _encode(text)
    counts = [0] * _N_ASCII
    for start in range(0, len(data), _CHUNK):
        _chunk_features(data[start : start + _CHUNK], counts)
    total = 0.0
    for weight, count in zip(_W_ASCII, counts, strict=True):
        total += weight * count
    if not text.isascii():
        leads = data.translate(_LEAD_TABLE, _LEAD_DELETE)
        for index, weight in enumerate(_W_SCRIPT):
            n = leads.count(index)
            if n and index == _INDIC:
                thai = data.count(_THAI[0]) + data.count(_THAI[1])
                total += _W_THAI * thai
                n -= thai
            total += weight * n
    return max(1, math.ceil(total))


# ---------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------


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


def _b64_image_size(data: str) -> tuple[int, int] | None:
    if data.startswith("data:"):
        comma = data.find(",", 0, 256)
        if comma < 0 or ";base64" not in data[:comma]:
            return None
        data = data[comma + 1 :]
    head = data[:_B64_HEAD_CHARS].strip()
    head = head[: len(head) - len(head) % 4]
    try:
        raw = base64.b64decode(head)
    except (binascii.Error, ValueError):
        return None
    return _png_jpeg_gif_webp_size(raw)


def estimate_image(block: Mapping[str, Any]) -> int:
    """Tokens for one image block (``image``, ``image_url`` or ``input_image``).

    Declared ``width``/``height`` (on the block, its ``source`` or its ``image_url``) win;
    else the size is read from the PNG/JPEG/GIF/WebP header of inline base64 data (only
    the first 3 KiB are decoded); else ``IMAGE_TOKENS_DEFAULT``. OpenAI ``detail: "low"``
    costs ``IMAGE_TOKENS_LOW_DETAIL``. Never proportional to the base64 length, never 0.
    """
    try:
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
            if size is not None and size[0] > 0 and size[1] > 0:
                return _image_tokens_for_size(*size)
    except Exception:
        pass
    return IMAGE_TOKENS_DEFAULT


# ---------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------


def _as_mapping(value: Any) -> Any:
    """Pydantic-like objects (``model_dump``) as plain dicts; anything else unchanged."""
    if not isinstance(value, Mapping | str | list | tuple) and value is not None:
        dump = getattr(value, "model_dump", None)
        if callable(dump):
            try:
                return dump()
            except Exception:
                return value
    return value


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


class _Collector:
    __slots__ = ("fixed", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.fixed = MESSAGE_OVERHEAD_TOKENS

    def value(self, value: Any) -> None:
        """Any value as text: strings as they are, everything else as JSON."""
        if isinstance(value, str):
            if value:
                self.texts.append(value)
        elif value is not None:
            self.texts.append(_json(value))

    def content(self, content: Any, depth: int) -> None:
        content = _as_mapping(content)
        if content is None:
            return
        if isinstance(content, str):
            if content:
                self.texts.append(content)
        elif isinstance(content, list | tuple):
            if depth >= _MAX_DEPTH:
                self.value(list(content))
                return
            for block in content:
                self.content(block, depth + 1)
        elif isinstance(content, Mapping):
            self.block(content, depth)
        else:
            self.value(content)

    def block(self, block: Mapping[str, Any], depth: int) -> None:
        kind = block.get("type")
        if kind in _TEXT_TYPES and isinstance(block.get("text"), str):
            self.value(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            self.value(block["thinking"])
        elif kind in _IMAGE_TYPES:
            self.fixed += estimate_image(block)
        elif kind == "tool_use":
            self.fixed += TOOL_CALL_OVERHEAD_TOKENS
            self.value(block.get("name"))
            self.value(block.get("input"))
        elif kind == "tool_result":
            self.content(block.get("content"), depth + 1)
        else:
            self.value(dict(block))

    def tool_calls(self, calls: Any) -> None:
        calls = _as_mapping(calls)
        if calls is None:
            return
        if not isinstance(calls, list | tuple):
            self.value(calls)
            return
        for call in calls:
            call = _as_mapping(call)
            if not isinstance(call, Mapping):
                self.value(call)
                continue
            self.fixed += TOOL_CALL_OVERHEAD_TOKENS
            function = _as_mapping(call.get("function"))
            source = function if isinstance(function, Mapping) else call
            name = source.get("name")
            if name is None:
                name = call.get("tool")
            self.value(name)
            arguments = source.get("arguments")
            if arguments is None:
                arguments = source.get("input")
            self.value(arguments)


def provider_texts(message: Mapping[str, Any]) -> tuple[list[str], int]:
    """The texts ``estimate_message`` tokenizes and its fixed tokens (overheads, images).

    May raise on pathological input; ``estimate_message`` never does.
    """
    collector = _Collector()
    collector.content(message.get("content"), 0)
    collector.tool_calls(message.get("tool_calls"))
    return collector.texts, collector.fixed


def estimate_message(message: Mapping[str, Any]) -> int:
    """Tokens one provider-facing message costs (see the module docstring). Never raises."""
    try:
        texts, fixed = provider_texts(_as_mapping(message))
        return fixed + sum(estimate_text(text) for text in texts)
    except Exception:
        pass
    try:
        return MESSAGE_OVERHEAD_TOKENS + estimate_text(repr(message))
    except Exception:
        return MESSAGE_OVERHEAD_TOKENS
