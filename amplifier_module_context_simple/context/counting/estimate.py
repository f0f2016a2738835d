"""Per-message token estimates: content-based, script-aware, calibrated against o200k_base.

Interface used by the rest of the package:

- ``estimate_text(text) -> int``: estimated o200k tokens for a piece of text.
- ``estimate_message(message) -> int``: tokens one provider-facing message costs, computed
  once at admission and cached by the store. Never raises.
- ``estimate_image(block) -> int``: the explicit estimate for one image block.
- ``provider_texts(message) -> (texts, fixed_tokens)``: exactly what ``estimate_message``
  counts (used by the calibration benchmark to tokenize the same text).

Text is estimated by ``text_tokens.py`` (how, and how it is calibrated: its docstring),
images by ``image_tokens.py``; this module counts messages.

Messages
--------
A message costs ``MESSAGE_OVERHEAD_TOKENS`` plus the text a provider tokenizes: string
content; ``text``/``input_text``/``output_text``/``thinking`` text of content blocks;
``tool_use`` name and input (as JSON); ``tool_result`` content (recursively); tool calls
(OpenAI ``{"function": {"name", "arguments"}}`` and Amplifier ``{"tool", "arguments"}``
with dict or JSON-string arguments) at ``TOOL_CALL_OVERHEAD_TOKENS`` each plus name and
arguments; call ids as the text they are (a call's ``id``, a result's ``tool_call_id`` or
``tool_use_id``: every id a request carries, as a view shows it). ``metadata`` is never
sent to a provider and is not counted. Blocks of unknown type are counted as their JSON.
Where each format keeps a call's id, name and arguments and a result's id and content is
the format classes' rule (``formats/``); they feed the texts to ``_Collector``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..formats import RESULT_ID_KEYS, as_plain, block_format, count_message, has_call_lists
from .image_tokens import IMAGE_TOKENS_DEFAULT, IMAGE_TOKENS_LOW_DETAIL, estimate_image
from .text_tokens import (
    FEATURES,
    FITTED_WEIGHTS,
    FIXED_WEIGHTS,
    SAFETY_MARGIN,
    estimate_text,
    text_features,
)

__all__ = [
    "FEATURES",
    "FITTED_WEIGHTS",
    "FIXED_WEIGHTS",
    "IMAGE_TOKENS_DEFAULT",
    "IMAGE_TOKENS_LOW_DETAIL",
    "MESSAGE_OVERHEAD_TOKENS",
    "SAFETY_MARGIN",
    "TOOL_CALL_OVERHEAD_TOKENS",
    "estimate_image",
    "estimate_message",
    "estimate_text",
    "provider_texts",
    "text_features",
]

MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Role marker and message framing (ChatML-style formats spend 3-4 tokens per message)."""

TOOL_CALL_OVERHEAD_TOKENS: Final = 1
"""Framing of one tool call or call block, on top of its id, name and arguments, which
are counted as text: no provider publishes it and OpenAI's counting recipe has none; one
token keeps a call from costing only its texts."""

_IMAGE_TYPES: Final = frozenset({"image", "image_url", "input_image"})
_TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})
_MAX_DEPTH: Final = 6


_as_mapping: Final = as_plain


_ENCODER: Final = json.JSONEncoder(default=str, ensure_ascii=False)
"""``json.dumps(value, default=str, ensure_ascii=False)`` without building an encoder per call."""


def _json(value: Any) -> str:
    return _ENCODER.encode(value)


class _Collector:
    """The texts and fixed tokens of one message (the format classes' ``Counter``)."""

    __slots__ = ("fixed", "listed_calls", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.fixed = MESSAGE_OVERHEAD_TOKENS
        # Calls a format records twice (in a list and as blocks): a provider is sent one
        # (set by ``count_message``).
        self.listed_calls: frozenset[str] = frozenset()

    def value(self, value: Any) -> None:
        """Any value as text: strings as they are, everything else as JSON."""
        if isinstance(value, str):
            if value:
                self.texts.append(value)
        elif value is not None:
            self.texts.append(_json(value))

    def call_id(self, value: Any) -> None:
        """A call id: counted as the text it is (a non-empty string; anything else is not
        sent as one)."""
        if type(value) is str and value:
            self.texts.append(value)

    def call(self) -> None:
        """The framing of one tool call."""
        self.fixed += TOOL_CALL_OVERHEAD_TOKENS

    def content(self, content: Any, depth: int) -> None:
        kind = type(content)
        if kind is str:  # the common shapes first, by exact type
            if content:
                self.texts.append(content)
            return
        if kind is dict:
            self.block(content, depth)
            return
        if kind is list and depth < _MAX_DEPTH:
            for block in content:
                self.content(block, depth + 1)
            return
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
        elif (owner := block_format(kind)) is not None:
            owner.count_block(self, block, depth)  # a call or a result, as its format says
        else:
            self.value(dict(block))


def provider_texts(message: Mapping[str, Any]) -> tuple[list[str], int]:
    """The texts ``estimate_message`` tokenizes and its fixed tokens (overheads, images).

    May raise on pathological input; ``estimate_message`` never does.
    """
    collector = _Collector()
    count_message(collector, message)  # the tool fields around the content, as sent
    return collector.texts, collector.fixed


def estimate_message(message: Mapping[str, Any]) -> int:
    """Tokens one provider-facing message costs (see the module docstring). Never raises."""
    try:
        if type(message) is dict and not has_call_lists(message):
            content = message.get("content")
            if type(content) is str:  # the commonest shape: what ``provider_texts`` counts
                tokens = MESSAGE_OVERHEAD_TOKENS + (estimate_text(content) if content else 0)
                for key in RESULT_ID_KEYS:
                    call_id = message.get(key)
                    if type(call_id) is str and call_id:
                        tokens += estimate_text(call_id)
                return tokens
        texts, fixed = provider_texts(_as_mapping(message))
        return fixed + sum(map(estimate_text, texts))
    except Exception:
        return _estimate_unreadable(message)


def _estimate_unreadable(message: Any) -> int:
    try:
        return MESSAGE_OVERHEAD_TOKENS + estimate_text(repr(message))
    except Exception:
        return MESSAGE_OVERHEAD_TOKENS
