"""Loading a transcript and converting it into the histories the replays request with.

``parse_transcript`` splits a document (one message per line, or one JSON array) into the
messages the module admits and the ``Problem`` s skipped; ``request_histories`` turns the
messages into what is held at each request (right before each assistant message and at
the end), after the tool-result ingress cap the module applies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..context.config import ContextConfig
from ..context.history.history import validate_message
from ..context.history.ingress import cap_tool_result
from ..errors import InvalidMessageError
from .exits import EXIT_FAILURE, CliError

__all__ = ("Problem", "Transcript", "parse_transcript", "request_histories")


@dataclass(frozen=True, slots=True)
class Problem:
    """A skipped piece of input: where it was (``unit`` ``number``) and why."""

    unit: str
    number: int
    reason: str

    def __str__(self) -> str:
        return f"{self.unit} {self.number}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Transcript:
    """The replayable messages of a transcript, each with its line (or item) number."""

    path: Path
    unit: str
    """``"line"`` (one message per line) or ``"item"`` (one JSON array)."""
    messages: list[tuple[int, dict[str, Any]]]
    problems: list[Problem]


def parse_transcript(path: Path, data: bytes) -> Transcript:
    """Split ``data`` into valid messages and problems; never raises for bad content.

    A document whose first non-blank character is ``[`` and which parses as a JSON array
    is read as one array; anything else is read line by line. Each message must be a JSON
    object that passes the module's own admission check (``InvalidMessageError``).

    Raises:
        CliError: (exit 1) the document looks like a JSON array but is not valid JSON.
    """
    text = data.decode("utf-8-sig", errors="replace")
    if text.lstrip().startswith("["):
        array = _json_array(path, text)
        if array is not None:
            return _checked(path, "item", list(enumerate(array, start=1)))
    return _lines(path, data)


def _json_array(path: Path, text: str) -> list[object] | None:
    """``text`` as a JSON array, or None when it is to be read line by line (it is JSON
    but not an array, or its first line alone is JSON: a transcript of lines).

    Raises:
        CliError: (exit 1) ``text`` is not valid JSON and its first line is not either.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        first = text.lstrip().splitlines()[0]
        if not _is_json(first):
            raise CliError(f"{path}: not a valid JSON array: {exc}", EXIT_FAILURE) from exc
        return None
    return document if isinstance(document, list) else None


def _lines(path: Path, data: bytes) -> Transcript:
    """``data`` read one message per line (blank lines skipped), problems in line order."""
    rows: list[tuple[int, object]] = []
    problems: list[Problem] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
        except UnicodeDecodeError as exc:
            problems.append(Problem("line", number, f"not UTF-8 ({exc.reason})"))
            continue
        if not line:
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            problems.append(Problem("line", number, f"invalid JSON ({exc.msg})"))
    checked = _checked(path, "line", rows)
    return dataclasses.replace(
        checked, problems=sorted(problems + checked.problems, key=lambda p: p.number)
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _checked(path: Path, unit: str, rows: list[tuple[int, object]]) -> Transcript:
    """The rows that are objects the module admits; the others as problems."""
    messages: list[tuple[int, dict[str, Any]]] = []
    problems: list[Problem] = []
    for number, value in rows:
        if not isinstance(value, dict):
            problems.append(Problem(unit, number, f"not a JSON object ({type(value).__name__})"))
            continue
        try:
            validate_message(value)
        except InvalidMessageError as exc:
            problems.append(Problem(unit, number, f"rejected by the module: {exc}"))
            continue
        messages.append((number, value))
    return Transcript(path, unit, messages, problems)


def request_histories(
    transcript: Transcript, config: ContextConfig
) -> list[list[Mapping[str, Any]]]:
    """The messages held at each of ``replay``'s requests (right before each assistant
    message and at the end), each after the tool-result ingress cap the module applies."""
    held: list[Mapping[str, Any]] = []
    histories: list[list[Mapping[str, Any]]] = []
    for _, message in transcript.messages:
        if message.get("role") == "assistant":
            histories.append(list(held))
        held.append(cap_tool_result(message, config.max_tool_result_bytes)[0])
    histories.append(held)
    return histories
