"""Replaying conversations under the preserved-thinking oracle, and generated sessions
with thinking in both block formats the module carries.

``replay_checked`` makes a request before each assistant message (the way a session asks
for the view its next answer is produced from), checks each view with a ``PrefixLedger``
and records the assistant message as that view's answer: every thinking block of a
replayed conversation is then bound to the view we sent, exactly as a provider binds it.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.testing import check_view_invariants
from amplifier_module_context_simple.testing.thinking_oracle import PrefixLedger, is_thinking

Request = Callable[[SimpleContextManager, int], Awaitable[list[dict[str, Any]]]]
"""``(manager, request number) -> the view sent``."""


@dataclass
class Tally:
    requests: int = 0
    invalid_requests: int = 0
    invalid_blocks: int = 0
    left_out: int = 0
    shown: int = 0
    compactions: int = 0
    first_invalid: str | None = None
    views: list[list[dict[str, Any]]] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.invalid_requests += other.invalid_requests
        self.invalid_blocks += other.invalid_blocks
        self.left_out += other.left_out
        self.shown += other.shown
        self.compactions += other.compactions
        self.first_invalid = self.first_invalid or other.first_invalid


def has_thinking(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(is_thinking(block) for block in content)


async def replay_checked(
    messages: list[dict[str, Any]],
    request: Request,
    *,
    keep_views: bool = False,
    validate: bool = False,
    **config: Any,
) -> Tally:
    """Replay ``messages`` through a fresh manager (``config``), checking every view with
    the thinking oracle (and, with ``validate``, with ``check_view_invariants``: the
    providers' tool-use rules among them)."""
    await checkpoint()  # (a conversation may have no assistant turn to await a request for)
    manager = SimpleContextManager(**config)
    ledger = PrefixLedger()
    tally = Tally()
    stats: object = None
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            view = await request(manager, tally.requests)
            if validate:
                check_view_invariants(messages[:index], view)
            verdict = ledger.check(view)
            tally.requests += 1
            tally.shown += verdict.shown
            tally.left_out += verdict.left_out
            if verdict.invalid:
                tally.invalid_requests += 1
                tally.invalid_blocks += len(verdict.invalid)
                if tally.first_invalid is None:
                    tally.first_invalid = f"request {tally.requests} (message {index})"
            if manager.last_compaction_stats is not stats:
                stats = manager.last_compaction_stats
                tally.compactions += 1
            if keep_views:
                tally.views.append(view)
            ledger.answered(view, message)
        await manager.add_message(copy.deepcopy(message))
    return tally


def ordinary(budget: int) -> Request:
    async def request(manager: SimpleContextManager, _: int) -> list[dict[str, Any]]:
        return await manager.get_messages_for_request(token_budget=budget)

    return request


# -- generated sessions ----------------------------------------------------------------------

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _thinking(fmt: str, rng: random.Random, n: int) -> dict[str, Any]:
    if fmt == "anthropic" and rng.random() < 0.2:
        return {"type": "redacted_thinking", "data": f"opaque-{n}-{rng.getrandbits(32):x}"}
    block = {
        "type": "thinking",
        "thinking": _text(rng, rng.randint(5, 120)),
        "signature": f"sig-{n}",
    }
    if fmt == "amplifier":
        block["visibility"] = "internal"
    return block


def thinking_session(fmt: str, turns: int, seed: int) -> list[dict[str, Any]]:
    """A tool-using session whose assistant turns carry thinking: Anthropic blocks
    (``thinking``/``redacted_thinking``, ``tool_use``, ``tool_result`` carriers; sometimes
    text before the thinking) or Amplifier's (``thinking`` with ``visibility``,
    ``tool_call`` blocks plus ``tool_calls``, ``role: tool`` results)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Please fix the build. " + _text(rng, 40)},
    ]
    n = 0
    for turn in range(turns):
        n += 1
        blocks: list[dict[str, Any]] = [_thinking(fmt, rng, n)]
        if rng.random() < 0.5:
            text = {"type": "text", "text": _text(rng, rng.randint(3, 40))}
            blocks.insert(1 if fmt == "amplifier" or rng.random() < 0.7 else 0, text)
        if rng.random() < 0.2:
            n += 1
            blocks.append(_thinking(fmt, rng, n))
        ids = [f"c{turn}_{k}" for k in range(rng.choice([0, 1, 1, 2]))]
        message: dict[str, Any] = {"role": "assistant", "content": blocks}
        if fmt == "anthropic":
            blocks += [
                {"type": "tool_use", "id": i, "name": "read", "input": {"p": i}} for i in ids
            ]
        elif ids:
            blocks += [
                {"type": "tool_call", "id": i, "name": "read", "input": {"p": i}} for i in ids
            ]
            message["tool_calls"] = [{"id": i, "tool": "read", "arguments": {"p": i}} for i in ids]
        messages.append(message)
        for call_id in ids:
            body = f"output of {call_id}: " + _text(rng, rng.choice([20, 200, 900]))
            if fmt == "anthropic":
                messages.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": call_id, "content": body}
                        ],
                    }
                )
            else:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": body})
        if not ids or rng.random() < 0.15:
            messages.append({"role": "user", "content": "Next: " + _text(rng, rng.randint(5, 80))})
    return messages
