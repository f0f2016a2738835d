"""An independent provider-side token counter: what an OpenAI-style provider would bill.

This module shares nothing with ``amplifier_module_context_simple`` (it imports nothing
from it, in particular not ``context/counting/estimate.py``): the negotiation benchmark's simulated
provider and the estimator rows on real conversations use it as the reference, so the
estimator is measured against a counter written separately, not against itself.

Conversion (``openai_messages``)
--------------------------------
Every message becomes what the ``messages`` array of an OpenAI Chat Completions request
body carries:

- ``role`` as it is (``system``, ``developer``, ``user``, ``assistant``, ``tool``, ...).
- ``content``: a string stays a string (``None`` stays ``None``; any other scalar becomes
  its JSON). A list becomes content parts: text blocks (``text``, ``input_text``,
  ``output_text``) and bare strings -> ``{"type": "text", "text"}``; images (``image``,
  ``image_url``, ``input_image``; Anthropic base64 sources as data URLs) -> ``{"type":
  "image_url", "image_url": {"url", "detail"}}``; ``thinking``, ``redacted_thinking``
  and ``reasoning`` blocks are dropped (Chat Completions has no input field for them,
  and Anthropic documents that earlier turns' thinking blocks are stripped and not
  counted as input); any other block -> a text part holding its JSON.
- Tool calls -> ``tool_calls: [{"id", "type": "function", "function": {"name",
  "arguments"}}]``, from OpenAI calls (``function.name`` / ``function.arguments``),
  Amplifier's stored calls ``{"id", "tool", "arguments"}`` and Anthropic ``tool_use`` /
  amplifier-core ``tool_call`` content blocks (``name`` / ``input``). Arguments that are
  not already a string become ``json.dumps(arguments, ensure_ascii=False)``. A content
  block call whose id a ``tool_calls`` entry also carries (Amplifier stores every call
  both ways) is sent once.
- ``tool_result`` blocks (Anthropic ``tool_use_id`` or amplifier-core ``tool_call_id``,
  content ``content`` or ``output``) become one ``{"role": "tool", "tool_call_id",
  "content"}`` message each, placed before whatever else their message holds (which stays
  a message of its own role, if anything is left).
- ``tool_call_id`` is kept on tool messages; ``name`` is kept as OpenAI's participant name
  on non-tool messages when it is a non-empty string (the Chat Completions tool message
  has no ``name``). Everything else - ``metadata``, block ids other than tool calls',
  ``is_error``, ``cache_control``, signatures - is dropped.

Counting (``Counter``)
----------------------
o200k_base BPE (``toktok.batch_count``), each string tokenized as the separate field it
is, plus OpenAI's published accounting for chat messages (the OpenAI Cookbook's "How to
count tokens with tiktoken", ``num_tokens_from_messages`` for gpt-4o / gpt-4): 3 tokens
per message, the encoded string values of its fields, 1 more per ``name``, and 3 per
request for the reply priming (``<|start|>assistant<|message|>``). The recipe encodes
every string value of a message; the nested fields it does not cover are counted the
same way. Exactly, per converted message::

    3 + bpe(role) + content + [bpe(name) + 1] + bpe(tool_call_id)
      + sum over tool_calls of (bpe(id) + bpe(function.name) + bpe(function.arguments))

where ``content`` is ``bpe(content)`` for a string, and for content parts the sum of
``bpe(text)`` over text parts plus, per image part, OpenAI's published image cost
(``image_tokens``: 85 with ``detail: "low"``, else 85 + 170 per 512-pixel tile after
fitting in 2048 x 2048 and scaling the shortest side to 768, with the size read from a
base64 PNG / GIF / JPEG header; 765, a 1024 x 1024 image, when the size is unknown).
Not counted: ``type`` strings (constants of the wire format), the JSON punctuation and
key names of the body. A request (``count_request``) adds ``REPLY_PRIMING`` once.
``message_tokens`` is one stored message's share: the sum over the messages it converts
to, without the reply priming.

Token counts are cached per string, and a message's conversion per content object.
Strings that are not valid UTF-8 (lone surrogates) are counted with the offending code
points replaced, as a JSON encoder would have to.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

ENCODING: Final = "o200k_base"
TOKENS_PER_MESSAGE: Final = 3
TOKENS_PER_NAME: Final = 1
REPLY_PRIMING: Final = 3
IMAGE_TOKENS_LOW: Final = 85
IMAGE_TOKENS: Final = 765

_TEXT_BLOCKS: Final = frozenset({"text", "input_text", "output_text"})
_IMAGE_HEAD_CHARS: Final = 8192
"""Base64 characters decoded at most to find an image's size (6 KiB of image)."""
_IMAGE_BLOCKS: Final = frozenset({"image", "image_url", "input_image"})
_DROPPED_BLOCKS: Final = frozenset({"thinking", "redacted_thinking", "reasoning"})
_CALL_BLOCKS: Final = frozenset({"tool_use", "tool_call"})

Field = tuple[str, str]
"""(kind, text) - kind is one of ``FIELD_KINDS``."""

ID_FIELDS: Final = frozenset({"tool_call_id", "call_id"})
"""The call ids (``tool_calls[].id`` and ``tool_call_id``): counted, as every string value
of a message is; whether a provider renders them into the model's input is not published
(gpt-oss's harmony format, the closest public rendering of OpenAI's, names the function
and carries no id)."""

FIELD_KINDS: Final = (
    "role",
    "content",
    "name",
    "tool_call_id",
    "call_id",
    "call_name",
    "arguments",
)


# -- conversion -----------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Pydantic-like objects (``model_dump``) as plain data; anything else unchanged."""
    if isinstance(value, str | int | float | bool | list | tuple | Mapping) or value is None:
        return value
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) else value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _arguments(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, str):
        return value
    return "" if value is None else _json(value)


def _function_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": arguments},
    }


def _tool_call(call: Any) -> dict[str, Any]:
    """One OpenAI or Amplifier stored call in the OpenAI shape."""
    call = _plain(call)
    if not isinstance(call, Mapping):
        return _function_call("", "", _arguments(call))
    function = _plain(call.get("function"))
    if isinstance(function, Mapping):
        return _function_call(
            call.get("id"), function.get("name"), _arguments(function.get("arguments"))
        )
    arguments = call.get("arguments")
    if arguments is None:
        arguments = call.get("input")
    return _function_call(call.get("id"), call.get("tool", call.get("name")), _arguments(arguments))


def _part(block: Any) -> dict[str, Any] | None:
    """One content block as an OpenAI content part (None: dropped)."""
    block = _plain(block)
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, Mapping):
        return {"type": "text", "text": _json(block)}
    kind = block.get("type")
    if kind in _TEXT_BLOCKS and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind in _DROPPED_BLOCKS:
        return None
    if kind in _IMAGE_BLOCKS:
        return {"type": "image_url", "image_url": _image_url(block)}
    return {"type": "text", "text": _json(dict(block))}


def _image_url(block: Mapping[str, Any]) -> dict[str, Any]:
    """``{"url", "detail"}`` of an OpenAI, Anthropic or amplifier-core image block."""
    image = _plain(block.get("image_url"))
    detail = block.get("detail")
    url: Any = block.get("url")
    if isinstance(image, Mapping):
        url, detail = image.get("url"), image.get("detail", detail)
    elif isinstance(image, str):
        url = image
    source = _plain(block.get("source"))
    if isinstance(source, Mapping):
        if isinstance(source.get("data"), str):
            url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
        elif isinstance(source.get("url"), str):
            url = source["url"]
    return {"url": url if isinstance(url, str) else "", "detail": detail or "auto"}


def _image_size(url: str) -> tuple[int, int] | None:
    """(width, height) from the header of a base64 data URL's PNG, GIF or JPEG image."""
    head, _, data = url.partition(";base64,")
    if not head.startswith("data:") or not data:
        return None
    try:
        raw = base64.b64decode(data[:_IMAGE_HEAD_CHARS].rstrip("=") + "==")
    except ValueError:
        return None
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) >= 24:
        return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        return int.from_bytes(raw[6:8], "little"), int.from_bytes(raw[8:10], "little")
    if raw[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(raw) and raw[i] == 0xFF:
            marker, length = raw[i + 1], int.from_bytes(raw[i + 2 : i + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height = int.from_bytes(raw[i + 5 : i + 7], "big")
                return int.from_bytes(raw[i + 7 : i + 9], "big"), height
            i += 2 + length
    return None


def image_tokens(image_url: Mapping[str, Any]) -> int:
    """OpenAI's published image cost: 85 with ``detail: "low"``; otherwise fit in 2048 x
    2048, shortest side down to 768, then 85 + 170 per 512-pixel tile. An image whose
    size the header does not give costs ``IMAGE_TOKENS`` (a 1024 x 1024 image)."""
    if image_url.get("detail") == "low":
        return IMAGE_TOKENS_LOW
    size = _image_size(str(image_url.get("url", "")))
    if size is None or min(size) <= 0:
        return IMAGE_TOKENS
    w, h = (float(v) for v in size)
    scale = min(1.0, 2048 / max(w, h))
    w, h = w * scale, h * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return IMAGE_TOKENS_LOW + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def _content(content: Any) -> str | list[dict[str, Any]] | None:
    content = _plain(content)
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return [p for p in map(_part, content) if p is not None]
    part = _part(content)
    return [part] if part is not None else []


def _result_message(block: Mapping[str, Any]) -> dict[str, Any]:
    call_id = block.get("tool_use_id", block.get("tool_call_id"))
    inner = block.get("content", block.get("output"))
    content = _content(inner if isinstance(inner, str | list | tuple) or inner is None else [inner])
    return {
        "role": "tool",
        "tool_call_id": call_id if isinstance(call_id, str) else "",
        "content": "" if content is None else content,
    }


def convert_message(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One stored message as the OpenAI Chat Completions message(s) it becomes."""
    message = _plain(message)
    role = message.get("role")
    role = role if isinstance(role, str) else ""
    raw = _plain(message.get("content"))
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    content: str | list[dict[str, Any]] | None
    if isinstance(raw, list | tuple):
        kept: list[Any] = []
        for block in raw:
            block = _plain(block)
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "tool_result":
                results.append(_result_message(block))
            elif kind in _CALL_BLOCKS:
                calls.append(
                    _function_call(
                        block.get("id"),
                        block.get("name"),
                        _arguments(block.get("input", block.get("arguments"))),
                    )
                )
            else:
                kept.append(block)
        content = _content(kept)
    else:
        content = _content(raw)
    stored_calls = _plain(message.get("tool_calls"))
    if isinstance(stored_calls, list | tuple):
        listed = [_tool_call(call) for call in stored_calls]
        ids = {call["id"] for call in listed if call["id"]}
        # Amplifier states each call twice (a tool_call block and a tool_calls entry):
        # a request carries it once
        calls = [*listed, *(call for call in calls if call["id"] not in ids)]
    elif stored_calls is not None:
        calls.append(_tool_call(stored_calls))
    if role == "tool":
        call_id = message.get("tool_call_id")
        tool: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": call_id if isinstance(call_id, str) else "",
            "content": "" if content is None else content,
        }
        return [*results, tool]
    out: dict[str, Any] = {"role": role, "content": content}
    name = message.get("name")
    if isinstance(name, str) and name:
        out["name"] = name
    if calls:
        out["tool_calls"] = calls
    if results and not calls and not content:
        return results  # a message of nothing but tool results
    return [*results, out]


def openai_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``messages`` array of the Chat Completions request for ``messages``."""
    return [converted for message in messages for converted in convert_message(message)]


# -- counting -------------------------------------------------------------------------------


def fields(message: Mapping[str, Any]) -> tuple[list[Field], int]:
    """The counted strings of one converted message and its fixed tokens (module docstring)."""
    out: list[Field] = [("role", message["role"])]
    fixed = TOKENS_PER_MESSAGE
    content = message.get("content")
    if isinstance(content, str):
        out.append(("content", content))
    elif isinstance(content, list):
        for part in content:
            if part["type"] == "text":
                out.append(("content", part["text"]))
            else:
                fixed += image_tokens(part["image_url"])
    if "name" in message:
        out.append(("name", message["name"]))
        fixed += TOKENS_PER_NAME
    if "tool_call_id" in message:
        out.append(("tool_call_id", message["tool_call_id"]))
    for call in message.get("tool_calls", ()):
        function = call["function"]
        out += [
            ("call_id", call["id"]),
            ("call_name", function["name"]),
            ("arguments", function["arguments"]),
        ]
    return [(kind, text) for kind, text in out if text], fixed


def _countable(text: str) -> str:
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


_MEMO_KEYS: Final = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "metadata"})


class Counter:
    """o200k_base counts of OpenAI Chat Completions messages (module docstring)."""

    def __init__(self, encoding: str = ENCODING) -> None:
        import toktok

        self._batch_count = toktok.batch_count
        self._encoding = encoding
        self._cache: dict[str, int] = {}
        self._memo: dict[tuple[Any, ...], tuple[list[str], int, Any, Any]] = {}

    def tokens(self, texts: Iterable[str]) -> list[int]:
        """BPE counts of ``texts`` (cached)."""
        texts = list(texts)
        cache = self._cache
        missing = list(dict.fromkeys(t for t in texts if t not in cache))
        if missing:
            counts = self._batch_count([_countable(t) for t in missing], self._encoding)
            cache.update(zip(missing, counts, strict=True))
        return [cache[t] for t in texts]

    def count_converted(
        self, converted: Sequence[Mapping[str, Any]], exclude: frozenset[str] = frozenset()
    ) -> list[int]:
        """Tokens of each converted message (no reply priming); ``exclude``: field kinds
        left out (for sensitivity figures only, e.g. ``ID_FIELDS``)."""
        spans: list[tuple[int, int, int]] = []
        texts: list[str] = []
        for message in converted:
            parts, fixed = fields(message)
            spans.append((len(texts), len(texts) + len(parts), fixed))
            texts += [text if kind not in exclude else "" for kind, text in parts]
        counts = self.tokens(texts)
        return [fixed + sum(counts[a:b]) for a, b, fixed in spans]

    def message_tokens(
        self, message: Mapping[str, Any], exclude: frozenset[str] = frozenset()
    ) -> int:
        """One stored message's tokens: the messages it converts to, no reply priming."""
        return sum(self.count_converted(convert_message(message), exclude))

    def _parts(self, message: Mapping[str, Any]) -> tuple[list[str], int]:
        """The counted strings and fixed tokens of everything ``message`` converts to.

        Memoised by the identity of the message's ``content`` and ``tool_calls`` objects
        (kept alive by the memo, so an identity is never reused) and its scalar fields:
        views are new dicts around shared, read-only contents.
        """
        key: tuple[Any, ...] | None = None
        if isinstance(message, dict) and set(message) <= _MEMO_KEYS:
            content, calls = message.get("content"), message.get("tool_calls")
            scalars = tuple(message.get(k) for k in ("role", "tool_call_id", "name"))
            if all(v is None or isinstance(v, str) for v in scalars):
                key = (id(content), id(calls), *scalars)
                hit = self._memo.get(key)
                if hit is not None:
                    return hit[0], hit[1]
        texts: list[str] = []
        fixed = 0
        for converted in convert_message(message):
            parts, extra = fields(converted)
            texts += [text for _, text in parts]
            fixed += extra
        if key is not None:
            self._memo[key] = (texts, fixed, message.get("content"), message.get("tool_calls"))
        return texts, fixed

    def count_request(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """The input tokens of a request carrying ``messages`` (reply priming included)."""
        texts: list[str] = []
        fixed = REPLY_PRIMING
        for message in messages:
            parts, extra = self._parts(message)
            texts += parts
            fixed += extra
        return fixed + sum(self.tokens(texts))


__all__ = [
    "ENCODING",
    "FIELD_KINDS",
    "ID_FIELDS",
    "IMAGE_TOKENS",
    "IMAGE_TOKENS_LOW",
    "REPLY_PRIMING",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "Counter",
    "Field",
    "convert_message",
    "fields",
    "image_tokens",
    "openai_messages",
]
