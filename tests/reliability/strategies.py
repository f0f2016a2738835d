"""Hypothesis strategies for the reliability suite: valid histories in all three tool
formats (mixed within one history), corrupted histories, junk values and bad seam results.

Histories are built from JSON values only (so every view must ``json.dumps``). Each
message's text starts with a unique tag so a view message traces back to one source.
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


def fill(style: str, size: int) -> str:
    unit = STYLES[style]
    return (unit * (size // len(unit) + 1))[:size]


@dataclass
class History:
    messages: list[dict[str, Any]]
    bodies: list[str] = field(default_factory=list)
    """Bodies of the persisted reminder envelopes (possibly repeated)."""
    formats: set[str] = field(default_factory=set)


class _Builder:
    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.tags = 0
        self.ids = 0
        self.out = History([])

    def text(self, sizes: tuple[int, ...] = SIZES) -> str:
        self.tags += 1
        style = self.draw(st.sampled_from(sorted(STYLES)))
        return f"m{self.tags} {fill(style, self.draw(st.sampled_from(sizes)))}"

    def add(self, message: dict[str, Any]) -> None:
        self.out.messages.append(message)

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
        if not answered:
            order = order[: draw(st.integers(0, len(order) - 1))]
        if fmt == "anthropic":
            while order:
                take = draw(st.integers(1, len(order)))
                chunk, order = order[:take], order[take:]
                results = [
                    {"type": "tool_result", "tool_use_id": i, "content": self.text()} for i in chunk
                ]
                self.add({"role": "user", "content": results})
                if order and draw(st.booleans()):
                    self.machine()  # results of one call split around another message
        else:
            for position, i in enumerate(order):
                self.add({"role": "tool", "tool_call_id": i, "content": self.text()})
                if position < len(order) - 1 and draw(st.integers(0, 4)) == 0:
                    self.machine()


@st.composite
def histories(draw: Any, *, max_turns: int = 6, pending: bool = True) -> History:
    """A valid conversation mixing the three tool formats."""
    b = _Builder(draw)
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
    paths = [("dispatch",), ("budget_decision",)]
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
