"""Real conversations: loading them, and the estimator's ratio on them per content class.

    uv run --frozen python -m benchmarks.real      # the estimator rows alone

Conversations come from the project's loader ``tests/realdata.py`` (``conversations()``,
objects with ``.name``, ``.format`` and ``.messages``) when it exists, else from the
``*.jsonl`` files of ``tests/data/real/`` (one message per line; the format is read off
the messages). ``BENCH_REALDATA=DIR`` reads the ``*.jsonl`` files of ``DIR`` instead.

Estimator rows
--------------
For every message of every conversation: ratio = the module's ``estimate_message`` /
``provider.Counter.message_tokens`` of the same message - the o200k_base count of the
OpenAI Chat Completions message(s) it becomes, per-message overhead included, with the
serializer of ``benchmarks/provider.py`` (which shares nothing with the estimator).

Each message gets one class, by a simple rule on its converted form. Its text fields are
its content texts (string content, text parts) and its tool calls' argument strings; the
longest of them (in characters) decides:

- ``tool_args``: it is a tool call's ``function.arguments``;
- ``json``: its stripped text parses (``json.loads``) to an object or an array - JSON tool
  output, mostly;
- ``cjk``: at least 20% of its non-whitespace characters are CJK (U+2E80-U+9FFF, Hangul
  syllables U+AC00-U+D7AF, U+F900-U+FAFF, full-width forms U+FF00-U+FFEF);
- ``code``: at least 3 non-blank lines of which at least 40% look like code (``CODE_LINE``:
  indented by 4+ spaces or a tab - list items excepted -, ending in ``{ } ; ( [``,
  starting with a closing bracket, a keyword such as ``def``/``class``/``import``/
  ``return``/``function``, a shell prompt, or a diff/traceback marker), or fenced blocks
  (```` ``` ````) holding at least half of its characters. A file reader's line-number
  prefix (``   12→``, ``cat -n``'s tab) is removed from a line before it is tested;
- ``prose``: anything else.

A message with no text field at all (an empty tool result, an image alone) is
``no_text``. Per class: messages, the sums of reference and estimated tokens and their
ratio, the median, p10 and p90 of the per-message ratios, and - for sensitivity only -
the median ratio against a reference that leaves out the call ids
(``provider.ID_FIELDS``); ``all`` covers every message.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from amplifier_module_context_simple.context.counting.estimate import estimate_message
from benchmarks import provider

ROOT: Final = Path(__file__).resolve().parent.parent
REAL_DIR: Final = ROOT / "tests" / "data" / "real"
ENV_DIR: Final = "BENCH_REALDATA"
CLASSES: Final = ("prose", "json", "code", "cjk", "tool_args", "no_text")

# The classification rule's thresholds (module docstring).
CJK_SHARE: Final = 0.20
CODE_SHARE: Final = 0.40
CODE_MIN_LINES: Final = 3

CODE_LINE: Final = re.compile(
    r"""^(?:\ {4}|\t)\s*(?![-*+]\ |\d+[.)]\ )\S  # indented 4+ (a list item is not)
    | [{};(\[]\s*$                # ends like a statement or block opener
    | ^\s*[}\])]                  # starts with a closing bracket
    | ^\s*(?:def|class|import|from|return|if|elif|else|for|while|try|except|with|async
          |await|const|let|var|function|fn|pub|impl|struct|enum|public|private|package
          |\#include|\#!|@\w)\b
    | ^\s*[$>]\ \S                # shell prompt
    | ^(?:\+\+\+|---|@@|diff\ )\s # diff headers
    | ^\s*(?:Traceback|File\ ")   # traceback
    """,
    re.VERBOSE,
)
_LINE_NUMBER: Final = re.compile(r"^\s*\d+(?:→|\t)")
"""A file reader's line-number prefix (Claude Code's ``   12→``, ``cat -n``'s tab)."""
_FENCE: Final = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_CJK: Final = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
_WS: Final = re.compile(r"\s")


@dataclass(frozen=True)
class Conversation:
    name: str
    format: str
    messages: list[dict[str, Any]]


def _format_of(messages: Sequence[dict[str, Any]]) -> str:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
        ):
            return "anthropic"
        calls = message.get("tool_calls")
        if isinstance(calls, list) and any(isinstance(c, dict) and "tool" in c for c in calls):
            return "amplifier"
    return "openai"


def _read_dir(directory: Path) -> list[Conversation]:
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        messages = [json.loads(line) for line in lines if line.strip()]
        out.append(Conversation(path.stem, _format_of(messages), messages))
    return out


def source() -> str:
    """Where ``conversations()`` reads from (for the table's legend)."""
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    if (ROOT / "tests" / "realdata.py").exists():
        return "tests/realdata.py"
    return str(REAL_DIR.relative_to(ROOT))


def conversations() -> list[Conversation]:
    """The real conversations (module docstring); empty when there are none."""
    override = os.environ.get(ENV_DIR)
    if override:
        return _read_dir(Path(override))
    if (ROOT / "tests" / "realdata.py").exists():
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        loader = importlib.import_module("tests.realdata")
        return [
            Conversation(str(c.name), str(c.format), list(c.messages))
            for c in loader.conversations()
        ]
    return _read_dir(REAL_DIR) if REAL_DIR.is_dir() else []


# -- classification ---------------------------------------------------------------------------


def classify_text(text: str) -> str:
    """``json``, ``cjk``, ``code`` or ``prose`` for one content text (module docstring)."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            if isinstance(json.loads(stripped), dict | list):
                return "json"
        except ValueError:
            pass
    visible = len(_WS.sub("", text))
    if visible and len(_CJK.findall(text)) >= CJK_SHARE * visible:
        return "cjk"
    lines = [_LINE_NUMBER.sub("", line, count=1) for line in text.splitlines() if line.strip()]
    code_lines = sum(bool(CODE_LINE.search(line)) for line in lines)
    if len(lines) >= CODE_MIN_LINES and code_lines >= CODE_SHARE * len(lines):
        return "code"
    if text and sum(len(m) for m in _FENCE.findall(text)) * 2 >= len(text):
        return "code"
    return "prose"


def classify(message: dict[str, Any]) -> str:
    """The class of one stored message (module docstring)."""
    texts = [
        (kind, text)
        for converted in provider.convert_message(message)
        for kind, text in provider.fields(converted)[0]
        if kind in ("content", "arguments")
    ]
    if not texts:
        return "no_text"
    kind, text = max(texts, key=lambda field: len(field[1]))
    return "tool_args" if kind == "arguments" else classify_text(text)


# -- estimator rows -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    cls: str
    messages: int
    reference: int
    estimated: int
    median: float
    p10: float
    p90: float
    median_no_ids: float
    """The median ratio against the reference without call ids (sensitivity only)."""

    @property
    def ratio(self) -> float:
        return self.estimated / self.reference if self.reference else float("nan")


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Sample:
    cls: str
    reference: int
    reference_no_ids: int
    """The reference without the call ids (``provider.ID_FIELDS``): sensitivity only."""
    estimated: int


def samples(convs: Sequence[Conversation], counter: provider.Counter | None = None) -> list[Sample]:
    """One ``Sample`` per message of ``convs``."""
    counter = counter or provider.Counter()
    return [
        Sample(
            classify(m),
            counter.message_tokens(m),
            counter.message_tokens(m, provider.ID_FIELDS),
            estimate_message(m),
        )
        for conv in convs
        for m in conv.messages
    ]


def estimator_rows(
    convs: Sequence[Conversation], counter: provider.Counter | None = None
) -> list[Row]:
    """One row per class of ``CLASSES`` (empty ones included), then ``all``."""
    measured = samples(convs, counter)
    rows = []
    for cls in (*CLASSES, "all"):
        chosen = [s for s in measured if cls in (s.cls, "all")]
        ratios = [s.estimated / s.reference for s in chosen if s.reference]
        no_ids = [s.estimated / s.reference_no_ids for s in chosen if s.reference_no_ids]
        rows.append(
            Row(
                cls=cls,
                messages=len(chosen),
                reference=sum(s.reference for s in chosen),
                estimated=sum(s.estimated for s in chosen),
                median=_median(ratios),
                p10=_percentile(ratios, 0.10),
                p90=_percentile(ratios, 0.90),
                median_no_ids=_median(no_ids),
            )
        )
    return rows


def check_rows(
    rows: Sequence[Row],
    class_bounds: tuple[float, float],
    aggregate_bounds: tuple[float, float],
) -> list[str]:
    """Failures: a class median outside ``class_bounds`` (classes with messages only), or
    the aggregate (sum) ratio of ``all`` outside ``aggregate_bounds``."""
    failures = []
    lo, hi = class_bounds
    for row in rows:
        if row.cls == "all":
            alo, ahi = aggregate_bounds
            if not alo <= row.ratio <= ahi:
                failures.append(f"all: ratio {row.ratio:.3f} outside [{alo}, {ahi}]")
        elif row.messages and not lo <= row.median <= hi:
            failures.append(f"{row.cls}: median {row.median:.3f} outside [{lo}, {hi}]")
    return failures


def main() -> int:
    convs = conversations()
    if not convs:
        print(f"no real conversations ({source()})", file=sys.stderr)
        return 1
    print(f"{len(convs)} conversations from {source()}: " + ", ".join(c.name for c in convs))
    header = f"{'class':<10} {'msgs':>5} {'ref':>8} {'est':>8} {'ratio':>6} {'median':>6}"
    print(header + f" {'p10':>6} {'p90':>6} {'no ids':>6}")
    for row in estimator_rows(convs):
        print(
            f"{row.cls:<10} {row.messages:>5} {row.reference:>8} {row.estimated:>8} "
            f"{row.ratio:>6.3f} {row.median:>6.3f} {row.p10:>6.3f} {row.p90:>6.3f} "
            f"{row.median_no_ids:>6.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
