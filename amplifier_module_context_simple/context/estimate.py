"""Per-message token estimates (placeholder: four characters per token).

Interface used by the rest of the package:

- ``estimate_text(text) -> int``: tokens for a piece of text.
- ``estimate_message(message) -> int``: tokens one provider-facing message costs,
  computed once at admission and cached by the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MESSAGE_OVERHEAD_TOKENS = 4


def estimate_text(text: str) -> int:
    return (len(text) + 3) // 4


def estimate_message(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str):
        body = content
    elif content is None:
        body = ""
    else:
        body = json.dumps(content, default=str, ensure_ascii=False)
    calls = message.get("tool_calls")
    if calls:
        body += json.dumps(calls, default=str, ensure_ascii=False)
    return MESSAGE_OVERHEAD_TOKENS + estimate_text(body)
