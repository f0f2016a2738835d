"""The reduced forms a view may show instead of a message: truncated and stubbed.

Both only ever shrink a message: a transformation whose estimate is not strictly smaller
than the original's is not made (the function returns None), so it is neither applied
nor counted. Reduced forms carry ``metadata["compaction"]`` saying what was done, so a
reader (and a test) can trace every reduced message back to its admitted original.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .classify import block_field
from .estimate import estimate_message

STUB_MIN_CHARS: Final = 80
STUB_PREVIEW_CHARS: Final = 50


def _mark(message: Mapping[str, Any], content: object, note: dict[str, Any]) -> dict[str, Any]:
    metadata = message.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    metadata["compaction"] = note
    return {**message, "content": content, "metadata": metadata}


def _clip_text(text: str, keep: int, original_tokens: int) -> str:
    return (
        f"[tool output truncated from ~{original_tokens:,} tokens to its first {keep:,} "
        f"characters; run the tool again with narrower parameters if you need the rest] "
        f"{text[:keep]}…"
    )


def truncated_form(
    message: Mapping[str, Any], tokens: int, truncate_chars: int
) -> tuple[dict[str, Any], int] | None:
    """A tool result cut to its first ``truncate_chars`` characters, or None if no smaller.

    Handles ``tool`` messages with string content and result carriers whose
    ``tool_result`` blocks hold string content (Anthropic style).
    """
    content = message.get("content")
    note = {"form": "truncated", "original_tokens": tokens}
    if isinstance(content, str):
        if len(content) <= truncate_chars:
            return None
        candidate = _mark(message, _clip_text(content, truncate_chars, tokens), note)
    elif isinstance(content, list):
        changed = False
        blocks: list[Any] = []
        for block in content:
            inner = block_field(block, "content") if isinstance(block, Mapping) else None
            if (
                block_field(block, "type") == "tool_result"
                and isinstance(inner, str)
                and len(inner) > truncate_chars
            ):
                blocks.append({**block, "content": _clip_text(inner, truncate_chars, tokens)})
                changed = True
            else:
                blocks.append(block)
        if not changed:
            return None
        candidate = _mark(message, blocks, note)
    else:
        return None
    new_tokens = estimate_message(candidate)
    return (candidate, new_tokens) if new_tokens < tokens else None


def stubbed_form(message: Mapping[str, Any], tokens: int) -> tuple[dict[str, Any], int] | None:
    """A user message replaced by a short preview, or None if that would not shrink it."""
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= STUB_MIN_CHARS:
        return None
    preview = " ".join(content[:STUB_PREVIEW_CHARS].split())
    stub = f'[earlier message compacted ({len(content):,} characters); it began: "{preview}…"]'
    note = {"form": "stubbed", "original_chars": len(content)}
    candidate = _mark(message, stub, note)
    new_tokens = estimate_message(candidate)
    return (candidate, new_tokens) if new_tokens < tokens else None
