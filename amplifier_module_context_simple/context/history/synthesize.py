"""Synthesized results: what a view shows for a tool call the history never answered.

A call whose results never arrived (a crashed or interrupted tool, a timeout, a result
that was never recorded) and that a later assistant turn follows cannot be sent as it is:
both the OpenAI Chat Completions and the Anthropic Messages APIs reject an assistant tool
call that is not followed by results for each of its ids. The view answers it instead, in
the call's own format (the format classes in ``formats/`` build the messages):

- a call in the OpenAI/Amplifier ``tool_calls`` list or an amplifier-core call block gets
  a ``role: "tool"`` message of its own;
- an Anthropic call block gets a result block with ``is_error: true``; all of one
  message's missing Anthropic ids share one user message.

Where they go (``History`` places them): after the results its turn did record, which
stay where and as they are stored, and before any message that mixes results with other
content (an Anthropic user turn of ``tool_result`` blocks followed by the person's text).
Both providers allow exactly that place: the Anthropic Messages API merges consecutive
user turns into one, which must begin with all of its ``tool_result`` blocks, so results
placed after the person's text would be rejected; an OpenAI adapter turns the mixed
message into its tool messages followed by a user message, so a tool message after it
would answer no call. An Anthropic turn's synthesized results may thus be a user message
of their own after the user message carrying its recorded results (the API merges them).

Each synthesized message says plainly that no result was recorded and carries
``metadata["compaction"] = {"form": "synthesized", "tool_call_ids": [...]}`` (the ids as
views show them). A result for a call whose reused id views show under a fresh name
(``ids.py``) carries ``metadata["renamed_tool_call_ids"]`` too (shown id -> stored id),
like every renamed message. It is built once, when the history learns that the call was
left unanswered, and is never stored: ``get_messages()`` is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..formats import answered_calls
from .ids import RENAMED_KEY

__all__ = (
    "SYNTHESIZED_FORM",
    "synthesized_results",
)


SYNTHESIZED_FORM: Final = "synthesized"


def _text(name: str | None) -> str:
    called = f"`{name}`" if name else "this tool"
    return (
        f"[No result was recorded for this call of {called}: the call was interrupted or "
        "its output was lost before it was stored. This placeholder was added to the request "
        "by the context manager; the stored history is unchanged. Run the tool again if you "
        "need its output, but check first before repeating an action that changes state.]"
    )


def _note(ids: Sequence[str], stored: Mapping[str, str]) -> dict[str, Any]:
    note: dict[str, Any] = {"compaction": {"form": SYNTHESIZED_FORM, "tool_call_ids": list(ids)}}
    renamed = {call_id: stored[call_id] for call_id in ids if call_id in stored}
    if renamed:
        note[RENAMED_KEY] = renamed
    return note


def synthesized_results(
    call_message: Mapping[str, Any],
    missing: Sequence[str],
    stored: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The messages that answer ``missing`` call ids of ``call_message``, in call order.

    ``missing`` must be ids the message declares (as the view shows it); ids are answered
    in the format in which the message declares them (see the module docstring; each
    format class builds its own answers). ``stored``: shown id -> stored id, for the ids
    views show renamed.
    """
    shown_to_stored = stored or {}

    def note(ids: Sequence[str]) -> dict[str, Any]:
        return _note(ids, shown_to_stored)

    messages: list[dict[str, Any]] = []
    for fmt, calls in answered_calls(call_message, missing):
        messages.extend(fmt.synthesized([(call_id, _text(name)) for call_id, name in calls], note))
    return messages
