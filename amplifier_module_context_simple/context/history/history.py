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

Entries and their forms are ``entries.py``'s, what admission accepts ``validation.py``'s,
and what a call or a result is in each format ``formats/``'s.

``History`` is a plain synchronous object. ``build_history`` validates a whole batch before
it admits any of it into a fresh ``History``, which the store swaps in only once it is built,
so a rejected batch leaves the previous history intact; ``History.admit_capped`` does
everything that can fail before its first mutation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...errors import InvalidMessageError
from ..counting.estimate import estimate_message
from ..formats import same_tool_fields
from .classify import MessageInfo, classify, metadata_of
from .entries import (
    BODY,
    HOOK_SYSTEM,
    SEQ_KEY,
    SKIP,
    SYSTEM,
    Entry,
    EntryKind,
    Synthesized,
    as_seen,
    copy_message,
    first_difference,
    given_form,
    make_entry,
    marker_owner,
    public_form,
    public_of,
    stored_form,
    synthesized_marker,
    utc_timestamp,
)
from .ids import fresh_ids, renamed_calls, renamed_results
from .indexes import HistoryIndexes, Run
from .ingress import IngressClip, cap_tool_result
from .synthesize import synthesized_results
from .validation import validate_message

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
    "stored_form",
    "synthesized_marker",
    "utc_timestamp",
    "validate_message",
)


logger = logging.getLogger(__name__)

_NO_IDS: Final[frozenset[str]] = frozenset()


@dataclass(slots=True)
class History(HistoryIndexes):
    """Admission into the indexes (see the module docstring)."""

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
        public form shows the same content and tool fields (all an estimate reads).
        """
        # Everything that can fail happens before the first mutation of the history.
        timestamp = _timestamp(capped, stamp_time)
        info = classify(capped)
        in_place, orphans = self._answering(info.result_ids)
        public, plain = public_of(capped, info, in_place, orphans)
        renames: dict[str, str] = {}
        if public is not None:
            public, plain, renames = self._shown_ids(public, plain, info, in_place)
        kind, tokens = _kind_and_tokens(capped, public, plain, info, estimated)
        entry = make_entry(
            (
                self.next_seq,
                given_form(capped, public, plain),
                timestamp,
                public,
                info,
                tokens,
                kind,
                not plain and public is not None and isinstance(public.get("metadata"), dict),
            )
        )
        self._record(entry, capped, max_tool_result_bytes, in_place, renames)
        return entry

    def _answering(self, result_ids: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
        """The ids among ``result_ids`` that answer a call of the open run, and the rest:
        orphans (or results naming no call at all), which never reach a view (a provider
        rejects a result without its call)."""
        if not result_ids:
            return (), _NO_IDS
        answerable = self._run.pending if self._run is not None else {}
        if len(result_ids) == 1:  # the commonest carrier: the same, without the loops
            if result_ids[0] in answerable:
                return result_ids, _NO_IDS
            return (), frozenset(result_ids)
        in_place = tuple(i for i in result_ids if i in answerable)
        return in_place, frozenset(result_ids).difference(in_place)

    def _shown_ids(
        self,
        public: dict[str, Any],
        plain: bool,
        info: MessageInfo,
        in_place: tuple[str, ...],
    ) -> tuple[dict[str, Any], bool, dict[str, str]]:
        """``public`` with reused call ids shown under fresh names (an assistant's calls,
        or the results answering calls the open run renamed), whether it is still a plain
        copy, and the renames of its own calls."""
        if info.call_ids:
            if not self._declared.keys().isdisjoint(info.call_ids):
                renames = fresh_ids(info.call_ids, self._declared)
                return renamed_calls(public, renames), False, renames
            return public, plain, {}
        run = self._run
        if run is not None and run.renames:
            shown_as = {i: run.renames[i] for i in in_place if i in run.renames}
            if shown_as:
                return renamed_results(public, shown_as), False, {}
        return public, plain, {}

    def _record(
        self,
        entry: Entry,
        capped: Mapping[str, Any],
        max_tool_result_bytes: int,
        in_place: tuple[str, ...],
        renames: dict[str, str],
    ) -> None:
        """Append ``entry`` and update every index (the first mutations of an admission)."""
        seq, info = entry.seq, entry.info
        self.entries.append(entry)
        self._parent.append(seq)  # its own group until a call links it
        self.widest_cap = max(self.widest_cap, max_tool_result_bytes)
        self.next_seq = seq + 1
        self._body_added = entry.tokens if entry.kind == BODY else 0
        if entry.public is not None:
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
                index = first_difference(entries.givens(index, end), messages, index, end)
                if index < end:
                    stored = map(entries.stored, range(index, end))
                    index = first_difference(stored, messages, index, end)
                if index == end:
                    return True
            message = validate_message(messages[index], index)
            capped = cap_tool_result(message, max_tool_result_bytes)[0]
            if as_seen(entries.given(index)) != as_seen(capped):
                return False
            index += 1
        return True

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
                self._run = Run(seq, dict.fromkeys(info.call_ids), end, end, renames)
                self.unanswered[seq] = set(info.call_ids)
                self._declared.update(dict.fromkeys(info.call_ids))
                self._declared.update(dict.fromkeys(renames.values()))
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
        if not unanswered:  # (an empty set per answered call message would only cost)
            del self.unanswered[run.owner]
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

    def _release(self, run: Run, at: int) -> None:
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
        owner_public = self.entries.public[run.owner]
        assert owner_public is not None
        renames = run.renames
        ids = tuple(renames.get(call_id, call_id) for call_id in run.pending)
        stored = {renames[call_id]: call_id for call_id in run.pending if call_id in renames}
        messages = tuple(synthesized_results(owner_public, ids, stored))
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


def _timestamp(capped: Mapping[str, Any], stamp_time: bool) -> str | None:
    """The admission time to stamp, unless the message has one (or none is wanted)."""
    if stamp_time and "timestamp" not in metadata_of(capped):
        return utc_timestamp()
    return None


def _kind_and_tokens(
    capped: Mapping[str, Any],
    public: dict[str, Any] | None,
    plain: bool,
    info: MessageInfo,
    estimated: int | None,
) -> tuple[EntryKind, int]:
    """How views use the message, and its estimate (``estimated`` when the public form
    shows what it was computed on)."""
    if public is None:
        return SKIP, 0
    kind = HOOK_SYSTEM if info.is_hook_system else SYSTEM if info.is_system else BODY
    if estimated is not None and (
        plain
        or (public.get("content") is capped.get("content") and same_tool_fields(public, capped))
    ):
        return kind, estimated  # what it would be: the estimate reads nothing else
    return kind, estimate_message(public)


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
