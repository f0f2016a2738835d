"""A deterministic scripted conversation for the demo (and the example tests).

``build_conversation(turns, seed)`` returns a ``Conversation``: ``turns`` user prompts, each
with the assistant's scripted replies. A reply is either a set of tool calls (with the
tool outputs the scripted tools return) or the final answer. Everything derives from
``seed`` through ``random.Random``; source excerpts are read from the running Python's
standard library, so a given interpreter always produces the same conversation.

Content mix (per turn, chosen by the seeded generator): large JSON tool outputs
(2-9 KB, and 16-20 KB on every eleventh turn), Python source code read from stdlib files,
English prose, Chinese and Japanese text, some long pasted prompts, and some turns with
no tools at all. Steps may issue two parallel calls.

Tool-call formats: a call id starting ``toolu_`` asks the orchestrator to store that step
Anthropic style (``tool_use`` / ``tool_result`` content blocks); ``call_`` ids are stored
OpenAI style (``tool_calls`` + ``role: tool`` messages). About 30 % of steps are Anthropic.

The conversation object is what both example modules read from the coordinator
capability ``SCRIPT_CAPABILITY``:

- the provider: ``locate_turn(text)`` (which turn a user prompt opens) and
  ``reply(turn, step)`` (the reply for the ``step``-th model call of that turn);
- the orchestrator: ``tool_output(call_id)`` (the scripted tool's output).
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = "context-simple-demo-v1"
DEFAULT_TURNS = 160
SCRIPT_CAPABILITY = "example.conversation_script"
SYSTEM_PROMPT = (
    "You are a careful engineering assistant working inside a long-running session. "
    "Use the tools to look things up before answering, quote exact numbers from tool "
    "output, and answer in the language of the user's request."
)
BIG_JSON_EVERY = 11
ANTHROPIC_SHARE = 0.3

_TURN_TAG = re.compile(r"^\[T(\d{3,})\]")

STDLIB_FILES = (
    "textwrap.py",
    "heapq.py",
    "bisect.py",
    "shlex.py",
    "fnmatch.py",
    "string.py",
    "colorsys.py",
    "base64.py",
    "calendar.py",
    "difflib.py",
    "json/decoder.py",
    "json/encoder.py",
    "queue.py",
    "sched.py",
    "statistics.py",
    "tokenize.py",
    "uuid.py",
    "dataclasses.py",
    "functools.py",
    "pprint.py",
)

ZH_SENTENCES = (
    "上下文窗口是模型一次能够看到的全部内容，超过这个限制的请求会被服务端直接拒绝。",
    "压缩只影响发送给模型的视图，完整的会话记录仍然保存在内存中。",
    "工具调用和工具结果必须成对出现，否则接口会返回校验错误。",
    "我们先统计每条消息的令牌数，再决定从哪一轮开始截断旧的工具输出。",
    "如果受保护的内容本身已经超过预算，系统应当明确报错，而不是悄悄丢弃指令。",
    "这份报告汇总了过去三十天各个地区的订单数量、退货率以及平均配送时间。",
    "华东地区的订单量环比增长了百分之十二，但退货率也略有上升。",
    "建议在下一个版本中加入缓存命中率的监控，并把告警阈值调整到百分之八十。",
    "测试覆盖了取消、回滚以及并发提交三种情况，全部通过。",
    "请注意，中文文本的令牌密度明显高于英文，按字符数估算会严重低估。",
    "会议纪要：产品、研发和运维三方同意在周五之前完成灰度发布。",
    "数据库迁移脚本已经在预发布环境中执行完毕，没有发现数据不一致。",
)

JA_SENTENCES = (
    "コンテキストウィンドウを超えるリクエストは、プロバイダー側で即座に拒否されます。",
    "圧縮はモデルに送るビューだけを変更し、会話の履歴そのものは書き換えません。",
    "ツール呼び出しとツール結果は必ずペアで保持する必要があります。",
    "古いツール出力から順番に切り詰め、それでも足りなければ古いメッセージを削除します。",
    "保護された内容だけで予算を超える場合は、黙って指示を捨てずにエラーを返すべきです。",
    "今月の売上は前年同月比で八パーセント増加し、特に関西地域の伸びが顕著でした。",
    "次のリリースでは、キャッシュヒット率の監視とアラートの閾値の見直しを行います。",
    "キャンセル、ロールバック、同時コミットの三つのケースについてテストを追加しました。",
    "日本語の文章は英語に比べてトークン密度が高いため、文字数による見積もりは過小評価になりがちです。",
    "議事録：開発チームと運用チームは金曜日までに段階的な展開を完了することで合意しました。",
    "移行スクリプトはステージング環境で正常に実行され、データの不整合は見つかりませんでした。",
    "ユーザーからの問い合わせの多くは、請求書のダウンロードに関するものでした。",
)

SUBJECTS = (
    "The scheduler",
    "Our billing service",
    "The nightly export",
    "The cache layer",
    "Each worker",
    "The migration",
    "The on-call engineer",
    "The rollout plan",
    "The request router",
    "This dashboard",
)
VERBS = (
    "retries",
    "records",
    "drops",
    "compacts",
    "validates",
    "streams",
    "reconciles",
    "throttles",
    "summarises",
    "replays",
)
OBJECTS = (
    "stale invoices",
    "every tool result",
    "the oldest partitions",
    "late webhook deliveries",
    "duplicate events",
    "the audit trail",
    "cold shards",
    "pending refunds",
    "the retention window",
    "orphaned sessions",
)
TAILS = (
    "before the window closes.",
    "whenever the queue backs up.",
    "so that the p99 latency stays under budget.",
    "unless an operator pins the previous release.",
    "and reports the counts to the metrics pipeline.",
    "after the second failed health check.",
    "without touching the canonical history.",
    "in batches of five hundred rows.",
)
REGIONS = ("emea-west", "emea-north", "apac-east", "apac-south", "us-east", "us-west", "latam")
SERVICES = ("checkout", "search", "billing", "ingest", "notifier", "auth", "reports")
STATUSES = ("shipped", "pending", "returned", "cancelled", "delivered", "on_hold")
NAMES = ("Ada", "Bo", "Chen Wei", "Dana", "Eun-ji", "Farid", "Greta", "Hiro", "Ines", "Jun")
SURNAMES = ("Okafor", "Lindqvist", "Tanaka", "Moreau", "Silva", "Kowalski", "Wang", "Haddad")


@dataclass(frozen=True)
class ScriptedCall:
    """One scripted tool call and the output the scripted tool returns for it."""

    id: str
    name: str
    arguments: Mapping[str, Any]
    output: str
    kind: str


@dataclass(frozen=True)
class Reply:
    """One assistant reply: tool calls (non-empty) or the final answer (no calls)."""

    text: str
    tool_calls: tuple[ScriptedCall, ...] = ()


@dataclass(frozen=True)
class Turn:
    """One user turn: the prompt and the replies of each model call, the last final."""

    number: int
    kind: str
    prompt: str
    replies: tuple[Reply, ...]


@dataclass
class ConversationStats:
    """Sizes, for the demo's header line."""

    turns: int = 0
    tool_calls: int = 0
    anthropic_calls: int = 0
    output_bytes: dict[str, int] = field(default_factory=dict)


class Conversation:
    """The script both example modules read (see the module contract)."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = turns
        self._outputs = {
            call.id: call.output
            for turn in turns
            for reply in turn.replies
            for call in reply.tool_calls
        }

    def locate_turn(self, text: str) -> int | None:
        """The turn number a prompt opens (prompts start with ``[Tnnn]``), else None."""
        match = _TURN_TAG.match(text)
        if match is None:
            return None
        number = int(match.group(1))
        return number if 1 <= number <= len(self.turns) else None

    def reply(self, turn: int, step: int) -> Reply:
        """The reply to the ``step``-th model call of ``turn`` (past the end: the answer)."""
        replies = self.turns[turn - 1].replies
        return replies[min(step, len(replies) - 1)]

    def tool_output(self, call_id: str) -> str | None:
        """The scripted tool output for ``call_id``, or None for an unknown call."""
        return self._outputs.get(call_id)

    def stats(self) -> ConversationStats:
        """Counts and output bytes per content kind."""
        stats = ConversationStats(turns=len(self.turns))
        for turn in self.turns:
            for reply in turn.replies:
                for call in reply.tool_calls:
                    stats.tool_calls += 1
                    stats.anthropic_calls += call.id.startswith("toolu_")
                    size = len(call.output.encode())
                    stats.output_bytes[call.kind] = stats.output_bytes.get(call.kind, 0) + size
        return stats


# -- content generators --------------------------------------------------------------


def _sentence(rng: random.Random) -> str:
    return " ".join(
        (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(TAILS))
    )


def prose(rng: random.Random, size: int) -> str:
    """English paragraphs of about ``size`` bytes."""
    paragraphs: list[str] = []
    total = 0
    while total < size:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7)))
        paragraphs.append(paragraph)
        total += len(paragraph) + 2
    return "\n\n".join(paragraphs)


def cjk(rng: random.Random, size: int, lang: str) -> str:
    """Chinese (``zh``) or Japanese (``ja``) sections of about ``size`` UTF-8 bytes."""
    bank = ZH_SENTENCES if lang == "zh" else JA_SENTENCES
    heading = "第{}节" if lang == "zh" else "第{}章"
    parts: list[str] = []
    total = 0
    section = 1
    while total < size:
        body = "".join(rng.choice(bank) for _ in range(rng.randint(3, 6)))
        part = f"## {heading.format(section)}\n{body}"
        parts.append(part)
        total += len(part.encode())
        section += 1
    return "\n\n".join(parts)


def _order(rng: random.Random) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {
            "sku": f"SKU-{rng.randint(1000, 9999)}",
            "qty": rng.randint(1, 12),
            "unit_price": round(rng.uniform(1, 500), 2),
        }
        for _ in range(rng.randint(1, 4))
    ]
    order: dict[str, Any] = {
        "id": f"ORD-{rng.randint(10**6, 10**7 - 1)}",
        "customer": {
            "name": f"{rng.choice(NAMES)} {rng.choice(SURNAMES)}",
            "tier": rng.choice(("free", "pro", "enterprise")),
        },
        "region": rng.choice(REGIONS),
        "created_at": (
            f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
        ),
        "status": rng.choice(STATUSES),
        "items": items,
        "total": round(sum(item["qty"] * item["unit_price"] for item in items), 2),
    }
    if rng.random() < 0.25:
        order["note"] = (
            rng.choice(ZH_SENTENCES + JA_SENTENCES) if rng.random() < 0.4 else (_sentence(rng))
        )
    return order


def _metric(rng: random.Random) -> dict[str, Any]:
    return {
        "ts": f"2025-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
        "service": rng.choice(SERVICES),
        "p50_ms": round(rng.uniform(3, 80), 1),
        "p99_ms": round(rng.uniform(80, 2400), 1),
        "errors": rng.randint(0, 40),
        "requests": rng.randint(1000, 90000),
        "cache_hit_ratio": round(rng.uniform(0.4, 0.99), 3),
    }


def json_payload(rng: random.Random, size: int, query: Mapping[str, Any], metrics: bool) -> str:
    """A JSON tool output of about ``size`` bytes (orders or metric samples)."""
    make = _metric if metrics else _order
    indent = 2 if rng.random() < 0.5 else None
    rows: list[dict[str, Any]] = []
    total = 80
    while total < size:
        row = make(rng)
        rows.append(row)
        total += len(json.dumps(row, ensure_ascii=False, indent=indent)) + 4
    document = {"query": dict(query), "count": len(rows), "results": rows}
    return json.dumps(document, ensure_ascii=False, indent=indent)


def _stdlib_lines(name: str) -> list[str]:
    path = Path(sysconfig.get_paths()["stdlib"]) / name
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return [f"# {name} is not available in this interpreter", "pass"]


def source_excerpt(rng: random.Random, size: int) -> tuple[dict[str, Any], str]:
    """``(arguments, text)`` for a read_file call: about ``size`` bytes of stdlib source."""
    name = rng.choice(STDLIB_FILES)
    lines = _stdlib_lines(name)
    start = rng.randrange(max(1, len(lines) // 2))
    chosen: list[str] = []
    total = 0
    for number, line in enumerate(lines[start:], start + 1):
        chosen.append(f"{number:5d}  {line}")
        total += len(line) + 8
        if total >= size:
            break
    arguments = {"path": f"Lib/{name}", "start_line": start + 1, "end_line": start + len(chosen)}
    return arguments, "\n".join(chosen)


# -- turns ---------------------------------------------------------------------------

KINDS = ("orders", "metrics", "code", "docs", "zh", "ja", "chat")
KIND_WEIGHTS = (16, 10, 24, 14, 12, 10, 14)


def _call(
    rng: random.Random, turn: int, step: int, index: int, kind: str, size: int
) -> ScriptedCall:
    anthropic = rng.random() < ANTHROPIC_SHARE
    call_id = f"{'toolu' if anthropic else 'call'}_{turn:03d}_{step}_{index}"
    if kind in ("orders", "metrics"):
        if kind == "orders":
            name, args = "search_orders", {"region": rng.choice(REGIONS), "limit": 200}
        else:
            name, args = "query_metrics", {"service": rng.choice(SERVICES), "window": "24h"}
        return ScriptedCall(
            call_id, name, args, json_payload(rng, size, args, kind == "metrics"), "json"
        )
    if kind == "code":
        args, text = source_excerpt(rng, size)
        return ScriptedCall(call_id, "read_file", args, text, "code")
    if kind in ("zh", "ja"):
        args = {"url": f"https://wiki.example/{kind}/{turn}-{step}", "lang": kind}
        return ScriptedCall(call_id, "fetch_document", args, cjk(rng, size, kind), "cjk")
    args = {"url": f"https://wiki.example/runbooks/{turn}-{step}"}
    return ScriptedCall(call_id, "fetch_document", args, prose(rng, size), "prose")


def _output_size(rng: random.Random, kind: str, turn: int, step: int, parallel: bool) -> int:
    if kind in ("orders", "metrics") and turn % BIG_JSON_EVERY == 5 and step == 0 and not parallel:
        return rng.randint(16_000, 20_000)
    if parallel:
        return rng.randint(1_500, 3_500)
    low, high = {"orders": (2_000, 9_000), "metrics": (2_000, 9_000), "code": (2_000, 8_000)}.get(
        kind, (2_000, 6_000)
    )
    return rng.randint(low, high)


def _prompt(rng: random.Random, number: int, kind: str) -> str:
    asks = {
        "orders": f"Pull the recent orders for {rng.choice(REGIONS)} and tell me what stands out.",
        "metrics": f"How did {rng.choice(SERVICES)} behave over the last day? Check the metrics.",
        "code": "Read the relevant part of the standard library and explain how it works.",
        "docs": "Fetch the runbook for this incident and summarise the next steps.",
        "zh": "请查阅相关文档，并用中文总结要点。",
        "ja": "関連するドキュメントを確認して、日本語で要点をまとめてください。",
        "chat": "Quick question before we continue: " + _sentence(rng).lower(),
    }
    prompt = f"[T{number:03d}] {asks[kind]}"
    if rng.random() < 0.15:
        if rng.random() < 0.5:
            pasted = prose(rng, rng.randint(800, 2_500))
        else:
            pasted = cjk(rng, rng.randint(600, 1_800), rng.choice(("zh", "ja")))
        prompt += f"\n\nContext I pasted from the ticket:\n{pasted}"
    return prompt


def _answer(rng: random.Random, kind: str, calls: list[ScriptedCall]) -> str:
    if kind in ("zh", "ja"):
        bank = ZH_SENTENCES if kind == "zh" else JA_SENTENCES
        return "".join(rng.choice(bank) for _ in range(rng.randint(3, 8)))
    if kind == "code" and calls:
        names = sorted(set(re.findall(r"def (\w+)", " ".join(call.output for call in calls))))
        shown = ", ".join(names[:6]) or "no functions"
        return f"The excerpt defines {shown}. " + prose(rng, rng.randint(300, 1_200))
    return prose(rng, rng.randint(200, 1_400))


def _turn(seed: str, number: int) -> Turn:
    rng = random.Random(f"{seed}:{number}")
    kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
    roll = rng.random()
    steps = 0 if kind == "chat" else 1 if roll < 0.6 else 2 if roll < 0.88 else 3
    replies: list[Reply] = []
    all_calls: list[ScriptedCall] = []
    for step in range(steps):
        parallel = rng.random() < 0.2
        count = 2 if parallel else 1
        calls = [
            _call(rng, number, step, index, kind, _output_size(rng, kind, number, step, parallel))
            for index in range(count)
        ]
        all_calls.extend(calls)
        replies.append(Reply(f"Checking with {calls[0].name} (step {step + 1}).", tuple(calls)))
    replies.append(Reply(_answer(rng, kind, all_calls)))
    return Turn(number, kind, _prompt(rng, number, kind), tuple(replies))


def build_conversation(turns: int = DEFAULT_TURNS, seed: str = SEED) -> Conversation:
    """The deterministic conversation of ``turns`` turns for ``seed``."""
    return Conversation([_turn(seed, number) for number in range(1, turns + 1)])
