"""Snapshots of a store, and a reference model of its canonical history.

``snapshot(manager)`` is ``manager.observable_state()``: the store's public, documented
state value (``Snapshot`` is its type, ``context.state.ObservableState``). It covers every
mark that changes a later operation - the sticky decisions and their stats, the meter, the
floor mark, the learned provider limit, the ``context:budget`` payload last delivered, the
history with its display order and held notes, the version - so a sweep comparing
snapshots sees every trace an operation leaves.

``ReferenceStore`` models what admission must have stored, in order, and the version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from ..context.state import FrozenMap, Ref, freeze
from ..context.state import ObservableState as Snapshot

if TYPE_CHECKING:
    from ..context.store import ContextStore

__all__ = (
    "FrozenMap",
    "Ref",
    "ReferenceStore",
    "Snapshot",
    "freeze",
    "snapshot",
)

_SEQ: Final = "_seq"


def snapshot(manager: ContextStore) -> Snapshot:
    """``manager.observable_state()``: a comparable, immutable snapshot of the store."""
    return manager.observable_state()


def _seen(frozen: object) -> object:
    """A frozen message without bookkeeping metadata (``_seq``, ``timestamp``)."""
    if not isinstance(frozen, FrozenMap):
        return frozen
    pairs: list[tuple[object, object]] = []
    for key, value in frozen.items:
        if key == "metadata" and isinstance(value, FrozenMap):
            kept = tuple((k, v) for k, v in value.items if k not in (_SEQ, "timestamp"))
            if kept:
                pairs.append((key, FrozenMap(kept)))
            continue
        pairs.append((key, value))
    return FrozenMap(tuple(pairs))


def _frozen_map(pairs: Mapping[Any, Any]) -> FrozenMap:
    return FrozenMap(tuple(sorted(pairs.items(), key=lambda kv: repr(kv[0]))))


class ReferenceStore:
    """A model of the canonical history: what admission must have stored, in order.

    It assumes no ingress clipping (keep tool results under ``max_tool_result_bytes``).
    ``version`` models ``SimpleContextManager.version``: ``set_messages``/``clear`` move
    both parts, a commit moves the second (call ``note_commit``).
    """

    def __init__(self) -> None:
        self.messages: list[object] = []
        self.stamped: list[bool] = []
        self.epoch = 0
        self.commits = 0

    @property
    def version(self) -> tuple[int, int]:
        return self.epoch, self.commits

    def add(self, message: Mapping[str, Any]) -> None:
        """Model ``add_message`` (stamps a timestamp unless the metadata has one)."""
        metadata = message.get("metadata")
        has_time = isinstance(metadata, Mapping) and "timestamp" in metadata
        self.messages.append(freeze(message))
        self.stamped.append(not has_time)

    def set(self, messages: Iterable[Mapping[str, Any]]) -> bool:
        """Model ``set_messages`` (no timestamps stamped); True when it replaced the history.

        A list that starts with the current history (compared without the store's
        ``_seq`` and timestamps) extends it: the version stays. Any other list replaces
        the history: both parts of the version move.
        """
        given = list(messages)
        current = self.messages
        if (
            current
            and len(given) >= len(current)
            and all(_seen(freeze(m)) == _seen(c) for m, c in zip(given, current, strict=False))
        ):
            self.messages = [*current, *(freeze(m) for m in given[len(current) :])]
            self.stamped = [*self.stamped, *([False] * (len(given) - len(current)))]
            return False
        self.messages = [freeze(m) for m in given]
        self.stamped = [False] * len(self.messages)
        self.epoch += 1
        self.commits += 1
        return True

    def clear(self) -> None:
        self.set(())

    def note_commit(self) -> None:
        self.commits += 1

    def mismatches(self, stored: Sequence[Mapping[str, Any]]) -> list[str]:
        """How ``stored`` (``manager.messages``) differs from the model; empty if it agrees."""
        problems: list[str] = []
        if len(stored) != len(self.messages):
            problems.append(f"history has {len(stored)} messages, the model {len(self.messages)}")
        for index, (message, expected, stamped) in enumerate(
            zip(stored, self.messages, self.stamped, strict=False)
        ):
            metadata = message.get("metadata")
            if not isinstance(metadata, Mapping) or metadata.get(_SEQ) != index:
                problems.append(f"message {index}: metadata._seq is not {index}")
                continue
            rest = {k: v for k, v in metadata.items() if k != _SEQ}
            if stamped and not isinstance(rest.pop("timestamp", None), str):
                problems.append(f"message {index}: no admission timestamp")
            shell = {k: v for k, v in message.items() if k != "metadata"}
            given = dict(cast(FrozenMap, expected).items)
            given_metadata = given.pop("metadata", None)
            if freeze(shell) != _frozen_map(given):
                problems.append(f"message {index}: stored message differs from the admitted one")
            wanted = dict(given_metadata.items) if isinstance(given_metadata, FrozenMap) else {}
            if freeze(rest) != _frozen_map(wanted):
                problems.append(f"message {index}: stored metadata differs from the admitted one")
        return problems

    def check(self, manager: ContextStore) -> None:
        """Raise ``AssertionError`` unless the manager's history and version agree."""
        problems = self.mismatches(manager.messages)
        if manager.version != self.version:
            problems.append(f"version {manager.version} != model {self.version}")
        if problems:
            raise AssertionError("store disagrees with the model: " + "; ".join(problems))
