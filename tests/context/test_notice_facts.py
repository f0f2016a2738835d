"""The verbose notice keeps the facts: the tool calls the view no longer shows in full.

Each listed line is ``name(key=value)`` of a call of the history (never invented), the
list holds the most recent such calls that fit the notice's share of the budget, and the
stats carry the whole list (``omitted_tool_calls``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager

pytestmark = pytest.mark.anyio
HEADER = "Tool calls no longer shown in full"


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def session(rounds: int) -> list[dict[str, Any]]:
    """Tool rounds in three formats with real-looking arguments."""
    messages: list[dict[str, Any]] = [human("first: investigate the failing build")]
    for k in range(rounds):
        kind = k % 3
        output = f"output {k} " + "line of output\n" * 120
        if kind == 0:
            args = json.dumps({"path": f"src/module_{k}.py", "limit": 400})
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"o{k}",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": args},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"o{k}", "content": output})
        elif kind == 1:
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": f"a{k}",
                            "tool": "bash",
                            "arguments": {"command": f"pytest -k case_{k}"},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"a{k}", "content": output})
        else:
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": f"t{k}",
                            "name": "grep",
                            "input": {"pattern": f"TODO_{k}"},
                        }
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"t{k}", "content": output}],
                }
            )
    messages.append(human("latest: what is the root cause?"))
    return messages


def history_calls(messages: list[dict[str, Any]]) -> set[str]:
    """Every ``name(key=value)`` the history could yield, written out independently."""
    facts: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            if "function" in call:
                name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
            else:
                name, args = call["tool"], call["arguments"]
            facts.update(f"{name}({key}={value})" for key, value in args.items())
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if block.get("type") == "tool_use":
                    facts.update(f"{block['name']}({k}={v})" for k, v in block["input"].items())
    return facts


async def test_the_verbose_notice_lists_the_omitted_calls_within_its_share() -> None:
    messages = session(30)
    manager = SimpleContextManager(
        compaction_notice_verbosity="verbose", compaction_notice_token_reserve=200
    )
    await manager.set_messages(copy.deepcopy(messages))
    view = await manager.get_messages_for_request(token_budget=6000)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["omitted_tool_calls"]
    known = history_calls(messages)
    assert set(stats["omitted_tool_calls"]) <= known  # never invented
    notice = view[-1]["content"]
    assert HEADER in notice
    listed = [line[2:] for line in notice.splitlines() if line.startswith("- ") and "(" in line]
    listed = [line for line in listed if not line.startswith("... and")]
    assert listed and set(listed) <= known
    # the most recent omitted calls, in order, within the share (3 characters per token)
    assert listed == stats["omitted_tool_calls"][-len(listed) :]
    assert sum(len(line) + 3 for line in listed) <= 3 * 200
    if len(listed) < len(stats["omitted_tool_calls"]):
        assert f"... and {len(stats['omitted_tool_calls']) - len(listed)} earlier calls" in notice


async def test_the_normal_notice_does_not_list_them() -> None:
    messages = session(30)
    manager = SimpleContextManager()
    await manager.set_messages(copy.deepcopy(messages))
    view = await manager.get_messages_for_request(token_budget=6000)
    assert manager.last_compaction_stats is not None
    assert HEADER not in view[-1]["content"]
