"""The facts a compaction must not lose: which tool calls the view no longer shows.

Summaries written by models are known to lose most file paths, commands and numbers. The
verbose compaction notice lists instead, deterministically and without a model call,
each tool call whose message was removed or whose result was shortened: its name and its
key argument (a path, a command, a query, an id), as the call gave them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..formats import called_tools

__all__ = ("KEY_ARGUMENTS", "MAX_FACT_CHARS", "call_facts")

KEY_ARGUMENTS: Final = (
    "path",
    "file_path",
    "filepath",
    "filename",
    "command",
    "cmd",
    "query",
    "pattern",
    "url",
    "id",
    "name",
)
"""Argument names that identify what a call touched, in order of preference."""

MAX_FACT_CHARS: Final = 120
"""A fact longer than this is cut (with an ellipsis): the notice has a budget."""


def _arguments(value: object) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, Mapping) else {}


def _fact(name: object, arguments: object) -> str | None:
    if not isinstance(name, str) or not name:
        return None
    args = _arguments(arguments)
    for key in KEY_ARGUMENTS:
        value = args.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            fact = f"{name}({key}={value})"
            break
    else:
        fact = f"{name}()"
    if len(fact) > MAX_FACT_CHARS:
        fact = fact[: MAX_FACT_CHARS - 1] + "…"
    return fact


def call_facts(message: Mapping[str, Any]) -> list[str]:
    """``name(key=value)`` for each tool call ``message`` declares, in every format (the
    format classes say where each keeps a call's name and arguments)."""
    facts = (_fact(name, arguments) for name, arguments in called_tools(message))
    return [fact for fact in facts if fact is not None]
