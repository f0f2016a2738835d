"""Hypothesis strategies for the reliability suite: valid histories in all three tool
formats (mixed within one history), corrupted histories, junk values and bad seam results.

Histories are built from JSON values only (so every view must ``json.dumps``). Each
message's text starts with a unique tag so a view message traces back to one source.
Besides parallel calls whose results arrive in any order, split across messages and
around machine messages, and an optional pending tail, each history draws which faults it
may contain, then draws them per round:

- *unanswered*: some or all results of a round never arrive, later turns follow (a later
  assistant turn or a person's turn closes the round: views answer the calls with
  synthesized results);
- *early*: a result message admitted before its call (an orphan; its call is unanswered);
- *late*: a result message admitted after the next assistant message (an orphan);
- *lists*: results whose content is a list of blocks - ``role: tool`` list content in
  the OpenAI and Amplifier formats, ``tool_result`` list content in the Anthropic format -
  of text blocks, sometimes an image block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

FORMATS = ("openai", "amplifier", "anthropic")
PREFIX = {"openai": "call_", "amplifier": "amp_", "anthropic": "toolu_"}
STYLES = {
    "prose": "The quick brown fox jumps over the lazy dog while the context grows. ",
    "json": '{"path": "src/app.py", "line": 42, "matches": [1, 2, 3], "ok": true} ',
    "code": "def handler(event):\n    return {k: v * 2 for k, v in event.items()}\n",
    "cjk": "上下文压缩测试数据包含中文字符与日本語のテキスト。",
}
SIZES = (0, 12, 80, 300, 900, 2500)
BODIES = (
    "<system-reminder>Run the tests before you commit.</system-reminder>",
    "<system-reminder>The user prefers short answers.</system-reminder>",
)
KNOWN_IDS = ("call_1", "amp_2", "toolu_3", "call_4", "toolu_5", "amp_6")
IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}
FAULTS = ("unanswered", "early", "late", "lists")


def fill(style: str, size: int) -> str:
    unit = STYLES[style]
    return (unit * (size // len(unit) + 1))[:size]


@dataclass
class History:
    messages: list[dict[str, Any]]
    bodies: list[str] = field(default_factory=list)
    """Bodies of the persisted reminder envelopes (possibly repeated)."""
    formats: set[str] = field(default_factory=set)
    faults: frozenset[str] = frozenset()
    """The faults this history may contain (``FAULTS``)."""
    unanswered: int = 0
    """Rounds left with results missing, followed by other messages."""
    early: int = 0
    late: int = 0
    list_results: int = 0
    images: int = 0


class _Builder:
    def __init__(self, draw: Any, faults: frozenset[str] = frozenset()) -> None:
        self.draw = draw
        self.tags = 0
        self.ids = 0
        self.out = History([], faults=faults)
        self.deferred: list[dict[str, Any]] = []
        """Late results: admitted right after the next assistant message."""

    def text(self, sizes: tuple[int, ...] = SIZES) -> str:
        self.tags += 1
        style = self.draw(st.sampled_from(sorted(STYLES)))
        return f"m{self.tags} {fill(style, self.draw(st.sampled_from(sizes)))}"

    def add(self, message: dict[str, Any]) -> None:
        self.out.messages.append(message)
        if message["role"] == "assistant" and self.deferred:
            self.out.messages.extend(self.deferred)
            self.out.late += len(self.deferred)
            self.deferred = []

    def content(self) -> Any:
        """A result's content: text, or (faults include lists) sometimes a block list."""
        text = self.text()
        if "lists" not in self.out.faults or self.draw(st.integers(0, 2)):
            return text
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if self.draw(st.integers(0, 2)) == 0:
            blocks.insert(self.draw(st.integers(0, 1)), dict(IMAGE))
            self.out.images += 1
        if self.draw(st.booleans()):
            blocks.append({"type": "text", "text": self.text((0, 12, 80))})
        self.out.list_results += 1
        return blocks

    def call_ids(self, fmt: str, n: int) -> list[str]:
        ids = []
        for _ in range(n):
            self.ids += 1
            ids.append(f"{PREFIX[fmt]}{self.ids}")
        return ids

    def machine(self) -> None:
        self.add({"role": "user", "content": self.text((12, 80)), "metadata": {"source": "hook"}})

    def tool_round(self, *, answered: bool = True) -> None:
        draw = self.draw
        fmt = draw(st.sampled_from(FORMATS))
        self.out.formats.add(fmt)
        ids = self.call_ids(fmt, draw(st.integers(1, 3)))
        if fmt == "openai":
            calls = [
                {"id": i, "type": "function", "function": {"name": "read", "arguments": "{}"}}
                for i in ids
            ]
            self.add({"role": "assistant", "content": self.text((0, 12)), "tool_calls": calls})
        elif fmt == "amplifier":
            calls = [{"id": i, "tool": "read", "arguments": {"path": i}} for i in ids]
            self.add({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": self.text((0, 12))}]
            blocks += [{"type": "tool_use", "id": i, "name": "grep", "input": {}} for i in ids]
            self.add({"role": "assistant", "content": blocks})
        order = draw(st.permutations(ids))
        faults = self.out.faults
        if not answered:
            order = order[: draw(st.integers(0, len(order) - 1))]
        elif "unanswered" in faults and draw(st.integers(0, 2)) == 0:
            order = order[: draw(st.integers(0, len(order) - 1))]
            self.out.unanswered += 1
        call_at = len(self.out.messages) - 1
        start = len(self.out.messages)
        if fmt == "anthropic":
            while order:
                take = draw(st.integers(1, len(order)))
                chunk, order = order[:take], order[take:]
                results = [
                    {"type": "tool_result", "tool_use_id": i, "content": self.content()}
                    for i in chunk
                ]
                self.add({"role": "user", "content": results})
                if order and draw(st.booleans()):
                    self.machine()  # results of one call split around another message
        else:
            for position, i in enumerate(order):
                self.add({"role": "tool", "tool_call_id": i, "content": self.content()})
                if position < len(order) - 1 and draw(st.integers(0, 4)) == 0:
                    self.machine()
        carriers = [
            i
            for i in range(start, len(self.out.messages))
            if self.out.messages[i]["role"] != "user"
            or not isinstance(self.out.messages[i]["content"], str)
        ]
        if not answered or not carriers:
            return
        if "early" in faults and draw(st.integers(0, 3)) == 0:
            moved = self.out.messages.pop(draw(st.sampled_from(carriers)))
            self.out.messages.insert(call_at, moved)
            self.out.early += 1
        elif "late" in faults and draw(st.integers(0, 3)) == 0:
            self.deferred.append(self.out.messages.pop(draw(st.sampled_from(carriers))))


@st.composite
def histories(draw: Any, *, max_turns: int = 6, pending: bool = True) -> History:
    """A valid conversation mixing the three tool formats (faults drawn per history)."""
    b = _Builder(draw, frozenset(draw(st.sets(st.sampled_from(FAULTS)))))
    if draw(st.booleans()):
        b.add({"role": "system", "content": b.text((12, 80, 300))})
    if draw(st.integers(0, 3)) == 0:
        b.add({"role": "system", "content": b.text((12,)), "metadata": {"source": "hook"}})
    for _ in range(draw(st.integers(1, max_turns))):
        b.add({"role": "user", "content": b.text((12, 80, 300, 900))})
        if draw(st.integers(0, 2)) == 0:
            body = draw(st.sampled_from(BODIES))
            b.out.bodies.append(body)
            metadata = {"ephemeral": True, "persisted": True, "source": "hook"}
            b.add({"role": "user", "content": body, "metadata": metadata})
        if draw(st.integers(0, 5)) == 0:
            b.add({"role": "developer", "content": b.text((12, 80))})
        for _ in range(draw(st.integers(0, 3))):
            b.tool_round()
        if draw(st.booleans()):
            b.add({"role": "assistant", "content": b.text((12, 80, 300))})
    if pending and draw(st.integers(0, 3)) == 0:
        b.tool_round(answered=False)
    b.out.messages.extend(b.deferred)  # no later assistant message: still in their run
    return b.out


# -- junk and corruption ---------------------------------------------------------------------

KEYS = ("role", "content", "tool_calls", "tool_call_id", "id", "type", "metadata")
ROLES = ("user", "assistant", "tool", "system", "developer", "tool_use", "tool_result")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.text(max_size=8),
    st.sampled_from((*ROLES, *KNOWN_IDS, "text", "")),
)
junk: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(KEYS), children, max_size=4),
    ),
    max_leaves=10,
)
junk_messages: st.SearchStrategy[Any] = st.one_of(
    junk,
    st.dictionaries(st.sampled_from(KEYS), junk, max_size=5),
    st.builds(
        lambda role, rest: {**rest, "role": role},
        st.sampled_from(ROLES),
        st.dictionaries(st.sampled_from(KEYS[1:]), junk, max_size=4),
    ),
)


@st.composite
def corrupted(draw: Any) -> tuple[History, str, list[Any]]:
    """A valid history with one corruption: drop, duplicate, swap, junk or a bad role."""
    history: History = draw(histories(max_turns=4))
    messages: list[Any] = list(history.messages)
    n = len(messages)
    kind = draw(st.sampled_from(("drop", "duplicate", "swap", "replace", "insert", "role")))
    i = draw(st.integers(0, n - 1))
    if kind == "drop":
        del messages[i]
    elif kind == "duplicate":
        messages.insert(draw(st.integers(0, n)), messages[i])
    elif kind == "swap":
        j = draw(st.integers(0, n - 1))
        messages[i], messages[j] = messages[j], messages[i]
    elif kind == "replace":
        messages[i] = draw(junk_messages)
    elif kind == "insert":
        messages.insert(i, draw(junk_messages))
    else:
        messages[i] = {**messages[i], "role": draw(st.one_of(st.sampled_from(ROLES), junk))}
    return history, kind, messages


# -- bad seam results --------------------------------------------------------------------------

bad_numbers: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([-1, 0, True, False, 1.5, math.nan, math.inf, 10**18, "12", None, [], {}]),
    st.integers(-(10**3), 10**19),
    st.floats(),
    st.text(max_size=3),
)
measurements: st.SearchStrategy[Any] = st.one_of(
    junk,
    st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["provider_count", "provider_count", "estimate", 5]),
            "source": st.one_of(st.sampled_from(["test", ""]), junk),
            "input_tokens": bad_numbers,
        }
    ),
)
decisions: st.SearchStrategy[Any] = st.one_of(
    junk,
    st.fixed_dictionaries(
        {"estimated_input_tokens": bad_numbers, "input_limit_tokens": bad_numbers},
        optional={"measurement": measurements},
    ),
)


def _valid_decision(count: int, limit: int) -> dict[str, Any]:
    return {
        "estimated_input_tokens": count,
        "input_limit_tokens": limit,
        "measurement": {"kind": "provider_count", "source": "test", "input_tokens": count},
    }


@st.composite
def _one_bad_field(draw: Any, *, fit: bool) -> dict[str, Any]:
    """A valid envelope (or fit result) with exactly one field replaced by a bad value."""
    count = draw(st.integers(0, 4000))
    envelope: dict[str, Any] = {"dispatch": {}, "budget_decision": _valid_decision(count, 4000)}
    paths: list[tuple[str, ...]] = [("dispatch",), ("budget_decision",)]
    paths += [("budget_decision", k) for k in ("estimated_input_tokens", "input_limit_tokens")]
    paths += [("budget_decision", "measurement")]
    paths += [("budget_decision", "measurement", k) for k in ("kind", "source", "input_tokens")]
    if fit:
        envelope["count_calls"] = 1
        paths.append(("count_calls",))
    path = draw(st.sampled_from(paths))
    target: Any = envelope
    for key in path[:-1]:
        target = target[key]
    if draw(st.booleans()):
        target[path[-1]] = draw(bad_numbers)
    else:
        del target[path[-1]]
    return envelope


envelopes: st.SearchStrategy[Any] = st.one_of(
    junk,
    st.fixed_dictionaries({"dispatch": junk}, optional={"budget_decision": decisions}),
    _one_bad_field(fit=False),
)
fit_results: st.SearchStrategy[Any] = st.one_of(
    junk,
    st.fixed_dictionaries(
        {"dispatch": junk, "count_calls": bad_numbers},
        optional={"budget_decision": decisions},
    ),
    _one_bad_field(fit=True),
)
