"""Write ``examples/sample-transcript.jsonl``: a deterministic, tool-heavy agent session.

The transcript is one message object per line, as Amplifier's ``transcript.jsonl``:
user prompts, assistant messages with OpenAI-style tool calls
(``{"id", "type": "function", "function": {"name", "arguments"}}``), ``role: tool``
results (JSON listings, source code, test logs; 1-8 KB each) and final answers. Some
prompts and answers are Chinese or Japanese prose. Everything derives from ``SEED``
through ``random.Random`` and synthesized text (nothing is read from the machine), so
every run writes the same bytes.

It is the sample input of ``amplifier-context-simple replay``; with ``--window 32000
--max-output 4000`` compaction fires many times, and ``compact_threshold`` 0.7 against
0.95 gives clearly different cadences. Run: ``python examples/make_sample_transcript.py
[OUT]``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SEED = "context-simple-sample-v1"
TASKS = 16
OUT = Path(__file__).resolve().parent / "sample-transcript.jsonl"

WORDS = (
    "cache",
    "budget",
    "window",
    "token",
    "request",
    "view",
    "history",
    "compaction",
    "reducer",
    "ladder",
    "rung",
    "provider",
    "session",
    "orchestrator",
    "message",
    "result",
    "call",
    "group",
    "notice",
    "sticky",
    "decision",
    "estimate",
    "meter",
    "ingress",
    "marker",
    "protected",
    "recent",
    "floor",
    "target",
    "threshold",
    "commit",
)
MODULES = ("store", "ledger", "router", "planner", "indexer", "scheduler", "parser", "codec")
TOOLS = ("read_file", "grep", "run_tests", "list_dir", "http_get")
TASK_PROMPTS = (
    "The {m} module drops entries under load. Find where and propose a fix.",
    "Add retry with jitter to the {m} client and cover it with tests.",
    "Why does test_{m}_roundtrip fail on CI only? Investigate the logs.",
    "Refactor {m} so the public API no longer leaks internal dicts.",
    "请检查 {m} 模块的缓存失效逻辑，找出为什么在高并发时会返回过期数据，并给出修改建议。",
    "{m} モジュールのエラーハンドリングを見直して、例外が握りつぶされている箇所を教えてください。",
)
CJK_PROSE = (
    "根据日志和源码的分析，问题出在写入路径没有持有锁的情况下更新了索引，"
    "并发请求因此可能读到一半更新的状态。建议把索引更新移到同一个临界区内，"
    "并在测试中加入多线程的回归用例，以确保修改后的行为稳定可靠。"
)
JA_PROSE = (
    "ログを確認したところ、例外が発生した際にリトライ処理がエラーを記録せずに"
    "終了していることが分かりました。例外を再送出するか、少なくとも警告として"
    "記録するように修正することをお勧めします。テストも追加しました。"
)


def sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def code_listing(rng: random.Random, module: str, size: int) -> str:
    """Synthesized Python source of about ``size`` bytes."""
    lines = [f'"""{module}: {sentence(rng, 8)}"""', "", "from __future__ import annotations", ""]
    while sum(len(line) + 1 for line in lines) < size:
        name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
        args = ", ".join(rng.sample(WORDS, rng.randint(1, 3)))
        lines += [
            "",
            f"def {name}({args}):",
            f'    """{sentence(rng, rng.randint(6, 14))}"""',
            f"    if {rng.choice(WORDS)} is None:",
            f"        raise ValueError('{rng.choice(WORDS)} is required')",
            f"    result = [{rng.choice(WORDS)} for _ in range({rng.randint(2, 64)})]",
            f"    return {{'{rng.choice(WORDS)}': result, 'count': len(result)}}",
        ]
    return "\n".join(lines)


def json_listing(rng: random.Random, size: int) -> str:
    """A JSON document of about ``size`` bytes (records of a directory or an API)."""
    records: list[dict[str, Any]] = []
    while len(json.dumps(records)) < size:
        records.append(
            {
                "id": f"{rng.getrandbits(48):012x}",
                "path": f"src/{rng.choice(MODULES)}/{rng.choice(WORDS)}_{rng.choice(WORDS)}.py",
                "size": rng.randint(200, 90_000),
                "status": rng.choice(("ok", "stale", "modified", "error")),
                "note": sentence(rng, rng.randint(3, 9)),
            }
        )
    return json.dumps({"total": len(records), "items": records}, indent=1)


def test_log(rng: random.Random, module: str, size: int) -> str:
    """A pytest-like log of about ``size`` bytes with a failure section."""
    lines = [f"============ test session starts: tests/test_{module}.py ============"]
    while sum(len(line) + 1 for line in lines) < size * 0.7:
        outcome = rng.choice(("PASSED", "PASSED", "PASSED", "FAILED"))
        lines.append(f"tests/test_{module}.py::test_{rng.choice(WORDS)} {outcome}")
    lines.append("=================== FAILURES ===================")
    while sum(len(line) + 1 for line in lines) < size:
        lines.append(f"E   AssertionError: {sentence(rng, rng.randint(5, 12))}")
    return "\n".join(lines)


def tool_output(rng: random.Random, tool: str, module: str) -> str:
    size = rng.randint(1_000, 8_000)
    if tool == "read_file":
        return code_listing(rng, module, size)
    if tool == "run_tests":
        return test_log(rng, module, size)
    if tool == "grep":
        hits: list[str] = []
        while sum(len(hit) + 1 for hit in hits) < size:
            hits.append(
                f"src/{module}/{rng.choice(WORDS)}.py:{rng.randint(1, 900)}: "
                f"{rng.choice(WORDS)} = {rng.choice(WORDS)}({rng.choice(WORDS)})"
            )
        return "\n".join(hits)
    return json_listing(rng, size)


def arguments(rng: random.Random, tool: str, module: str) -> dict[str, Any]:
    if tool == "read_file":
        return {"path": f"src/{module}/{rng.choice(WORDS)}.py"}
    if tool == "grep":
        return {"pattern": rng.choice(WORDS), "path": f"src/{module}"}
    if tool == "run_tests":
        return {"target": f"tests/test_{module}.py", "verbose": True}
    if tool == "list_dir":
        return {"path": f"src/{module}", "recursive": True}
    return {"url": f"https://ci.example.test/api/{module}/runs?limit={rng.randint(5, 50)}"}


def build(seed: str = SEED, tasks: int = TASKS) -> list[dict[str, Any]]:
    """The whole session as a list of messages (deterministic for a given seed)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    call_number = 0
    for task in range(tasks):
        module = rng.choice(MODULES)
        prompt = TASK_PROMPTS[task % len(TASK_PROMPTS)].format(m=module)
        messages.append({"role": "user", "content": prompt})
        for _ in range(rng.randint(6, 11)):
            calls = []
            for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
                call_number += 1
                tool = rng.choice(TOOLS)
                calls.append(
                    (
                        f"call_{call_number:04d}",
                        tool,
                        arguments(rng, tool, module),
                    )
                )
            messages.append(
                {
                    "role": "assistant",
                    "content": sentence(rng, rng.randint(5, 15)),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": tool, "arguments": json.dumps(args)},
                        }
                        for call_id, tool, args in calls
                    ],
                }
            )
            messages.extend(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": tool_output(rng, tool, module),
                }
                for call_id, tool, _ in calls
            )
        if "请" in prompt:
            answer = CJK_PROSE
        elif "ください" in prompt:
            answer = JA_PROSE
        else:
            answer = " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(3, 8)))
        messages.append({"role": "assistant", "content": answer})
    return messages


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    messages = build()
    lines = (json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in messages)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(messages)} messages ({out.stat().st_size:,} bytes) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
