"""Rendering a view: the per-request hot path.

A view is system messages first, then the conversation with the sticky decisions applied,
every message a new dict (and a new metadata dict when it has one). What a view *shows*
depends only on the history prefix, the decisions and which protected messages are shown
intact; so the renderer keeps that "what to show" list between requests and extends it
with newly admitted messages. A steady-state request then costs one shallow copy per
message and no per-message policy work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from .decisions import Decisions
from .estimate import estimate_message
from .history import BODY, HOOK_SYSTEM, SYSTEM, History, copy_message, marker_owner

__all__ = (
    "Rendered",
    "Renderer",
)


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered view and its estimate."""

    messages: list[dict[str, Any]]
    tokens: int
    system_count: int
    system_tokens: int
    synthesized: int = 0
    """How many unanswered calls the view answers with synthesized results."""
    message_tokens: Sequence[int] = ()
    """The estimate of each message of ``messages`` (shared, read-only)."""

    def prefix_kept(self, other: Sequence[Mapping[str, Any]]) -> tuple[int, int | None]:
        """Tokens of the leading messages ``other`` shows unchanged from this view, and the
        index of the first one it changes (None when ``other`` changes none)."""
        kept = 0
        for index, message in enumerate(self.messages):
            if index >= len(other) or other[index] != message:
                return kept, index
            kept += self.message_tokens[index]
        return kept, None


@dataclass(slots=True)
class _Shown:
    """The forms a view shows for one (epoch, order version, intact set, factory) key."""

    key: tuple[int, int, frozenset[int], bool]
    decisions: Decisions
    length: int = 0
    position: int = 0
    """How many ``History.order`` items have been looked at."""
    sealed: bool = False
    """A rebuild skipped an item past ``length``: only this exact length may reuse it."""
    systems: list[dict[str, Any]] = field(default_factory=list)
    system_tokens: int = 0
    body: list[dict[str, Any]] = field(default_factory=list)
    with_metadata: list[int] = field(default_factory=list)
    body_tokens: int = 0
    body_token_list: list[int] = field(default_factory=list)
    system_token_list: list[int] = field(default_factory=list)
    synthesized: int = 0


class Renderer:
    """Builds views; remembers what the last view showed so the next one is cheap."""

    def __init__(self) -> None:
        self._shown: _Shown | None = None
        self._factory: tuple[str, int] | None = None

    def render(
        self,
        history: History,
        length: int,
        *,
        epoch: int,
        decisions: Decisions,
        protected: frozenset[int],
        factory_text: str | None,
    ) -> Rendered:
        """The view of the first ``length`` entries of ``history`` under ``decisions``.

        Messages follow ``history.order`` (results with their calls, synthesized results
        for calls a later assistant turn left unanswered). Messages in ``protected`` are
        shown as admitted even when a decision reduced or removed them. With a
        ``factory_text``, stored system messages other than hook-sourced ones are replaced
        by that one system prompt.
        """
        overrides = decisions.overrides
        intact = protected.intersection(overrides) if overrides else frozenset()
        key = (epoch, history.order_version, frozenset(intact), factory_text is not None)
        shown = self._shown
        if (
            shown is None
            or shown.key != key
            or shown.decisions is not decisions
            or shown.length > length
            or (shown.sealed and shown.length != length)
        ):
            shown = _Shown(key, decisions)
            self._shown = shown
        if shown.length < length:
            self._extend(shown, history, length, intact, factory_text is not None)
        systems = [copy_message(message) for message in shown.systems]
        system_tokens = shown.system_tokens
        token_list = shown.system_token_list
        if factory_text is not None:
            systems.insert(0, {"role": "system", "content": factory_text})
            factory_tokens = self._factory_tokens(factory_text)
            system_tokens += factory_tokens
            token_list = [factory_tokens, *token_list]
        body = [message.copy() for message in shown.body]
        for index in shown.with_metadata:
            body[index]["metadata"] = body[index]["metadata"].copy()
        return Rendered(
            messages=systems + body if systems else body,
            tokens=system_tokens + shown.body_tokens,
            system_count=len(systems),
            system_tokens=system_tokens,
            synthesized=shown.synthesized,
            message_tokens=_Concat(token_list, shown.body_token_list),
        )

    def _factory_tokens(self, text: str) -> int:
        cached = self._factory
        if cached is None or cached[0] != text:
            cached = (text, estimate_message({"role": "system", "content": text}))
            self._factory = cached
        return cached[1]

    @staticmethod
    def _extend(
        shown: _Shown,
        history: History,
        length: int,
        intact: frozenset[int],
        factory: bool,
    ) -> None:
        overrides = shown.decisions.overrides
        entries = history.entries
        order = history.order
        body = shown.body
        # Items past the last look are appended in seq order unless the order version
        # changed (then this is a rebuild from 0): a first item past ``length`` ends the
        # look, except in a rebuild, where later items may still be inside the prefix.
        rebuild = shown.position == 0
        position = shown.position
        while position < len(order):
            item = order[position]
            if history.position_seq(item) >= length:
                if not rebuild or all(
                    history.position_seq(later) >= length for later in order[position:]
                ):
                    break
                shown.sealed = True
                position += 1
                continue
            position += 1
            if item < 0:
                owner = marker_owner(item)
                if owner in overrides and overrides[owner] is None and owner not in intact:
                    continue  # removed with its call
                synthesized = history.synthesized[owner]
                for message, tokens in zip(
                    synthesized.messages, synthesized.message_tokens, strict=True
                ):
                    shown.with_metadata.append(len(body))
                    body.append(message)
                    shown.body_token_list.append(tokens)
                shown.body_tokens += synthesized.tokens
                shown.synthesized += len(synthesized.call_ids)
                continue
            entry = entries[item]
            kind = entry.kind
            if kind == BODY:
                form = entry.public
                tokens = entry.tokens
                has_metadata = entry.has_metadata
                if item in overrides and item not in intact:
                    override = overrides[item]
                    if override is None:
                        continue  # removed
                    form, tokens = override
                    has_metadata = True
                if has_metadata:
                    shown.with_metadata.append(len(body))
                body.append(form)  # type: ignore[arg-type]  # not SKIP: has a public form
                shown.body_tokens += tokens
                shown.body_token_list.append(tokens)
            elif (kind == SYSTEM and not factory) or kind == HOOK_SYSTEM:
                shown.systems.append(entry.public)  # type: ignore[arg-type]  # not SKIP: public
                shown.system_tokens += entry.tokens
                shown.system_token_list.append(entry.tokens)
        shown.position = position
        shown.length = length


class _Concat(Sequence[int]):
    """Two lists read as one, without copying either (the renderer keeps them)."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: list[int], second: list[int]) -> None:
        self._first, self._second = first, second

    def __len__(self) -> int:
        return len(self._first) + len(self._second)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [*self._first, *self._second][index]
        if index < 0:
            index += len(self)
        head = len(self._first)
        return self._first[index] if index < head else self._second[index - head]
