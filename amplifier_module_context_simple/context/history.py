"""The canonical history: admitted messages, append-only between resets.

Admission validates a message's shape, applies the tool-result ingress cap, stamps a
sequence id (kept out of every provider-facing view) and a timestamp, classifies it and
estimates its tokens once. Tool groups are linked at admission, by id, in every format: a
result is attached to the latest earlier message that declared its call id; a result with
no earlier call is an orphan and never reaches a view (a provider rejects it).

``History`` is a plain synchronous object; ``admit_batch`` builds the whole new state
before anything is swapped in, so a rejected batch leaves the previous history intact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errors import InvalidMessageError
from .classify import (
    PUBLIC_METADATA_KEYS,
    MessageInfo,
    block_field,
    block_id,
    block_type,
    classify,
    has_anonymous_results,
)
from .estimate import estimate_message
from .ingress import IngressClip, cap_tool_result

SEQ_KEY = "_seq"
_VALID_CONTENT = (str, list)


@dataclass(frozen=True, slots=True)
class Entry:
    """One admitted message and everything decided about it at admission."""

    seq: int
    stored: dict[str, Any]
    """The message as admitted (metadata carries ``_seq``); never mutated."""
    public: dict[str, Any] | None
    """The provider-facing form (no ``_seq``, no history-only keys, no orphan results);
    None when the message never reaches a view (reference-only row, orphan result)."""
    info: MessageInfo
    tokens: int
    kind: int
    """How views use it: ``SKIP``, ``BODY``, ``SYSTEM`` or ``HOOK_SYSTEM``."""
    has_metadata: bool
    """Whether the public form has a metadata dict (views copy it)."""


SKIP, BODY, SYSTEM, HOOK_SYSTEM = range(4)


def _kind(info: MessageInfo, public: Mapping[str, Any] | None) -> int:
    if public is None:
        return SKIP
    if info.is_hook_system:
        return HOOK_SYSTEM
    return SYSTEM if info.is_system else BODY


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def validate_message(message: object, index: int | None = None) -> Mapping[str, Any]:
    """Check the shape admission relies on; raise ``InvalidMessageError`` otherwise."""
    if not isinstance(message, Mapping):
        raise InvalidMessageError(
            f"a message must be a dict, got {type(message).__name__}", index=index
        )
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidMessageError(
            f"a message needs a non-empty string 'role', got {role!r}", index=index
        )
    metadata = message.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidMessageError(
            f"'metadata' must be a dict when present, got {type(metadata).__name__}",
            index=index,
        )
    content = message.get("content")
    if content is not None and not isinstance(content, _VALID_CONTENT):
        raise InvalidMessageError(
            f"'content' must be a string, a list of blocks or null, got {type(content).__name__}",
            index=index,
        )
    calls = message.get("tool_calls")
    if calls is not None and not (
        isinstance(calls, list) and all(isinstance(c, Mapping) for c in calls)
    ):
        raise InvalidMessageError("'tool_calls' must be a list of dicts when present", index=index)
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidMessageError(
            f"'tool_call_id' must be a string, got {type(call_id).__name__}", index=index
        )
    for call in calls or ():
        for key in ("id", "tool_call_id"):
            if call.get(key) is not None and not isinstance(call.get(key), str):
                raise InvalidMessageError(f"tool call {key!r} must be a string", index=index)
    if isinstance(content, list):
        for position, block in enumerate(content):
            _validate_block(block, position, index)
        if role == "system" and any(
            block_type(block) in ("tool_result", "tool_use", "tool_call") for block in content
        ):
            # system messages are hoisted to the front of every view: a tool block there
            # would stand before the call it answers (or answer nothing)
            raise InvalidMessageError(
                "a system message cannot carry tool_use/tool_result blocks", index=index
            )
    return message


def _validate_block(block: object, position: int, index: int | None) -> None:
    """A block's ``type`` and tool ids, when present, are strings (unknown blocks pass)."""
    kind = block_field(block, "type")
    if kind is not None and not isinstance(kind, str):
        raise InvalidMessageError(
            f"content block {position}: 'type' must be a string, got {kind!r}", index=index
        )
    for key in ("id", "tool_use_id", "tool_call_id"):
        value = block_field(block, key)
        if value is not None and not isinstance(value, str):
            raise InvalidMessageError(
                f"content block {position}: {key!r} must be a string, got {value!r}", index=index
            )


def public_form(admitted: Mapping[str, Any], drop_results: frozenset[str]) -> dict[str, Any]:
    """The provider-facing form of a message, built once at admission.

    It is the message as the caller gave it (after the ingress cap): our bookkeeping
    (the sequence id, the timestamp we stamp) stays in the stored history only, and the
    history-only ``amplifier_public_*`` keys are dropped. A message that came without
    metadata has none in its views, so building a view copies one dict per message.
    """
    message = dict(admitted)
    metadata = message.get("metadata")
    if isinstance(metadata, Mapping):
        message["metadata"] = {
            k: v for k, v in metadata.items() if k != SEQ_KEY and k not in PUBLIC_METADATA_KEYS
        }
    if isinstance(admitted.get("content"), list) and (
        drop_results or has_anonymous_results(admitted)
    ):
        message["content"] = [
            block
            for block in admitted["content"]
            if block_type(block) != "tool_result"
            or block_id(block, "tool_use_id", "tool_call_id") not in drop_results | {None}
        ]
    return message


def copy_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with a new metadata dict; nested values are shared (read-only by contract)."""
    copied = dict(message)
    metadata = copied.get("metadata")
    if isinstance(metadata, dict):
        copied["metadata"] = metadata.copy()
    return copied


@dataclass(slots=True)
class History:
    """Admitted entries plus the tool-group links between them."""

    entries: list[Entry] = field(default_factory=list)
    next_seq: int = 0
    # call id -> seq of the latest message that declared it
    _call_owner: dict[str, int] = field(default_factory=dict)
    # union-find over seqs: messages linked through tool ids form one group
    _parent: dict[int, int] = field(default_factory=dict)
    # assistant seq -> ids of its calls that no admitted result answers yet
    unanswered: dict[int, set[str]] = field(default_factory=dict)
    first_human: int | None = None
    last_human: int | None = None
    # reminder body -> seq of the newest persisted envelope carrying it
    latest_envelope: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)

    def group_of(self, seq: int) -> int:
        """The representative seq of the tool group ``seq`` belongs to (itself if none)."""
        parent = self._parent
        root = seq
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(seq, seq) != root:  # path compression
            parent[seq], seq = root, parent[seq]
        return root

    def admit(
        self, message: Mapping[str, Any], *, max_tool_result_bytes: int, stamp_time: bool
    ) -> tuple[Entry, IngressClip | None]:
        """Admit one validated message; return its entry and any ingress clip."""
        capped, clip = cap_tool_result(message, max_tool_result_bytes)
        seq = self.next_seq
        metadata = dict(capped.get("metadata") or {})
        if stamp_time and "timestamp" not in metadata:
            metadata["timestamp"] = utc_timestamp()
        metadata[SEQ_KEY] = seq
        stored = {**capped, "metadata": metadata}
        info = classify(stored)
        # Everything that can fail happens before the first mutation of the history.
        # Results that answer no earlier call (orphans, or results naming no call at all)
        # never reach a view: a provider rejects a result without its call.
        orphans = frozenset(i for i in info.result_ids if i not in self._call_owner)
        anonymous = has_anonymous_results(capped)
        public: dict[str, Any] | None
        if info.reference_only or (info.is_result_carrier and orphans == set(info.result_ids)):
            public = None
        elif (orphans or anonymous) and isinstance(capped.get("content"), list):
            public = public_form(capped, orphans)
            if not public["content"]:
                public = None
        else:
            public = public_form(capped, frozenset())
        tokens = estimate_message(public) if public is not None else 0
        if public is not None:
            # A message no view shows (a reference-only row, an orphan) declares and
            # answers nothing: linking it would show a result whose call is never shown.
            self._link(seq, info)
        if public is not None and info.is_human:
            if self.first_human is None:
                self.first_human = seq
            self.last_human = seq
        if public is not None and info.is_envelope:
            self.latest_envelope[stored["content"]] = seq
        entry = Entry(
            seq=seq,
            stored=stored,
            public=public,
            info=info,
            tokens=tokens,
            kind=_kind(info, public),
            has_metadata=public is not None and isinstance(public.get("metadata"), dict),
        )
        self.entries.append(entry)
        self.next_seq = seq + 1
        return entry, clip

    def _link(self, seq: int, info: MessageInfo) -> None:
        """Attach results to their calls (orphan results stay unlinked)."""
        for call_id in info.result_ids:
            owner = self._call_owner.get(call_id)
            if owner is not None:
                self._union(owner, seq)
                self.unanswered.get(owner, set()).discard(call_id)
        if info.call_ids:
            for call_id in info.call_ids:
                self._call_owner[call_id] = seq
            self.unanswered[seq] = set(info.call_ids)

    def _union(self, a: int, b: int) -> None:
        ra, rb = self.group_of(a), self.group_of(b)
        if ra != rb:
            # the earlier message is the representative, so a group is named by its call
            self._parent[max(ra, rb)] = min(ra, rb)


def build_history(
    messages: Iterable[object], *, max_tool_result_bytes: int
) -> tuple[History, list[IngressClip]]:
    """Validate and admit a whole batch into a fresh ``History`` (no timestamps added).

    Raises:
        InvalidMessageError: naming the index of the first bad message; nothing is built.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise InvalidMessageError(
            f"set_messages needs a list of message dicts, got {type(messages).__name__}"
        )
    items: Sequence[object] = list(messages)
    for index, message in enumerate(items):
        validate_message(message, index)
    history = History()
    clips: list[IngressClip] = []
    for message in items:
        _, clip = history.admit(
            message,  # type: ignore[arg-type]
            max_tool_result_bytes=max_tool_result_bytes,
            stamp_time=False,
        )
        if clip is not None:
            clips.append(clip)
    return history, clips
