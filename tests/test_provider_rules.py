"""The provider-request oracle: hand-written requests with one exact expected outcome each.

Each test states, per dialect, either ``VALID`` or the code of the *first* violation that
``check_provider_valid`` raises. Calls and results are written in every format the module
meets (OpenAI, Amplifier, Anthropic blocks) and in mixes of them.
"""

from __future__ import annotations

import ast
import pickle
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from amplifier_core.message_models import ToolCall, ToolCallBlock, ToolResultBlock

from amplifier_module_context_simple.testing import provider_rules, thinking_oracle
from amplifier_module_context_simple.testing.provider_rules import (
    CODES,
    Dialect,
    ProviderRuleError,
    check_provider_valid,
    provider_violations,
)

Message = dict[str, Any]
VALID = "valid"
DIALECTS: tuple[Dialect, ...] = ("openai", "anthropic")


def outcome(view: Any, dialect: Dialect, *, allow_pending_tail: bool = True) -> str:
    """``VALID``, or the code of the first violation ``check_provider_valid`` raises."""
    try:
        check_provider_valid(view, dialect, allow_pending_tail=allow_pending_tail)
    except ProviderRuleError as error:
        assert error.code in CODES
        return error.code
    return VALID


# --- message builders -------------------------------------------------------------------------


def system(text: str = "be brief") -> Message:
    return {"role": "system", "content": text}


def user(text: str = "please look") -> Message:
    return {"role": "user", "content": text}


def assistant(text: str = "done") -> Message:
    return {"role": "assistant", "content": text}


def openai_call(*ids: str) -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "grep", "arguments": "{}"}}
            for i in ids
        ],
    }


def amplifier_call(*ids: str) -> Message:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": i, "tool": "grep", "arguments": {}} for i in ids],
    }


def anthropic_call(*ids: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "let me look"},
            *({"type": "tool_use", "id": i, "name": "grep", "input": {}} for i in ids),
        ],
    }


def tool_message(call_id: str, content: Any = "42 matches") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def result_block(call_id: str, content: Any = "42 matches", **extra: Any) -> Message:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


def tool_messages(*ids: str) -> list[Message]:
    return [tool_message(i) for i in ids]


def result_user_message(*ids: str) -> list[Message]:
    return [{"role": "user", "content": [result_block(i) for i in ids]}]


Calls = Callable[..., Message]
Results = Callable[..., list[Message]]

#: How a call is written and how its results are written back, including mixed pairs.
FORMATS: dict[str, tuple[Calls, Results]] = {
    "openai": (openai_call, tool_messages),
    "amplifier": (amplifier_call, tool_messages),
    "anthropic": (anthropic_call, result_user_message),
    "anthropic-call+tool-message": (anthropic_call, tool_messages),
    "openai-call+result-block": (openai_call, result_user_message),
    "amplifier-call+result-block": (amplifier_call, result_user_message),
}


def cases(expected: Mapping[Dialect, str]) -> list[Any]:
    """Every (format, dialect, expected outcome) combination as pytest params."""
    return [
        pytest.param(calls, results, dialect, expected[dialect], id=f"{name}-{dialect}")
        for name, (calls, results) in FORMATS.items()
        for dialect in DIALECTS
    ]


BOTH_VALID: dict[Dialect, str] = {"openai": VALID, "anthropic": VALID}


def both(code: str) -> dict[Dialect, str]:
    return {"openai": code, "anthropic": code}


# --- pairing rules, in every format -------------------------------------------------------------


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(BOTH_VALID))
def test_answered_calls_are_valid(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [system(), user(), calls("a", "b"), *results("a", "b"), assistant()]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(both("missing-result")))
def test_call_without_results_before_the_next_exchange(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), user("anything?"), assistant("nothing")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(both("orphan-result")))
def test_result_without_a_call(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), assistant("hello"), *results("z")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("calls", "results", "dialect", "expected"),
    # OpenAI: the run of tool messages is broken, so the call is unanswered (first) and the
    # late result an orphan. Anthropic: the API merges the two user turns into one that does
    # not begin with the result.
    cases({"openai": "missing-result", "anthropic": "results-not-first"}),
)
def test_result_after_an_intervening_user_text_message(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), user("hurry up"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(both("missing-result")))
def test_result_separated_from_its_call_by_another_assistant_turn(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), user("and?"), assistant("still waiting"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("calls", "results", "dialect", "expected"),
    # Anthropic merges consecutive assistant messages into one turn, so the result still
    # follows the turn holding its tool_use; OpenAI needs the tool messages right after.
    cases({"openai": "missing-result", "anthropic": VALID}),
)
def test_consecutive_assistant_messages_before_the_results(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), assistant("one more thing"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("calls", "results", "dialect", "expected"),
    # Anthropic hoists system messages out of the list; in OpenAI one breaks the run.
    cases({"openai": "missing-result", "anthropic": VALID}),
)
def test_system_message_between_call_and_results(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), system("reminder"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(BOTH_VALID))
def test_parallel_results_split_across_several_messages(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a", "b", "c"), *results("b"), *results("a"), *results("c")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(BOTH_VALID))
def test_pending_tail_with_no_results_yet_is_allowed(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    assert outcome([user(), calls("a", "b")], dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(BOTH_VALID))
def test_pending_tail_with_some_results_is_allowed(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    assert outcome([user(), calls("a", "b"), *results("b")], dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(both("missing-result")))
def test_pending_tail_rejected_when_not_allowed(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a", "b"), *results("b")]
    assert outcome(view, dialect, allow_pending_tail=False) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(both("missing-result")))
def test_partial_results_followed_by_more_conversation_are_not_a_pending_tail(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a", "b"), *results("b"), user("never mind")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("calls", "results", "dialect", "expected"), cases(both("duplicate-call-id"))
)
def test_duplicate_ids_within_one_assistant_message(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a", "a"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("calls", "results", "dialect", "expected"),
    # Anthropic requires tool_use ids unique across the whole request; OpenAI pairs each
    # run of tool messages with its own assistant message.
    cases({"openai": VALID, "anthropic": "duplicate-call-id"}),
)
def test_same_call_id_reused_in_a_later_assistant_message(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), *results("a"), user("again"), calls("a"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("calls", "results", "dialect", "expected"), cases(both("duplicate-result"))
)
def test_two_results_for_one_call(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    view = [user(), calls("a"), *results("a"), *results("a")]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(both("bad-id")))
def test_empty_call_id(calls: Calls, results: Results, dialect: Dialect, expected: str) -> None:
    view = [user(), calls(""), *results("")]
    assert outcome(view, dialect) == expected


# --- Anthropic result-block placement inside one user message ----------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_results_then_text_in_one_user_message_is_valid(dialect: Dialect) -> None:
    view = [
        user(),
        anthropic_call("a", "b"),
        {
            "role": "user",
            "content": [result_block("a"), result_block("b"), {"type": "text", "text": "go on"}],
        },
    ]
    assert outcome(view, dialect) == VALID


@pytest.mark.parametrize(
    ("dialect", "expected"),
    # The OpenAI adapter moves the results ahead of the message's text; Anthropic sends the
    # blocks as written, and the turn must begin with its tool_result blocks.
    [("openai", VALID), ("anthropic", "results-not-first")],
)
def test_text_before_results_in_one_user_message(dialect: Dialect, expected: str) -> None:
    view = [
        user(),
        anthropic_call("a"),
        {"role": "user", "content": [{"type": "text", "text": "here:"}, result_block("a")]},
    ]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_message_then_user_text_merges_into_a_valid_turn(dialect: Dialect) -> None:
    view = [user(), openai_call("a"), tool_message("a"), user("thanks, continue")]
    assert outcome(view, dialect) == VALID


@pytest.mark.parametrize(("dialect", "expected"), [(d, "orphan-result") for d in DIALECTS])
def test_result_block_inside_an_assistant_message(dialect: Dialect, expected: str) -> None:
    view = [
        user(),
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, result_block("a")]},
    ]
    assert outcome(view, dialect) == expected


# --- result content -----------------------------------------------------------------------------

TEXT_BLOCKS = [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}]
IMAGE_BLOCK = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("as_block", [False, True], ids=["tool-message", "result-block"])
def test_block_list_result_content_is_valid(dialect: Dialect, as_block: bool) -> None:
    result = (
        {"role": "user", "content": [result_block("a", TEXT_BLOCKS)]}
        if as_block
        else tool_message("a", TEXT_BLOCKS)
    )
    assert outcome([user(), openai_call("a"), result], dialect) == VALID


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("as_block", [False, True], ids=["tool-message", "result-block"])
@pytest.mark.parametrize(
    "junk",
    [{"text": "no type"}, {"type": 7, "text": "x"}, {"type": "text", "text": None}, 42],
    ids=["no-type", "int-type", "text-not-str", "not-a-block"],
)
def test_junk_block_in_result_content(dialect: Dialect, as_block: bool, junk: Any) -> None:
    content = [*TEXT_BLOCKS, junk]
    result = (
        {"role": "user", "content": [result_block("a", content)]}
        if as_block
        else tool_message("a", content)
    )
    assert outcome([user(), openai_call("a"), result], dialect) == "bad-result-content"


@pytest.mark.parametrize(
    ("dialect", "expected"),
    # Chat Completions tool messages take only text parts.
    [("openai", "bad-result-content"), ("anthropic", VALID)],
)
def test_image_block_in_result_content(dialect: Dialect, expected: str) -> None:
    view = [user(), openai_call("a"), tool_message("a", [*TEXT_BLOCKS, IMAGE_BLOCK])]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(
    ("dialect", "expected"),
    # content is required in an OpenAI tool message and optional in an Anthropic tool_result.
    [("openai", "bad-result-content"), ("anthropic", VALID)],
)
def test_tool_message_without_content(dialect: Dialect, expected: str) -> None:
    view = [user(), openai_call("a"), {"role": "tool", "tool_call_id": "a"}]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_result_block_without_content_is_valid(dialect: Dialect) -> None:
    view = [user(), anthropic_call("a"), {"role": "user", "content": [result_block("a", None)]}]
    assert outcome(view, dialect) == VALID


@pytest.mark.parametrize(
    ("dialect", "expected"),
    # OpenAI has no is_error field: the adapter drops it.
    [("openai", VALID), ("anthropic", "bad-is-error")],
)
def test_non_bool_is_error(dialect: Dialect, expected: str) -> None:
    view = [
        user(),
        anthropic_call("a"),
        {"role": "user", "content": [result_block("a", is_error="yes")]},
    ]
    assert outcome(view, dialect) == expected


# --- objects with attributes --------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_blocks_as_objects_with_attributes(dialect: Dialect) -> None:
    view = [
        user(),
        {
            "role": "assistant",
            "content": [
                SimpleNamespace(type="text", text="checking"),
                SimpleNamespace(type="tool_use", id="a", name="grep", input={}),
            ],
        },
        {
            "role": "user",
            "content": [
                SimpleNamespace(
                    type="tool_result",
                    tool_use_id="a",
                    content=[SimpleNamespace(type="text", text="ok")],
                    is_error=False,
                )
            ],
        },
    ]
    assert outcome(view, dialect) == VALID


@pytest.mark.parametrize("dialect", DIALECTS)
def test_amplifier_core_blocks_and_tool_calls(dialect: Dialect) -> None:
    view = [
        user(),
        {
            "role": "assistant",
            "content": [ToolCallBlock(id="a", name="grep", input={})],
            # The same call in both representations is one call, not a duplicate.
            "tool_calls": [
                ToolCall(id="a", name="grep", arguments={}),
                ToolCall(id="b", name="ls", arguments={}),
            ],
        },
        {
            "role": "user",
            "content": [
                ToolResultBlock(tool_call_id="a", output={"matches": 42}),
                ToolResultBlock(tool_call_id="b", output="README.md"),
            ],
        },
    ]
    assert outcome(view, dialect) == VALID


@pytest.mark.parametrize("dialect", DIALECTS)
def test_object_result_with_junk_content(dialect: Dialect) -> None:
    view = [
        user(),
        anthropic_call("a"),
        {
            "role": "user",
            "content": [
                SimpleNamespace(type="tool_result", tool_use_id="a", content=[SimpleNamespace()])
            ],
        },
    ]
    assert outcome(view, dialect) == "bad-result-content"


# --- the shapes the module synthesizes for an unanswered call -----------------------------------


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(BOTH_VALID))
def test_synthesized_openai_tool_message_right_after_the_call(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    synthesized = {
        "role": "tool",
        "tool_call_id": "a",
        "content": "[tool result unavailable: the call was interrupted]",
        "metadata": {"compaction": {"form": "synthesized"}},
    }
    view = [user(), calls("a", "b"), synthesized, *results("b"), assistant()]
    assert outcome(view, dialect) == expected


@pytest.mark.parametrize(("calls", "results", "dialect", "expected"), cases(BOTH_VALID))
def test_synthesized_anthropic_error_result_right_after_the_call(
    calls: Calls, results: Results, dialect: Dialect, expected: str
) -> None:
    synthesized = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "a",
                "is_error": True,
                "content": "[tool result unavailable: the call was interrupted]",
            }
        ],
    }
    view = [user(), calls("a"), synthesized, assistant()]
    assert outcome(view, dialect) == expected


# --- a mixed view ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mixed_formats_across_one_view(dialect: Dialect) -> None:
    view = [
        system(),
        user(),
        openai_call("o1", "o2"),
        tool_message("o1"),
        {"role": "user", "content": [result_block("o2")]},
        anthropic_call("t1"),
        tool_message("t1", [{"type": "text", "text": "ok"}]),
        amplifier_call("m1"),
        {"role": "user", "content": [result_block("m1"), {"type": "text", "text": "next?"}]},
        {"role": "developer", "content": "stay on task"},
        assistant(),
        user("thanks"),
        anthropic_call("t2"),
    ]
    assert outcome(view, dialect) == VALID


# --- malformed views ----------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("view", [None, "hello", {"role": "user"}], ids=["none", "str", "dict"])
def test_view_not_a_list(dialect: Dialect, view: Any) -> None:
    assert outcome(view, dialect) == "not-a-list"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_message_not_a_dict(dialect: Dialect) -> None:
    assert outcome([user(), "assistant: hi"], dialect) == "not-a-dict"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("message", [{"content": "hi"}, {"role": None, "content": "hi"}])
def test_message_without_a_string_role(dialect: Dialect, message: Message) -> None:
    assert outcome([user(), message], dialect) == "no-role"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_calls_not_a_list(dialect: Dialect) -> None:
    view = [user(), {"role": "assistant", "content": "", "tool_calls": {"id": "a"}}]
    assert outcome(view, dialect) == "bad-tool-calls"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_message_without_an_id(dialect: Dialect) -> None:
    view = [user(), openai_call("a"), {"role": "tool", "content": "ok"}, user("next")]
    # The call's missing result is reported first (position 1), then the id (position 2).
    assert [e.code for e in provider_violations(view, dialect)] == ["missing-result", "bad-id"]


# --- the error and the API ----------------------------------------------------------------------


def test_error_says_what_and_where() -> None:
    view = [user(), openai_call("a"), user("hm")]
    with pytest.raises(ProviderRuleError) as raised:
        check_provider_valid(view, "openai")
    error = raised.value
    assert (error.dialect, error.code, error.position) == ("openai", "missing-result", 1)
    assert "missing-result" in str(error)
    assert "view[1]" in str(error)
    assert "'a'" in str(error)
    assert isinstance(error, AssertionError)


def test_error_pickles() -> None:
    error = ProviderRuleError("anthropic", "orphan-result", 3, "tool_result 'z' answers nothing")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.dialect, copy.code, copy.position, copy.detail, str(copy)) == (
        error.dialect,
        error.code,
        error.position,
        error.detail,
        str(error),
    )


def test_violations_are_all_reported_in_view_order() -> None:
    view: list[Any] = [
        user(),
        openai_call("a", "a"),
        tool_message("a"),
        user("late"),
        tool_message("z"),
        "junk",
    ]
    found = [(e.code, e.position) for e in provider_violations(view, "openai")]
    assert found == [("duplicate-call-id", 1), ("orphan-result", 4), ("not-a-dict", 5)]


def test_unknown_dialect_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="dialect"):
        provider_violations([user()], "gemini")  # type: ignore[arg-type]  # not a dialect


def test_an_empty_view_has_no_tool_violations() -> None:
    assert [outcome([], dialect) for dialect in DIALECTS] == [VALID, VALID]


def test_images_of_an_anthropic_result_move_to_a_user_message_for_openai() -> None:
    """An adapter sends the image of an Anthropic ``tool_result`` in the user message after
    the tool messages (tool messages take only text): valid in both dialects."""
    view: list[dict[str, Any]] = [
        {"role": "user", "content": "look at the screen"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [
                        {"type": "text", "text": "captured"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                        },
                    ],
                }
            ],
        },
    ]
    assert provider_violations(view, "openai") == []
    assert provider_violations(view, "anthropic") == []


@pytest.mark.parametrize("oracle", [provider_rules, thinking_oracle], ids=lambda m: m.__name__)
def test_the_oracles_import_only_the_standard_library(oracle: Any) -> None:
    """They share no code with the runtime they check: no import of this package (relative
    or absolute) and nothing outside the standard library."""
    assert oracle.__file__ is not None
    tree = ast.parse(Path(oracle.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import from {node.module!r}"
            assert node.module is not None
            imported.add(node.module)
    roots = {name.split(".")[0] for name in imported}
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots
