"""The reduced forms (docs/design.md sections 4.1 and 6.1): every carrier of tool results is truncated alike.

``truncated_form`` reduces ``role: tool`` messages with string or block-list content and
``tool_result`` blocks with string or block-list content; block lists keep their first
``truncate_chars`` characters of text, get the lead-in once per result and placeholders
for non-text blocks, and stay valid block lists. A reduced form only ever shrinks.
``stubbed_form`` never stubs a tool_result carrier.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from amplifier_core import TextBlock
from hypothesis import given
from hypothesis import strategies as st

from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.history.ingress import RETRIEVAL_GUIDANCE
from amplifier_module_context_simple.context.ladder.forms import stubbed_form, truncated_form

LOG = "log line: compiling module ok\n"
TEXT = LOG * 30
KEEP = 50
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="}}
DOCUMENT = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": TEXT},
}
AUDIO = {"type": "audio", "data": "AAAA"}


def lead(tokens: int, keep: int = KEEP) -> str:
    return (
        f"[tool output truncated from ~{tokens:,} tokens to its first {keep:,} characters; "
        "run the tool again with narrower parameters if you need the rest]"
    )


def protected_lead(tokens: int, keep: int = KEEP) -> str:
    return (
        f"[tool output shortened from ~{tokens:,} tokens to its first {keep:,} characters "
        f"to fit the model's input limit; to get the rest, {RETRIEVAL_GUIDANCE}]"
    )


def note(tokens: int) -> dict[str, Any]:
    return {"compaction": {"form": "truncated", "original_tokens": tokens}}


def carrier(inner: Any, **extra: Any) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": "toolu_1", "content": inner, **extra}
    return {"role": "user", "content": [block]}


def shape(name: str, inner: Any) -> dict[str, Any]:
    """A tool result in one of the four carrier shapes (``inner``: string or block list)."""
    if name.startswith("tool"):
        return {"role": "tool", "tool_call_id": "toolu_1", "name": "read", "content": inner}
    return carrier(inner)


def with_result(message: dict[str, Any], inner: Any, tokens: int) -> dict[str, Any]:
    """``message`` with its one result's content replaced and the truncation note."""
    if message["role"] == "tool":
        return {**message, "content": inner, "metadata": note(tokens)}
    (block,) = message["content"]
    return {**message, "content": [{**block, "content": inner}], "metadata": note(tokens)}


def expect(message: dict[str, Any]) -> tuple[dict[str, Any], int]:
    return message, estimate_message(message)


SHAPES = {
    "tool-string": TEXT,
    "tool-blocks": [{"type": "text", "text": TEXT}],
    "tool_result-string": TEXT,
    "tool_result-blocks": [{"type": "text", "text": TEXT}],
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_truncated_form_clips_every_shape(name: str) -> None:
    """All four carriers keep the first ``truncate_chars`` characters after the lead-in;
    a block list stays a list of one text block holding exactly the string form's text."""
    original = shape(name, SHAPES[name])
    tokens = estimate_message(original)
    clipped = f"{lead(tokens)} {TEXT[:KEEP]}…"
    inner: Any = clipped if name.endswith("string") else [{"type": "text", "text": clipped}]
    assert truncated_form(original, tokens, KEEP) == expect(with_result(original, inner, tokens))


@pytest.mark.parametrize("name", ["tool-blocks", "tool_result-blocks"])
def test_non_text_blocks_become_placeholders(name: str) -> None:
    """Image, document and audio blocks become short text placeholders in place; text past
    the limit is dropped."""
    original = shape(
        name,
        [{"type": "text", "text": TEXT}, IMAGE, DOCUMENT, AUDIO, {"type": "text", "text": "more"}],
    )
    tokens = estimate_message(original)
    inner = [
        {"type": "text", "text": f"{lead(tokens)} {TEXT[:KEEP]}…"},
        {"type": "text", "text": "[image omitted from this earlier tool result]"},
        {"type": "text", "text": "[document omitted from this earlier tool result]"},
        {"type": "text", "text": "[audio omitted from this earlier tool result]"},
    ]
    assert truncated_form(original, tokens, KEEP) == expect(with_result(original, inner, tokens))


def test_text_budget_spans_blocks_and_lead_in_leads() -> None:
    """The limit counts text over all direct text blocks; a list that starts with a
    non-text block gets the lead-in as its own first block."""
    blocks = [IMAGE, {"type": "text", "text": "a" * 30}, {"type": "text", "text": "b" * 30}]
    blocks += [{"type": "text", "text": "c" * 30}]
    original = shape("tool-blocks", blocks)
    tokens = estimate_message(original)
    inner = [
        {"type": "text", "text": lead(tokens)},
        {"type": "text", "text": "[image omitted from this earlier tool result]"},
        blocks[1],
        {"type": "text", "text": "b" * 20 + "…"},
    ]
    assert truncated_form(original, tokens, KEEP) == expect(with_result(original, inner, tokens))


def test_short_text_with_an_image_keeps_the_text_whole() -> None:
    """A result whose text is within the limit is still reduced for its image, and the
    lead-in names the characters actually kept."""
    blocks = [{"type": "text", "text": "short"}, {"type": "image", "source": {"data": "x"}}]
    original = carrier(blocks, is_error=True)
    tokens = estimate_message(original)
    inner = [
        {"type": "text", "text": f"{lead(tokens, 5)} short"},
        {"type": "text", "text": "[image omitted from this earlier tool result]"},
    ]
    block = {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": inner}
    expected = {"role": "user", "content": [block], "metadata": note(tokens)}
    assert truncated_form(original, tokens, KEEP) == expect(expected)


def test_ids_is_error_and_other_blocks_are_kept() -> None:
    """Ids, ``is_error`` and metadata survive; untouched blocks are the same objects and
    the caller's message is not mutated."""
    human = {"type": "text", "text": "and here is what I think " * 20}
    small = {"type": "tool_result", "tool_use_id": "toolu_s", "content": "ok"}
    big = {"type": "tool_result", "tool_use_id": "toolu_b", "is_error": True, "content": TEXT}
    original = {"role": "user", "content": [small, big, human], "metadata": {"keep": 1}}
    snapshot = copy.deepcopy(original)
    tokens = estimate_message(original)
    form = truncated_form(original, tokens, KEEP)
    assert form is not None
    content = form[0]["content"]
    assert (
        content[0] is small,
        content[1],
        content[2] is human,
        form[0]["metadata"],
        original,
    ) == (
        True,
        {**big, "content": f"{lead(tokens)} {TEXT[:KEEP]}…"},
        True,
        {"keep": 1, **note(tokens)},
        snapshot,
    )


def test_text_block_model_is_rebuilt_with_model_copy() -> None:
    """A ``TextBlock`` in a tool message's list stays a ``TextBlock`` with its extras."""
    block = TextBlock(text=TEXT, trace="keep-me")
    original = shape("tool-blocks", [block])
    tokens = estimate_message(original)
    form = truncated_form(original, tokens, KEEP)
    assert form is not None
    (clipped,) = form[0]["content"]
    assert (type(clipped), clipped.text, clipped.model_dump()["trace"], block.text) == (
        TextBlock,
        f"{lead(tokens)} {TEXT[:KEEP]}…",
        "keep-me",
        TEXT,
    )


@pytest.mark.parametrize("name", list(SHAPES))
def test_protected_form_says_why_and_how_to_refetch(name: str) -> None:
    """``protected=True``: the lead-in says the output was shortened to fit the model's
    input limit with the retrieval guidance, and the note is marked protected."""
    original = shape(name, SHAPES[name])
    tokens = estimate_message(original)
    clipped = f"{protected_lead(tokens)} {TEXT[:KEEP]}…"
    inner: Any = clipped if name.endswith("string") else [{"type": "text", "text": clipped}]
    expected = with_result(original, inner, tokens)
    expected["metadata"]["compaction"]["protected"] = True
    assert truncated_form(original, tokens, KEEP, protected=True) == expect(expected)


def test_protected_placeholder_wording() -> None:
    """A protected result's non-text blocks say they were omitted to fit the input limit."""
    original = carrier([IMAGE, {"type": "text", "text": TEXT}])
    tokens = estimate_message(original)
    form = truncated_form(original, tokens, KEEP, protected=True)
    assert form is not None
    assert form[0]["content"][0]["content"][:2] == [
        {"type": "text", "text": protected_lead(tokens)},
        {"type": "text", "text": "[image omitted to fit the model's input limit]"},
    ]


@pytest.mark.parametrize(
    "original",
    [
        shape("tool-blocks", [{"type": "text", "text": "x" * 60}]),
        carrier([{"type": "text", "text": "y" * 60}]),
        carrier([{"type": "text", "text": "tiny"}, {"type": "x"}]),
        shape("tool-blocks", [{"type": "text", "text": "a" * 20}, {"type": "text", "text": "b"}]),
        carrier([{"type": "text", "text": "z" * 10}]),
        carrier(None),
        shape("tool-blocks", []),
    ],
    ids=[
        "tool-barely-over",
        "result-barely-over",
        "tiny-unknown",
        "within",
        "short",
        "none",
        "empty",
    ],
)
def test_no_form_unless_strictly_smaller(original: dict[str, Any]) -> None:
    """Results within the limit, or whose reduction would not shrink the estimate (the
    lead-in costs more than it saves), have no truncated form."""
    assert truncated_form(original, estimate_message(original), KEEP) is None


BLOCK = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=300)),
    st.builds(lambda t: TextBlock(text=t), st.text(max_size=300)),
    st.just(IMAGE),
    st.just(DOCUMENT),
    st.just(AUDIO),
    st.builds(lambda k: {"type": k}, st.text(max_size=60)),
    st.just({"type": 7, "text": "junk type"}),
    st.just({"text": "untyped"}),
    st.just({"type": "tool_result", "content": "nested " * 30}),
)


LEAD_IN = re.compile(
    r"^\[tool output truncated from ~[\d,]+ tokens to its first [\d,]+ characters; "
    r"run the tool again with narrower parameters if you need the rest\] ?"
)
PLACEHOLDER = re.compile(r"^\[.* omitted from this earlier tool result\]$")


def kept_chars(blocks: Any) -> int:
    """Characters of original text in a reduced list (the lead-in and placeholders aside;
    the one ellipsis marking a cut counts as a character)."""
    texts = [block.text if isinstance(block, TextBlock) else block["text"] for block in blocks]
    texts[0] = LEAD_IN.sub("", texts[0], count=1)
    return sum(len(text) for text in texts if not PLACEHOLDER.match(text))


def valid_blocks(blocks: Any) -> bool:
    for block in blocks:
        kind = block.type if isinstance(block, TextBlock) else block.get("type")
        if not isinstance(kind, str):
            return False
        text = block.text if isinstance(block, TextBlock) else block.get("text")
        if kind == "text" and not (isinstance(text, str) and text):
            return False
    return True


@given(
    blocks=st.lists(BLOCK, max_size=6),
    keep=st.integers(min_value=0, max_value=200),
    anthropic=st.booleans(),
)
def test_reduced_block_lists_are_valid_and_smaller(
    blocks: list[Any], keep: int, anthropic: bool
) -> None:
    """Any block list: a reduced result is a valid block list (string types, non-empty
    string text), keeps at most ``truncate_chars`` characters of the original text and is
    strictly smaller; otherwise there is no form."""
    original = carrier(blocks) if anthropic else shape("tool-blocks", blocks)
    tokens = estimate_message(original)
    form = truncated_form(original, tokens, keep)
    if form is None:
        return
    message, new_tokens = form
    inner = message["content"][0]["content"] if anthropic else message["content"]
    assert (
        valid_blocks(inner),
        kept_chars(inner) <= keep + 1,
        new_tokens < tokens,
        new_tokens,
    ) == (True, True, True, estimate_message(message))


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "tool_result", "tool_use_id": "toolu_1", "content": TEXT}],
        [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": TEXT}],
            }
        ],
        [
            {"type": "text", "text": TEXT},
            {"type": "tool_result", "tool_use_id": "t", "content": TEXT},
        ],
    ],
    ids=["string-result", "block-result", "mixed"],
)
def test_tool_result_carrier_is_never_stubbed(content: list[Any]) -> None:
    """A user message carrying tool_result blocks has no stubbed form (rung 8)."""
    message = {"role": "user", "content": content}
    assert stubbed_form(message, estimate_message(message)) is None
