"""Loader for the real public agent conversations under ``tests/data/real``.

Each conversation is a ``<name>.jsonl`` file (one chat message per line) listed, with its
public source, commit, licence and conversion, in ``tests/data/real/SOURCES.json``. Formats:
``openai`` (``tool_calls`` answered by ``role: tool`` messages), ``anthropic`` (``tool_use``
blocks answered by ``tool_result`` blocks in user messages) and ``amplifier`` (``tool_calls``
entries ``{"id", "tool", "arguments"}`` answered by ``role: tool`` messages).

Usage::

    from tests.realdata import conversations, with_result_removed

    for conv in conversations():
        history = with_result_removed(conv.messages)
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "LONG_DIR",
    "REAL_DIR",
    "Conversation",
    "LongSession",
    "conversations",
    "long_sessions",
    "with_result_removed",
]

REAL_DIR: Path = Path(__file__).resolve().parent / "data" / "real"
LONG_DIR: Path = REAL_DIR / "long"
_SOURCES = "SOURCES.json"


@dataclass(frozen=True)
class Conversation:
    """One real conversation: its file stem, format, messages and source record."""

    name: str
    format: str
    messages: list[dict[str, Any]]
    source: dict[str, Any]


@functools.cache
def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _records(directory: Path = REAL_DIR) -> list[dict[str, Any]]:
    path = directory / _SOURCES
    if not path.is_file():
        raise FileNotFoundError(f"real-data index missing: {path}")
    data: object = json.loads(_read_text(path))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise TypeError(f"{path}: expected a JSON list of records")
    records: list[dict[str, Any]] = data
    for record in records:
        if not isinstance(record.get("file"), str) or not isinstance(record.get("format"), str):
            raise TypeError(f"{path}: record without a string 'file' and 'format': {record!r}")
    return records


def _load_messages(path: Path) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            message: object = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: invalid JSON: {exc}") from exc
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise TypeError(f"{path}:{number}: not a message dict with a string 'role'")
        messages.append(message)
    return messages


def conversations(directory: Path = REAL_DIR) -> list[Conversation]:
    """Every conversation listed in SOURCES.json, sorted by name, as fresh copies.

    Raises FileNotFoundError naming the file when a listed conversation is missing,
    ValueError naming the file (and line) on invalid JSON or a message count that disagrees
    with the record, and TypeError naming the file and line when a line is not a message.
    """
    result: list[Conversation] = []
    for record in _records(directory):
        path = directory / str(record["file"])
        if not path.is_file():
            raise FileNotFoundError(f"real conversation listed in {_SOURCES} is missing: {path}")
        messages = _load_messages(path)
        expected = record.get("messages")
        if isinstance(expected, int) and expected != len(messages):
            raise ValueError(f"{path}: {len(messages)} messages, but {_SOURCES} says {expected}")
        result.append(
            Conversation(
                name=path.stem,
                format=str(record["format"]),
                messages=messages,
                source=copy.deepcopy(record),
            )
        )
    return sorted(result, key=lambda conv: conv.name)


@dataclass(frozen=True)
class LongSession:
    """One long timestamped session: its conversation and the time each message was logged
    (timezone-aware, one per message, never decreasing)."""

    conversation: Conversation
    times: tuple[datetime, ...]

    @property
    def name(self) -> str:
        return self.conversation.name


def long_sessions() -> list[LongSession]:
    """The long sessions under ``tests/data/real/long`` (sorted by name, fresh copies).

    Raises what ``conversations`` raises, and ValueError naming the file when its times
    file does not hold one ISO timestamp per message, in order.
    """
    sessions: list[LongSession] = []
    for conv in conversations(LONG_DIR):
        path = LONG_DIR / str(conv.source["times"])
        raw: object = json.loads(_read_text(path))
        if not isinstance(raw, list) or len(raw) != len(conv.messages):
            raise ValueError(f"{path}: expected {len(conv.messages)} timestamps")
        times = tuple(datetime.fromisoformat(str(stamp)) for stamp in raw)
        if any(later < earlier for earlier, later in itertools.pairwise(times)):
            raise ValueError(f"{path}: timestamps go back in time")
        sessions.append(LongSession(conv, times))
    return sessions


def _result_blocks(message: dict[str, Any]) -> list[int]:
    """Indexes of the tool_result blocks in a message's content list."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [
        i
        for i, block in enumerate(content)
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def _carries_result(message: dict[str, Any]) -> bool:
    return message.get("role") == "tool" or bool(_result_blocks(message))


def with_result_removed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ONE tool result removed mid-history.

    The middle-most result-carrying message is chosen (``role: "tool"``, or a message whose
    content list holds ``tool_result`` blocks; of n such messages, number n // 2 counting
    from 0). A tool message is dropped whole; otherwise its middle ``tool_result`` block is
    removed, and the message is dropped only if nothing is left in it. The input is not
    modified. Raises ValueError when no message carries a tool result.
    """
    carriers = [i for i, message in enumerate(messages) if _carries_result(message)]
    if not carriers:
        raise ValueError("no tool result to remove")
    target = carriers[len(carriers) // 2]
    result = copy.deepcopy(messages)
    message = result[target]
    if message.get("role") == "tool":
        del result[target]
        return result
    blocks = _result_blocks(message)
    content: list[Any] = message["content"]
    del content[blocks[len(blocks) // 2]]
    if not content:
        del result[target]
    return result
