"""The tool-result ingress cap (docs/design.md section 3.1; docs/configuration.md, "Tool-result ingress cap").

Every carrier of tool results is capped alike: ``role: tool`` messages (string content or
direct text blocks) and the ``tool_result`` blocks of Anthropic-style user messages (string
content or a list of blocks whose direct text blocks count).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from amplifier_core import TextBlock
from hypothesis import given
from hypothesis import strategies as st

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context import config as config_module
from amplifier_module_context_simple.context.history.ingress import cap_tool_result, marker
from tests.support import mounted

CAP = 131_072
EVENT = "context:tool_result_ingress_truncated"
MARKER_PREFIX = "[tool-result truncated at ingress:"
# The brief's retrieval sentence, verbatim.
GUIDANCE = (
    "retrieve missing content using narrower read/query parameters; "
    "do not repeat state-changing actions just to recover output."
)
KERNEL_FIELDS = {"session_id", "parent_id", "timestamp"}
PAYLOAD_KEYS = {
    "tool_name",
    "tool_call_id",
    "original_text_utf8_bytes",
    "stored_text_utf8_bytes",
    "max_tool_result_bytes",
    "content_kind",
}
from amplifier_module_context_simple.testing import RecordingHooks

LOGGER = "amplifier_module_context_simple"
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


class RaisingHooks:
    async def emit(self, event: str, data: dict[str, Any]) -> None:
        raise RuntimeError("hook bus down")


def utf8(text: str) -> int:
    return len(text.encode("utf-8", errors="replace"))


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block["text"])
    return "".join(parts)


def tool(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call", "name": "read", "content": content, **extra}


async def admit(message: dict[str, Any], **config: Any) -> tuple[dict[str, Any], RecordingHooks]:
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks, **config)
    await cm.add_message(message)
    (stored,) = await cm.get_messages()
    return stored, hooks


def assert_one_marker(text: str, original: int) -> None:
    assert text.count(MARKER_PREFIX) == 1
    assert text.count(GUIDANCE) == 1
    assert text.endswith(marker(original))
    assert f"={original};" in marker(original)


# -- strings ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_exactly_at_cap_is_unchanged() -> None:
    """A tool result of exactly the cap is stored unchanged; no event."""
    content = "a" * CAP
    stored, hooks = await admit(tool(content))
    assert stored["content"] == content
    assert hooks.events == []


@pytest.mark.anyio
async def test_one_byte_over_is_clipped_to_the_cap() -> None:
    """cap + 1 ASCII bytes: stored content is exactly cap bytes with one marker."""
    stored, hooks = await admit(tool("b" * (CAP + 1)))
    content = stored["content"]
    assert utf8(content) == CAP
    assert_one_marker(content, CAP + 1)
    assert "original_text_utf8_bytes=131073" in content
    assert content.startswith("b" * 100)
    assert len(hooks.named(EVENT)) == 1


@pytest.mark.parametrize(
    ("characters", "clipped"),
    [(CAP // 4, False), (CAP // 4 + 1, True)],
    ids=["four-byte characters filling the cap", "one four-byte character over"],
)
def test_the_quick_size_bound_never_hides_an_over_cap_result(
    characters: int, clipped: bool
) -> None:
    """A result of at most cap / 4 characters is within the cap however it is encoded
    (the check skips counting its bytes); one character more is counted and clipped."""
    message = tool("\U0001f600" * characters)
    capped, clip = cap_tool_result(message, CAP)
    assert (capped is not message, clip is not None, utf8(capped["content"]) <= CAP) == (
        clipped,
        clipped,
        True,
    )


@pytest.mark.anyio
async def test_view_carries_the_clipped_content() -> None:
    """The provider-facing view shows the clipped text, not the original."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    call = {"id": "call", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    await cm.add_message({"role": "user", "content": "go"})
    await cm.add_message({"role": "assistant", "content": None, "tool_calls": [call]})
    await cm.add_message(tool("z" * (CAP * 2)))
    view = await cm.get_messages_for_request()
    assert utf8(view[-1]["content"]) == CAP
    assert_one_marker(view[-1]["content"], CAP * 2)


@pytest.mark.anyio
async def test_callers_message_is_not_mutated() -> None:
    """Clipping builds a new message; the caller's dict keeps its full content."""
    message = tool("c" * (CAP + 10), metadata={"k": "v"})
    snapshot = copy.deepcopy(message)
    await admit(message)
    assert message == snapshot


@pytest.mark.anyio
async def test_emoji_string_is_clipped_utf8_safely() -> None:
    """An oversized emoji string is clipped to valid UTF-8 within the cap, one marker."""
    original = "🙂" * (CAP // 4 + 10)
    stored, hooks = await admit(tool(original))
    content = stored["content"]
    encoded = content.encode("utf-8")  # strict: raises on invalid text
    assert len(encoded) <= CAP
    assert_one_marker(content, utf8(original))
    prefix = content[: -len(marker(utf8(original)))]
    assert prefix and set(prefix) == {"🙂"}
    assert len(hooks.named(EVENT)) == 1


@pytest.mark.anyio
async def test_lone_surrogate_under_cap_is_kept_byte_for_byte() -> None:
    """Under the cap an ill-formed string is stored exactly as given."""
    stored, hooks = await admit(tool("prefix\ud800suffix"))
    assert stored["content"] == "prefix\ud800suffix"
    assert hooks.events == []


@pytest.mark.anyio
async def test_oversized_surrogate_string_becomes_valid_utf8() -> None:
    """An oversized string with lone surrogates is clipped to valid UTF-8 within the cap."""
    original = ("x\ud800" * (CAP // 2 + 5)) + "\udfff"
    stored, hooks = await admit(tool(original))
    content = stored["content"]
    assert len(content.encode("utf-8")) <= CAP
    assert_one_marker(content, utf8(original))
    assert len(hooks.named(EVENT)) == 1


@pytest.mark.anyio
async def test_surrogate_counts_one_byte_at_the_boundary() -> None:
    """A lone surrogate counts as one replaced byte: cap-1 ASCII + surrogate is unchanged."""
    original = "a" * (CAP - 1) + "\udc80"
    stored, hooks = await admit(tool(original))
    assert stored["content"] == original
    assert hooks.events == []


@pytest.mark.anyio
@pytest.mark.parametrize("role", ["user", "assistant", "system"])
async def test_non_tool_roles_are_never_capped(role: str) -> None:
    """String content of other roles is not tool output; over the cap it is unchanged."""
    content = "u" * (CAP + 1)
    stored, hooks = await admit({"role": role, "content": content})
    assert stored["content"] == content
    assert hooks.events == []


@pytest.mark.anyio
async def test_custom_cap_above_the_default() -> None:
    """With max_tool_result_bytes = cap + 1 a result of that size is unchanged."""
    content = "d" * (CAP + 1)
    stored, hooks = await admit(tool(content), max_tool_result_bytes=CAP + 1)
    assert stored["content"] == content
    assert hooks.events == []


@pytest.mark.anyio
async def test_minimum_cap_still_fits_the_marker() -> None:
    """At the smallest allowed cap an oversized result is exactly a marker within the cap."""
    minimum = config_module.MIN_MAX_TOOL_RESULT_BYTES
    original = "m" * 10_000
    stored, _ = await admit(tool(original), max_tool_result_bytes=minimum)
    assert utf8(stored["content"]) <= minimum
    assert_one_marker(stored["content"], 10_000)


@pytest.mark.anyio
async def test_identity_fields_and_metadata_are_preserved() -> None:
    """Tool identity keys and metadata survive clipping; the marker is not in metadata."""
    metadata = {"openai:tool_search_items": [{"id": "x"}], "custom": "keep"}
    message = {
        "role": "tool",
        "name": "safe_name",
        "tool_call_id": "safe_call",
        "tool_use_id": "use_1",
        "status": "ok",
        "error": None,
        "content": "e" * (CAP + 1),
        "metadata": metadata,
    }
    stored, _ = await admit(message)
    for key in ("role", "name", "tool_call_id", "tool_use_id", "status", "error"):
        assert stored[key] == message[key]
    assert {k: v for k, v in stored["metadata"].items() if k not in ("timestamp", "_seq")} == (
        metadata
    )
    assert MARKER_PREFIX not in repr(stored["metadata"])


@pytest.mark.anyio
@pytest.mark.parametrize(
    "content",
    [
        None,
        [{"type": "image", "source": {"type": "base64", "data": "A" * (CAP * 2)}}],
        [{"type": "text", "text": 42}, {"type": "image", "data": "B" * (CAP * 2)}],
        [{"type": "tool_result", "content": [{"type": "text", "text": "n" * (CAP * 2)}]}],
        [{"text": "no type" * CAP}],
    ],
    ids=["none", "image-only", "malformed-text", "nested-text", "untyped"],
)
async def test_non_text_content_is_untouched(content: Any) -> None:
    """Image-only, malformed, nested or untyped blocks are not read or sliced; no event."""
    stored, hooks = await admit(tool(content))
    assert stored["content"] == content
    if isinstance(content, list):
        assert all(a is b for a, b in zip(stored["content"], content, strict=True))
    assert hooks.events == []


# -- blocks ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_mixed_blocks() -> None:
    """Non-text blocks are the same objects in the same order; one marker; text within cap;
    the trailing text block is dropped; the leading TextBlock keeps its type and extras."""
    first = TextBlock(text="short", trace="keep-me")
    image = {"type": "image", "source": {"type": "base64", "data": "I" * 1000}}
    file = {"type": "file", "name": "f.bin"}
    audio = {"type": "audio", "data": "A" * 1000}
    big = {"type": "text", "text": "🙂" * CAP}
    trailing = {"type": "text", "text": "after"}
    blocks = [first, image, file, audio, big, trailing]
    snapshot = copy.deepcopy(blocks)
    stored, hooks = await admit(tool(blocks))
    content = stored["content"]
    assert blocks == snapshot
    assert content[0] is first
    assert isinstance(content[0], TextBlock)
    assert content[0].model_dump()["trace"] == "keep-me"
    assert content[1] is image
    assert content[2] is file
    assert content[3] is audio
    assert len(content) == 5
    assert content[4] is not big
    assert content[4]["type"] == "text"
    original = utf8("short") + utf8(big["text"]) + utf8("after")
    text = text_of(content)
    assert len(text.encode("utf-8")) <= CAP
    assert_one_marker(text, original)
    assert text_of([content[0]]) == "short"
    assert text_of([content[4]])
    (payload,) = hooks.named(EVENT)
    assert payload["content_kind"] == "text_blocks"
    assert payload["original_text_utf8_bytes"] == original
    assert payload["stored_text_utf8_bytes"] == utf8(text)


@pytest.mark.anyio
async def test_clipped_textblock_stays_a_textblock() -> None:
    """A TextBlock that is clipped becomes a new TextBlock with its extra fields."""
    block = TextBlock(text="t" * (CAP + 50), trace="x", visibility="internal")
    stored, _ = await admit(tool([block]))
    (clipped,) = stored["content"]
    assert isinstance(clipped, TextBlock)
    assert clipped is not block
    assert block.text == "t" * (CAP + 50)
    assert clipped.model_dump()["trace"] == "x"
    assert clipped.visibility == "internal"
    assert utf8(clipped.text) <= CAP
    assert_one_marker(clipped.text, CAP + 50)


@pytest.mark.anyio
async def test_dict_block_keeps_extra_keys() -> None:
    """A clipped dict text block keeps its other keys; the caller's block is unchanged."""
    block = {"type": "text", "text": "k" * (CAP + 1), "cache_control": {"type": "ephemeral"}}
    stored, _ = await admit(tool([block]))
    (clipped,) = stored["content"]
    assert clipped["cache_control"] == {"type": "ephemeral"}
    assert len(block["text"]) == CAP + 1
    assert utf8(clipped["text"]) == CAP


@pytest.mark.anyio
async def test_many_small_blocks_over_cap() -> None:
    """Blocks that fit are kept whole; the first that does not carries the only marker."""
    blocks = [{"type": "text", "text": "p" * 50_000} for _ in range(4)]
    stored, _ = await admit(tool(blocks))
    content = stored["content"]
    assert content[0] is blocks[0]
    assert content[1] is blocks[1]
    assert len(content) == 3
    text = text_of(content)
    assert utf8(text) <= CAP
    assert_one_marker(text, 200_000)


@pytest.mark.anyio
async def test_blocks_under_cap_unchanged() -> None:
    """Text blocks totalling the cap are stored as the same objects; no event."""
    blocks = [{"type": "text", "text": "h" * (CAP // 2)}, TextBlock(text="h" * (CAP // 2))]
    stored, hooks = await admit(tool(blocks))
    assert all(a is b for a, b in zip(stored["content"], blocks, strict=True))
    assert hooks.events == []


# -- events and logging ----------------------------------------------------------------------


@asyncio_only
@pytest.mark.anyio
async def test_event_payload_via_real_hooks() -> None:
    """Through the real hook registry the payload is the six numeric/identity keys only."""
    coordinator, context, recorder = await mounted({}, EVENT)
    secret = "SECRET-CONTENT-"
    content = secret + "s" * CAP
    await context.add_message(
        {"role": "tool", "name": "safe_name", "tool_call_id": "safe_call", "content": content}
    )
    (payload,) = recorder.named(EVENT)
    ours = {k: v for k, v in payload.items() if k not in KERNEL_FIELDS}
    assert ours == {
        "tool_name": "safe_name",
        "tool_call_id": "safe_call",
        "original_text_utf8_bytes": utf8(content),
        "stored_text_utf8_bytes": CAP,
        "max_tool_result_bytes": CAP,
        "content_kind": "string",
    }
    assert secret not in repr(payload)
    assert MARKER_PREFIX not in repr(payload)
    await coordinator.cleanup()


@asyncio_only
@pytest.mark.anyio
async def test_block_event_payload_via_real_hooks() -> None:
    """A clipped block list reports kind text_blocks through the real registry."""
    coordinator, context, recorder = await mounted({"max_tool_result_bytes": 1000}, EVENT)
    await context.add_message(
        {"role": "tool", "tool_call_id": "c", "content": [TextBlock(text="w" * 5000)]}
    )
    (payload,) = recorder.named(EVENT)
    assert set(payload) - KERNEL_FIELDS == PAYLOAD_KEYS
    assert payload["content_kind"] == "text_blocks"
    assert payload["original_text_utf8_bytes"] == 5000
    assert payload["stored_text_utf8_bytes"] == 1000
    assert payload["max_tool_result_bytes"] == 1000
    assert payload["tool_name"] is None
    await coordinator.cleanup()


@pytest.mark.anyio
async def test_non_string_identity_fields_are_not_reported() -> None:
    """Only string identity fields are reported; anything else becomes None.

    (A non-string ``tool_call_id`` is rejected at admission, so only ``name`` can be junk.)
    """
    _, hooks = await admit(
        {"role": "tool", "name": {"x": 1}, "tool_call_id": None, "content": "q" * (CAP + 1)}
    )
    (payload,) = hooks.named(EVENT)
    assert payload["tool_name"] is None
    assert payload["tool_call_id"] is None
    assert set(payload) == PAYLOAD_KEYS


@pytest.mark.anyio
async def test_no_hooks_logs_a_warning_with_guidance(caplog: pytest.LogCaptureFixture) -> None:
    """Without hooks the clip is logged as a warning carrying the retrieval sentence."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cm = SimpleContextManager()
        await cm.add_message(tool("g" * (CAP + 1)))
    (stored,) = await cm.get_messages()
    assert utf8(stored["content"]) == CAP
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(GUIDANCE in w for w in warnings), warnings


@pytest.mark.anyio
async def test_raising_emit_logs_and_still_stores(caplog: pytest.LogCaptureFixture) -> None:
    """If emit raises, the clipped message is still stored and a warning carries guidance."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cm = SimpleContextManager(hooks=RaisingHooks())
        await cm.add_message(tool("r" * (CAP + 1)))
    (stored,) = await cm.get_messages()
    assert utf8(stored["content"]) == CAP
    assert any(GUIDANCE in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_delivered_event_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A successfully delivered event needs no warning."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await admit(tool("v" * (CAP + 1)))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.anyio
async def test_set_messages_clips_once() -> None:
    """set_messages clips an oversized result with one event; re-setting emits nothing new."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.set_messages(
        [
            {"role": "user", "content": "x"},
            tool("o" * (CAP + 5)),
            {"role": "tool", "tool_call_id": "small", "content": "fine"},
        ]
    )
    assert len(hooks.named(EVENT)) == 1
    stored = await cm.get_messages()
    assert utf8(stored[1]["content"]) == CAP
    await cm.set_messages(await cm.get_messages())
    assert len(hooks.named(EVENT)) == 1
    assert await cm.get_messages() == stored


@pytest.mark.anyio
async def test_each_clipped_message_emits_one_event() -> None:
    """One event per clipped message, in admission order."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks, max_tool_result_bytes=1000)
    for i in range(3):
        await cm.add_message({"role": "tool", "tool_call_id": f"c{i}", "content": "y" * 2000})
    assert [p["tool_call_id"] for p in hooks.named(EVENT)] == ["c0", "c1", "c2"]


# -- the pure function, property-based ---------------------------------------------------------

TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\ud800", "\udfff", "🙂", "中", "é"]),
    ),
    max_size=600,
)


@given(text=TEXT, cap=st.integers(min_value=config_module.MIN_MAX_TOOL_RESULT_BYTES, max_value=700))
def test_cap_property_string(text: str, cap: int) -> None:
    """Any string: under cap unchanged (same object); over cap valid UTF-8, <= cap, one marker."""
    message = {"role": "tool", "tool_call_id": "c", "content": text}
    result, clip = cap_tool_result(message, cap)
    original = utf8(text)
    if original <= cap:
        assert result is message
        assert clip is None
    else:
        content = result["content"]
        assert len(content.encode("utf-8")) <= cap
        assert content.count(MARKER_PREFIX) == 1
        assert content.endswith(marker(original))
        assert clip is not None
        assert clip.original_text_utf8_bytes == original
        assert clip.stored_text_utf8_bytes == len(content.encode("utf-8"))
        assert message["content"] is text


@given(
    texts=st.lists(TEXT, max_size=6),
    cap=st.integers(min_value=config_module.MIN_MAX_TOOL_RESULT_BYTES, max_value=900),
)
def test_cap_property_blocks(texts: list[str], cap: int) -> None:
    """Any text-block list: total text <= cap and exactly one marker when clipped."""
    image = {"type": "image", "data": "IMG"}
    blocks: list[Any] = [{"type": "text", "text": t} for t in texts] + [image]
    message = {"role": "tool", "tool_call_id": "c", "content": blocks}
    result, clip = cap_tool_result(message, cap)
    original = sum(utf8(t) for t in texts)
    if original <= cap:
        assert result is message
        assert clip is None
        return
    content = result["content"]
    text = text_of(content)
    assert len(text.encode("utf-8")) <= cap
    assert text.count(MARKER_PREFIX) == 1
    assert content[-1] is image
    assert clip is not None
    assert clip.content_kind == "text_blocks"


# -- every carrier: Anthropic tool_result blocks ------------------------------------------------

MIB = 1024 * 1024
CALL_ID = "toolu_1"


def mib_text() -> str:
    """Exactly 1 MiB of UTF-8 with multi-byte characters all through it."""
    line = "row 中文 🙂 é output line with some ascii padding\n"
    text = line * (MIB // utf8(line))
    text += "z" * (MIB - utf8(text))
    assert utf8(text) == MIB
    return text


MIB_TEXT = mib_text()


def expected_clip(text: str, cap: int) -> str:
    """The stored text every shape must get: a UTF-8-safe prefix and the one marker."""
    tail = marker(utf8(text))
    return text.encode("utf-8")[: cap - utf8(tail)].decode("utf-8", errors="ignore") + tail


def result_shape(shape: str, text: str) -> dict[str, Any]:
    """A tool result of ``text`` in one of the four carrier shapes."""
    if shape == "openai-tool-string":
        return {"role": "tool", "tool_call_id": CALL_ID, "content": text}
    if shape == "amplifier-tool-string":
        return {"role": "tool", "tool_call_id": CALL_ID, "name": "read", "content": text}
    inner: Any = text if shape == "anthropic-result-string" else [{"type": "text", "text": text}]
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": inner}],
    }


def call_shape(shape: str) -> dict[str, Any]:
    """The assistant call the result of ``shape`` answers."""
    if shape == "openai-tool-string":
        call = {"id": CALL_ID, "type": "function", "function": {"name": "read", "arguments": "{}"}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if shape == "amplifier-tool-string":
        call = {"id": CALL_ID, "tool": "read", "arguments": {}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    block = {"type": "tool_use", "id": CALL_ID, "name": "read", "input": {}}
    return {"role": "assistant", "content": [block]}


def result_text(message: Any) -> str:
    """The text of the (single) tool result a message carries."""
    if message["role"] == "tool":
        return text_of(message["content"])
    (block,) = message["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == CALL_ID
    return text_of(block["content"])


SHAPES = [
    "openai-tool-string",
    "amplifier-tool-string",
    "anthropic-result-string",
    "anthropic-result-blocks",
]
SHAPE_KIND = {
    "openai-tool-string": ("string", None),
    "amplifier-tool-string": ("string", "read"),
    "anthropic-result-string": ("tool_result_blocks", None),
    "anthropic-result-blocks": ("tool_result_blocks", None),
}


@pytest.mark.anyio
@pytest.mark.parametrize("shape", SHAPES)
async def test_one_mib_result_is_admitted_identically_in_every_shape(shape: str) -> None:
    """A 1 MiB output admitted through ``add_message`` is stored as the same prefix plus one
    marker in all four shapes, with one event carrying the same byte figures."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "read the log"})
    await cm.add_message(call_shape(shape))
    await cm.add_message(result_shape(shape, MIB_TEXT))
    stored = (await cm.get_messages())[-1]
    expected = expected_clip(MIB_TEXT, CAP)
    kind, name = SHAPE_KIND[shape]
    assert (result_text(stored), hooks.named(EVENT)) == (
        expected,
        [
            {
                "tool_name": name,
                "tool_call_id": CALL_ID,
                "original_text_utf8_bytes": MIB,
                "stored_text_utf8_bytes": utf8(expected),
                "max_tool_result_bytes": CAP,
                "content_kind": kind,
            }
        ],
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_cap_tool_result_clips_every_shape_identically(shape: str) -> None:
    """``cap_tool_result`` gives every shape the same stored text and byte figures."""
    message = result_shape(shape, MIB_TEXT)
    result, clip = cap_tool_result(message, CAP)
    expected = expected_clip(MIB_TEXT, CAP)
    assert clip is not None
    assert (result_text(result), clip.payload()) == (
        expected,
        {
            "tool_name": SHAPE_KIND[shape][1],
            "tool_call_id": CALL_ID,
            "original_text_utf8_bytes": MIB,
            "stored_text_utf8_bytes": utf8(expected),
            "max_tool_result_bytes": CAP,
            "content_kind": SHAPE_KIND[shape][0],
        },
    )


@pytest.mark.anyio
async def test_two_clipped_results_in_one_user_message_emit_one_summed_event() -> None:
    """Two oversized tool_result blocks of one user message: one event whose byte figures
    are the sums and whose id is the first clipped result's; each keeps its own marker."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks, max_tool_result_bytes=1000)
    small = {"type": "tool_result", "tool_use_id": "toolu_a", "content": "fine"}
    big_string = {"type": "tool_result", "tool_use_id": "toolu_b", "content": "s" * 5000}
    big_blocks = {
        "type": "tool_result",
        "tool_use_id": "toolu_c",
        "is_error": True,
        "content": [{"type": "text", "text": "中" * 2000}],
    }
    await cm.add_message({"role": "user", "content": [small, big_string, big_blocks]})
    (stored,) = await cm.get_messages()
    clipped_b = expected_clip("s" * 5000, 1000)
    clipped_c = expected_clip("中" * 2000, 1000)
    assert (stored["content"], hooks.named(EVENT)) == (
        [
            small,
            {**big_string, "content": clipped_b},
            {**big_blocks, "content": [{"type": "text", "text": clipped_c}]},
        ],
        [
            {
                "tool_name": None,
                "tool_call_id": "toolu_b",
                "original_text_utf8_bytes": 5000 + 6000,
                "stored_text_utf8_bytes": utf8(clipped_b) + utf8(clipped_c),
                "max_tool_result_bytes": 1000,
                "content_kind": "tool_result_blocks",
            }
        ],
    )


@asyncio_only
@pytest.mark.anyio
async def test_tool_result_blocks_event_via_real_hooks() -> None:
    """Through the real hook registry a clipped user carrier reports one numbers-only event."""
    coordinator, context, recorder = await mounted({"max_tool_result_bytes": 1000}, EVENT)
    secret = "SECRET-CONTENT-"
    blocks = [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": secret + "x" * 3000},
        {"type": "tool_result", "tool_use_id": "toolu_y", "content": [TextBlock(text="y" * 2000)]},
    ]
    await context.add_message({"role": "user", "content": blocks})
    (payload,) = recorder.named(EVENT)
    assert {k: v for k, v in payload.items() if k not in KERNEL_FIELDS} == {
        "tool_name": None,
        "tool_call_id": "toolu_x",
        "original_text_utf8_bytes": utf8(secret) + 3000 + 2000,
        "stored_text_utf8_bytes": 2000,
        "max_tool_result_bytes": 1000,
        "content_kind": "tool_result_blocks",
    }
    assert secret not in repr(payload)
    await coordinator.cleanup()


def test_non_text_blocks_of_a_tool_result_are_untouched() -> None:
    """Image, document, audio and nested blocks inside a clipped tool_result are the same
    objects in the same places; only the text is clipped; the caller's message is intact."""
    image = {"type": "image", "source": {"type": "base64", "data": "I" * (CAP * 2)}}
    document = {"type": "document", "source": {"type": "text", "data": "D" * (CAP * 2)}}
    audio = {"type": "audio", "data": "A" * (CAP * 2)}
    nested = {"type": "tool_result", "content": [{"type": "text", "text": "n" * (CAP * 2)}]}
    big = {"type": "text", "text": "t" * (CAP + 1)}
    inner = [image, big, document, audio, nested]
    message = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": inner}],
    }
    snapshot = copy.deepcopy(message)
    result, _ = cap_tool_result(message, CAP)
    content = result["content"][0]["content"]
    assert (
        [block is original for block, original in zip(content, inner, strict=True)],
        text_of(content),
        message,
    ) == (
        [True, False, True, True, True],
        expected_clip(big["text"], CAP),
        snapshot,
    )


@pytest.mark.parametrize(
    "inner",
    [
        [{"type": "image", "source": {"type": "base64", "data": "I" * (CAP * 2)}}],
        [{"type": "document", "source": {"data": "D" * (CAP * 2)}}],
        [{"type": "tool_result", "content": "n" * (CAP * 2)}],
        [{"type": "text", "text": 42}],
        None,
    ],
    ids=["image-only", "document-only", "nested-only", "malformed-text", "none"],
)
def test_tool_result_without_direct_text_is_never_clipped(inner: Any) -> None:
    """A tool_result with no direct text over the cap is returned as the same message."""
    message = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": inner}],
    }
    result, clip = cap_tool_result(message, CAP)
    assert (result is message, clip) == (True, None)


@pytest.mark.parametrize("shape", SHAPES)
def test_under_cap_message_is_the_same_object(shape: str) -> None:
    """A result of exactly the cap is returned as the very same message with no clip."""
    message = result_shape(shape, "a" * (CAP - 5) + "é中")  # exactly CAP bytes
    result, clip = cap_tool_result(message, CAP)
    assert (result is message, clip) == (True, None)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": "text", "text": "h" * (CAP + 1)}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": "a" * MIB}],
        },
    ],
    ids=["human-text-block", "assistant-tool-result"],
)
def test_only_tool_output_is_capped(message: dict[str, Any]) -> None:
    """A human's text block and an assistant's (invalid) tool_result are not tool output."""
    assert cap_tool_result(message, CAP)[0] is message


def test_human_text_beside_a_clipped_result_is_kept() -> None:
    """In a user message mixing a result and human text only the result is clipped."""
    note = {"type": "text", "text": "h" * (CAP * 2)}
    result = {"type": "tool_result", "tool_use_id": CALL_ID, "content": "r" * (CAP * 2)}
    capped, clip = cap_tool_result({"role": "user", "content": [result, note]}, CAP)
    assert clip is not None
    assert (capped["content"][1] is note, capped["content"][0]["content"]) == (
        True,
        expected_clip("r" * (CAP * 2), CAP),
    )


SMALL_CAP = config_module.MIN_MAX_TOOL_RESULT_BYTES + 37


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("shift", range(8))
def test_multibyte_cut_at_every_offset_is_valid_utf8(shape: str, shift: int) -> None:
    """Multi-byte text whose cut falls at every byte offset of its characters is clipped to
    the longest valid UTF-8 prefix within the cap, with exactly one marker."""
    text = "a" * shift + "中🙂é" * 200
    result, _ = cap_tool_result(result_shape(shape, text), SMALL_CAP)
    stored = result_text(result)
    budget = SMALL_CAP - utf8(marker(utf8(text)))
    prefix = stored[: -len(marker(utf8(text)))]
    assert (
        text.startswith(prefix),
        budget - 4 < len(prefix.encode("utf-8")) <= budget,
        stored.count(MARKER_PREFIX),
        stored.endswith(marker(utf8(text))),
    ) == (True, True, 1, True)


def test_lone_surrogates_in_a_tool_result_become_valid_utf8() -> None:
    """An oversized tool_result with lone surrogates counts them as replaced bytes and is
    clipped to valid UTF-8 within the cap."""
    text = "x\ud800" * (CAP // 2 + 5)
    result, clip = cap_tool_result(result_shape("anthropic-result-blocks", text), CAP)
    stored = result_text(result)
    assert clip is not None
    assert (len(stored.encode("utf-8")), clip.original_text_utf8_bytes) == (CAP, utf8(text))


def test_lone_surrogate_under_cap_tool_result_is_kept() -> None:
    """Under the cap an ill-formed tool_result string is kept: the same message."""
    message = result_shape("anthropic-result-string", "a" * (CAP - 1) + "\udc80")
    assert cap_tool_result(message, CAP)[0] is message


def test_model_tool_result_block_is_clipped_with_model_copy() -> None:
    """A pydantic tool_result block is rebuilt with ``model_copy``; the original is intact."""
    from amplifier_core.message_models import ToolResultBlock

    block = ToolResultBlock(
        tool_call_id="toolu_p", output=None, content=[TextBlock(text="p" * (CAP + 1))]
    )
    result, clip = cap_tool_result({"role": "user", "content": [block]}, CAP)
    (clipped,) = result["content"]
    assert clip is not None
    assert (
        type(clipped),
        text_of(clipped.content),
        text_of(block.content),
        clip.payload()["tool_call_id"],
    ) == (ToolResultBlock, expected_clip("p" * (CAP + 1), CAP), "p" * (CAP + 1), "toolu_p")


@pytest.mark.anyio
async def test_set_messages_clips_tool_result_blocks_once() -> None:
    """set_messages clips a user carrier with one event; re-setting emits nothing new."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    shape = "anthropic-result-blocks"
    await cm.set_messages(
        [
            {"role": "user", "content": "go"},
            call_shape(shape),
            result_shape(shape, MIB_TEXT),
        ]
    )
    await cm.set_messages(await cm.get_messages())
    assert (
        result_text((await cm.get_messages())[-1]),
        [p["content_kind"] for p in hooks.named(EVENT)],
    ) == (expected_clip(MIB_TEXT, CAP), ["tool_result_blocks"])
