"""The working view of a compaction run as columns: one row per message, in view order.

A ladder (``ladder.py``) reads and reduces these rows. They are columns, not an object per
message: a compacting request at 16k messages used to allocate an ``Item`` per message and
a list per tool group, all tracked by the cyclic collector and alive for the whole request
(docs/design.md section 8.1). ``Item`` is the record a row is built from and read back as
(``Rows.of``, ``Ladder.view_items``); ``Groups`` is the live rows of each tool group, one
flat array with int offsets.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..history.classify import MessageInfo

__all__ = (
    "CALLS",
    "FORM_NAMES",
    "FULL",
    "PROTECTED",
    "REMOVED",
    "RESULTS",
    "STUBBED",
    "TRUNCATED",
    "Form",
    "FormName",
    "Groups",
    "Item",
    "Rows",
)


Form = tuple[dict[str, Any], int]
"""A reduced message and its token estimate."""
FormName = Literal["full", "truncated", "stubbed"]
"""How an item is shown: as admitted, or in one of the reduced forms."""
# Form codes (``Rows.form``). REMOVED is the ladder's own: a removed row keeps its place
# in the columns (scopes list rows by number) and leaves the live order. A reduced row's
# code also says which reduction made it (PROTECTED: ``truncate_protected``), so that its
# form can be made again (``Ladder._form``).
FULL: Final = 0
TRUNCATED: Final = 1
STUBBED: Final = 2
REMOVED: Final = 3
PROTECTED: Final = 4
FORM_NAMES: Final[tuple[FormName, ...]] = ("full", "truncated", "stubbed", "full", "truncated")
_FORM_CODES: Final[dict[str, int]] = {"full": FULL, "truncated": TRUNCATED, "stubbed": STUBBED}

# Flag bits (``Rows.flags``).
CALLS: Final = 1
RESULTS: Final = 2


@dataclass(slots=True)
class Item:
    """One message of the working view as a record: what ``Rows.of`` takes and
    ``Ladder.view_items`` builds on access (the ladder itself holds columns)."""

    seq: int
    info: MessageInfo
    """What kind of message it is (its tool ids may be left out: see ``has_calls``)."""
    message: dict[str, Any]
    tokens: int
    group: int
    form: FormName = "full"
    synthesized: int = 0
    """Synthesized results shown with this call message (counted in ``tokens``)."""
    reduced: Form | None = None
    """The ``(message, tokens)`` of the reduced form this ladder made, if any."""
    has_calls: bool = False
    """The message declares tool calls (the ladder needs no more of its ids)."""
    has_results: bool = False
    """The message answers tool calls."""


class Rows:
    """The working view's messages as columns, one row each, in view order.

    A row is a message's number in the columns; it never changes (a removed row keeps its
    number, with the form code REMOVED). The messages and kinds are two lists of shared
    references; everything else is an array or a bytearray, which hold plain numbers:
    whatever the history's length, the columns are a handful of objects for the collector.
    """

    __slots__ = ("flags", "form", "group", "info", "message", "seq", "synthesized", "tokens")

    def __init__(self) -> None:
        self.seq = array("q")
        self.info: list[MessageInfo] = []
        self.message: list[dict[str, Any]] = []
        self.tokens = array("q")
        self.group = array("q")
        self.form = bytearray()
        self.flags = bytearray()
        self.synthesized: dict[int, int] = {}
        """Row -> synthesized results shown with that call message (only calls that have
        some; their tokens are in the row's ``tokens``)."""

    def __len__(self) -> int:
        return len(self.seq)

    def append(
        self,
        seq: int,
        info: MessageInfo,
        message: dict[str, Any],
        tokens: int,
        group: int,
        form: FormName = "full",
        *,
        has_calls: bool = False,
        has_results: bool = False,
    ) -> int:
        """Add a message at the end of the view; return its row."""
        row = len(self.seq)
        self.seq.append(seq)
        self.info.append(info)
        self.message.append(message)
        self.tokens.append(tokens)
        self.group.append(group)
        self.form.append(_FORM_CODES[form])
        self.flags.append((CALLS if has_calls else 0) | (RESULTS if has_results else 0))
        return row

    def add_synthesized(self, row: int, tokens: int, count: int) -> None:
        """Show ``count`` synthesized results (``tokens`` in all) with the call at ``row``."""
        self.tokens[row] += tokens
        self.synthesized[row] = count

    @classmethod
    def of(cls, items: Iterable[Item]) -> Rows:
        """Columns holding ``items`` in order (their ``reduced`` pairs are not kept)."""
        rows = cls()
        for item in items:
            row = rows.append(
                item.seq,
                item.info,
                item.message,
                item.tokens,
                item.group,
                item.form,
                has_calls=item.has_calls,
                has_results=item.has_results,
            )
            if item.synthesized:
                rows.synthesized[row] = item.synthesized
        return rows


class Groups:
    """The live rows of each tool group, in view order: one flat array of rows, sorted by
    group, and each group's ``[start, end)`` in it (dicts of ints: untracked)."""

    __slots__ = ("_end", "_flat", "_start")

    def __init__(self, start: dict[int, int], end: dict[int, int], flat: array[int]) -> None:
        self._start, self._end, self._flat = start, end, flat

    def members(self, group: int, row: int) -> Iterable[int]:
        """The rows of ``group`` (just ``row`` when the group has no tool messages)."""
        start = self._start.get(group)
        if start is None:
            return (row,)
        return self._flat[start : self._end[group]]
