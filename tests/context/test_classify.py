"""Message classification (docs/design.md sections 3.1 and 6.1).

Classification reads roles and metadata only (text never changes a message's class);
reminder envelopes are recognised by identity checks; tool ids are read in three formats.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.formats import tool_ids
from amplifier_module_context_simple.context.history.classify import classify
from amplifier_module_context_simple.testing import check_view_invariants
from tests.context.strategies import histories

REMINDER_XML = "<system-reminders><system-reminder>be brief</system-reminder></system-reminders>"


def user(content: Any, **metadata: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": content}
    if metadata:
        message["metadata"] = metadata
    return message


# -- human prompts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        user("hello"),
        user("hello", client="cli"),
        user("hello", ephemeral=False),
        user("hello", source="user"),
        user(f"please read this {REMINDER_XML}"),
        user([{"type": "text", "text": "hello"}]),
        user([{"type": "text", "text": "see"}, {"type": "image", "source": {"data": "x"}}]),
    ],
)
def test_human_prompt_by_role_and_metadata(message: dict[str, Any]) -> None:
    """A user message without ephemeral/hook/notice metadata is a human prompt, whatever
    its text says (quoting reminder XML does not make it a reminder)."""
    info = classify(message)
    assert info.is_human
    assert not info.is_envelope and not info.is_notice and not info.is_result_carrier


@pytest.mark.parametrize(
    "message",
    [
        user("x", ephemeral=True),
        user("x", ephemeral=1),
        user("x", ephemeral="yes"),
        user("x", source="hook"),
        user("x", source="context-compaction", ephemeral=True),
        user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"}]),
        {"role": "assistant", "content": "hello"},
        {"role": "developer", "content": "hello"},
        {"role": "system", "content": "hello"},
    ],
)
def test_not_a_human_prompt(message: dict[str, Any]) -> None:
    """Ephemeral (truthy), hook-sourced, notice, result-only and non-user messages are not
    human prompts."""
    assert not classify(message).is_human


# -- persisted reminder envelopes ------------------------------------------------------


def test_envelope_requires_identity_true_flags_and_string_content() -> None:
    """An envelope is ``ephemeral is True and persisted is True`` with str content."""
    assert classify(user("body", ephemeral=True, persisted=True, source="hook")).is_envelope
    assert classify(user("body", ephemeral=True, persisted=True)).is_envelope


@pytest.mark.parametrize(
    "message",
    [
        user("body", ephemeral=1, persisted=True),
        user("body", ephemeral=True, persisted=1),
        user("body", ephemeral="true", persisted="true"),
        user("body", ephemeral=True),
        user("body", persisted=True),
        user([{"type": "text", "text": "body"}], ephemeral=True, persisted=True),
        {
            "role": "assistant",
            "content": "body",
            "metadata": {"ephemeral": True, "persisted": True},
        },
    ],
)
def test_not_an_envelope(message: dict[str, Any]) -> None:
    """Truthy-but-not-True flags, a missing flag, list content or a non-user role: no envelope."""
    assert not classify(message).is_envelope


# -- other classes -----------------------------------------------------------------------


def test_compaction_notice_classified() -> None:
    """A user message with ``source: context-compaction`` is a notice, not a human prompt."""
    info = classify(user("notice", source="context-compaction", ephemeral=True))
    assert info.is_notice and not info.is_human


def test_developer_and_system_classes() -> None:
    """Developer messages are their own class; hook-sourced system messages are marked."""
    assert classify({"role": "developer", "content": "d"}).is_developer
    plain = classify({"role": "system", "content": "s"})
    hook = classify({"role": "system", "content": "s", "metadata": {"source": "hook"}})
    assert plain.is_system and not plain.is_hook_system
    assert hook.is_system and hook.is_hook_system


@pytest.mark.parametrize(
    ("value", "loaded"),
    [([{"name": "grep"}], True), ({"k": 1}, True), ([], False), (None, False), (0, False)],
)
def test_loaded_tool_state_is_truthy_metadata(value: Any, loaded: bool) -> None:
    """``metadata["openai:tool_search_items"]`` marks loaded-tool state when truthy."""
    message = {"role": "assistant", "content": "a", "metadata": {"openai:tool_search_items": value}}
    assert classify(message).has_loaded_tool_state is loaded


@pytest.mark.parametrize(("value", "reference"), [(True, True), (1, False), ("yes", False)])
def test_reference_only_is_an_identity_check(value: Any, reference: bool) -> None:
    """Only ``amplifier_public_reference_only is True`` marks a history-only row."""
    message = {
        "role": "assistant",
        "content": "a",
        "metadata": {"amplifier_public_reference_only": value},
    }
    assert classify(message).reference_only is reference


# -- tool ids in three formats -------------------------------------------------------------


def test_call_ids_openai_style() -> None:
    """OpenAI ``tool_calls[].id`` are declared, in order, duplicates collapsed."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_a", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            {"id": "call_b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ],
    }
    assert tool_ids(message).calls == ("call_b", "call_a")


def test_call_ids_amplifier_stored_style() -> None:
    """Amplifier's stored ``{"id", "tool", "arguments"}`` calls are declared."""
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "amp_1", "tool": "read", "arguments": {"path": "a"}}],
    }
    assert tool_ids(message).calls == ("amp_1",)


def test_call_ids_tool_call_id_key_fallback() -> None:
    """A call carrying ``tool_call_id`` instead of ``id`` is still declared."""
    message = {"role": "assistant", "tool_calls": [{"tool_call_id": "x1", "tool": "t"}]}
    assert tool_ids(message).calls == ("x1",)


def test_call_ids_anthropic_blocks() -> None:
    """``tool_use`` (and amplifier-core ``tool_call``) blocks in assistant content declare."""
    message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {}},
            {"type": "tool_call", "id": "tc_2", "name": "ls", "input": {}},
        ],
    }
    assert tool_ids(message).calls == ("toolu_1", "tc_2")


def test_only_assistants_declare_calls() -> None:
    """A user message quoting a tool_use block declares nothing; junk ids are ignored."""
    assert tool_ids(user([{"type": "tool_use", "id": "toolu_1"}])).calls == ()
    junk = {"role": "assistant", "tool_calls": [{"id": 5}, {"id": ""}, {"tool": "t"}]}
    assert tool_ids(junk).calls == ()


def test_result_ids_tool_message() -> None:
    """A ``tool`` message carries its ``tool_call_id`` and nothing else."""
    assert tool_ids({"role": "tool", "tool_call_id": "c1", "content": "x"}) == (
        (),
        ("c1",),
        True,
    )


def test_result_ids_anthropic_blocks() -> None:
    """``tool_result`` blocks carry ``tool_use_id`` (or ``tool_call_id``); a message with
    other blocks too is not result-only."""
    only = user(
        [
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "b"},
            {"type": "tool_result", "tool_call_id": "toolu_1", "content": "a"},
        ]
    )
    assert tool_ids(only) == ((), ("toolu_2", "toolu_1"), True)
    mixed = user(
        [
            {"type": "tool_result", "tool_use_id": "toolu_3", "content": "c"},
            {"type": "text", "text": "and now do this"},
        ]
    )
    assert tool_ids(mixed) == ((), ("toolu_3",), False)
    assert classify(mixed).is_human and not classify(only).is_human
    assert tool_ids({"role": "assistant", "content": only["content"]}) == ((), (), False)


# -- classification as the store uses it -----------------------------------------------------


@pytest.mark.anyio
async def test_reference_only_rows_never_reach_a_view(anyio_backend: str) -> None:
    """Reference-only rows are absent from every view; ``amplifier_public_*`` keys are
    stripped while other metadata is kept; the canonical history keeps everything."""
    messages = [
        user("first"),
        {
            "role": "assistant",
            "content": "history only",
            "metadata": {"amplifier_public_reference_only": True},
        },
        {
            "role": "assistant",
            "content": "kept",
            "metadata": {"amplifier_public_reference_only": False, "custom": 1},
        },
        {
            "role": "assistant",
            "content": "copy",
            "metadata": {
                "amplifier_public_message": True,
                "amplifier_public_copy_source": "t",
                "custom": 2,
            },
        },
        user("last"),
    ]
    manager = SimpleContextManager()
    await manager.set_messages(copy.deepcopy(messages))
    stored = await manager.get_messages()
    view = await manager.get_messages_for_request()
    check_view_invariants(messages, view)
    assert [m["content"] for m in view] == ["first", "kept", "copy", "last"]
    assert view[1]["metadata"] == {"custom": 1}
    assert view[2]["metadata"] == {"custom": 2}
    retaining = await manager.get_messages_for_request_retaining(retain_contents=[])
    assert retaining == view
    assert await manager.get_messages() == stored
    assert stored[1]["metadata"]["amplifier_public_reference_only"] is True


@pytest.mark.anyio
async def test_human_classification_decides_protection(anyio_backend: str) -> None:
    """Under heavy pressure the first and latest human prompts survive verbatim, while
    machine-written user turns around them (hook, reminder) may be reduced."""
    long = "x" * 2000
    messages = [
        user(f"machine before {long}", source="hook"),
        user(f"first human {long}"),
        {"role": "assistant", "content": f"answer {long}"},
        user(f"middle human {long}"),
        {"role": "assistant", "content": f"answer {long}"},
        user(f"latest human {REMINDER_XML} {long}"),
        user(f"reminder after {long}", ephemeral=True, persisted=True, source="hook"),
    ]
    manager = SimpleContextManager(compaction_notice_enabled=False)
    await manager.set_messages(copy.deepcopy(messages))
    view = await manager.get_messages_for_request(token_budget=200)
    check_view_invariants(messages, view)
    assert messages[1] in view and messages[5] in view
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] == 8


# -- a message without metadata ----------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated=histories(orphans=True))
def test_no_metadata_classifies_as_metadata_without_flags(generated: Any) -> None:
    """A message without metadata (a fast path) gets the class it gets with a metadata
    dict that carries nothing classification reads."""
    for message in generated.messages:
        bare = {k: v for k, v in message.items() if k != "metadata"}
        flagless = {**bare, "metadata": {"client": "cli"}}
        assert classify(bare) == classify(flagless)
