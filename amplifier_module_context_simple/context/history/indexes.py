"""The history's indexes: what admission records besides the entries, and its queries.

``HistoryIndexes`` holds the tool-group links (a union-find over sequence ids), the
display order, the open run, the synthesized results, the human and envelope marks and
the running body-token prefix; ``History`` (``history.py``) is what fills them, one
admission at a time. The queries here read them and never change anything but the
union-find's path compression.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from .entries import Entries, Synthesized, marker_owner

__all__ = ("HistoryIndexes", "Run")


@dataclass(slots=True)
class Run:
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
class HistoryIndexes:
    """Admitted entries, the tool-group links between them and their display order."""

    entries: Entries = field(default_factory=Entries)
    next_seq: int = 0
    # union-find over seqs: messages linked through tool ids form one group (a seq's
    # parent, itself when it is a root; numbers in an array, nothing for the collector)
    _parent: array[int] = field(default_factory=lambda: array("q"))
    # assistant seq -> ids of its calls that no admitted result answers
    unanswered: dict[int, set[str]] = field(default_factory=dict)
    first_human: int | None = None
    last_human: int | None = None
    # reminder body -> seq of the newest persisted envelope carrying it
    latest_envelope: dict[str, int] = field(default_factory=dict)
    order: array[int] = field(default_factory=lambda: array("q"))
    """Display order of the messages views can show (see ``history.py``'s docstring)."""
    order_version: int = 0
    synthesized: dict[int, Synthesized] = field(default_factory=dict)
    """Call message seq -> the results views supply for its unanswered calls."""
    _run: Run | None = None
    released_at: dict[int, int] = field(default_factory=dict)
    """Held notes -> the seq from which views show them (see ``position_seq``)."""
    _declared: dict[str, None] = field(default_factory=dict)
    """Every call id (and view name) declared so far, to make reused ids unique (a dict of
    strings to None: the collector does not track it, where a set of them is walked on
    every full collection)."""
    body_prefix: array[int] = field(default_factory=lambda: array("q", (0,)))
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
        while parent[root] != root:
            root = parent[root]
        while parent[seq] != root:  # path compression
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
        calls, results = self.entries.call_ids, self.entries.result_ids
        open_groups.update(
            self.group_of(seq)
            for seq in range(length, len(self.entries))
            if seq in results or seq in calls
        )
        return frozenset(open_groups)

    def uncompacted_body_tokens(self, length: int) -> int:
        """Estimated tokens of the non-system messages a view of ``length`` entries shows
        with no compaction (synthesized results included)."""
        return self.body_prefix[length]
