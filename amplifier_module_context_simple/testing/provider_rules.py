"""An independent oracle for the providers' own request rules on tool calls and results.

A *view* is the list of chat messages an orchestrator hands a provider. This module answers
one question about it: would the provider accept the tool-call structure of this request,
after a provider adapter has converted the view to the provider's wire format? It is a test
oracle shipped with the package, deliberately written from the providers' public documentation
and their known HTTP 400 errors, not from this project's code: it imports only the standard
library (``tests/test_provider_rules.py`` checks it), so a bug shared with the code under test
cannot hide here. It sits in ``testing/`` with the other oracles; the runtime never imports
it. Where the runtime makes views obey each rule: docs/design.md section 10.1.

Public API::

    check_provider_valid(view, "openai" | "anthropic", *, allow_pending_tail=True) -> None
        raises the first ProviderRuleError (ordered by view position)
    provider_violations(view, dialect, *, allow_pending_tail=True) -> list[ProviderRuleError]
        every violation, in view order, for sweeps that tally
    ProviderRuleError(AssertionError): .dialect, .code, .position (view index or None), .detail

Input formats (possibly mixed in one view)
-------------------------------------------
- OpenAI: assistant ``tool_calls: [{"id", "type": "function", "function": {...}}]`` answered
  by ``{"role": "tool", "tool_call_id", "content"}``;
- Amplifier: assistant ``tool_calls: [{"id", "tool", "arguments"}]``, answered the same way;
- Anthropic blocks: assistant ``content`` blocks ``{"type": "tool_use", "id", ...}`` (or
  amplifier-core's ``{"type": "tool_call", "id", ...}``), answered by user ``content`` blocks
  ``{"type": "tool_result", "tool_use_id" (or "tool_call_id"), "content"?, "is_error"?}``.
  amplifier-core's ``ToolResultBlock`` carries ``output`` instead of ``content``; an adapter
  serialises it, so it counts as string content.

Blocks and tool-call entries may be mappings or objects with attributes. ``metadata`` and
every other extra key are ignored, as providers' adapters drop them. When one assistant
message states the same call both in ``tool_calls`` and as a content block, that is one call
in two representations (adapters emit it once), not a duplicate.

What the adapters do (the conversion modelled here)
---------------------------------------------------
**openai** (Chat Completions): system/developer messages stay in the list; an assistant's
``tool_use``/``tool_call`` blocks join its ``tool_calls``; a user message's ``tool_result``
blocks become ``role: "tool"`` messages where the user message was, in block order, before
the rest of that message, which follows as a user message if anything is left.

**anthropic** (Messages): system/developer messages are hoisted into the top-level ``system``
parameter; a ``role: "tool"`` message becomes a user turn with one ``tool_result`` block
(``tool_use_id`` = ``tool_call_id``); ``tool_calls`` become ``tool_use`` blocks after the
assistant's own content; consecutive same-role turns are merged, because the API merges them
anyway (A6). Any other role is sent as a user turn.

Rules checked, with their sources
---------------------------------
OpenAI Chat Completions:

- ``missing-result``: every assistant message with tool_calls is followed immediately by tool
  messages responding to each of its ids, with nothing but tool messages in between:
  "An assistant message with 'tool_calls' must be followed by tool messages responding to each
  'tool_call_id'. The following tool_call_ids did not have response messages: call_..." (O1:
  https://github.com/BerriAI/litellm/issues/10083, https://github.com/aliasrobotics/cai/issues/111;
  the DeepSeek wording "(insufficient tool messages following tool_calls message)":
  https://github.com/agno-agi/agno/issues/3105).
- ``orphan-result``: a tool message must answer a call of the assistant message that opens its
  contiguous run of tool messages: "Invalid parameter: messages with role 'tool' must be a
  response to a preceeding message with 'tool_calls'." (O2, param ``messages.[4].role``:
  https://github.com/smarter-sh/smarter/issues/264, https://github.com/miurla/morphic/issues/136).
- ``duplicate-result``: "Invalid parameter: Duplicate value for 'tool_call_id' of 'call_...' in
  messages[7] and messages[8]." (O3: https://github.com/agno-agi/agno/issues/5116).
- ``duplicate-call-id``: ids within one assistant message are unique; OpenAI-compatible APIs
  answer HTTP 400 to repeated ids in one message (O4:
  https://github.com/openclaw/openclaw/pull/47136, fixing openclaw/openclaw#40897).
- ``bad-id``: ``id``/``tool_call_id`` are required strings (O5, ``tool_call_id: Required[str]``
  in openai/openai-python ``src/openai/types/chat/chat_completion_tool_message_param.py``), and
  the API rejects empty required strings: "Invalid 'messages[69].tool_calls[0].function.name':
  empty string. Expected a string with minimum length 1" (O6:
  https://github.com/continuedev/continue/issues/11645).
- ``bad-result-content``: a tool message's ``content`` is required and is a string or an array
  of text parts (O5: ``content: Required[Union[str, Iterable[ChatCompletionContentPartTextParam]]]``);
  the API reference adds "For tool messages, only type `text` is supported."
  (https://platform.openai.com/docs/api-reference/chat/create). A result converted from a
  ``tool_result`` block with no content gets ``""`` from the adapter and passes; the
  non-text parts of an Anthropic ``tool_result`` (images, documents) are sent by the
  adapter in a user message after the tool messages, as adapters between the two formats
  do, while a native ``role: tool`` message with an image part is a violation.

Anthropic Messages:

- ``missing-result``: "messages.N: `tool_use` ids were found without `tool_result` blocks
  immediately after: toolu_... Each `tool_use` block must have a corresponding `tool_result`
  block in the next message." (A1: https://github.com/anthropics/claude-code/issues/1237,
  https://github.com/anthropics/claude-code/issues/5989); the results are not optional, per the
  maintainers (https://github.com/anthropics/anthropic-sdk-typescript/issues/653).
- ``results-not-first``: "messages.N: Did not find 1 `tool_result` block(s) at the beginning of
  this message. Messages following `tool_use` blocks must begin with a matching number of
  `tool_result` blocks." (A2: https://github.com/anthropics/claude-code/issues/37,
  https://github.com/apify/tester-mcp-client/issues/12); the docs: "Tool result blocks must
  immediately follow their corresponding tool use blocks in the message history" and "In the
  user message containing tool results, the tool_result blocks must come FIRST in the content
  array. Any text must come AFTER all tool results." (A3:
  https://platform.claude.com/docs/en/agents-and-tools/tool-use/handle-tool-calls).
- ``orphan-result``: "messages.N.content.M: unexpected `tool_use_id` found in `tool_result`
  blocks: toolu_... Each `tool_result` block must have a corresponding `tool_use` block in the
  previous message." (A4: https://github.com/anthropics/claude-code/issues/13460,
  https://github.com/router-for-me/CLIProxyAPI/issues/497). A ``tool_result`` inside an
  assistant message answers nothing either way and is reported the same (both dialects).
- ``duplicate-call-id``: "messages.1.content.1: `tool_use` ids must be unique" across the whole
  request (A5: https://github.com/anthropics/claude-code/issues/20901).
- ``duplicate-result``: "each tool_use must have a single result. Found multiple `tool_result`
  blocks with id: ..." (quoted by BerriAI/litellm's regression test
  ``test_translate_anthropic_messages_to_openai_tool_result_with_multiple_content_items``).
- ``bad-id``, ``bad-result-content``, ``bad-is-error``: ``ToolResultBlockParam`` has
  ``tool_use_id: Required[str]``, optional ``content: Union[str, Iterable[TextBlockParam |
  ImageBlockParam | SearchResultBlockParam]]`` and optional ``is_error: bool``; every block has
  a string ``type`` and ``TextBlockParam.text`` is a required string (A7: anthropics/anthropic-
  sdk-python ``src/anthropic/types/tool_result_block_param.py``, ``text_block_param.py``).
  ``None`` for an optional field is treated as absent (adapters drop ``None`` fields).
- Merging (A6): "Consecutive `user` or `assistant` turns in your request will be combined into a
  single turn." and system prompts are the top-level ``system`` parameter (Messages API
  reference, ``messages`` and ``system``: https://platform.claude.com/docs/en/api/messages/create).

Both dialects:

- ``not-a-list``, ``not-a-dict``, ``no-role``, ``bad-tool-calls``: the view is a list (or tuple)
  of mappings, each with a string ``role``; ``tool_calls``, when present and not ``None``, is a
  list. Such messages are reported and left out of the conversion instead of crashing it.

Pending tail (``allow_pending_tail=True``): the orchestrator sends a view while it is still
executing the last assistant message's tools, so that message's results may be (partly)
missing *provided nothing but its own results follows it to the end of the view* (OpenAI: only
tool messages; Anthropic: it is the last turn, or only a user turn made of nothing but
``tool_result`` blocks follows). With ``allow_pending_tail=False`` every call needs its result.

Out of scope (adapter or transport concerns, not tool pairing): message alternation beyond the
merge, empty ``tool_calls`` arrays, id character sets, tool names and arguments, non-tool
content blocks, thinking-block signatures and the request's other parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

__all__ = (
    "CODES",
    "Dialect",
    "ProviderRuleError",
    "check_provider_valid",
    "provider_violations",
)

Dialect: TypeAlias = Literal["openai", "anthropic"]

#: Every violation code this module reports, for sweeps that tally by code.
CODES: Final[frozenset[str]] = frozenset(
    {
        "not-a-list",
        "not-a-dict",
        "no-role",
        "bad-tool-calls",
        "bad-id",
        "duplicate-call-id",
        "missing-result",
        "orphan-result",
        "duplicate-result",
        "results-not-first",
        "bad-result-content",
        "bad-is-error",
    }
)

_DIALECTS: Final[frozenset[str]] = frozenset({"openai", "anthropic"})
_CALL_BLOCK_TYPES: Final[frozenset[str]] = frozenset({"tool_use", "tool_call"})
_RESULT_BLOCK_TYPE: Final = "tool_result"
_HOISTED_ROLES: Final[frozenset[str]] = frozenset({"system", "developer"})


class ProviderRuleError(AssertionError):
    """One broken provider request rule.

    ``dialect`` is ``"openai"`` or ``"anthropic"``; ``code`` is a short kebab-case name from
    ``CODES``; ``position`` is the index in the view of the message at fault (``None`` when the
    view as a whole is at fault); ``detail`` says what is wrong. ``str(error)`` says all four.
    It subclasses ``AssertionError`` so a failed check reads as a failed test.
    """

    def __init__(self, dialect: str, code: str, position: int | None, detail: str) -> None:
        where = "the view" if position is None else f"view[{position}]"
        super().__init__(f"{dialect} rule {code!r} broken at {where}: {detail}")
        self.dialect = dialect
        self.code = code
        self.position = position
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduction re-calls __init__ with the formatted message only.
        return (type(self), (self.dialect, self.code, self.position, self.detail))


def check_provider_valid(
    view: Sequence[Mapping[str, Any]],
    dialect: Dialect,
    *,
    allow_pending_tail: bool = True,
) -> None:
    """Raise the first ``ProviderRuleError`` the provider would answer ``view`` with.

    Returns ``None`` when the converted request obeys every rule in the module docstring.
    "First" means lowest view position (a whole-view fault first), then detection order.
    Raises ``ValueError`` for an unknown dialect.
    """
    violations = provider_violations(view, dialect, allow_pending_tail=allow_pending_tail)
    if violations:
        raise violations[0]


def provider_violations(
    view: Sequence[Mapping[str, Any]],
    dialect: Dialect,
    *,
    allow_pending_tail: bool = True,
) -> list[ProviderRuleError]:
    """Every rule ``view`` breaks for ``dialect``, ordered by view position.

    Never raises for a malformed view (it reports ``not-a-list``, ``not-a-dict``, ``no-role``
    instead); raises ``ValueError`` only for an unknown dialect.
    """
    if dialect not in _DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; expected 'openai' or 'anthropic'")
    report = _Report(dialect)
    messages = _well_formed(view, report)
    if messages is not None:
        if dialect == "openai":
            _check_openai(_to_openai(messages, report), report, allow_pending_tail)
        else:
            _check_anthropic(_to_anthropic(messages, report), report, allow_pending_tail)
    return report.ordered()


# ---------------------------------------------------------------------------------------------
# Normalized form shared by both converters: calls, results and "other" content, each tagged
# with the view position of the message it came from.


class _Absent:
    """Marks a field the message does not carry (distinct from an explicit ``None``)."""

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Final = _Absent()


@dataclass(frozen=True)
class _Call:
    """A tool call (OpenAI/Amplifier ``tool_calls`` entry, or a tool_use/tool_call block)."""

    id: object
    position: int


@dataclass(frozen=True)
class _Result:
    """A tool result (``role: tool`` message or ``tool_result`` block)."""

    id: object
    position: int
    content: object = _ABSENT
    is_error: object = _ABSENT


@dataclass(frozen=True)
class _Other:
    """Any content that is neither a call nor a result (text, images, thinking...)."""

    position: int


_Block: TypeAlias = _Call | _Result | _Other


@dataclass
class _OpenAIMessage:
    """One Chat Completions message after conversion; only the tool structure is kept."""

    role: str
    position: int
    calls: list[_Call] = field(default_factory=list)
    result: _Result | None = None  # set exactly when role == "tool"


@dataclass
class _Turn:
    """One Messages API turn after hoisting, conversion and merging."""

    role: Literal["user", "assistant"]
    position: int  # view index of the first message merged into this turn
    blocks: list[_Block] = field(default_factory=list)


class _Report:
    """Collects violations; ``ordered`` sorts them by position, keeping detection order."""

    def __init__(self, dialect: str) -> None:
        self._dialect = dialect
        self._found: list[ProviderRuleError] = []

    def add(self, code: str, position: int | None, detail: str) -> None:
        assert code in CODES, code
        self._found.append(ProviderRuleError(self._dialect, code, position, detail))

    def ordered(self) -> list[ProviderRuleError]:
        return sorted(self._found, key=lambda e: -1 if e.position is None else e.position)


# ---------------------------------------------------------------------------------------------
# Reading messages and blocks.


def _get(obj: object, name: str) -> object:
    """A field of a mapping or an attribute of an object; ``_ABSENT`` when missing."""
    if isinstance(obj, Mapping):
        return obj.get(name, _ABSENT)
    return getattr(obj, name, _ABSENT)


def _given(value: object) -> bool:
    """Present and not ``None`` (adapters drop ``None`` fields)."""
    return value is not _ABSENT and value is not None


def _is_sequence(value: object) -> bool:
    """A JSON array as a Python caller writes one: a list or a tuple."""
    return isinstance(value, list | tuple)


def _blocks(content: object) -> list[object]:
    """A message's content as a list of blocks: a string is one text block."""
    if isinstance(content, str):
        return [content] if content else []
    if _is_sequence(content):
        assert isinstance(content, list | tuple)
        return list(content)
    return [] if not _given(content) else [content]


def _block_type(block: object) -> object:
    return "text" if isinstance(block, str) else _get(block, "type")


def _result_from_block(block: object, position: int) -> _Result:
    """A ``tool_result`` block; its id is ``tool_use_id`` (Anthropic) or ``tool_call_id``."""
    result_id = _get(block, "tool_use_id")
    if not _given(result_id):
        result_id = _get(block, "tool_call_id")
    content = _get(block, "content")
    if not _given(content) and _given(_get(block, "output")):
        content = ""  # amplifier-core's ``output``: the adapter serialises it to a string
    return _Result(result_id, position, content, _get(block, "is_error"))


def _well_formed(view: object, report: _Report) -> list[tuple[int, Mapping[str, Any]]] | None:
    """The messages that have the basic shape, with their view positions; ``None`` if no list."""
    if not _is_sequence(view):
        report.add("not-a-list", None, f"the view is a {type(view).__name__}, not a list")
        return None
    assert isinstance(view, list | tuple)
    messages: list[tuple[int, Mapping[str, Any]]] = []
    for position, message in enumerate(view):
        if not isinstance(message, Mapping):
            report.add("not-a-dict", position, f"message is a {type(message).__name__}")
        elif not isinstance(message.get("role"), str):
            report.add("no-role", position, f"role is {message.get('role')!r}, not a string")
        else:
            messages.append((position, message))
    return messages


def _assistant_calls(message: Mapping[str, Any], position: int, report: _Report) -> list[_Call]:
    """An assistant message's calls: content blocks first, then ``tool_calls`` entries.

    The same id in both places is one call written twice (adapters emit it once); a repeat
    within one representation is kept so the checker reports it.
    """
    from_blocks = [
        _Call(_get(block, "id"), position)
        for block in _blocks(message.get("content"))
        if _block_type(block) in _CALL_BLOCK_TYPES
    ]
    tool_calls = message.get("tool_calls")
    from_entries: list[_Call] = []
    if _is_sequence(tool_calls):
        assert isinstance(tool_calls, list | tuple)
        from_entries = [_Call(_get(entry, "id"), position) for entry in tool_calls]
    elif _given(tool_calls):
        report.add("bad-tool-calls", position, f"tool_calls is a {type(tool_calls).__name__}")
    written_as_blocks = {call.id for call in from_blocks if isinstance(call.id, str)}
    return from_blocks + [call for call in from_entries if call.id not in written_as_blocks]


def _report_results_in_assistant(
    message: Mapping[str, Any], position: int, report: _Report
) -> None:
    for block in _blocks(message.get("content")):
        if _block_type(block) == _RESULT_BLOCK_TYPE:
            result = _result_from_block(block, position)
            report.add(
                "orphan-result",
                position,
                f"tool_result {result.id!r} sits in an assistant message, answering no call",
            )


# ---------------------------------------------------------------------------------------------
# OpenAI Chat Completions.


def _is_media(part: object) -> bool:
    """A well-formed non-text content part (junk stays put, to be reported)."""
    kind = _get(part, "type")
    return isinstance(kind, str) and bool(kind) and kind != "text"


def _to_openai(
    messages: list[tuple[int, Mapping[str, Any]]], report: _Report
) -> list[_OpenAIMessage]:
    """Convert as a Chat Completions adapter does (see the module docstring)."""
    converted: list[_OpenAIMessage] = []
    for position, message in messages:
        role: str = message["role"]
        if role == "assistant":
            calls = _assistant_calls(message, position, report)
            _report_results_in_assistant(message, position, report)
            converted.append(_OpenAIMessage(role, position, calls=calls))
        elif role == "tool":
            result = _Result(message.get("tool_call_id", _ABSENT), position, message.get("content"))
            converted.append(_OpenAIMessage(role, position, result=result))
        elif role == "user":
            rest: list[object] = []
            for block in _blocks(message.get("content")):
                if _block_type(block) != _RESULT_BLOCK_TYPE:
                    rest.append(block)
                    continue
                result = _result_from_block(block, position)
                if not _given(result.content):
                    # The adapter must send some content; it sends an empty string.
                    result = _Result(result.id, position, "", result.is_error)
                elif _is_sequence(result.content):
                    # Tool messages take only text parts: an adapter sends the other parts
                    # of an Anthropic result (images, documents) in the user message that
                    # follows the tool messages.
                    parts = list(result.content)  # type: ignore[call-overload]  # a list/tuple
                    moved = [part for part in parts if _is_media(part)]
                    kept = [part for part in parts if not _is_media(part)]
                    rest.extend(moved)
                    result = _Result(result.id, position, kept or "", result.is_error)
                converted.append(_OpenAIMessage("tool", position, result=result))
            if rest or not _blocks(message.get("content")):
                converted.append(_OpenAIMessage(role, position))
        else:
            converted.append(_OpenAIMessage(role, position))
    return converted


def _check_openai(
    messages: list[_OpenAIMessage], report: _Report, allow_pending_tail: bool
) -> None:
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.role == "tool":
            # A tool message not consumed by a run: nothing with tool_calls precedes it.
            _check_openai_result(message, frozenset(), set(), report)
            index += 1
            continue
        if message.role != "assistant" or not message.calls:
            index += 1
            continue
        wanted = _valid_call_ids(message.calls, report, seen=set())
        answered: set[str] = set()
        run_end = index + 1
        while run_end < len(messages) and messages[run_end].role == "tool":
            _check_openai_result(messages[run_end], frozenset(wanted), answered, report)
            run_end += 1
        missing = [call_id for call_id in wanted if call_id not in answered]
        pending = allow_pending_tail and run_end == len(messages)
        if missing and not pending:
            report.add(
                "missing-result",
                message.position,
                f"tool_calls {missing} have no tool message in the run that follows",
            )
        index = run_end


def _check_openai_result(
    message: _OpenAIMessage, wanted: frozenset[str], answered: set[str], report: _Report
) -> None:
    """Check one tool message against the calls of the assistant message opening its run."""
    result = message.result
    assert result is not None
    _check_openai_content(result, report)
    if not _valid_id(result.id):
        report.add(
            "bad-id", result.position, f"tool_call_id {result.id!r} is not a non-empty string"
        )
    elif result.id in answered:
        report.add("duplicate-result", result.position, f"second response to {result.id!r}")
    elif result.id not in wanted:
        report.add(
            "orphan-result",
            result.position,
            f"tool message answers {result.id!r}, which is not a tool_call of the assistant "
            "message right before its run of tool messages",
        )
    else:
        answered.add(result.id)


def _check_openai_content(result: _Result, report: _Report) -> None:
    content = result.content
    if isinstance(content, str):
        return
    if not _is_sequence(content):
        report.add(
            "bad-result-content",
            result.position,
            f"tool message content is {type(content).__name__}, not a string or a list of parts",
        )
        return
    assert isinstance(content, list | tuple)
    for number, part in enumerate(content):
        part_type = _get(part, "type")
        if part_type != "text":
            report.add(
                "bad-result-content",
                result.position,
                f"tool message content part {number} has type {part_type!r}; "
                "tool messages take only text parts",
            )
        elif not isinstance(_get(part, "text"), str):
            report.add(
                "bad-result-content",
                result.position,
                f"tool message text part {number} has no string text",
            )


# ---------------------------------------------------------------------------------------------
# Anthropic Messages.


def _to_anthropic(messages: list[tuple[int, Mapping[str, Any]]], report: _Report) -> list[_Turn]:
    """Convert and merge as a Messages adapter and the API do (see the module docstring)."""
    turns: list[_Turn] = []
    for position, message in messages:
        role: str = message["role"]
        if role in _HOISTED_ROLES:
            continue  # sent as the top-level ``system`` parameter
        blocks: list[_Block]
        turn_role: Literal["user", "assistant"]
        if role == "assistant":
            turn_role = "assistant"
            _report_results_in_assistant(message, position, report)
            others: list[_Block] = [
                _Other(position)
                for block in _blocks(message.get("content"))
                if _block_type(block) not in _CALL_BLOCK_TYPES | {_RESULT_BLOCK_TYPE}
            ]
            # tool_use blocks go after the text. No rule depends on where text sits in an
            # assistant turn, so block calls may move there too; only their order matters.
            blocks = [*others, *_assistant_calls(message, position, report)]
        elif role == "tool":
            turn_role = "user"
            blocks = [
                _Result(message.get("tool_call_id", _ABSENT), position, message.get("content"))
            ]
        else:
            turn_role = "user"
            blocks = [
                _result_from_block(block, position)
                if _block_type(block) == _RESULT_BLOCK_TYPE
                else _Other(position)
                for block in _blocks(message.get("content"))
            ]
        if turns and turns[-1].role == turn_role:
            turns[-1].blocks.extend(blocks)
        else:
            turns.append(_Turn(turn_role, position, blocks))
    return turns


def _check_anthropic(turns: list[_Turn], report: _Report, allow_pending_tail: bool) -> None:
    seen_call_ids: set[str] = set()
    for number, turn in enumerate(turns):
        if turn.role == "assistant":
            calls = [block for block in turn.blocks if isinstance(block, _Call)]
            wanted = _valid_call_ids(calls, report, seen=seen_call_ids)
            if wanted:
                following = turns[number + 1] if number + 1 < len(turns) else None
                is_last = number + 2 == len(turns)
                _check_answered(calls, wanted, following, is_last, report, allow_pending_tail)
        else:
            previous = turns[number - 1] if number > 0 else None
            _check_anthropic_results(turn, previous, report)


def _check_answered(
    calls: list[_Call],
    wanted: list[str],
    following: _Turn | None,
    following_is_last: bool,
    report: _Report,
    allow_pending_tail: bool,
) -> None:
    """Each tool_use of an assistant turn has its result at the head of the next user turn."""
    first_call = calls[0].position
    if following is None:
        if not allow_pending_tail:
            report.add("missing-result", first_call, f"tool_use ids {wanted} have no tool_result")
        return
    results = [block for block in following.blocks if isinstance(block, _Result)]
    present = {result.id for result in results if isinstance(result.id, str)}
    missing = [call_id for call_id in wanted if call_id not in present]
    # Pending tail: the orchestrator is still running these tools and has appended only
    # the results it already has.
    only_results = len(results) == len(following.blocks)
    if missing and not (allow_pending_tail and following_is_last and only_results):
        report.add(
            "missing-result",
            first_call,
            f"tool_use ids {missing} have no tool_result in the next user turn",
        )
    # The next turn must *begin* with the results: any of them after other content is late.
    leading = 0
    while leading < len(following.blocks) and isinstance(following.blocks[leading], _Result):
        leading += 1
    for block in following.blocks[leading:]:
        if isinstance(block, _Result) and block.id in wanted:
            report.add(
                "results-not-first",
                block.position,
                f"tool_result {block.id!r} comes after other content in its user turn; "
                f"the turn must begin with its {len(wanted)} tool_result block(s)",
            )
            break


def _check_anthropic_results(turn: _Turn, previous: _Turn | None, report: _Report) -> None:
    """Each tool_result of a user turn answers a tool_use of the turn right before, once."""
    allowed: set[str] = set()
    if previous is not None and previous.role == "assistant":
        allowed = {
            block.id
            for block in previous.blocks
            if isinstance(block, _Call) and isinstance(block.id, str)
        }
    answered: set[str] = set()
    for block in turn.blocks:
        if not isinstance(block, _Result):
            continue
        _check_anthropic_content(block, report)
        if not _valid_id(block.id):
            report.add(
                "bad-id", block.position, f"tool_use_id {block.id!r} is not a non-empty string"
            )
        elif block.id in answered:
            report.add("duplicate-result", block.position, f"second tool_result for {block.id!r}")
        elif block.id not in allowed:
            report.add(
                "orphan-result",
                block.position,
                f"tool_result {block.id!r} answers no tool_use of the previous assistant turn",
            )
        else:
            answered.add(block.id)


def _check_anthropic_content(result: _Result, report: _Report) -> None:
    if _given(result.is_error) and not isinstance(result.is_error, bool):
        report.add("bad-is-error", result.position, f"is_error is {result.is_error!r}, not a bool")
    content = result.content
    if not _given(content) or isinstance(content, str):
        return  # content is optional
    if not _is_sequence(content):
        report.add(
            "bad-result-content",
            result.position,
            f"tool_result content is {type(content).__name__}, not a string or a list of blocks",
        )
        return
    assert isinstance(content, list | tuple)
    for number, block in enumerate(content):
        block_type = _get(block, "type")
        if not isinstance(block_type, str):
            report.add(
                "bad-result-content",
                result.position,
                f"tool_result content block {number} has no string type",
            )
        elif block_type == "text" and not isinstance(_get(block, "text"), str):
            report.add(
                "bad-result-content",
                result.position,
                f"tool_result text block {number} has no string text",
            )


# ---------------------------------------------------------------------------------------------
# Shared id checks.


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _valid_call_ids(calls: list[_Call], report: _Report, *, seen: set[str]) -> list[str]:
    """The well-formed, first-seen call ids in order; reports bad and repeated ids.

    ``seen`` is shared across the whole request for Anthropic (ids unique per request) and
    fresh per message for OpenAI (ids unique per assistant message).
    """
    wanted: list[str] = []
    for call in calls:
        if not _valid_id(call.id):
            report.add(
                "bad-id", call.position, f"tool call id {call.id!r} is not a non-empty string"
            )
            continue
        assert isinstance(call.id, str)
        if call.id in seen:
            report.add("duplicate-call-id", call.position, f"tool call id {call.id!r} repeats")
            continue
        seen.add(call.id)
        wanted.append(call.id)
    return wanted
