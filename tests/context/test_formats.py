"""The tool-call format classes (docs/design.md section 6), exercised one rule at a time.

Each format class (``context/formats/``) holds its own rules: where its calls and results
live, how ids are read and renamed, how a result's content is put back once reduced, how
a missing result is answered and what an estimate counts. The last test keeps those
rules there: no other runtime module names a format's keys.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import amplifier_module_context_simple as package
from amplifier_module_context_simple.context.counting.estimate import (
    estimate_message,
    provider_texts,
)
from amplifier_module_context_simple.context.formats import (
    AMPLIFIER,
    ANTHROPIC,
    BLOCK_ID_KEYS,
    CALL_BLOCK_TYPES,
    FORMATS,
    OPENAI,
    answered_calls,
    block_format,
    block_roles_error,
    called_tools,
    message_fields_error,
    result_block_format,
    results_first,
    tool_ids,
    whole_result_format,
)


def note(ids: Any) -> dict[str, Any]:
    return {"ids": list(ids)}


def openai_call(call_id: str, name: str = "read") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def anthropic_result(call_id: str, content: Any = "out") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content}


# -- OpenAI ---------------------------------------------------------------------------------


def test_openai_owns_the_tool_message() -> None:
    assert whole_result_format({"role": "tool", "tool_call_id": "c1"}) is OPENAI


def test_openai_reads_a_call_id_under_tool_call_id_when_id_is_missing() -> None:
    assert OPENAI.call_id({"tool_call_id": "c7", "tool": "bash"}) == "c7"


def test_openai_message_result_id_ignores_an_empty_id() -> None:
    assert OPENAI.message_result_id({"role": "tool", "tool_call_id": ""}) is None


def test_openai_renames_both_id_keys_of_a_call() -> None:
    renamed = OPENAI.renamed_call({"id": "c1", "tool_call_id": "c1"}, {"c1": "c1~2"})
    assert renamed == {"id": "c1~2", "tool_call_id": "c1~2"}


def test_openai_renames_the_id_a_tool_message_answers() -> None:
    message = {"role": "tool", "tool_call_id": "c1", "content": "x"}
    renamed = dict(message)
    OPENAI.rename_message_result(renamed, message, {"c1": "c1~2"})
    assert renamed["tool_call_id"] == "c1~2"


def test_openai_puts_a_reduced_result_back_as_the_message_content() -> None:
    message = {"role": "tool", "tool_call_id": "c1", "content": "long", "name": "read"}
    reduced = OPENAI.with_message_result_content(message, "short")
    assert reduced == {"role": "tool", "tool_call_id": "c1", "content": "short", "name": "read"}


def test_openai_answers_each_missing_call_with_a_tool_message() -> None:
    answers = OPENAI.synthesized([("c1", "none"), ("c2", "none")], note)
    assert [(m["role"], m["tool_call_id"], m["metadata"]) for m in answers] == [
        ("tool", "c1", {"ids": ["c1"]}),
        ("tool", "c2", {"ids": ["c2"]}),
    ]


def test_openai_facts_read_function_or_amplifiers_tool() -> None:
    facts = [OPENAI.call_fact(openai_call("c1")), OPENAI.call_fact({"id": "c2", "tool": "bash"})]
    assert facts == [("read", "{}"), ("bash", None)]


def test_openai_rejects_a_non_string_tool_call_id() -> None:
    assert message_fields_error({"role": "tool", "tool_call_id": 3}) == (
        "'tool_call_id' must be a string, got int"
    )


# -- Anthropic ------------------------------------------------------------------------------


def test_anthropic_owns_tool_result_blocks() -> None:
    assert result_block_format(anthropic_result("t1")) is ANTHROPIC


def test_anthropic_result_id_falls_back_to_amplifier_cores_tool_call_id() -> None:
    block = {"type": "tool_result", "tool_use_id": "", "tool_call_id": "t9"}
    assert ANTHROPIC.result_block_id(block) == "t9"


def test_anthropic_renames_the_id_a_result_block_answers() -> None:
    assert ANTHROPIC.renamed_result_block(anthropic_result("t1"), {"t1": "t1~2"}) == (
        anthropic_result("t1~2")
    )


def test_anthropic_puts_a_reduced_result_back_keeping_the_blocks_other_keys() -> None:
    block = {**anthropic_result("t1", "long"), "is_error": True}
    assert ANTHROPIC.with_block_result_content(block, "short") == {
        **anthropic_result("t1", "short"),
        "is_error": True,
    }


def test_anthropic_answers_a_messages_missing_calls_in_one_user_message() -> None:
    answers = ANTHROPIC.synthesized([("t1", "none"), ("t2", "none")], note)
    assert answers == [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "none"},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": "none"},
            ],
            "metadata": {"ids": ["t1", "t2"]},
        }
    ]


def test_anthropic_result_blocks_may_not_be_sent_by_the_assistant() -> None:
    assert block_roles_error("assistant", {"tool_result"}) == (
        "a 'assistant' message cannot carry tool_result blocks (only 'user' or 'tool')"
    )


def test_an_anthropic_result_counts_its_id_and_its_content() -> None:
    message = {"role": "user", "content": [anthropic_result("toolu_1", "file text")]}
    assert provider_texts(message) == (["toolu_1", "file text"], 4)


# -- Amplifier ------------------------------------------------------------------------------


def test_amplifier_owns_tool_call_blocks() -> None:
    assert block_format("tool_call") is AMPLIFIER
    assert AMPLIFIER.call_block_types == frozenset({"tool_call"})


def test_amplifier_calls_are_answered_by_openai_tool_messages() -> None:
    assert AMPLIFIER.answered_by is OPENAI


def test_amplifier_lists_the_calls_its_blocks_record_twice() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "tool_call", "id": "a1", "name": "bash"}],
        "tool_calls": [{"id": "a1", "tool": "bash", "arguments": {}}],
    }
    assert AMPLIFIER.listed_call_ids(message) == frozenset({"a1"})


def test_an_amplifier_call_recorded_twice_is_estimated_once() -> None:
    entry = {"id": "a1", "tool": "bash", "arguments": {"command": "ls"}}
    block = {"type": "tool_call", "id": "a1", "name": "bash", "input": {"command": "ls"}}
    twice = {"role": "assistant", "content": [block], "tool_calls": [entry]}
    once = {"role": "assistant", "content": [], "tool_calls": [entry]}
    assert estimate_message(twice) == estimate_message(once)


def test_an_amplifier_call_recorded_twice_is_listed_once_in_the_facts() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "tool_call", "id": "a1", "name": "bash", "input": {}}],
        "tool_calls": [{"id": "a1", "tool": "bash", "arguments": {}}],
    }
    assert called_tools(message) == [("bash", {})]


# -- the registry ---------------------------------------------------------------------------


def test_every_carrier_has_one_owner() -> None:
    owned = [
        carrier
        for fmt in FORMATS
        for carrier in (
            fmt.calls_key,
            fmt.result_role,
            *sorted(fmt.call_block_types),
            *sorted(fmt.result_block_types),
        )
        if carrier is not None
    ]
    assert sorted(owned) == sorted(set(owned))


def test_block_format_finds_calls_and_results() -> None:
    assert [block_format(kind) for kind in ("tool_use", "tool_call", "tool_result", "text")] == [
        ANTHROPIC,
        AMPLIFIER,
        ANTHROPIC,
        None,
    ]


def test_validation_checks_every_block_id_key() -> None:
    assert BLOCK_ID_KEYS == ("id", "tool_use_id", "tool_call_id")


def test_validation_names_the_call_block_types_in_registry_order() -> None:
    assert CALL_BLOCK_TYPES == ("tool_use", "tool_call")


def test_declared_ids_come_list_first_then_blocks_in_content_order() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "tool_call", "id": "a1"},
            {"type": "text", "text": "x"},
            {"type": "tool_use", "id": "t1"},
        ],
        "tool_calls": [openai_call("c1"), {"id": "a1", "tool": "bash"}],
    }
    assert tool_ids(message) == (("c1", "a1", "t1"), (), False)


def test_a_user_message_of_results_and_text_is_not_a_pure_carrier() -> None:
    message = {"role": "user", "content": [anthropic_result("t1"), {"type": "text", "text": "k"}]}
    assert tool_ids(message) == ((), ("t1",), False)


def test_a_result_naming_no_call_is_a_result_that_answers_nothing() -> None:
    message = {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}
    assert tool_ids(message) == ((), (), True)


def test_missing_calls_are_grouped_under_the_format_that_answers_them() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "t1", "name": "grep"},
            {"type": "tool_call", "id": "a1"},
        ],
        "tool_calls": [openai_call("c1")],
    }
    groups = answered_calls(message, ["t1", "a1", "c1"])
    assert [(fmt.name, calls) for fmt, calls in groups] == [
        ("openai", [("c1", "read"), ("a1", None)]),
        ("anthropic", [("t1", "grep")]),
    ]


def test_results_first_drops_orphans_and_moves_results_before_text() -> None:
    text = {"type": "text", "text": "thanks"}
    blocks = [text, anthropic_result("t1"), anthropic_result("t2")]
    assert results_first(blocks, frozenset({"t2"})) == [anthropic_result("t1"), text]


# -- the rules stay here --------------------------------------------------------------------

FORMAT_KEYS = frozenset(
    {"tool_use", "tool_use_id", "tool_result", "tool_calls", "tool_call_id", "tool_call"}
)
# Modules that may name a format's keys: the format classes themselves and the test
# support (the independent provider-rules oracle, ``testing/provider_rules.py``, and the
# test-message builders).
MAY_NAME_FORMAT_KEYS = ("context/formats/", "testing/")
# Other modules that keep one, and why: the ingress event's payload has a ``tool_call_id``
# field of its own (a published event schema, not a message key).
KEEP_A_FORMAT_KEY = ["context/history/ingress.py"]


def test_only_the_format_modules_name_format_keys() -> None:
    package_dir = Path(package.__file__).parent
    naming = sorted(
        path.relative_to(package_dir).as_posix()
        for path in package_dir.rglob("*.py")
        if not path.relative_to(package_dir).as_posix().startswith(MAY_NAME_FORMAT_KEYS)
        and any(
            isinstance(node, ast.Constant) and node.value in FORMAT_KEYS
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert naming == KEEP_A_FORMAT_KEY
