"""The reduced forms a view may show instead of a message: truncated and stubbed.

Both only ever shrink a message: a transformation whose estimate (``estimate_message``) is
not strictly smaller than the original's is not made (the function returns None), so it
is neither applied nor counted. Reduced forms carry ``metadata["compaction"]`` saying what
was done, so a reader (and a test) can trace every reduced message back to its admitted
original. The input message is never mutated; unchanged blocks are the same objects.

``truncated_form`` reduces every carrier of tool results alike (the format classes in
``formats/`` say where each format's results live and how a reduced one is put back):

- a message with string content (a ``role: tool`` result) keeps its first
  ``truncate_chars`` characters after a lead-in naming the original size and how to get
  the rest;
- a ``role: tool`` message whose content is a list of blocks, and each ``tool_result``
  block (dict, or object with ``model_copy``) of a result carrier, whose ``content`` is a
  string (clipped as above) or a list of blocks. A block list is reduced to a valid block
  list: the text of its direct text blocks (``text``/``input_text``/``output_text``) is
  kept up to ``truncate_chars`` characters in total (earlier text first, later text
  dropped, empty text blocks dropped), the lead-in appears once per result (merged into
  the first text block when the list starts with text, else a text block of its own),
  and every other block (image, document, audio, nested, unknown) becomes a short text
  placeholder naming its type. Block ids, ``is_error`` and every other key of a
  ``tool_result`` block are kept; other blocks of a carrier (a human's text) are kept.

``truncated_form(..., protected=True)`` is the form of last resort for protected results
(the newest ones) when nothing else makes a request fit: its lead-in says the output was
shortened to fit the model's input limit and carries the retrieval guidance, and its note
has ``"protected": True``.

``stubbed_form`` replaces a user message with string content by a short preview; a
message whose content is a list (so every ``tool_result`` carrier) is never stubbed.

``thoughtless_form`` is an assistant message without its ``thinking`` and
``redacted_thinking`` blocks: what a view shows after a compaction changed the prefix that
thinking was produced with (docs/thinking.md). Every other block is kept, in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..counting.estimate import estimate_message
from ..formats import (
    block_field,
    block_type,
    rebuildable,
    result_block_format,
    tool_ids,
    whole_result_format,
    with_field,
)
from ..history.ingress import RETRIEVAL_GUIDANCE

__all__ = (
    "STUB_MIN_CHARS",
    "STUB_PREVIEW_CHARS",
    "THINKING_TYPES",
    "Unthought",
    "has_thinking",
    "stubbed_form",
    "thoughtless_form",
    "truncated_form",
    "unthought",
)

THINKING_TYPES: Final = frozenset({"thinking", "redacted_thinking"})
"""The content block types a provider with preserved thinking binds to their prefix."""


STUB_MIN_CHARS: Final = 80
STUB_PREVIEW_CHARS: Final = 50
_TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})
_MAX_LABEL_CHARS: Final = 40


def _mark(message: Mapping[str, Any], content: object, note: dict[str, Any]) -> dict[str, Any]:
    metadata = message.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    metadata["compaction"] = note
    return {**message, "content": content, "metadata": metadata}


def _lead_in(keep: int, original_tokens: int, protected: bool) -> str:
    if protected:
        return (
            f"[tool output shortened from ~{original_tokens:,} tokens to its first {keep:,} "
            f"characters to fit the model's input limit; to get the rest, {RETRIEVAL_GUIDANCE}]"
        )
    return (
        f"[tool output truncated from ~{original_tokens:,} tokens to its first {keep:,} "
        f"characters; run the tool again with narrower parameters if you need the rest]"
    )


def _clip_text(text: str, keep: int, original_tokens: int, protected: bool = False) -> str:
    return f"{_lead_in(keep, original_tokens, protected)} {text[:keep]}…"


def _text_of(block: object) -> str | None:
    """The text of a direct text block that can be rebuilt, else None."""
    text = block_field(block, "text")
    if block_type(block) in _TEXT_TYPES and isinstance(text, str) and rebuildable(block):
        return text
    return None


def _placeholder(block: object, protected: bool) -> dict[str, str]:
    kind = block_type(block)
    if not kind or len(kind) > _MAX_LABEL_CHARS or not kind.isprintable():
        kind = "content block"
    if protected:
        return {"type": "text", "text": f"[{kind} omitted to fit the model's input limit]"}
    return {"type": "text", "text": f"[{kind} omitted from this earlier tool result]"}


def _reduce_blocks(
    blocks: list[Any], keep_chars: int, tokens: int, protected: bool
) -> list[Any] | None:
    """One result's block list reduced (see the module docstring), or None if unchanged."""
    texts = [_text_of(block) for block in blocks]
    total = sum(len(text) for text in texts if text is not None)
    if total <= keep_chars and None not in texts:
        return None
    remaining = keep_chars
    reduced: list[Any] = []
    starts_with_text = False
    for block, text in zip(blocks, texts, strict=True):
        if text is None:
            reduced.append(_placeholder(block, protected))
            continue
        piece = text[:remaining]
        remaining -= len(piece)
        if not piece:
            continue  # text past the limit (and empty text) is dropped
        if not reduced:
            starts_with_text = True
        if len(piece) < len(text):
            piece += "…"
        reduced.append(block if piece == text else with_field(block, "text", piece))
    lead = _lead_in(min(total, keep_chars), tokens, protected)
    if starts_with_text:
        first = reduced[0]
        reduced[0] = with_field(first, "text", f"{lead} {block_field(first, 'text')}")
    else:
        reduced.insert(0, {"type": "text", "text": lead})
    return reduced


def _reduce_result(
    content: object, keep_chars: int, tokens: int, protected: bool
) -> str | list[Any] | None:
    """One result's content (a string or a block list) reduced, or None if unchanged."""
    if isinstance(content, str):
        if len(content) <= keep_chars:
            return None
        return _clip_text(content, keep_chars, tokens, protected)
    if isinstance(content, list):
        return _reduce_blocks(content, keep_chars, tokens, protected)
    return None


def _reduce_carrier(
    blocks: list[Any], keep_chars: int, tokens: int, protected: bool
) -> list[Any] | None:
    """Each result block of a carrier reduced; None if none changed."""
    changed = False
    reduced: list[Any] = []
    for block in blocks:
        inner = None
        fmt = result_block_format(block)
        if fmt is not None and rebuildable(block):
            inner = _reduce_result(fmt.block_result_content(block), keep_chars, tokens, protected)
        if inner is None or fmt is None:
            reduced.append(block)
        else:
            reduced.append(fmt.with_block_result_content(block, inner))
            changed = True
    return reduced if changed else None


def truncated_form(
    message: Mapping[str, Any], tokens: int, truncate_chars: int, *, protected: bool = False
) -> tuple[dict[str, Any], int] | None:
    """A tool result cut to its first ``truncate_chars`` characters, or None if no smaller.

    ``tokens`` is the message's estimate; the returned pair is the reduced message and
    its estimate, strictly smaller. Handles every carrier (module docstring): ``tool``
    messages with string or block-list content, and ``tool_result`` blocks with string or
    block-list content. With ``protected`` the lead-in says the output was shortened to
    fit the model's input limit and how to re-fetch it, and the note is marked protected.
    """
    content = message.get("content")
    note: dict[str, Any] = {"form": "truncated", "original_tokens": tokens}
    if protected:
        note["protected"] = True
    reduced: str | list[Any] | None
    if isinstance(content, list) and whole_result_format(message) is None:
        reduced = _reduce_carrier(content, truncate_chars, tokens, protected)
    else:
        reduced = _reduce_result(content, truncate_chars, tokens, protected)
    if reduced is None:
        return None
    candidate = _mark(message, reduced, note)
    new_tokens = estimate_message(candidate)
    return (candidate, new_tokens) if new_tokens < tokens else None


def stubbed_form(message: Mapping[str, Any], tokens: int) -> tuple[dict[str, Any], int] | None:
    """A user message replaced by a short preview, or None if that would not shrink it.

    Only string content is stubbed: a message with block content (a ``tool_result``
    carrier in particular) has no stubbed form.
    """
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= STUB_MIN_CHARS:
        return None
    preview = " ".join(content[:STUB_PREVIEW_CHARS].split())
    stub = f'[earlier message compacted ({len(content):,} characters); it began: "{preview}…"]'
    note = {"form": "stubbed", "original_chars": len(content)}
    candidate = _mark(message, stub, note)
    new_tokens = estimate_message(candidate)
    return (candidate, new_tokens) if new_tokens < tokens else None


def has_thinking(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` carries a thinking block."""
    content = message.get("content")
    return isinstance(content, list) and any(
        block_type(block) in THINKING_TYPES for block in content
    )


def thoughtless_form(message: Mapping[str, Any]) -> tuple[dict[str, Any] | None, int] | None:
    """``message`` without its thinking blocks, or None when it has none.

    Returns ``(form, blocks omitted)``; the form is None when nothing would be left (a
    message of thinking alone, with no tool calls): a view then leaves the message out.
    """
    content = message.get("content")
    if not isinstance(content, list):
        return None
    kept = [block for block in content if block_type(block) not in THINKING_TYPES]
    omitted = len(content) - len(kept)
    if not omitted:
        return None
    if not kept and not tool_ids(message).calls:
        return None, omitted
    # No note in the metadata: the form is traceable as it is (the message less its
    # thinking blocks), and sharing the message's metadata dict keeps it at two objects
    # (a view copies a shown message's metadata dict anyway).
    return {**message, "content": kept}, omitted


Unthought = tuple[dict[str, Any] | None, int, int, int]
"""A message without its thinking: the form (None: nothing is left, the view leaves the
message out), its estimate, the estimate it saves, and the thinking blocks it leaves out."""


def unthought(message: Mapping[str, Any]) -> Unthought | None:
    """``thoughtless_form`` of ``message`` with its estimates, or None when it has no
    thinking (what a ladder row, a rendered view and the count of dropped thinking use)."""
    made = thoughtless_form(message)
    if made is None:
        return None
    form, omitted = made
    tokens = 0 if form is None else estimate_message(form)
    return form, tokens, estimate_message(message) - tokens, omitted
