"""Admitted entries: what admission decides about one message, and its forms.

An ``Entry`` is one admitted message with everything decided about it at admission; its
*given* form is the message as the caller gave it (after the ingress cap), its *public*
form the provider-facing one (``public_form``), its *stored* form what ``get_messages``
returns (``stored_form``). ``Synthesized`` holds the results views supply for calls a
later turn left unanswered; ``History.order`` stands for them by ``synthesized_marker``.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import compress, count
from operator import ne
from typing import Any, Final, NamedTuple

from ..formats import is_mapping, results_first
from .classify import PUBLIC_METADATA_KEYS, MessageInfo, with_ids, without_ids

__all__ = (
    "BODY",
    "HOOK_SYSTEM",
    "SEQ_KEY",
    "SKIP",
    "SYSTEM",
    "Entries",
    "Entry",
    "EntryKind",
    "Synthesized",
    "as_seen",
    "copy_message",
    "first_difference",
    "given_form",
    "make_entry",
    "marker_owner",
    "own_copy",
    "public_form",
    "public_of",
    "stored_form",
    "synthesized_marker",
    "utc_timestamp",
)


SEQ_KEY = "_seq"


class Entry(NamedTuple):
    """One admitted message and everything decided about it at admission.

    A named tuple, cheap to build: admission builds one per message and ``Entries``
    (which records it as columns) builds one on access.
    """

    seq: int
    given: dict[str, Any]
    """The message as the caller gave it, after the ingress cap; never mutated. Its
    top-level and metadata dicts are the store's own (the public form itself when the two
    are equal); nested values are shared with the caller (read-only by contract)."""
    timestamp: str | None
    """The admission time ``add_message`` stamped (None when it added none)."""
    public: dict[str, Any] | None
    """The provider-facing form (no ``_seq``, no history-only keys, no orphan results);
    None when the message never reaches a view (reference-only row, orphan result)."""
    info: MessageInfo
    tokens: int
    kind: EntryKind
    """How views use it."""
    has_metadata: bool
    """Whether the public form has a metadata dict (views copy it)."""

    @property
    def stored(self) -> dict[str, Any]:
        """The message as ``get_messages`` returns it (see ``stored_form``)."""
        return stored_form(self)


def stored_form(entry: Entry) -> dict[str, Any]:
    """``entry``'s message as ``get_messages`` returns it: as given, its metadata carrying
    ``_seq`` (and the stamped timestamp). A new dict, with a new metadata dict.

    A plain function, mapped over the history by ``get_messages`` and by ``History.starts``
    (a property costs one more call per message).
    """
    return _stored(entry.seq, entry.given, entry.timestamp)


def _stored(seq: int, given: dict[str, Any], timestamp: str | None) -> dict[str, Any]:
    given_metadata = given.get("metadata")
    # Keys in the order the message had them, then the stamped timestamp, then _seq.
    if given_metadata:
        metadata = dict(given_metadata)
        if timestamp is not None:
            metadata["timestamp"] = timestamp
        metadata[SEQ_KEY] = seq
    elif timestamp is None:
        metadata = {SEQ_KEY: seq}
    else:
        metadata = {"timestamp": timestamp, SEQ_KEY: seq}
    stored = given.copy()
    stored["metadata"] = metadata
    return stored


make_entry: Final = partial(tuple.__new__, Entry)
"""``Entry`` from all its fields in order: without ``__new__``'s argument binding."""


class Entries:
    """The admitted entries, held as columns: one slot per message in each.

    A history of many thousands of messages is long-lived, so what it holds per message is
    what the interpreter's collector walks on every full collection. As columns, the
    entries add no collector-tracked object of their own per message: the per-message
    values are the public form and untracked numbers and flags, the message's kind among
    them (a number into ``kind_table``: one ``MessageInfo`` without ids per kind of
    message, shared). The rest is sparse, in
    dicts keyed by seq: the caller's message as given (the store's own copy of its top
    level) only where it is not the public form itself (most messages have one dict for
    both), the stamped timestamps (strings: a dict of them is not tracked), and the call
    and result ids of the messages that have some (tuples of strings: once the collector
    has stopped tracking them, it stops tracking the dict too). An ``Entry`` (and a
    message's whole ``MessageInfo``) is built on access; the hot paths (rendering, the
    ladder, the extension check) read the columns.
    """

    __slots__ = (
        "_given",
        "_shared",
        "call_ids",
        "has_metadata",
        "kind_codes",
        "kind_table",
        "kinds",
        "public",
        "result_ids",
        "timestamps",
        "tokens",
    )

    def __init__(self) -> None:
        self.public: list[dict[str, Any] | None] = []
        self._given: dict[int, dict[str, Any]] = {}
        """Seq -> the message as given, where that is not ``public[seq]`` itself."""
        self.timestamps: dict[int, str] = {}
        """Seq -> the timestamp ``add_message`` stamped (only where it stamped one)."""
        self.kind_table: list[MessageInfo] = []
        """Every kind of message admitted so far: a ``MessageInfo`` without ids
        (``without_ids``), once each."""
        self.kind_codes = array("I")
        """Each message's kind, as its index in ``kind_table``."""
        self.call_ids: dict[int, tuple[str, ...]] = {}
        """Seq -> the ids of the message's tool calls (only where it declares some)."""
        self.result_ids: dict[int, tuple[str, ...]] = {}
        """Seq -> the ids the message answers (only where it answers some)."""
        self._shared: dict[MessageInfo, int] = {}
        """Kind -> its index in ``kind_table``."""
        self.tokens = array("q")
        self.kinds = bytearray()
        """``EntryKind`` values."""
        self.has_metadata = bytearray()

    def __len__(self) -> int:
        return len(self.public)

    def given(self, seq: int) -> dict[str, Any]:
        """The message of ``seq`` as given (after the ingress cap): the store's own dict."""
        given = self._given.get(seq)
        if given is not None:
            return given
        public = self.public[seq]
        assert public is not None  # a message with no public form is in ``_given``
        return public

    def givens(self, start: int, end: int) -> list[dict[str, Any]]:
        """``given(seq)`` for the seqs ``start`` to ``end``, as a new list."""
        forms = self.public[start:end]
        for seq, given in self._given.items():
            if start <= seq < end:
                forms[seq - start] = given
        return forms  # type: ignore[return-value]  # every None was replaced above

    def entry(self, seq: int) -> Entry:
        """The entry of ``seq`` (a new ``Entry``; the columns are the record)."""
        return make_entry(
            (
                seq,
                self.given(seq),
                self.timestamps.get(seq),
                self.public[seq],
                self.info(seq),
                self.tokens[seq],
                _KINDS[self.kinds[seq]],
                bool(self.has_metadata[seq]),
            )
        )

    def __getitem__(self, index: int) -> Entry:
        if index < 0:
            index += len(self.public)
        if not 0 <= index < len(self.public):
            raise IndexError("entry index out of range")
        return self.entry(index)

    def __iter__(self) -> Iterator[Entry]:
        return map(self.entry, range(len(self.public)))

    def append(self, entry: Entry) -> None:
        """Record ``entry`` (its seq is the next index)."""
        info = entry.info
        kind = without_ids(info)
        code = self._shared.get(kind)  # (hashing is the one step that can fail: first)
        if code is None:
            code = self._shared[kind] = len(self.kind_table)
            self.kind_table.append(kind)
        seq = len(self.public)
        self.public.append(entry.public)
        if entry.given is not entry.public:
            self._given[seq] = entry.given
        if entry.timestamp is not None:
            self.timestamps[seq] = entry.timestamp
        self.kind_codes.append(code)
        if info.call_ids:
            self.call_ids[seq] = info.call_ids
        if info.result_ids:
            self.result_ids[seq] = info.result_ids
        self.tokens.append(entry.tokens)
        self.kinds.append(entry.kind)
        self.has_metadata.append(entry.has_metadata)

    def info(self, seq: int) -> MessageInfo:
        """The ``MessageInfo`` of ``seq`` (new when it carries ids)."""
        return with_ids(self.kind(seq), self.call_ids.get(seq, ()), self.result_ids.get(seq, ()))

    def kind(self, seq: int) -> MessageInfo:
        """The ``MessageInfo`` of ``seq`` without ids (shared by every message of its kind)."""
        return self.kind_table[self.kind_codes[seq]]

    def stored(self, seq: int) -> dict[str, Any]:
        """The message of ``seq`` as ``get_messages`` returns it (see ``stored_form``)."""
        return _stored(seq, self.given(seq), self.timestamps.get(seq))


class EntryKind(enum.IntEnum):
    """How views use an admitted message."""

    SKIP = 0
    """Never shown (a reference-only row, an orphan result)."""
    BODY = 1
    """Shown in the conversation, in display order."""
    SYSTEM = 2
    """A stored system message: hoisted, or replaced by the system prompt factory."""
    HOOK_SYSTEM = 3
    """A hook-sourced system message: hoisted, and kept even with a factory."""


SKIP, BODY, SYSTEM, HOOK_SYSTEM = EntryKind
_KINDS: Final = tuple(EntryKind)


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def public_form(admitted: Mapping[str, Any], drop_results: frozenset[str]) -> dict[str, Any]:
    """The provider-facing form of a message, built once at admission.

    It is the message as the caller gave it (after the ingress cap): our bookkeeping
    (the sequence id, the timestamp we stamp) stays in the stored history only, and the
    history-only ``amplifier_public_*`` keys are dropped. A message that came without
    metadata has none in its views, so building a view copies one dict per message.

    In a list of blocks, ``tool_result`` blocks that answer nothing (their id is in
    ``drop_results``, they name no call, or they repeat an id already answered in the
    message) are left out, and the remaining results come first: the Anthropic API
    requires a turn that answers calls to begin with its results.
    """
    message = dict(admitted)
    metadata = message.get("metadata")
    if metadata is not None and is_mapping(metadata):
        message["metadata"] = {
            k: v for k, v in metadata.items() if k != SEQ_KEY and k not in PUBLIC_METADATA_KEYS
        }
    content = admitted.get("content")
    if isinstance(content, list) and admitted.get("role") != "assistant":
        tidy = results_first(content, drop_results)
        if tidy is not None:
            message["content"] = tidy
    return message


def public_of(
    capped: Mapping[str, Any],
    info: MessageInfo,
    in_place: tuple[str, ...],
    orphans: frozenset[str],
) -> tuple[dict[str, Any] | None, bool]:
    """The message's public form (None when no view shows it) and whether it is a plain
    copy of ``capped``."""
    content = capped.get("content")
    if info.reference_only or (info.is_result_carrier and not in_place):
        return None, False
    if type(capped) is dict and capped.get("metadata") is None and not isinstance(content, list):
        return dict(capped), True  # what ``public_form`` gives here, for less
    if isinstance(content, list) and content:
        public = public_form(capped, orphans)
        # None when it carried nothing but results that answer nothing
        return (public if public["content"] else None), False
    return public_form(capped, frozenset()), False


def given_form(
    capped: Mapping[str, Any], public: dict[str, Any] | None, plain: bool
) -> dict[str, Any]:
    """What was given: usually the public form itself (equal to it, and the store's own)."""
    if public is not None and (plain or public == capped):
        return public
    return own_copy(capped)


def copy_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with a new metadata dict; nested values are shared (read-only by contract)."""
    copied = dict(message)
    metadata = copied.get("metadata")
    if isinstance(metadata, dict):
        copied["metadata"] = metadata.copy()
    return copied


def own_copy(message: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with its own metadata dict (of any mapping); nested values are shared."""
    copied = dict(message)
    metadata = copied.get("metadata")
    if metadata is not None and is_mapping(metadata):
        copied["metadata"] = dict(metadata)
    return copied


@dataclass(frozen=True, slots=True)
class Synthesized:
    """The results a view supplies for calls a later assistant turn left unanswered."""

    owner: int
    """Seq of the call message."""
    closed_at: int
    """Seq of the assistant message that closed the run: views of shorter prefixes show
    the call as a pending tail instead."""
    call_ids: tuple[str, ...]
    messages: tuple[dict[str, Any], ...]
    message_tokens: tuple[int, ...]
    tokens: int


def synthesized_marker(owner: int) -> int:
    """The ``History.order`` item standing for the synthesized results of ``owner``."""
    return -owner - 1


def marker_owner(item: int) -> int:
    return -item - 1


_BOOKKEEPING: Final = frozenset({SEQ_KEY, "timestamp"})


def first_difference(
    forms: Iterator[Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    messages: Sequence[object],
    start: int,
    end: int,
) -> int:
    """The first index from ``start`` whose message is not ``==`` to its entry's form in
    ``forms`` (the forms of seqs ``start`` to ``end``), or ``end`` (the loop runs in C:
    ``map``, ``compress``, dict equality)."""
    differs = map(ne, forms, messages[start:end])
    return next(compress(count(start), differs), end)


def as_seen(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` without the store's bookkeeping (sequence id, admission timestamp)."""
    metadata = message.get("metadata")
    if not isinstance(metadata, Mapping) or not _BOOKKEEPING.intersection(metadata):
        if isinstance(metadata, Mapping) and not metadata:
            return {k: v for k, v in message.items() if k != "metadata"}
        return message
    kept = {k: v for k, v in metadata.items() if k not in _BOOKKEEPING}
    seen = {k: v for k, v in message.items() if k != "metadata"}
    if kept:
        seen["metadata"] = kept
    return seen
