"""Hypothesis strategies: valid conversation histories in every tool format.

``histories()`` builds conversations the way Amplifier sessions store them:

- an optional system message (and an optional hook-sourced one);
- turns of human prompt -> 0-3 tool rounds -> optional assistant answer;
- each tool round in one of three formats, drawn per round (so one history mixes them):

  * ``openai``: ``assistant.tool_calls = [{"id", "type": "function", "function": {...}}]``
    answered by ``{"role": "tool", "tool_call_id"}`` messages;
  * ``amplifier``: Amplifier's stored calls ``[{"id", "tool", "arguments"}]``, answered
    the same way;
  * ``anthropic``: ``{"type": "tool_use", "id"}`` blocks in assistant content, answered by
    ``{"type": "tool_result", "tool_use_id"}`` blocks in later user messages;

- parallel results in a random order, split across several messages, sometimes with a
  machine-written message between them (pairing is by id, never by adjacency; views show
  the results right after their call and the machine message after them);
- tool results whose content is a list of blocks, in every format: a ``role: tool``
  message with list content (OpenAI and Amplifier rounds), an Anthropic ``tool_result``
  block with list content; text blocks, sometimes an image block;
- faults drawn per history (``Faults``), each then drawn per round:

  * *unanswered*: some (or all) results of a round never arrive and later turns follow
    (views answer them with synthesized results once a later assistant turn or a person's
    turn closes the round; a round followed by machine-written messages only is a pending
    tail);
  * *early*: a result message admitted before its call (an orphan: never shown; its call
    is left unanswered);
  * *late*: a result message admitted after the next assistant message (an orphan; its
    call is left unanswered);
- persisted reminder envelopes (``metadata.ephemeral is True and persisted is True``),
  sometimes repeating an earlier body; developer messages; machine (hook) user turns;
  loaded-tool state; history-only reference rows; ``amplifier_public_*`` metadata;
- an optional pending tail: a last tool call whose results are (partly) missing;
- optional orphan results when asked for: a result whose call was never made, or was
  made only in a reference-only (history-only) row;
- sometimes a human turn carrying tool results (results plus typed text, Anthropic style);
- contents from empty to several thousand characters: prose, JSON, code and CJK.

Every message's text starts with a unique tag (``m17``), so a view message can be traced
back to exactly one history message.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from hypothesis import strategies as st

EXAMPLES: Counter[str] = Counter()
"""Tallies of what the context property tests exercised (printed by ``conftest.py``)."""
FORMATS: tuple[str, ...] = ("openai", "amplifier", "anthropic")
ID_PREFIX = {"openai": "call_", "amplifier": "amp_", "anthropic": "toolu_"}

STYLES: dict[str, str] = {
    "prose": "The quick brown fox jumps over the lazy dog while context grows. ",
    "json": '{"path": "src/app.py", "line": 42, "matches": [1, 2, 3], "ok": true} ',
    "code": "def handler(event):\n    return {k: v * 2 for k, v in event.items()}\n",
    "cjk": "上下文压缩测试数据包含中文字符与日本語のテキスト。",
}
SIZES: tuple[int, ...] = (0, 10, 60, 120, 300, 700, 1500, 3000, 6000)
SMALL_SIZES: tuple[int, ...] = (0, 10, 60, 120)
PROSE_SIZES: tuple[int, ...] = (0, 10, 60, 120, 300, 700, 1500)
REMINDER_XML = "<system-reminders><system-reminder>quoted by the user</system-reminder>"


@cache
def pick(options: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """A cached ``sampled_from`` (building strategies per draw dominates generation time)."""
    return st.sampled_from(options)


@cache
def ints(low: int, high: int) -> st.SearchStrategy[int]:
    """A cached ``integers(low, high)``."""
    return st.integers(low, high)


@cache
def _texts(sizes: tuple[int, ...]) -> st.SearchStrategy[tuple[str, int]]:
    return st.sampled_from([(style, size) for size in sizes for style in sorted(STYLES)])


BOOLS = st.booleans()


def fill(style: str, size: int) -> str:
    """``size`` characters of text in ``style`` (deterministic, cheap to generate)."""
    unit = STYLES[style]
    return (unit * (size // len(unit) + 1))[:size]


@dataclass
class Generated:
    """A generated history plus what the generator knows about it."""

    messages: list[dict[str, Any]]
    bodies: list[str] = field(default_factory=list)
    """Bodies of the persisted reminder envelopes, in admission order (may repeat)."""
    formats: set[str] = field(default_factory=set)
    pending: bool = False
    """The history ends with a tool call that has at least one missing result."""
    orphans: int = 0
    unanswered: int = 0
    """Rounds with results dropped (followed by other messages)."""
    early: int = 0
    """Result messages admitted before their call."""
    late: int = 0
    """Result messages admitted after a later assistant message."""
    list_results: int = 0
    """Results whose content is a list of blocks."""
    images: int = 0
    """Image blocks inside tool results."""


@dataclass(frozen=True)
class Faults:
    """Which faults a history may contain (drawn once per history)."""

    unanswered: bool = False
    early: bool = False
    late: bool = False
    lists: bool = False


NO_FAULTS = Faults()
IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}


class _Builder:
    """Mutable state of one draw: unique tags and ids."""

    def __init__(
        self,
        draw: Any,
        sizes: tuple[int, ...],
        result_sizes: tuple[int, ...],
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.draw = draw
        self.sizes = sizes
        self.result_sizes = result_sizes
        self.faults = faults
        self.tags = 0
        self.ids = 0
        self.out = Generated(messages=[])
        self.deferred: list[dict[str, Any]] = []
        """Late results, admitted right after the next assistant message."""

    def tag(self) -> str:
        self.tags += 1
        return f"m{self.tags}"

    def text(self, *, sizes: tuple[int, ...] | None = None) -> str:
        style, size = self.draw(_texts(sizes or self.sizes))
        return f"{self.tag()} {fill(style, size)}"

    def call_id(self, fmt: str) -> str:
        self.ids += 1
        return f"{ID_PREFIX[fmt]}{self.ids}"

    def add(self, message: dict[str, Any]) -> None:
        self.out.messages.append(message)
        shown = not (message.get("metadata") or {}).get("amplifier_public_reference_only")
        if message.get("role") == "assistant" and shown and self.deferred:
            self.out.messages.extend(self.deferred)
            self.out.late += len(self.deferred)
            self.deferred = []

    def finish(self) -> Generated:
        """The history; late results with no later assistant message stay in their run."""
        self.out.messages.extend(self.deferred)
        self.deferred = []
        return self.out

    def result_content(self, *, block: bool) -> Any:
        """A result's content: text, or (when lists are drawn) a list of text blocks,
        sometimes with an image block."""
        text = self.text(sizes=self.result_sizes)
        if not (self.faults.lists and self.draw(ints(0, 2)) == 0) and not (
            block and self.draw(ints(0, 4)) == 0
        ):
            return text
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if self.faults.lists:
            if self.draw(ints(0, 2)) == 0:
                blocks.insert(self.draw(ints(0, 1)), dict(IMAGE))
                self.out.images += 1
            if self.draw(BOOLS):
                blocks.append({"type": "text", "text": self.text(sizes=SMALL_SIZES)})
        self.out.list_results += 1
        return blocks

    # -- message kinds -----------------------------------------------------------------

    def human(self) -> None:
        shape = self.draw(pick(("plain", "plain", "meta", "blocks", "quoting")))
        text = self.text()
        if shape == "blocks":
            self.add({"role": "user", "content": [{"type": "text", "text": text}]})
        elif shape == "meta":
            self.add({"role": "user", "content": text, "metadata": {"client": "cli"}})
        elif shape == "quoting":
            self.add({"role": "user", "content": f"{text} {REMINDER_XML}"})
        else:
            self.add({"role": "user", "content": text})

    def envelope(self) -> None:
        bodies = self.out.bodies
        if bodies and self.draw(BOOLS):
            body = self.draw(st.sampled_from(bodies))
        else:
            body = f"<system-reminder>{self.text()}</system-reminder>"
        bodies.append(body)
        self.add(
            {
                "role": "user",
                "content": body,
                "metadata": {"source": "hook", "ephemeral": True, "persisted": True},
            }
        )

    def machine_extra(self) -> None:
        kind = self.draw(pick(("envelope", "envelope", "developer", "hook_user", "reference")))
        if kind == "envelope":
            self.envelope()
        elif kind == "developer":
            self.add({"role": "developer", "content": self.text()})
        elif kind == "hook_user":
            self.add({"role": "user", "content": self.text(), "metadata": {"source": "hook"}})
        else:
            self.add(
                {
                    "role": "assistant",
                    "content": self.text(),
                    "metadata": {"amplifier_public_reference_only": True},
                }
            )

    def assistant_text(self) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": self.text()}
        flavour = self.draw(pick(("plain", "plain", "plain", "public", "loaded")))
        if flavour == "public":
            message["metadata"] = {
                "amplifier_public_message": True,
                "amplifier_public_copy_source": "transcript",
            }
        elif flavour == "loaded":
            message["metadata"] = {"openai:tool_search_items": [{"name": "grep"}]}
        self.add(message)

    def call_message(self, fmt: str, ids: list[str]) -> None:
        names = [f"tool{i % 3}" for i in range(len(ids))]
        note = self.text(sizes=SMALL_SIZES)
        if fmt == "openai":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": note if self.draw(BOOLS) else None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps({"q": call_id})},
                    }
                    for call_id, name in zip(ids, names, strict=True)
                ],
            }
        elif fmt == "amplifier":
            message = {
                "role": "assistant",
                "content": note,
                "tool_calls": [
                    {"id": call_id, "tool": name, "arguments": {"q": call_id}}
                    for call_id, name in zip(ids, names, strict=True)
                ],
            }
        else:
            blocks: list[dict[str, Any]] = []
            if self.draw(BOOLS):
                blocks.append({"type": "text", "text": note})
            blocks.extend(
                {"type": "tool_use", "id": call_id, "name": name, "input": {"q": call_id}}
                for call_id, name in zip(ids, names, strict=True)
            )
            message = {"role": "assistant", "content": blocks}
        if self.draw(ints(0, 9)) == 0:
            message.setdefault("metadata", {})["openai:tool_search_items"] = [{"name": "x"}]
        self.add(message)

    def result_messages(self, fmt: str, ids: list[str]) -> None:
        """Results for ``ids`` (already permuted), split into one or more messages."""
        if fmt == "anthropic":
            cuts = sorted(self.draw(st.sets(ints(1, max(1, len(ids) - 1)), max_size=len(ids) - 1)))
            bounds = [0, *[c for c in cuts if 0 < c < len(ids)], len(ids)]
            chunks = [ids[a:b] for a, b in itertools.pairwise(bounds) if b > a]
        else:
            chunks = [[call_id] for call_id in ids]
        for position, chunk in enumerate(chunks):
            if position and self.draw(ints(0, 7)) == 0:
                self.machine_extra()  # something between parallel results
            if fmt == "anthropic":
                blocks = []
                for call_id in chunk:
                    inner = self.result_content(block=True)
                    blocks.append({"type": "tool_result", "tool_use_id": call_id, "content": inner})
                if position == len(chunks) - 1 and self.draw(ints(0, 9)) == 0:
                    # the user typed something alongside the results: a human turn
                    blocks.append({"type": "text", "text": self.text(sizes=SMALL_SIZES)})
                self.add({"role": "user", "content": blocks})
            else:
                message: dict[str, Any] = {
                    "role": "tool",
                    "tool_call_id": chunk[0],
                    "content": self.result_content(block=False),
                }
                if fmt == "amplifier":
                    message["name"] = "tool0"
                self.add(message)

    def tool_round(self, formats: tuple[str, ...], *, pending: bool = False) -> None:
        fmt = self.draw(pick(formats))
        self.out.formats.add(fmt)
        ids = [self.call_id(fmt) for _ in range(self.draw(ints(1, 3)))]
        call_at = len(self.out.messages)
        self.call_message(fmt, ids)
        order = list(self.draw(st.permutations(ids)))
        faults = self.faults
        if pending:
            answered = self.draw(ints(0, len(ids) - 1))
            order = order[:answered]
            self.out.pending = True
        elif faults.unanswered and self.draw(ints(0, 2)) == 0:
            order = order[: self.draw(ints(0, len(ids) - 1))]
            self.out.unanswered += 1
        if not order:
            return
        start = len(self.out.messages)
        self.result_messages(fmt, order)
        if pending:
            return
        carriers = [
            i for i in range(start, len(self.out.messages)) if result_ids_of(self.out.messages[i])
        ]
        if faults.early and self.draw(ints(0, 3)) == 0:
            moved = self.out.messages.pop(self.draw(pick(tuple(carriers))))
            self.out.messages.insert(self.draw(ints(max(0, call_at - 2), call_at)), moved)
            self.out.early += 1
        elif faults.late and self.draw(ints(0, 3)) == 0:
            self.deferred.append(self.out.messages.pop(self.draw(pick(tuple(carriers)))))

    def orphan(self) -> None:
        """A result no view may show: its call was never made, or made only in a
        reference-only (history-only) row."""
        fmt = self.draw(pick(FORMATS))
        stray = f"{ID_PREFIX[fmt]}orphan{self.tag()}"
        if self.draw(BOOLS):
            hidden = len(self.out.messages)
            self.call_message(fmt, [stray])
            self.out.messages[hidden].setdefault("metadata", {})[
                "amplifier_public_reference_only"
            ] = True
            self.result_messages(fmt, [stray])
            self.out.orphans += 1
            return
        if fmt == "anthropic":
            blocks: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": stray, "content": self.text()}
            ]
            if self.draw(BOOLS):
                blocks.append({"type": "text", "text": self.text()})  # a human turn with it
            message: dict[str, Any] = {"role": "user", "content": blocks}
        else:
            message = {"role": "tool", "tool_call_id": stray, "content": self.text()}
        position = self.draw(ints(0, len(self.out.messages)))
        self.out.messages.insert(position, message)
        self.out.orphans += 1


@st.composite
def histories(
    draw: Any,
    formats: tuple[str, ...] = FORMATS,
    *,
    min_turns: int = 1,
    max_turns: int = 6,
    max_rounds: int = 3,
    system: bool | None = None,
    pending: bool | None = None,
    orphans: bool = False,
    faults: bool | Faults = True,
    extras: bool = True,
    sizes: tuple[int, ...] = PROSE_SIZES,
    result_sizes: tuple[int, ...] = SIZES,
) -> Generated:
    """A valid history (see the module docstring). ``None`` flags are drawn; ``faults``
    True draws the faults of this history, False allows none."""
    if faults is True:
        faults = Faults(draw(BOOLS), draw(BOOLS), draw(BOOLS), draw(BOOLS))
    b = _Builder(draw, sizes, result_sizes, faults or NO_FAULTS)
    if system if system is not None else draw(BOOLS):
        b.add({"role": "system", "content": b.text()})
    if extras and draw(ints(0, 5)) == 0:
        b.add({"role": "system", "content": b.text(), "metadata": {"source": "hook"}})
    for _ in range(draw(ints(min_turns, max_turns))):
        if extras:
            for _ in range(draw(ints(0, 2))):
                b.machine_extra()
        b.human()
        for _ in range(draw(ints(0, max_rounds))):
            b.tool_round(formats)
        if draw(BOOLS):
            b.assistant_text()
    if pending if pending is not None else draw(ints(0, 3)) == 0:
        b.tool_round(formats, pending=True)
    if orphans:
        for _ in range(draw(ints(0, 2))):
            b.orphan()
    return b.finish()


def configs() -> st.SearchStrategy[dict[str, Any]]:
    """Manager configurations that reach every rung at small budgets."""
    return st.fixed_dictionaries(
        {
            "compact_threshold": pick((0.92, 0.6, 0.3)),
            "target_usage": pick((0.5, 0.3, 0.8)),
            "protected_recent": pick((0.3, 0.1, 0.0, 0.6, 0.9, 1.0, 1.0)),
            "protected_tool_results": pick((5, 0, 0, 1, 2)),
            "truncate_chars": pick((250, 40, 0, 1000)),
            "compaction_notice_enabled": BOOLS,
            "compaction_notice_token_reserve": pick((0, 30, 100, 800)),
            "compaction_notice_verbosity": pick(("normal", "minimal", "verbose")),
            "compaction_notice_min_level": pick((1, 1, 3)),
        }
    )


# -- plain builders for example-based tests ------------------------------------------------


def calls(fmt: str, ids: list[str], text: str = "") -> dict[str, Any]:
    """An assistant message declaring ``ids`` in format ``fmt``."""
    if fmt == "openai":
        return {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in ids
            ],
        }
    if fmt == "amplifier":
        return {
            "role": "assistant",
            "content": text,
            "tool_calls": [{"id": i, "tool": "f", "arguments": {}} for i in ids],
        }
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def results(fmt: str, contents: dict[str, str], *, together: bool = False) -> list[dict[str, Any]]:
    """Result messages for ``{id: content}`` in the given order.

    ``anthropic``: one user message per result, or one for all when ``together``.
    """
    if fmt == "anthropic":
        blocks = [
            {"type": "tool_result", "tool_use_id": i, "content": c} for i, c in contents.items()
        ]
        if together:
            return [{"role": "user", "content": blocks}]
        return [{"role": "user", "content": [b]} for b in blocks]
    return [{"role": "tool", "tool_call_id": i, "content": c} for i, c in contents.items()]


def synthesized_for(
    fmt: str, ids: list[str], stored: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The shape of the synthesized results a view shows for ``ids`` (as shown; text
    aside) of a call in ``fmt``; ``stored``: shown id -> stored id of the renamed ones."""
    stored = stored or {}
    if fmt == "anthropic":
        blocks = [
            {"type": "tool_result", "tool_use_id": i, "is_error": True, "content": ANY_TEXT}
            for i in ids
        ]
        return [{"role": "user", "content": blocks, "metadata": synthesized_note(ids, stored)}]
    return [
        {
            "role": "tool",
            "tool_call_id": i,
            "content": ANY_TEXT,
            "metadata": synthesized_note([i], stored),
        }
        for i in ids
    ]


def synthesized_note(ids: list[str], stored: dict[str, str]) -> dict[str, Any]:
    note: dict[str, Any] = {"compaction": {"form": "synthesized", "tool_call_ids": ids}}
    renamed = {i: stored[i] for i in ids if i in stored}
    if renamed:
        note["renamed_tool_call_ids"] = renamed
    return note


class _AnyText(str):
    """Equal to any string that says no result was recorded."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and "No result was recorded" in other

    def __hash__(self) -> int:
        return 0


ANY_TEXT = _AnyText("<no result recorded>")


def result_ids_of(message: dict[str, Any]) -> list[str]:
    """Result ids a message carries (tool message or tool_result blocks)."""
    if message.get("role") == "tool":
        return [message["tool_call_id"]]
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
