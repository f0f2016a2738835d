"""The preserved-thinking prefix rule, checked over a sequence of requests.

Models with preserved thinking check every ``thinking`` / ``redacted_thinking`` block a
request sends back: the top-level system prompt and everything before the block (the
earlier messages, and the blocks before it in its own message) must be exactly what the
request that produced the block sent. Otherwise that block, and every thinking block after
it, is invalid (a 400, or a dropped block and a model that thinks again).

``PrefixLedger`` checks that rule the way the provider sees a request, and shares nothing
with the package it checks (it imports only the standard library): it converts each view
to the Anthropic wire shape itself (system messages to the top-level system; tool and
developer messages to user turns; consecutive turns of one side merged, as the API merges
them; ``metadata`` dropped, as provider modules never send it), records for every answer
the prefix each of its thinking blocks was produced with, and checks a later view against
those records:

- **invalid**: a thinking block shown whose prefix is not the one it was produced with,
  or that follows an invalid one;
- **left out**: an answer shown with its thinking removed although the view still starts
  exactly with the request that produced it (the block could have been sent validly).

Usage, one request at a time::

    ledger = PrefixLedger()
    verdict = ledger.check(view)      # before sending ``view``
    ledger.answered(view, answer)     # the assistant message that answered it
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ("THINKING_TYPES", "PrefixLedger", "Verdict", "is_thinking", "wire_turns")

THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
"""The content block types the rule binds (both Anthropic's and Amplifier's ``thinking``)."""

_USER_SIDE = frozenset({"user", "tool", "developer", "function"})
_SKIPPED_KEYS = frozenset({"metadata", "role", "content", "tool_calls"})


def is_thinking(block: object) -> bool:
    """Whether a content block is one the prefix rule binds."""
    return isinstance(block, Mapping) and block.get("type") in THINKING_TYPES


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    """The content blocks a provider module sends for ``message`` (as plain values)."""
    blocks: list[Any] = []
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        blocks.append(
            {"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": content}
        )
    elif isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend(content)
    elif content is not None:
        blocks.append({"type": "unknown", "value": content})
    blocks.extend(
        {"type": "tool_call_field", "call": call} for call in message.get("tool_calls") or ()
    )
    for key in sorted(set(message) - _SKIPPED_KEYS):
        if role == "tool" and key == "tool_call_id":
            continue
        blocks.append({"type": "field", "key": key, "value": message[key]})
    return blocks


@dataclass(frozen=True, slots=True)
class _Wire:
    """A view as the provider reads it: the system part, then a flat list of items (a turn
    marker ``("turn", side)`` opening each merged turn, then its blocks)."""

    system: str
    items: list[tuple[str, Any]]


def wire_turns(view: Sequence[Mapping[str, Any]]) -> _Wire:
    """``view`` in the Anthropic wire shape (see the module docstring)."""
    system: list[Any] = []
    items: list[tuple[str, Any]] = []
    side: str | None = None
    for message in view:
        role = message.get("role")
        if role == "system":
            system.append(message.get("content"))
            continue
        this = "user" if role in _USER_SIDE else "assistant"
        if this != side:
            items.append(("turn", this))
            side = this
        items.extend(("block", block) for block in _blocks(message))
    return _Wire(_canonical(system), items)


def _key(block: Mapping[str, Any]) -> str:
    """What identifies a thinking block: its signature (or redacted data), else its text."""
    for name in ("signature", "data", "thinking"):
        value = block.get(name)
        if isinstance(value, str) and value:
            return f"{block.get('type')}:{name}:{value}"
    return f"{block.get('type')}:{_canonical(block)}"


def _prefix_hashes(wire: _Wire) -> list[str]:
    """``hashes[i]``: the hash of the system part and ``items[:i]``, for i in 0..len(items)."""
    running = hashlib.blake2b(wire.system.encode(), digest_size=20)
    hashes = [running.hexdigest()]
    for item in wire.items:
        running.update(b"\x00" + _canonical(item).encode())
        hashes.append(running.hexdigest())
    return hashes


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one view does with the thinking blocks the ledger knows."""

    shown: int
    """Thinking blocks the view sends."""
    invalid: tuple[str, ...]
    """Keys of blocks sent with another prefix than they were produced with (or after one)."""
    left_out: int
    """Answers shown without their thinking although it could have been sent validly."""
    unknown: int
    """Thinking blocks the ledger has no record of (not produced by a recorded request)."""

    @property
    def ok(self) -> bool:
        return not self.invalid and not self.left_out


@dataclass(slots=True)
class _Answer:
    stripped: tuple[str, ...]
    """The answer's non-thinking items, canonical (how it looks with its thinking removed)."""
    thinking: int


@dataclass(slots=True)
class PrefixLedger:
    """Records the prefix every thinking block was produced with, and checks views."""

    origins: dict[str, str] = field(default_factory=dict)
    """Block key -> hash of the prefix it was produced with."""
    answers: dict[str, list[_Answer]] = field(default_factory=dict)
    """Hash of the prefix up to an answer's turn marker -> answers produced there."""

    def answered(self, view: Sequence[Mapping[str, Any]], answer: Mapping[str, Any]) -> None:
        """Record that ``answer`` (an assistant message) answered the request ``view``."""
        wire = wire_turns([*view, answer])
        start = wire_turns(view)
        hashes = _prefix_hashes(wire)
        first = len(start.items)
        if not (start.items and start.items[-1] == ("turn", "assistant")) and (
            first < len(wire.items) and wire.items[first][0] == "turn"
        ):
            turn_at = first  # the answer opens its own turn
        else:
            turn_at = None  # the answer continues an assistant turn (a prefill)
        own = wire.items[first:]
        thinking = 0
        for index in range(first, len(wire.items)):
            kind, block = wire.items[index]
            if kind == "block" and is_thinking(block):
                self.origins[_key(block)] = hashes[index]
                thinking += 1
        if turn_at is not None and thinking:
            stripped = tuple(
                _canonical(item)
                for item in own[1:]
                if not (item[0] == "block" and is_thinking(item[1]))
            )
            marker_hash = hashes[turn_at + 1]
            self.answers.setdefault(marker_hash, []).append(_Answer(stripped, thinking))

    def check(self, view: Sequence[Mapping[str, Any]]) -> Verdict:
        """The verdict on ``view`` (it records nothing)."""
        wire = wire_turns(view)
        shown = unknown = 0
        invalid: list[str] = []
        broken = False
        hashes = _prefix_hashes(wire)
        for index, (kind, block) in enumerate(wire.items):
            if kind != "block" or not is_thinking(block):
                continue
            shown += 1
            key = _key(block)
            origin = self.origins.get(key)
            if origin is None:
                unknown += 1
                continue
            if broken or origin != hashes[index]:
                broken = True
                invalid.append(key)
        return Verdict(shown, tuple(invalid), self._left_out(wire, hashes), unknown)

    def _left_out(self, wire: _Wire, hashes: list[str]) -> int:
        left_out = 0
        items = wire.items
        for index, item in enumerate(items):
            if item != ("turn", "assistant"):
                continue
            answers = self.answers.get(hashes[index + 1])
            if not answers:
                continue
            end = next(
                (later for later in range(index + 1, len(items)) if items[later][0] == "turn"),
                len(items),
            )
            turn = tuple(_canonical(later) for later in items[index + 1 : end])
            shows_thinking = any(
                kind == "block" and is_thinking(block) for kind, block in items[index + 1 : end]
            )
            if not shows_thinking and any(answer.stripped == turn for answer in answers):
                left_out += 1
        return left_out
