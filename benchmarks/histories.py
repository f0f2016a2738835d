"""Deterministic agent-session histories for the benchmarks (and the scaling test).

A session is a stream of *chunks*, each a list of messages that belong together:

- a user prompt (English prose or CJK, sometimes with an inline code word);
- one to six tool rounds: an assistant turn with 1-3 tool calls and the results that
  answer them. The call format rotates round by round through OpenAI ``tool_calls``
  (``{"id", "type": "function", "function": {"name", "arguments": "<json>"}}`` answered by
  ``role: tool`` messages), Amplifier's stored calls (``{"id", "tool", "arguments": {...}}``
  answered the same way) and Anthropic content blocks (``tool_use`` answered by
  ``tool_result`` blocks in a user message). Results sometimes arrive out of call order,
  and Anthropic results of one turn are sometimes split across two user messages;
- a final assistant answer.

Tool results are 200 B - 8 KB (log-uniform, ``corpus._target_size``) of prose, code
(source slices, diffs, logs, shell output), JSON tool output or CJK, drawn from
``benchmarks.corpus``'s generators with per-mix class weights. The history starts with a
system prompt. The same ``(n, seed, mix)`` always gives the same messages, and the history
of ``n`` messages repeats the chunks of the shorter ones of the same seed and mix (so the
1k / 4k / 16k rows compare the same kind of session, and the chunks are generated once);
when the next chunk does not fit exactly, the history is completed with short plain user /
assistant exchanges, so it never ends with an unanswered tool call.

``history(n)`` caches its result: build once per size, reuse everywhere. ``window`` gives a
history that starts at a random user prompt of a session (the negotiation benchmark);
``SMALL`` is a mix with 100-400 B tool results (the scaling test). Callers must not mutate
the returned messages (they are shared; the module under test never mutates them).
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks.corpus import (
    _TEXT_GENERATORS,
    ZH_TECH_WORDS,
    _call_id,
    _Sources,
    _target_size,
    _tool_args,
)

FORMATS: tuple[str, ...] = ("openai", "amplifier", "anthropic")
TOOL_NAMES: tuple[str, ...] = ("bash", "read_file", "edit_file", "grep", "web_fetch", "glob")

DEFAULT_SEED = 20250611


@dataclass(frozen=True)
class Mix:
    """Class weights for tool-result content (keys of ``corpus._TEXT_GENERATORS``)."""

    name: str
    weights: tuple[tuple[str, float], ...]
    result_bytes: tuple[int, int] | None = None
    """Tool-result size range; None: ``corpus._target_size`` (200 B - 8 KB, log-uniform)."""

    def result_size(self, rng: random.Random) -> int:
        if self.result_bytes is None:
            return _target_size(rng)
        return rng.randint(*self.result_bytes)

    def choose(self, rng: random.Random) -> str:
        classes = [c for c, _ in self.weights]
        return rng.choices(classes, [w for _, w in self.weights])[0]


BALANCED = Mix("balanced", (("prose", 3), ("code", 4), ("json", 3), ("cjk", 2)))
MIXES: tuple[Mix, ...] = (
    BALANCED,
    Mix("code-heavy", (("prose", 1), ("code", 8), ("json", 2), ("cjk", 1))),
    Mix("json-heavy", (("prose", 1), ("code", 2), ("json", 8), ("cjk", 1))),
    Mix("prose-heavy", (("prose", 8), ("code", 2), ("json", 1), ("cjk", 1))),
    Mix("cjk-heavy", (("prose", 1), ("code", 2), ("json", 1), ("cjk", 6))),
    Mix("multilingual", (("prose", 2), ("code", 3), ("json", 2), ("cjk", 3), ("other_scripts", 3))),
)

SMALL = Mix("small", BALANCED.weights, result_bytes=(100, 400))
"""Small tool results: a history whose working set stays in the CPU caches (the scaling
test uses it so that it measures the algorithm, not the memory hierarchy)."""

_SOURCES = _Sources()


def _prompt_text(rng: random.Random, lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    if rng.random() < 0.3:
        text = _TEXT_GENERATORS["cjk"](rng, _SOURCES, target)
        if rng.random() < 0.3:
            text += " " + rng.choice(ZH_TECH_WORDS)
        return text
    # prose paragraphs can be long; keep the first ``target`` characters at a word boundary
    text = _TEXT_GENERATORS["prose"](rng, _SOURCES, target)
    if len(text) > target * 2:
        cut = text.rfind(" ", 0, target * 2)
        text = text[: cut if cut > 0 else target * 2]
    return text


def _result_text(rng: random.Random, mix: Mix) -> str:
    cls = mix.choose(rng)
    target = mix.result_size(rng)
    try:
        return _TEXT_GENERATORS[cls](rng, _SOURCES, target)
    except ValueError:
        # corpus._diff can fail on a one-line slice (randrange on an emptied list); the
        # failure is deterministic, so falling back keeps the history deterministic too
        return _TEXT_GENERATORS["json"](rng, _SOURCES, target)


def _tool_round(rng: random.Random, mix: Mix, fmt: str) -> list[dict[str, Any]]:
    """One assistant turn with 1-3 calls in ``fmt`` and the messages answering them."""
    n = rng.randint(1, 3)
    text = _prompt_text(rng, 40, 400) if rng.random() < 0.6 else ""
    names = [rng.choice(TOOL_NAMES) for _ in range(n)]
    args = [_tool_args(rng, _SOURCES) for _ in range(n)]
    results = [_result_text(rng, mix) for _ in range(n)]
    order = list(range(n))
    if n > 1 and rng.random() < 0.2:
        rng.shuffle(order)  # results arriving out of call order: pairing is by id
    if fmt == "anthropic":
        ids = ["toolu_" + _call_id(rng)[5:] for _ in range(n)]
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [
            {"type": "tool_use", "id": ids[i], "name": names[i], "input": args[i]} for i in range(n)
        ]
        blocks = []
        for i in order:
            inner: Any = results[i]
            if rng.random() < 0.2:
                inner = [{"type": "text", "text": results[i]}]
            blocks.append({"type": "tool_result", "tool_use_id": ids[i], "content": inner})
        out: list[dict[str, Any]] = [{"role": "assistant", "content": content}]
        if n > 1 and rng.random() < 0.4:
            cut = rng.randint(1, n - 1)  # results split across two user messages
            out.append({"role": "user", "content": blocks[:cut]})
            out.append({"role": "user", "content": blocks[cut:]})
        else:
            out.append({"role": "user", "content": blocks})
        return out
    ids = [_call_id(rng) for _ in range(n)]
    if fmt == "openai":
        calls: list[dict[str, Any]] = [
            {
                "id": ids[i],
                "type": "function",
                "function": {"name": names[i], "arguments": json.dumps(args[i])},
            }
            for i in range(n)
        ]
    else:
        calls = [{"id": ids[i], "tool": names[i], "arguments": args[i]} for i in range(n)]
    out = [{"role": "assistant", "content": text, "tool_calls": calls}]
    for i in order:
        result: dict[str, Any] = {"role": "tool", "tool_call_id": ids[i], "content": results[i]}
        if fmt == "openai":
            result["name"] = names[i]
        out.append(result)
    return out


def chunks(
    seed: int = DEFAULT_SEED, mix: Mix = BALANCED
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The endless ``(kind, messages)`` chunk stream of one session (module docstring).

    ``kind`` is ``"system"`` (the first chunk only), ``"prompt"``, ``"round"`` (an assistant
    turn with its tool results) or ``"answer"``.
    """
    rng = random.Random(f"{seed}/{mix.name}")
    yield "system", [{"role": "system", "content": _TEXT_GENERATORS["prose"](rng, _SOURCES, 3000)}]
    rounds = 0
    turn = 0
    while True:
        turn += 1
        prompt: dict[str, Any] = {"role": "user", "content": _prompt_text(rng, 60, 1500)}
        if turn % 4 == 0:
            prompt["metadata"] = {"turn": turn}
        yield "prompt", [prompt]
        for _ in range(rng.randint(1, 6)):
            yield "round", _tool_round(rng, mix, FORMATS[rounds % len(FORMATS)])
            rounds += 1
        yield "answer", [{"role": "assistant", "content": _prompt_text(rng, 100, 2000)}]


class _Stream:
    """The chunks of one ``(seed, mix)`` session, generated lazily and kept."""

    def __init__(self, seed: int, mix: Mix) -> None:
        self._source = chunks(seed, mix)
        self.kinds: list[str] = []
        self.chunks: list[list[dict[str, Any]]] = []

    def chunk(self, index: int) -> tuple[str, list[dict[str, Any]]]:
        while len(self.chunks) <= index:
            kind, messages = next(self._source)
            self.kinds.append(kind)
            self.chunks.append(messages)
        return self.kinds[index], self.chunks[index]

    def prompt_starts(self, upto: int) -> list[int]:
        """Indices of the prompt chunks among the first ``upto`` chunks."""
        self.chunk(upto - 1)
        return [i for i in range(1, upto) if self.kinds[i] == "prompt"]


@functools.lru_cache(maxsize=64)
def _stream(seed: int, mix: Mix) -> _Stream:
    return _Stream(seed, mix)


def build(
    n: int, seed: int = DEFAULT_SEED, mix: Mix = BALANCED, start: int = 1
) -> list[dict[str, Any]]:
    """``n`` messages: the system prompt, then the session from chunk ``start`` (a prompt).

    Chunks are shared between calls with the same ``(seed, mix)``: a longer history
    repeats the chunks of a shorter one (only the completing exchanges differ).
    """
    stream = _stream(seed, mix)
    out: list[dict[str, Any]] = list(stream.chunk(0)[1])
    index = start
    while True:
        _, chunk = stream.chunk(index)
        if len(out) + len(chunk) > n:
            break
        out.extend(chunk)
        index += 1
    # complete with plain exchanges (never an unanswered call at the tail)
    rng = random.Random(f"{seed}/{mix.name}/{n}/{start}/fill")
    while len(out) < n:
        role = "assistant" if out[-1]["role"] == "user" else "user"
        out.append({"role": role, "content": _prompt_text(rng, 40, 300)})
    return out[:n]


@functools.lru_cache(maxsize=16)
def _cached(n: int, seed: int, mix: Mix) -> tuple[dict[str, Any], ...]:
    return tuple(build(n, seed, mix))


def history(n: int, seed: int = DEFAULT_SEED, mix: Mix = BALANCED) -> list[dict[str, Any]]:
    """``n`` messages of one deterministic session (cached; a new list, shared dicts)."""
    return list(_cached(n, seed, mix))


def window(
    n: int, seed: int, mix: Mix, rng: random.Random, span: int = 2000
) -> list[dict[str, Any]]:
    """``n`` messages starting at a random prompt among the first ``span`` chunks."""
    return build(n, seed, mix, start=rng.choice(_stream(seed, mix).prompt_starts(span)))


def text_bytes(messages: list[dict[str, Any]]) -> int:
    """UTF-8 size of the messages as JSON (what a session file would hold)."""
    return len(json.dumps(messages, ensure_ascii=False).encode("utf-8"))


__all__ = [
    "BALANCED",
    "FORMATS",
    "MIXES",
    "SMALL",
    "Mix",
    "build",
    "chunks",
    "history",
    "text_bytes",
    "window",
]
