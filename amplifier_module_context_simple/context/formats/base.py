"""Reading content blocks, and what every tool-call format class provides.

A content block (and a tool call in a message's call list) may be a dict or a model
object (amplifier-core's pydantic blocks); the readers here accept both. ``ToolFormat``
is the base of the format classes: its class attributes name the carriers a format owns
(each carrier has exactly one owner, see ``formats/__init__.py``), and its methods hold
the rules a format shares with the others unless it says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final, Protocol, TypeGuard

__all__ = (
    "Counter",
    "Note",
    "ToolFormat",
    "as_plain",
    "block_field",
    "block_id",
    "block_type",
    "is_mapping",
    "rebuildable",
    "renamed_block",
    "with_field",
)


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, with plain dicts (nearly every value) checked first:
    an ABC check costs several times a type comparison, per block of every message."""
    return type(value) is dict or isinstance(value, Mapping)


def block_field(block: object, key: str) -> Any:
    """Read ``key`` from a content block given as a dict or as a model object."""
    if type(block) is dict or isinstance(block, Mapping):
        return block.get(key)
    return getattr(block, key, None)


def block_type(block: object) -> str | None:
    """A content block's ``type`` when it is a string (junk types read as None)."""
    value = block_field(block, "type")
    return value if isinstance(value, str) else None


def block_id(block: object, *keys: str) -> str | None:
    """The first non-empty string among ``keys`` of a block (junk ids read as None)."""
    if type(block) is dict:
        for key in keys:
            value = block.get(key)
            if isinstance(value, str) and value:
                return value
        return None
    for key in keys:
        value = block_field(block, key)
        if isinstance(value, str) and value:
            return value
    return None


def rebuildable(block: object) -> bool:
    """Whether a changed copy of ``block`` can be made (a mapping, or has ``model_copy``)."""
    return isinstance(block, Mapping) or callable(getattr(block, "model_copy", None))


def with_field(block: object, key: str, value: object) -> object:
    """A copy of a ``rebuildable`` block with ``key`` set to ``value`` (input unchanged)."""
    if isinstance(block, Mapping):
        return {**block, key: value}
    return block.model_copy(update={key: value})  # type: ignore[attr-defined]  # has model_copy


def renamed_block(block: object, keys: tuple[str, ...], renames: Mapping[str, str]) -> object:
    """``block`` with the ids under ``keys`` that ``renames`` names renamed (a copy if any
    is; a model object without ``model_copy`` stays as it is)."""
    if not isinstance(block, Mapping):
        update = {
            key: renames[value]
            for key in keys
            if isinstance(value := block_field(block, key), str) and value in renames
        }
        copy = getattr(block, "model_copy", None)
        return copy(update=update) if update and callable(copy) else block
    changed = {key: renames[block[key]] for key in keys if block.get(key) in renames}
    return {**block, **changed} if changed else block


_PLAIN: Final = frozenset({str, list, tuple, dict, type(None)})
"""Types read as they are (checked by exact type first: ABC checks cost per message)."""


def as_plain(value: Any) -> Any:
    """Pydantic-like objects (``model_dump``) as plain dicts; anything else unchanged."""
    if type(value) in _PLAIN:
        return value
    if not isinstance(value, Mapping | str | list | tuple) and value is not None:
        dump = getattr(value, "model_dump", None)
        if callable(dump):
            try:
                return dump()
            except Exception:
                return value
    return value


class Counter(Protocol):
    """What a format's estimate rules feed: the token estimator's collector."""

    listed_calls: frozenset[str]

    def value(self, value: Any) -> None:
        """Any value as text (strings as they are, everything else as JSON)."""

    def call_id(self, value: Any) -> None:
        """A call id, counted as the text it is."""

    def content(self, content: Any, depth: int) -> None:
        """A result's content (a string, blocks, nested lists), counted as a message's."""

    def call(self) -> None:
        """The framing of one tool call (on top of its id, name and arguments)."""


Note = Callable[[Sequence[str]], dict[str, Any]]
"""The metadata of a synthesized message answering the given (shown) ids."""


class ToolFormat:
    """One wire format's tool calls and results: where they live and how they are read,
    renamed, reduced, counted and answered. Subclasses set the carriers they own."""

    name: ClassVar[str]
    calls_key: ClassVar[str | None] = None
    """The message-level list of calls an assistant message carries, if any."""
    result_role: ClassVar[str | None] = None
    """A role whose message is one tool result as a whole, if any."""
    result_id_key: ClassVar[str | None] = None
    """Where such a message names the call it answers."""
    call_block_types: ClassVar[frozenset[str]] = frozenset()
    """Content block types that are calls (in an assistant message)."""
    result_block_types: ClassVar[frozenset[str]] = frozenset()
    """Content block types that are results (in a non-assistant message)."""
    result_block_roles: ClassVar[tuple[str, ...]] = ()
    """The roles that may carry this format's result blocks."""
    call_id_keys: ClassVar[tuple[str, ...]] = ("id",)
    """Where a call (list entry or block) holds its id, first non-empty string wins."""
    result_id_keys: ClassVar[tuple[str, ...]] = ()
    """Where a result block names the call it answers, first non-empty string wins."""
    block_clip_kind: ClassVar[str] = ""
    """The ingress event's ``content_kind`` for a message whose result blocks were clipped."""

    # -- ids ---------------------------------------------------------------------------

    def call_id(self, call: object) -> str | None:
        """The id of one call (list entry or call block), None if it has none."""
        return block_id(call, *self.call_id_keys)

    def result_block_id(self, block: object) -> str | None:
        """The call id one result block answers, None if it names none."""
        return block_id(block, *self.result_id_keys)

    def message_result_id(self, message: Mapping[str, Any]) -> str | None:
        """The call id a whole-message result answers, None if it names none."""
        if self.result_id_key is None:
            return None
        call_id = message.get(self.result_id_key)
        return call_id if isinstance(call_id, str) and call_id else None

    def renamed_call(self, call: object, renames: Mapping[str, str]) -> object:
        return renamed_block(call, self.call_id_keys, renames)

    def renamed_result_block(self, block: object, renames: Mapping[str, str]) -> object:
        return renamed_block(block, self.result_id_keys, renames)

    def rename_message_result(
        self, renamed: dict[str, Any], message: Mapping[str, Any], renames: Mapping[str, str]
    ) -> None:
        """Rename, in ``renamed`` (a copy of ``message``), the id a message-level result
        field names."""
        if self.result_id_key is None:
            return
        call_id = message.get(self.result_id_key)
        if isinstance(call_id, str) and call_id in renames:
            renamed[self.result_id_key] = renames[call_id]

    # -- what a call says -------------------------------------------------------------

    def call_name(self, call: object) -> str | None:
        """The tool a call names, for the text of its synthesized result."""
        for value in (
            block_field(block_field(call, "function"), "name"),
            block_field(call, "tool"),
            block_field(call, "name"),
        ):
            if isinstance(value, str) and value:
                return value
        return None

    def call_fact(self, call: object) -> tuple[object, object]:
        """The name and arguments the compaction notice lists for one call block."""
        arguments = block_field(call, "input")
        return (
            block_field(call, "name"),
            arguments if arguments is not None else block_field(call, "arguments"),
        )

    # -- results in place -------------------------------------------------------------

    def block_result_content(self, block: object) -> object:
        """A result block's content (where its text lives)."""
        return block_field(block, "content")

    def with_block_result_content(self, block: object, content: object) -> object:
        """A copy of a (``rebuildable``) result block holding ``content`` instead."""
        return with_field(block, "content", content)

    def message_result_content(self, message: Mapping[str, Any]) -> object:
        """A whole-message result's content (where its text lives)."""
        return message.get("content")

    def with_message_result_content(
        self, message: Mapping[str, Any], content: object
    ) -> dict[str, Any]:
        """A copy of a whole-message result holding ``content`` instead."""
        return {**message, "content": content}

    def message_result_id_field(self, message: Mapping[str, Any]) -> object:
        """The raw value a whole-message result names its call by (junk included)."""
        return message.get(self.result_id_key) if self.result_id_key is not None else None

    def block_result_name(self, block: object) -> object:
        """The tool name a result block records, as the ingress event reports it."""
        return block_field(block, "name")

    def message_result_name(self, message: Mapping[str, Any]) -> object:
        """The tool name a whole-message result records, as the ingress event reports it."""
        return message.get("name")

    def message_clip_kind(self, content: object) -> str:
        """The ingress event's ``content_kind`` for a clipped whole-message result."""
        return "string" if isinstance(content, str) else "text_blocks"

    # -- synthesized results ----------------------------------------------------------

    @property
    def answered_by(self) -> ToolFormat:
        """The format whose results answer this format's calls."""
        return self

    def synthesized(self, answers: Sequence[tuple[str, str]], note: Note) -> list[dict[str, Any]]:
        """The messages answering ``answers`` ((shown id, text) pairs, in call order)."""
        raise NotImplementedError(f"{self.name} does not answer calls itself")

    # -- estimates ----------------------------------------------------------------------

    def count_message_fields(self, counter: Counter, message: Mapping[str, Any]) -> None:
        """Count the message-level result id this format puts on a message, if any."""

    def count_calls(self, counter: Counter, message: Mapping[str, Any]) -> None:
        """Count the message-level list of calls this format puts on a message, if any."""

    def count_block(self, counter: Counter, block: Mapping[str, Any], depth: int) -> None:
        """Count one of this format's call or result blocks."""

    # -- validation ---------------------------------------------------------------------

    def check_message_fields(self, message: Mapping[str, Any]) -> str | None:
        """What is wrong with this format's message-level fields, or None."""
        return None
