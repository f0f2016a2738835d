"""The canonical history: admitted messages, append-only between resets.

Admission validates a message's shape, applies the tool-result ingress cap, stamps a
sequence id (kept out of every provider-facing view) and a timestamp, classifies it and
estimates its tokens once. Tool groups are linked at admission, by id, in every format,
under the providers' own rule: an assistant message's calls are answered by the results
that arrive before the next assistant message (its *run*).

- A result that answers a call of the open run is linked to it. In the view it is placed
  with its call: pure result carriers right after the call and its earlier results, a
  message mixing results with other content after those, so that a message admitted in
  between (a hook's note, a reminder) moves after the results instead of splitting them
  from their call (both APIs reject that).
- A result that answers nothing in the open run (its call never made, made in an earlier
  run, or already answered) is an orphan and never reaches a view.
- When the next assistant message (or a person's turn) closes a run whose calls are not
  all answered, the view answers them with synthesized results (``synthesize.py``). The
  results the run did record stay where and as they are; the synthesized ones follow the
  run's pure result carriers, in call order, and come before a message mixing results
  with other content: both providers reject results after such content (Anthropic merges
  consecutive user turns into one that must begin with all of its results; an OpenAI
  adapter sends a mixed message as its tool messages then a user message, after which a
  tool message answers nothing). A run still open at the end of the history is a pending
  tail and is left as it is.

``order`` is that display order (sequence ids, and ``synthesized_marker(owner)`` for the
synthesized results of a call message); ``order_version`` changes whenever something is
placed anywhere but at the end, so a renderer that extends its last view knows to rebuild.

``History`` is a plain synchronous object. ``build_history`` validates a whole batch before
it admits any of it into a fresh ``History``, which the store swaps in only once it is built,
so a rejected batch leaves the previous history intact; ``History.admit_capped`` does
everything that can fail before its first mutation.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from itertools import compress, count
from operator import attrgetter, ne
from typing import Any, Final, NamedTuple

from ..errors import InvalidMessageError
from .classify import (
    PUBLIC_METADATA_KEYS,
    MessageInfo,
    block_field,
    block_id,
    block_type,
    classify,
    is_mapping,
    metadata_of,
)
from .estimate import estimate_message
from .ids import fresh_ids, renamed_calls, renamed_results
from .ingress import IngressClip, cap_tool_result
from .synthesize import synthesized_results

__all__ = (
    "BODY",
    "HOOK_SYSTEM",
    "SEQ_KEY",
    "SKIP",
    "SYSTEM",
    "Entry",
    "EntryKind",
    "History",
    "Synthesized",
    "build_history",
    "copy_message",
    "marker_owner",
    "public_form",
    "synthesized_marker",
    "utc_timestamp",
    "validate_message",
)


logger = logging.getLogger(__name__)

SEQ_KEY = "_seq"
_VALID_CONTENT = (str, list)


class Entry(NamedTuple):
    """One admitted message and everything decided about it at admission.

    A named tuple: immutable, and cheap to build (a session resume builds thousands).
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
    given = entry.given
    given_metadata = given.get("metadata")
    timestamp = entry.timestamp
    # Keys in the order the message had them, then the stamped timestamp, then _seq.
    if given_metadata:
        metadata = dict(given_metadata)
        if timestamp is not None:
            metadata["timestamp"] = timestamp
        metadata[SEQ_KEY] = entry.seq
    elif timestamp is None:
        metadata = {SEQ_KEY: entry.seq}
    else:
        metadata = {"timestamp": timestamp, SEQ_KEY: entry.seq}
    stored = given.copy()
    stored["metadata"] = metadata
    return stored


_make_entry: Final = partial(tuple.__new__, Entry)
"""``Entry`` from all its fields in order: without ``__new__``'s argument binding."""
_NO_IDS: Final[frozenset[str]] = frozenset()


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


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# The roles that may carry each kind of tool block (both providers' request rules).
_RESULT_ROLES = frozenset({"user", "tool"})
_CALL_ROLES = frozenset({"assistant"})


def validate_message(message: object, index: int | None = None) -> Mapping[str, Any]:
    """Check the shape admission relies on; raise ``InvalidMessageError`` otherwise."""
    if type(message) is not dict and not isinstance(message, Mapping):
        raise InvalidMessageError(
            f"a message must be a dict, got {type(message).__name__}", index=index
        )
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidMessageError(
            f"a message needs a non-empty string 'role', got {role!r}", index=index
        )
    metadata = message.get("metadata")
    if metadata is not None and type(metadata) is not dict and not isinstance(metadata, Mapping):
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
    if calls is not None and not (isinstance(calls, list) and all(map(is_mapping, calls))):
        raise InvalidMessageError("'tool_calls' must be a list of dicts when present", index=index)
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidMessageError(
            f"'tool_call_id' must be a string, got {type(call_id).__name__}", index=index
        )
    for call in calls or ():
        for key in ("id", "tool_call_id"):
            value = call.get(key)
            if value is not None and not isinstance(value, str):
                raise InvalidMessageError(f"tool call {key!r} must be a string", index=index)
    if isinstance(content, list):
        kinds = {_validate_block(block, position, index) for position, block in enumerate(content)}
        if role == "system" and not kinds.isdisjoint(("tool_result", "tool_use", "tool_call")):
            # system messages are hoisted to the front of every view: a tool block there
            # would stand before the call it answers (or answer nothing)
            raise InvalidMessageError(
                "a system message cannot carry tool_use/tool_result blocks", index=index
            )
        if role not in _RESULT_ROLES and "tool_result" in kinds:
            # a result answers a call from the caller's side of the turn: Anthropic accepts
            # tool_result blocks in user turns only, OpenAI results are role "tool"; in any
            # other role no view could show it as the answer to its call
            raise InvalidMessageError(
                f"a {role!r} message cannot carry tool_result blocks (only 'user' or 'tool')",
                index=index,
            )
        if role not in _CALL_ROLES and not kinds.isdisjoint(("tool_use", "tool_call")):
            # only the model calls tools: a call in any other turn is one no provider accepts
            raise InvalidMessageError(
                f"a {role!r} message cannot carry tool_use/tool_call blocks (only 'assistant')",
                index=index,
            )
    return message


def _validate_block(block: object, position: int, index: int | None) -> str | None:
    """A block's ``type`` and tool ids, when present, are strings (unknown blocks pass);
    returns the type."""
    read = block.get if type(block) is dict else partial(block_field, block)
    kind = read("type")
    if kind is not None and not isinstance(kind, str):
        raise InvalidMessageError(
            f"content block {position}: 'type' must be a string, got {kind!r}", index=index
        )
    for key in ("id", "tool_use_id", "tool_call_id"):
        value = read(key)
        if value is not None and not isinstance(value, str):
            raise InvalidMessageError(
                f"content block {position}: {key!r} must be a string, got {value!r}", index=index
            )
    return kind


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
        tidy = _results_first(content, drop_results)
        if tidy is not None:
            message["content"] = tidy
    return message


def _results_first(blocks: list[Any], drop: frozenset[str]) -> list[Any] | None:
    """``blocks`` with unanswerable results dropped and results first; None if unchanged."""
    results: list[Any] = []
    others: list[Any] = []
    seen: set[str] = set()
    changed = False
    for block in blocks:
        if block_type(block) != "tool_result":
            others.append(block)
            continue
        call_id = block_id(block, "tool_use_id", "tool_call_id")
        if call_id is None or call_id in drop or call_id in seen:
            changed = True
            continue
        seen.add(call_id)
        if others:
            changed = True  # a result after other content: move it up
        results.append(block)
    return results + others if changed else None


def copy_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with a new metadata dict; nested values are shared (read-only by contract)."""
    copied = dict(message)
    metadata = copied.get("metadata")
    if isinstance(metadata, dict):
        copied["metadata"] = metadata.copy()
    return copied


def _own_copy(message: Mapping[str, Any]) -> dict[str, Any]:
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


@dataclass(slots=True)
class _Run:
    """The open run: a call message and the results that may still answer it."""

    owner: int
    pending: dict[str, None]
    """Ids not answered yet (as stored), in call order."""
    pure_end: int
    """Where the next pure result carrier goes in ``History.order`` (and, when the run is
    closed with ids pending, its synthesized results)."""
    mixed_end: int
    """Where the next message mixing results and other content goes."""
    renames: dict[str, str]
    """Reused call ids and the names views show them under (see ``ids.py``)."""
    held: list[int] = field(default_factory=list)
    """Notes admitted while calls were running, shown once the run is answered or closed."""


@dataclass(slots=True)
class History:
    """Admitted entries, the tool-group links between them and their display order."""

    entries: list[Entry] = field(default_factory=list)
    next_seq: int = 0
    # union-find over seqs: messages linked through tool ids form one group
    _parent: dict[int, int] = field(default_factory=dict)
    # assistant seq -> ids of its calls that no admitted result answers
    unanswered: dict[int, set[str]] = field(default_factory=dict)
    first_human: int | None = None
    last_human: int | None = None
    # reminder body -> seq of the newest persisted envelope carrying it
    latest_envelope: dict[str, int] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    """Display order of the messages views can show (see the module docstring)."""
    order_version: int = 0
    synthesized: dict[int, Synthesized] = field(default_factory=dict)
    """Call message seq -> the results views supply for its unanswered calls."""
    _run: _Run | None = None
    released_at: dict[int, int] = field(default_factory=dict)
    """Held notes -> the seq from which views show them (see ``position_seq``)."""
    _declared: set[str] = field(default_factory=set)
    """Every call id (and view name) declared so far, to make reused ids unique."""
    body_prefix: list[int] = field(default_factory=lambda: [0])
    """``body_prefix[n]``: see ``uncompacted_body_tokens``."""
    _body_added: int = 0
    widest_cap: int = 0
    """The largest ``max_tool_result_bytes`` any admission used."""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def held(self) -> tuple[int, ...]:
        """Seqs of the notes the open run holds back while its calls are running."""
        return tuple(self._run.held) if self._run is not None else ()

    def group_of(self, seq: int) -> int:
        """The representative seq of the tool group ``seq`` belongs to (itself if none)."""
        parent = self._parent
        root = seq
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(seq, seq) != root:  # path compression
            parent[seq], seq = root, parent[seq]
        return root

    def position_seq(self, item: int) -> int:
        """The seq that decides whether an ``order`` item is inside a history prefix.

        A prefix of ``length`` entries shows ``item`` iff this is below ``length``: a
        message by its own seq, synthesized results by the seq that closed their run.
        """
        if item < 0:
            return self.synthesized[marker_owner(item)].closed_at
        return self.released_at.get(item, item)

    def pending_groups(self, length: int) -> frozenset[int]:
        """Groups with a call that a view of the first ``length`` entries leaves open.

        That is a call not answered in the prefix and not closed in it (a pending tail),
        or one whose results were admitted after the prefix.
        """
        open_groups = {
            self.group_of(seq)
            for seq, ids in self.unanswered.items()
            if seq < length
            and ids
            and (seq not in self.synthesized or self.synthesized[seq].closed_at >= length)
        }
        open_groups.update(
            self.group_of(entry.seq)
            for entry in self.entries[length:]
            if entry.info.result_ids or entry.info.call_ids
        )
        return frozenset(open_groups)

    def admit(
        self, message: Mapping[str, Any], *, max_tool_result_bytes: int, stamp_time: bool
    ) -> tuple[Entry, IngressClip | None]:
        """Admit one validated message, its tool results capped; return its entry and any
        ingress clip."""
        capped, clip = cap_tool_result(message, max_tool_result_bytes)
        entry = self.admit_capped(
            capped, max_tool_result_bytes=max_tool_result_bytes, stamp_time=stamp_time
        )
        return entry, clip

    def admit_capped(
        self,
        capped: Mapping[str, Any],
        *,
        max_tool_result_bytes: int,
        stamp_time: bool,
        estimated: int | None = None,
    ) -> Entry:
        """Admit one validated message whose tool results ``cap_tool_result`` already
        capped to ``max_tool_result_bytes``; return its entry.

        ``estimated``: ``estimate_message(capped)``, when the caller has it; used when the
        public form shows the same content, tool calls and ``tool_call_id`` (all an estimate
        reads).
        """
        seq = self.next_seq
        timestamp = None
        if stamp_time and "timestamp" not in metadata_of(capped):
            timestamp = utc_timestamp()
        info = classify(capped)
        # Everything that can fail happens before the first mutation of the history.
        # Results that answer nothing in the open run (orphans, or results naming no call
        # at all) never reach a view: a provider rejects a result without its call.
        run = self._run
        in_place: tuple[str, ...] = ()
        orphans = _NO_IDS
        result_ids = info.result_ids
        if result_ids:
            answerable = run.pending if run is not None else {}
            if len(result_ids) == 1:  # the commonest carrier: the same, without the loops
                if result_ids[0] in answerable:
                    in_place = result_ids
                else:
                    orphans = frozenset(result_ids)
            else:
                in_place = tuple(i for i in result_ids if i in answerable)
                orphans = frozenset(result_ids).difference(in_place)
        public: dict[str, Any] | None
        content = capped.get("content")
        plain = False  # whether ``public`` is a plain copy of ``capped``
        if info.reference_only or (info.is_result_carrier and not in_place):
            public = None
        elif (
            type(capped) is dict
            and capped.get("metadata") is None
            and not isinstance(content, list)
        ):
            public, plain = dict(capped), True  # what ``public_form`` gives here, for less
        elif isinstance(content, list) and content:
            public = public_form(capped, orphans)
            if not public["content"]:
                public = None  # it carried nothing but results that answer nothing
        else:
            public = public_form(capped, frozenset())
        renames: dict[str, str] = {}
        if public is not None:
            if info.call_ids:  # an assistant's: a reused id is shown under a fresh name
                if not self._declared.isdisjoint(info.call_ids):
                    renames = fresh_ids(info.call_ids, self._declared)
                    public, plain = renamed_calls(public, renames), False
            elif run is not None and run.renames:
                shown_as = {i: run.renames[i] for i in in_place if i in run.renames}
                if shown_as:
                    public, plain = renamed_results(public, shown_as), False
        kind = SKIP
        tokens = 0
        if public is not None:
            kind = HOOK_SYSTEM if info.is_hook_system else SYSTEM if info.is_system else BODY
            if estimated is not None and (
                plain
                or (
                    public.get("content") is content
                    and public.get("tool_calls") is capped.get("tool_calls")
                    and public.get("tool_call_id") == capped.get("tool_call_id")
                )
            ):
                tokens = estimated  # what it would be: the estimate reads nothing else
            else:
                tokens = estimate_message(public)
        # what was given: usually the public form itself (equal to it, and the store's own)
        given = public if public is not None and (plain or public == capped) else None
        entry = _make_entry(
            (
                seq,
                _own_copy(capped) if given is None else given,  # given
                timestamp,
                public,
                info,
                tokens,
                kind,
                not plain and public is not None and isinstance(public.get("metadata"), dict),
            )
        )
        self.entries.append(entry)
        self.widest_cap = max(self.widest_cap, max_tool_result_bytes)
        self.next_seq = seq + 1
        self._body_added = tokens if kind == BODY else 0
        if public is not None:
            # A message no view shows (a reference-only row, an orphan) declares and
            # answers nothing: linking it would show a result whose call is never shown.
            self._place(entry, in_place, renames)
            if info.is_human:
                if self.first_human is None:
                    self.first_human = seq
                self.last_human = seq
            if info.is_envelope:
                self.latest_envelope[capped["content"]] = seq
        self.body_prefix.append(self.body_prefix[-1] + self._body_added)
        return entry

    def starts(self, messages: Sequence[object], max_tool_result_bytes: int) -> bool:
        """Whether ``messages`` begins with this history's messages as a provider sees
        them: each equal to its entry once capped to ``max_tool_result_bytes``, ignoring
        the store's ``_seq`` and timestamps (and an empty metadata dict).

        Each message is first compared (``==``, in C) with the message as it was given,
        then with its stored form (what ``get_messages`` returned); only one equal to
        neither is validated, capped and compared without the bookkeeping. A dict is
        compared by its current content, never by identity (the store keeps its own
        top-level and metadata dicts), so a caller that changed a message in place since
        it was given - a key replaced, added or removed, in the message or its metadata -
        is seen to differ. Nested values (content lists, blocks, tool calls) are shared
        with the stored history (read-only by contract): a change inside one is not seen.

        Raises:
            InvalidMessageError: a message it had to look into is malformed (naming its
                index); messages equal to an entry are valid as that entry was.
        """
        entries = self.entries
        end = len(entries)
        if len(messages) < end:
            return False
        # Under a cap no narrower than any admission used, capping leaves an admitted
        # message (and anything equal to it) as it is: plain equality decides.
        fast = max_tool_result_bytes >= self.widest_cap
        index = 0
        while index < end:
            if fast:
                index = _first_difference(entries, messages, index, end, _GIVEN)
                if index < end:
                    index = _first_difference(entries, messages, index, end, _STORED)
                if index == end:
                    return True
            message = validate_message(messages[index], index)
            capped = cap_tool_result(message, max_tool_result_bytes)[0]
            if _as_seen(entries[index].given) != _as_seen(capped):
                return False
            index += 1
        return True

    def uncompacted_body_tokens(self, length: int) -> int:
        """Estimated tokens of the non-system messages a view of ``length`` entries shows
        with no compaction (synthesized results included)."""
        return self.body_prefix[length]

    def _place(self, entry: Entry, in_place: tuple[str, ...], renames: dict[str, str]) -> None:
        """Link ``entry`` to its run and put it in the display order.

        A new assistant turn closes the open run; so does a person's own turn (a call
        that a person speaks after was interrupted: both APIs reject the request
        otherwise). A machine-written note does not: results still to come are placed
        before it.
        """
        seq, info = entry.seq, entry.info
        if info.role == "assistant":
            self._close_run(seq)
            self.order.append(seq)
            if info.call_ids:
                end = len(self.order)
                self._run = _Run(seq, dict.fromkeys(info.call_ids), end, end, renames)
                self.unanswered[seq] = set(info.call_ids)
                self._declared.update(info.call_ids)
                self._declared.update(renames.values())
            return
        run = self._run
        if run is None or not in_place:
            if info.is_human:
                self._close_run(seq)
            elif run is not None and run.pending and not info.is_system:
                # A note admitted while calls are still running is shown after their
                # results (or their synthesized results): shown now, it would stand
                # between a call and its results.
                run.held.append(seq)
                return
            self.order.append(seq)
            return
        unanswered = self.unanswered[run.owner]
        for call_id in in_place:
            del run.pending[call_id]
            unanswered.discard(call_id)
        # link to the call's group: ``seq`` is new (its own group) and later than the call
        self._parent[seq] = self.group_of(run.owner)
        if info.is_result_carrier:
            position = run.pure_end
            run.pure_end += 1
        else:
            position = run.mixed_end
        run.mixed_end += 1
        self._insert(position, seq)
        if not run.pending:
            self._release(run, seq)
        if info.is_human:
            self._close_run(seq)

    def _release(self, run: _Run, at: int) -> None:
        """Show the notes held back while ``run`` had calls running, from seq ``at`` on."""
        for held in run.held:
            self.released_at[held] = at
            self.order.append(held)
        run.held.clear()

    def _close_run(self, closing: int) -> None:
        """A new assistant turn or a person's turn: the open run's unanswered calls get
        synthesized results, placed after its pure result carriers and before a message
        mixing results with other content (see the module docstring)."""
        run, self._run = self._run, None
        if run is None:
            return
        if not run.pending:
            self._release(run, closing)
            return
        owner = self.entries[run.owner]
        assert owner.public is not None
        renames = run.renames
        ids = tuple(renames.get(call_id, call_id) for call_id in run.pending)
        stored = {renames[call_id]: call_id for call_id in run.pending if call_id in renames}
        messages = tuple(synthesized_results(owner.public, ids, stored))
        message_tokens = tuple(estimate_message(m) for m in messages)
        tokens = sum(message_tokens)
        self.synthesized[run.owner] = Synthesized(
            owner=run.owner,
            closed_at=closing,
            call_ids=ids,
            messages=messages,
            message_tokens=message_tokens,
            tokens=tokens,
        )
        self._body_added += tokens
        self._insert(run.pure_end, synthesized_marker(run.owner))
        self._release(run, closing)
        for call_id in run.pending:
            shown = f" (shown as {renames[call_id]})" if call_id in renames else ""
            logger.warning(
                "context-simple: tool call %s%s (message %d) has no recorded result and the "
                "conversation went on after it; views answer it with a synthesized error "
                "result (the stored history is unchanged)",
                call_id,
                shown,
                run.owner,
            )

    def _insert(self, position: int, item: int) -> None:
        if position == len(self.order):
            self.order.append(item)
        else:
            self.order.insert(position, item)
            self.order_version += 1


_GIVEN: Final = attrgetter("given")
_STORED: Final = stored_form
_BOOKKEEPING: Final = frozenset({SEQ_KEY, "timestamp"})


def _first_difference(
    entries: list[Entry],
    messages: Sequence[object],
    start: int,
    end: int,
    form: Callable[[Entry], Mapping[str, Any]],
) -> int:
    """The first index from ``start`` whose message is not ``==`` to ``form`` of its
    entry, or ``end`` (the loop runs in C: ``map``, ``compress``, dict equality)."""
    differs = map(ne, map(form, entries[start:end]), messages[start:end])
    return next(compress(count(start), differs), end)


def _as_seen(message: Mapping[str, Any]) -> Mapping[str, Any]:
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
    capped: list[Mapping[str, Any]] = []
    clips: list[IngressClip] = []
    for index, message in enumerate(list(messages)):
        capped_message, clip = cap_tool_result(
            validate_message(message, index), max_tool_result_bytes
        )
        capped.append(capped_message)
        if clip is not None:
            clips.append(clip)
    # Estimated in a pass of their own (the estimator's loop runs faster alone than
    # between admissions); admission keeps each estimate its public form agrees with.
    estimates = list(map(estimate_message, capped))
    history = History()
    for message, estimated in zip(capped, estimates, strict=True):
        history.admit_capped(
            message,
            max_tool_result_bytes=max_tool_result_bytes,
            stamp_time=False,
            estimated=estimated,
        )
    return history, clips
