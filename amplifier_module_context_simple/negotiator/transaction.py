"""``RequestTransaction``: the state machine of one negotiated request, whole.

Theory of operation
-------------------
A negotiation proposes candidate views to the orchestrator's provider count and reduces
them rung by rung until one fits. Every candidate it keeps is *staged* here, inside the
transaction, never in the store: readers outside it (an ordinary request, another
negotiation) see committed state only. The transaction becomes real only at ``commit``,
which applies the staged decisions in one synchronous step through the store's one
commit primitive and then delivers ``context:compaction``; ``rollback`` discards them.

Everything about the machine is in this module, in one table. Each entry says, for a
state and an event, the next state and the effects the transition performs, in order;
``_Machine._fire`` is the only function that changes the state, and it performs exactly
the effects of the entry it found::

    state      event     next         effects
    STAGED     reduce    STAGED       check the history; stage the candidate (a rung
                                      applied, count skipped)
    STAGED     count     COUNTING     -
    STAGED     finish    READY        check the history; stage the final candidate (with
                                      its stats)
    COUNTING   record    COUNTED      check the history was not replaced meanwhile
    COUNTED    reduce    STAGED       check the history; stage the candidate
    COUNTED    fit       FITTING      -
    COUNTED    finish    READY        check the history; stage the final candidate
    FITTING    fitted    READY        check the history; stage the final candidate
    FITTING    no_fit    COUNTED      check the history (fit_output found no output cap)
    READY      commit    COMMITTED    check the store's version; apply the staged decisions
    live       rollback  ROLLED_BACK  discard
    COMMITTED  commit    COMMITTED    - (idempotent: commit() answers True)
    COMMITTED  rollback  COMMITTED    - (a committed request stays committed)
    ROLLED_BACK commit   ROLLED_BACK  - (commit() answers False)
    ROLLED_BACK rollback ROLLED_BACK  -

Rule 1: legality has one source, the table. An event without an entry raises
``TransactionStateError`` naming the event and the state, before any effect.
Rule 2: an effect that fails ends the transaction ROLLED_BACK with nothing applied and
raises ``TransactionConflictError`` (the history was replaced during a count or a fit, or while
the candidate being staged was built in slices, ``Negotiable.pace``: ``conflict`` stays
False; the store moved before the commit: ``conflict`` is True and ``commit`` answers False
instead of raising). An admission does not stop a transaction: it is for the planned
prefix of the history.
Rule 3: the machine is synchronous. The only awaits are in ``commit``: one checkpoint
before the cancellation check and the commit step, then event delivery after it (the
commit stands once delivery starts, even if the caller is cancelled during it).

Orchestrators receive a ``RequestTransaction``: ``commit``, ``rollback``, and the
read-only ``state``, ``conflict``, ``has_changes`` and ``stats``. The negotiation driver
holds the machine itself (``_Machine``), which is
not reachable from the handle.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio.lowlevel

from ..errors import TransactionConflictError, TransactionStateError

if TYPE_CHECKING:
    from ..context.policy.negotiable import Candidate, Negotiable

__all__ = ("TRANSITIONS", "Effect", "RequestTransaction", "TxnEvent", "TxnState")


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
    NO_FIT = "no_fit"
    FINISH = "finish"
    COMMIT = "commit"
    ROLLBACK = "rollback"


class Effect(enum.Enum):
    """What a transition does besides changing the state."""

    STAGE = "stage the given candidate"
    CHECK_HISTORY = "stop if the history was replaced since planning"
    APPLY = "check the store's version, then apply the staged decisions"
    DISCARD = "discard the staged decisions"


S, E = TxnState, TxnEvent
_ROLLBACK: Final = (S.ROLLED_BACK, (Effect.DISCARD,))

TRANSITIONS: Final[Mapping[TxnState, Mapping[TxnEvent, tuple[TxnState, tuple[Effect, ...]]]]] = {
    S.STAGED: {
        E.REDUCE: (S.STAGED, (Effect.CHECK_HISTORY, Effect.STAGE)),
        E.COUNT: (S.COUNTING, ()),
        E.FINISH: (S.READY, (Effect.CHECK_HISTORY, Effect.STAGE)),
        E.ROLLBACK: _ROLLBACK,
    },
    S.COUNTING: {
        E.RECORD: (S.COUNTED, (Effect.CHECK_HISTORY,)),
        E.ROLLBACK: _ROLLBACK,
    },
    S.COUNTED: {
        E.REDUCE: (S.STAGED, (Effect.CHECK_HISTORY, Effect.STAGE)),
        E.FIT: (S.FITTING, ()),
        E.FINISH: (S.READY, (Effect.CHECK_HISTORY, Effect.STAGE)),
        E.ROLLBACK: _ROLLBACK,
    },
    S.FITTING: {
        E.FITTED: (S.READY, (Effect.CHECK_HISTORY, Effect.STAGE)),
        E.NO_FIT: (S.COUNTED, (Effect.CHECK_HISTORY,)),
        E.ROLLBACK: _ROLLBACK,
    },
    S.READY: {
        E.COMMIT: (S.COMMITTED, (Effect.APPLY,)),
        E.ROLLBACK: _ROLLBACK,
    },
    S.COMMITTED: {
        E.COMMIT: (S.COMMITTED, ()),
        E.ROLLBACK: (S.COMMITTED, ()),
    },
    S.ROLLED_BACK: {
        E.COMMIT: (S.ROLLED_BACK, ()),
        E.ROLLBACK: (S.ROLLED_BACK, ()),
    },
}
del S, E

TERMINAL: Final = frozenset({TxnState.COMMITTED, TxnState.ROLLED_BACK})


class _Machine:
    """The transaction itself; the negotiation driver's internal API."""

    __slots__ = ("_apply", "_base", "_seam", "_staged", "_state", "conflict")

    def __init__(self, seam: Negotiable) -> None:
        self._seam = seam
        self._apply = seam.claim_commit()
        """The request's one commit: only this transaction holds it."""
        self._state = TxnState.STAGED
        self._base = seam.committed
        self._staged = self._base
        self.conflict = False

    @property
    def state(self) -> TxnState:
        return self._state

    @property
    def staged(self) -> Candidate:
        return self._staged

    @property
    def has_changes(self) -> bool:
        """Whether anything beyond the committed decisions is staged."""
        return self._seam.changed(self._staged)

    def _fire(self, event: TxnEvent, candidate: Candidate | None = None) -> None:
        """The transition function: look ``event`` up, perform its effects, move.

        Raises:
            TransactionStateError: ``event`` has no entry for the current state (nothing
                changes).
            TransactionConflictError: a check failed; the transaction is ROLLED_BACK.
        """
        entry = TRANSITIONS[self._state].get(event)
        if entry is None:
            raise TransactionStateError(event.value, self._state.name)
        target, effects = entry
        for effect in effects:
            if effect is Effect.STAGE:
                if candidate is None:
                    raise TypeError(f"{event.value} needs the candidate to stage")
                self._staged = candidate
            elif effect is Effect.DISCARD:
                self._staged = self._base
            elif effect is Effect.CHECK_HISTORY:
                if self._seam.history_replaced():
                    self._end()
                    raise TransactionConflictError(
                        "the context history was replaced (set_messages or clear) while "
                        "this request was being planned or counted; nothing was applied"
                    )
            else:  # Effect.APPLY: the version is checked even with nothing to apply
                try:
                    if self.has_changes:
                        self._apply(self._staged)
                    else:
                        self._seam.check_current()
                except TransactionConflictError:
                    self.conflict = True
                    self._end()
                    raise
        self._state = target

    def _end(self) -> None:
        self._staged = self._base
        self._state = TxnState.ROLLED_BACK

    # -- the driver's API -------------------------------------------------------------

    def stage(self, candidate: Candidate) -> None:
        self._fire(TxnEvent.REDUCE, candidate)

    def counting(self) -> None:
        self._fire(TxnEvent.COUNT)

    def counted(self) -> None:
        self._fire(TxnEvent.RECORD)

    def fitting(self) -> None:
        self._fire(TxnEvent.FIT)

    def fitted(self, candidate: Candidate) -> None:
        self._fire(TxnEvent.FITTED, candidate)

    def no_fit(self) -> None:
        self._fire(TxnEvent.NO_FIT)

    def finish(self, candidate: Candidate) -> None:
        self._fire(TxnEvent.FINISH, candidate)

    def rollback(self) -> None:
        self._fire(TxnEvent.ROLLBACK)

    async def commit(self, is_cancelled: Callable[[], bool] | None) -> bool:
        # The last checkpoint: from here to the commit step nothing awaits.
        await anyio.lowlevel.checkpoint()
        if self._state in TERMINAL:
            self._fire(TxnEvent.COMMIT)  # a table no-op
            return self._state is TxnState.COMMITTED
        if self._state is TxnState.READY and is_cancelled is not None and is_cancelled():
            self._fire(TxnEvent.ROLLBACK)
            return False
        try:
            self._fire(TxnEvent.COMMIT)
        except TransactionConflictError:
            return False
        # -- committed: delivery may be interrupted, the commit stands ---------------------
        stats = self._staged.stats
        if self.has_changes and stats is not None:
            await self._seam.deliver_compaction(stats)
        return True


class RequestTransaction:
    """What an orchestrator holds of a negotiated request: commit it or roll it back.

    ``state`` and ``conflict`` are read-only; nothing here can move the transaction any
    other way.
    """

    __slots__ = ("__machine",)

    def __init__(self, machine: _Machine) -> None:
        self.__machine = machine

    @property
    def state(self) -> TxnState:
        """``READY`` until ``commit``/``rollback``; then ``COMMITTED`` or ``ROLLED_BACK``.

        After a ``commit`` that was cancelled: ``COMMITTED`` means the decisions stand
        (delivery had started; do not negotiate them again), ``READY`` means the commit
        step was never reached (roll back, or commit again), ``ROLLED_BACK`` means nothing
        was applied.
        """
        return self.__machine.state

    @property
    def conflict(self) -> bool:
        """True when ``commit`` found the store changed since the request was planned."""
        return self.__machine.conflict

    @property
    def stats(self) -> dict[str, Any] | None:
        """The compaction stats the commit would make the store's (read-only by contract;
        ``context:compaction`` delivers a copy)."""
        return self.__machine.staged.stats

    @property
    def has_changes(self) -> bool:
        """Whether committing would change the store's decisions."""
        return self.__machine.has_changes

    def __repr__(self) -> str:
        machine = self.__machine
        return (
            f"<RequestTransaction state={machine.state.name} changes={machine.has_changes} "
            f"conflict={machine.conflict}>"
        )

    async def commit(self, *, is_cancelled: Callable[[], bool] | None = None) -> bool:
        """Commit immediately before dispatch; return whether the decisions now stand.

        Returns False, with nothing applied, when the transaction was rolled back, when
        ``is_cancelled()`` is true, or when the store changed since planning (``conflict``
        is then True). Returns True, idempotently, once committed. After the synchronous
        commit step, ``context:compaction`` is delivered; the commit stands even if the
        caller is cancelled during that delivery. A raising ``is_cancelled`` propagates
        and leaves the transaction READY (the caller may still roll it back).

        Raises:
            TransactionStateError: the negotiation has not finished (never the case for a
                transaction returned by ``get_measured_request_view``).
        """
        return await self.__machine.commit(is_cancelled)

    def rollback(self) -> None:
        """Discard everything staged. Synchronous; a no-op once committed or rolled back."""
        self.__machine.rollback()
