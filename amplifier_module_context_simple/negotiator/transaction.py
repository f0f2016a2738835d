"""``RequestTransaction``: the state machine of one negotiated request.

Theory of operation
-------------------
A negotiation proposes candidate views to the orchestrator's provider count and reduces
them rung by rung until one fits. Every decision it makes is *staged* here, inside the
transaction, never in the store: readers outside the transaction (an ordinary request,
another negotiation) see committed state only. The transaction becomes real only at
``commit``, which applies the staged decisions in one synchronous step and then delivers
``context:compaction``; ``rollback`` discards them.

::

    STAGED --count--> COUNTING --record--> COUNTED --reduce--> STAGED
       |                                      |  \\
       |                                      |   fit--> FITTING --fitted--> READY
       |                                      |            |
       +<-------------------reduce (no fit: the protected floor is reduced)
       +--finish--> READY <--------finish-----+
    READY --commit--> COMMITTED
    any non-terminal --rollback--> ROLLED_BACK

Rule 1: everything that affects the states and their transitions lives in this module.
Rule 2: an illegal event raises ``TransactionStateError`` naming the event and the state,
*before* any effect, so the transaction and the store are unchanged.
Rule 3: the machine is synchronous. The only awaits are in ``commit`` (one checkpoint
before the commit step, then event delivery after it), never between the last
cancellation check and the state change.

Optimistic concurrency: the transaction remembers the store version it was staged on.
If a ``set_messages``, ``clear`` or another commit moved the store before ``commit``, the
commit applies nothing, the transaction ends ROLLED_BACK with ``conflict`` set, and
``commit`` returns False (the orchestrator's "not committed: do not dispatch" answer).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio.lowlevel

from ..errors import TransactionConflictError, TransactionStateError

if TYPE_CHECKING:
    from ..context.decisions import Decisions
    from ..context.manager import SimpleContextManager


class TxnState(enum.Enum):
    """Where a negotiated request stands.

    STAGED: a candidate is staged and not yet counted.
    COUNTING: the orchestrator's ``count_view`` is counting the candidate.
    COUNTED: the candidate's count is recorded.
    FITTING: the orchestrator's ``fit_output`` is fitting the final attempt.
    READY: the result is chosen; waiting for the orchestrator to commit or roll back.
    COMMITTED: the staged decisions are the store's (terminal).
    ROLLED_BACK: nothing was applied (terminal).
    """

    STAGED = enum.auto()
    COUNTING = enum.auto()
    COUNTED = enum.auto()
    FITTING = enum.auto()
    READY = enum.auto()
    COMMITTED = enum.auto()
    ROLLED_BACK = enum.auto()


class TxnEvent(enum.Enum):
    """What can happen to a transaction."""

    COUNT = "count"
    RECORD = "record"
    REDUCE = "reduce"
    FIT = "fit"
    FITTED = "fitted"
    FINISH = "finish"
    COMMIT = "commit"
    ROLLBACK = "rollback"


TERMINAL: Final = frozenset({TxnState.COMMITTED, TxnState.ROLLED_BACK})

_LIVE: Final = (TxnState.STAGED, TxnState.COUNTING, TxnState.COUNTED, TxnState.FITTING)

TRANSITIONS: Final[Mapping[TxnState, Mapping[TxnEvent, TxnState]]] = {
    TxnState.STAGED: {
        TxnEvent.COUNT: TxnState.COUNTING,
        TxnEvent.REDUCE: TxnState.STAGED,  # a rung applied without counting (skipped count)
        TxnEvent.FINISH: TxnState.READY,
        TxnEvent.ROLLBACK: TxnState.ROLLED_BACK,
    },
    TxnState.COUNTING: {
        TxnEvent.RECORD: TxnState.COUNTED,
        TxnEvent.ROLLBACK: TxnState.ROLLED_BACK,
    },
    TxnState.COUNTED: {
        TxnEvent.REDUCE: TxnState.STAGED,
        TxnEvent.FIT: TxnState.FITTING,
        TxnEvent.FINISH: TxnState.READY,
        TxnEvent.ROLLBACK: TxnState.ROLLED_BACK,
    },
    TxnState.FITTING: {
        TxnEvent.FITTED: TxnState.READY,
        # fit_output found no fit: the protected floor is reduced instead
        TxnEvent.REDUCE: TxnState.STAGED,
        TxnEvent.ROLLBACK: TxnState.ROLLED_BACK,
    },
    TxnState.READY: {
        TxnEvent.COMMIT: TxnState.COMMITTED,
        TxnEvent.ROLLBACK: TxnState.ROLLED_BACK,
    },
    TxnState.COMMITTED: {},
    TxnState.ROLLED_BACK: {},
}


class RequestTransaction:
    """Staged compaction decisions of one negotiated request, and their fate.

    Orchestrators use only ``commit`` and ``rollback``; the negotiation driver moves the
    transaction through its states with ``fire`` and stages decisions with ``stage``.
    """

    def __init__(
        self, store: SimpleContextManager, base: Decisions, version: tuple[int, int]
    ) -> None:
        self._store = store
        self._state = TxnState.STAGED
        self._version = version
        self._base = base
        self._staged = base
        self.conflict = False
        """True when the commit found the store moved since staging (nothing applied)."""

    def __repr__(self) -> str:
        return f"<RequestTransaction state={self._state.name} changed={self.has_changes}>"

    # -- state --------------------------------------------------------------------

    @property
    def state(self) -> TxnState:
        return self._state

    @property
    def is_terminal(self) -> bool:
        return self._state in TERMINAL

    @property
    def staged(self) -> Decisions:
        """The decisions this transaction would commit (the base when nothing changed)."""
        return self._staged

    @property
    def has_changes(self) -> bool:
        """Whether anything beyond the committed decisions is staged."""
        return self._staged is not self._base

    @property
    def stats(self) -> dict[str, Any] | None:
        return self._staged.stats

    def fire(self, event: TxnEvent) -> TxnState:
        """Apply one event; raise ``TransactionStateError`` (changing nothing) if illegal."""
        try:
            new_state = TRANSITIONS[self._state][event]
        except KeyError:
            raise TransactionStateError(event.value, self._state.name) from None
        self._state = new_state
        return new_state

    def stage(self, decisions: Decisions) -> None:
        """Replace the staged decisions (only while the transaction is live)."""
        if self._state not in _LIVE:
            raise TransactionStateError("stage", self._state.name)
        self._staged = decisions

    # -- the orchestrator API ------------------------------------------------------------

    def rollback(self) -> None:
        """Discard everything staged. Synchronous; a no-op once terminal."""
        if self._state not in TERMINAL:
            self.fire(TxnEvent.ROLLBACK)
            self._staged = self._base

    def apply(self) -> None:
        """Commit synchronously: check the version, apply, become COMMITTED.

        Raises:
            TransactionStateError: not READY (nothing changes).
            TransactionConflictError: the store moved since staging; the transaction is
                rolled back and nothing is applied.
        """
        if TxnEvent.COMMIT not in TRANSITIONS[self._state]:
            raise TransactionStateError(TxnEvent.COMMIT.value, self._state.name)
        if self._store.version != self._version:
            self.conflict = True
            self.rollback()
            raise TransactionConflictError(
                "the context changed since this request was negotiated "
                "(set_messages, clear or another commit); nothing was applied"
            )
        if self.has_changes:
            self._store.apply_decisions(self._staged)
        self.fire(TxnEvent.COMMIT)

    async def commit(self, *, is_cancelled: Callable[[], bool] | None = None) -> bool:
        """Commit immediately before dispatch; return whether the decisions now stand.

        Returns False, with nothing applied, when the transaction was rolled back, when
        ``is_cancelled()`` is true, or when the store changed since staging (conflict).
        Returns True, idempotently, once committed. After the synchronous commit step,
        ``context:compaction`` is delivered; the commit stands even if the caller is
        cancelled during that delivery. A raising ``is_cancelled`` propagates and leaves
        the transaction READY (the caller may still roll it back).
        """
        # The last checkpoint: from here to the commit step nothing awaits.
        await anyio.lowlevel.checkpoint()
        if self._state is TxnState.COMMITTED:
            return True
        if self._state is TxnState.ROLLED_BACK:
            return False
        if self._state is not TxnState.READY:
            raise TransactionStateError(TxnEvent.COMMIT.value, self._state.name)
        if is_cancelled is not None and is_cancelled():
            self.rollback()
            return False
        try:
            self.apply()
        except TransactionConflictError:
            return False
        # -- committed: delivery may be interrupted, the commit stands ---------------------
        stats = self._staged.stats
        if self.has_changes and stats is not None:
            await self._store.deliver_compaction(stats)
        return True
