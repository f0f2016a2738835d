"""The compaction notice: one user-role message, placed at the tail of a compacted view.

It tells the model, in our own words, that older context was reduced and how to recover
what it needs. It is made once, when its compaction decision is staged, and from then on
shown at the same place with the same text, until the next decision (``notice_position``):
views stay append-only, so the prompt cache and the thinking the model produced after it
stay valid. It is never a system message and never sits between a tool call and its
results: when the view ends with an unanswered call, it goes after the results, on the
first request that has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..formats import tool_ids
from ..history.classify import NOTICE_SOURCE

__all__ = (
    "NOTICE_CLOSE",
    "NOTICE_OPEN",
    "notice_message",
    "notice_position",
    "notice_text",
    "tail_is_safe",
)


NOTICE_OPEN: Final = f'<system-reminder source="{NOTICE_SOURCE}">'
NOTICE_CLOSE: Final = "</system-reminder>"
_MINIMAL: Final = (
    "Earlier parts of this conversation were condensed to fit the context window; "
    "some older tool output and messages are shortened or omitted."
)


def tail_is_safe(view: Sequence[Mapping[str, Any]], end: int | None = None) -> bool:
    """False when ``view[:end]`` ends with a tool call whose results are not all present."""
    answered: set[str] = set()
    for index in range(len(view) if end is None else end, 0, -1):
        calls, results, only_results = tool_ids(view[index - 1])
        if only_results:
            answered.update(results)
            continue
        return all(call_id in answered for call_id in calls)
    return True


def notice_position(
    view: Sequence[Mapping[str, Any]], body_seqs: Sequence[int], system_count: int, at: int
) -> int | None:
    """Where in ``view`` the notice of a decision made at history length ``at`` goes: right
    after the last message with a smaller seq, or after the results that message's calls
    still wait for; None while they are not all in the view.

    The place depends only on the view up to it, so a view that extends the last one puts
    the notice where the last one did (``body_seqs``: ``Rendered.body_seqs``).
    """
    anchor = len(body_seqs)
    # (messages admitted since the decision are at the end: a short walk back)
    while anchor > 0 and body_seqs[anchor - 1] >= at:
        anchor -= 1
    for index in range(system_count + anchor, len(view) + 1):
        if tail_is_safe(view, index):
            return index
    return None


def notice_text(stats: Mapping[str, Any], verbosity: str, *, facts_chars: int = 2400) -> str:
    """The notice body for the cumulative ``stats`` of the committed decisions.

    The verbose notice also lists the tool calls the view no longer shows whole
    (``omitted_tool_calls``), the most recent ones that fit ``facts_chars`` characters.
    """
    if verbosity == "minimal":
        return f"{NOTICE_OPEN}\n{_MINIMAL}\n{NOTICE_CLOSE}"
    level = stats.get("strategy_level", 0)
    lines = [
        NOTICE_OPEN,
        "Earlier parts of this conversation were condensed to fit the context window.",
        "",
        (
            f"Reduction level {level} of 8: {stats.get('messages_removed', 0)} older messages "
            f"omitted, {stats.get('messages_truncated', 0)} tool results shortened, "
            f"{stats.get('user_messages_stubbed', 0)} earlier messages replaced by short previews."
        ),
        (
            "Kept in full: the instructions, the original request, the latest request and the "
            f"most recent {stats.get('protected_tool_results', 0)} tool results."
        ),
    ]
    if level >= 3:
        lines.append("If you need something that is no longer visible, ask or re-read it.")
    lines.append(
        "To recover shortened tool output, run the tool again with narrower parameters; "
        "do not repeat actions that change state just to see their output again."
    )
    if verbosity == "verbose":
        lines.append(
            f"(view: {stats.get('before_messages', 0)} -> {stats.get('after_messages', 0)} "
            "messages; the full history is kept outside this request.)"
        )
        lines.extend(_omitted(stats.get("omitted_tool_calls") or (), facts_chars))
    lines.append(NOTICE_CLOSE)
    return "\n".join(lines)


def _omitted(facts: Sequence[str], budget: int) -> list[str]:
    """The most recent ``facts`` that fit ``budget`` characters, oldest first."""
    shown: list[str] = []
    used = 0
    for fact in reversed(facts):
        if used + len(fact) + 3 > budget:
            break
        shown.append(f"- {fact}")
        used += len(fact) + 3
    if not shown:
        return []
    lines = ["Tool calls no longer shown in full (re-run one if you need its output):"]
    if len(shown) < len(facts):
        lines.append(f"- ... and {len(facts) - len(shown)} earlier calls")
    return lines + shown[::-1]


def notice_message(
    stats: Mapping[str, Any], verbosity: str, *, facts_chars: int = 2400
) -> dict[str, Any]:
    return {
        "role": "user",
        "content": notice_text(stats, verbosity, facts_chars=facts_chars),
        "metadata": {"source": NOTICE_SOURCE, "ephemeral": True},
    }
