"""Stateful model test of ``RequestTransaction`` against a small reference model (RELIABILITY T7).

Hypothesis drives one store and its transactions with every event from every state
(legal and illegal), ``stage``/``apply``/``rollback``, ``commit`` (through a synchronous
wrapper that runs it with ``anyio.run`` on either backend, with a predicate that says
"not cancelled", "cancelled" or raises) and the store moves that matter to optimistic
concurrency (``set_messages``, ``clear``, ``add_message``, an ordinary request that may
commit its own compaction). The model is written from CONTRACT 8.2, independently of the
implementation's transition table.

Invariants after every step: the store's committed decisions are the model's (the same
object), its version is the model's, the canonical history is the model's (it only ever
changes by admission, ``set_messages`` or ``clear``), and the live transaction agrees with
the model's (state, staged object, conflict flag).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import anyio
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.decisions import Decisions
from amplifier_module_context_simple.errors import (
    TransactionConflictError,
    TransactionStateError,
)
from amplifier_module_context_simple.negotiator.transaction import (
    RequestTransaction,
    TxnEvent,
    TxnState,
)
from tests.negotiator.orchestrator import conversation

S, E = TxnState, TxnEvent

MODEL_TABLE: dict[TxnState, dict[TxnEvent, TxnState]] = {
    S.STAGED: {
        E.COUNT: S.COUNTING,
        E.REDUCE: S.STAGED,
        E.FINISH: S.READY,
        E.ROLLBACK: S.ROLLED_BACK,
    },
    S.COUNTING: {E.RECORD: S.COUNTED, E.ROLLBACK: S.ROLLED_BACK},
    S.COUNTED: {E.REDUCE: S.STAGED, E.FIT: S.FITTING, E.FINISH: S.READY, E.ROLLBACK: S.ROLLED_BACK},
    S.FITTING: {E.FITTED: S.READY, E.REDUCE: S.STAGED, E.ROLLBACK: S.ROLLED_BACK},
    S.READY: {E.COMMIT: S.COMMITTED, E.ROLLBACK: S.ROLLED_BACK},
    S.COMMITTED: {},
    S.ROLLED_BACK: {},
}
LIVE = frozenset({S.STAGED, S.COUNTING, S.COUNTED, S.FITTING})
TERMINAL = frozenset({S.COMMITTED, S.ROLLED_BACK})

HISTORIES = [conversation(3, size=600), conversation(2, size=900, rounds=2), []]


class PredicateError(Exception):
    pass


def predicate(kind: str) -> Any:
    if kind == "none":
        return None
    if kind == "raises":

        def raising() -> bool:
            raise PredicateError(kind)

        return raising
    return lambda: kind == "cancelled"


@dataclass
class ModelTxn:
    state: TxnState
    base: Decisions
    staged: Decisions
    version: tuple[int, int]
    conflict: bool = False

    def discard(self) -> None:
        self.state = S.ROLLED_BACK
        self.staged = self.base


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = SimpleContextManager(token_meter="actual", max_tokens=2000)
        anyio.run(self.store.set_messages, HISTORIES[0])
        self.history = self._contents(HISTORIES[0])
        self.decisions = self.store._decisions
        self.version = self.store.version
        self.candidates = self._candidates()
        self.txn: RequestTransaction | None = None
        self.model: ModelTxn | None = None

    # -- helpers ------------------------------------------------------------------

    @staticmethod
    def _contents(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        return [(m["role"], m.get("content")) for m in messages]

    def _candidates(self) -> list[Decisions]:
        """Real staged decisions: the committed ones plus rungs 1..k of a ladder."""
        store = self.store
        plan = anyio.run(
            functools.partial(
                store.plan_request, token_budget=None, provider=None, retain=(), hard_fit=False
            )
        )
        ladder = store.ladder_for(plan, plan.decisions, target=-1, extra_protected=frozenset())
        candidates = []
        for rung in range(1, 9):
            ladder.apply(rung)
            candidates.append(plan.decisions.merged(ladder))
        return candidates

    def _reset(self, messages: list[dict[str, Any]]) -> None:
        epoch, commit = self.version
        assert self.store._decisions == Decisions()
        self.decisions = self.store._decisions
        self.version = (epoch + 1, commit + 1)
        self.history = self._contents(messages)

    def _commit_model(self) -> None:
        assert self.model is not None
        if self.model.staged is not self.model.base:
            self.decisions = self.model.staged
            self.version = (self.version[0], self.version[1] + 1)
        self.model.state = S.COMMITTED

    # -- transactions ---------------------------------------------------------------

    @initialize()
    def first(self) -> None:
        self.begin()

    @precondition(lambda self: self.model is None or self.model.state in TERMINAL)
    @rule()
    def begin(self) -> None:
        self.txn = RequestTransaction(self.store, self.store._decisions, self.store.version)
        self.model = ModelTxn(S.STAGED, self.decisions, self.decisions, self.version)

    def fire(self, event: TxnEvent) -> None:
        assert self.txn is not None and self.model is not None
        target = MODEL_TABLE[self.model.state].get(event)
        if target is None:
            try:
                self.txn.fire(event)
            except TransactionStateError as error:
                assert (error.event, error.state) == (event.value, self.model.state.name)
            else:
                raise AssertionError(f"{event} was accepted in {self.model.state}")
            return
        assert self.txn.fire(event) is target
        self.model.state = target

    @precondition(lambda self: self.txn is not None)
    @rule(walk=st.integers(0, 4), data=st.data())
    def fire_events(self, walk: int, data: st.DataObject) -> None:
        """Walk up to ``walk`` legal non-terminal events (so programs reach every state), then
        fire any event, legal or not."""
        assert self.model is not None
        for _ in range(walk):
            table = MODEL_TABLE[self.model.state]
            legal = sorted((e for e in table if table[e] not in TERMINAL), key=lambda e: e.value)
            if not legal:
                break
            self.fire(data.draw(st.sampled_from(legal), label="legal event"))
        self.fire(data.draw(st.sampled_from(list(TxnEvent)), label="any event"))

    @precondition(lambda self: self.txn is not None)
    @rule(index=st.integers(0, 7))
    def stage(self, index: int) -> None:
        assert self.txn is not None and self.model is not None
        decisions = self.candidates[index]
        if self.model.state in LIVE:
            self.txn.stage(decisions)
            self.model.staged = decisions
            return
        try:
            self.txn.stage(decisions)
        except TransactionStateError:
            return
        raise AssertionError(f"stage was accepted in {self.model.state}")

    @precondition(lambda self: self.txn is not None)
    @rule()
    def apply(self) -> None:
        assert self.txn is not None and self.model is not None
        if self.model.state is not S.READY:
            try:
                self.txn.apply()
            except TransactionStateError:
                return
            raise AssertionError(f"apply was accepted in {self.model.state}")
        if self.model.version != self.version:
            try:
                self.txn.apply()
            except TransactionConflictError:
                self.model.conflict = True
                self.model.discard()
                return
            raise AssertionError("apply on a moved store did not conflict")
        self.txn.apply()
        self._commit_model()

    @precondition(lambda self: self.txn is not None)
    @rule()
    def rollback(self) -> None:
        assert self.txn is not None and self.model is not None
        self.txn.rollback()
        if self.model.state not in TERMINAL:
            self.model.discard()

    @precondition(lambda self: self.txn is not None)
    @rule(
        kind=st.sampled_from(["none", "not_cancelled", "cancelled", "raises"]),
        backend=st.sampled_from(["asyncio", "trio"]),
    )
    def commit(self, kind: str, backend: str) -> None:
        assert self.txn is not None and self.model is not None
        model = self.model
        call = functools.partial(self.txn.commit, is_cancelled=predicate(kind))
        if model.state in LIVE:
            try:
                anyio.run(call, backend=backend)
            except TransactionStateError:
                return
            raise AssertionError(f"commit was accepted in {model.state}")
        if model.state in TERMINAL:
            assert anyio.run(call, backend=backend) is (model.state is S.COMMITTED)
            return
        if kind == "raises":
            try:
                anyio.run(call, backend=backend)
            except PredicateError:
                return  # still READY, nothing applied
            raise AssertionError("a raising predicate was swallowed")
        committed = anyio.run(call, backend=backend)
        if kind == "cancelled":
            model.discard()
            expected = False
        elif model.version != self.version:
            model.conflict = True
            model.discard()
            expected = False
        else:
            self._commit_model()
            expected = True
        assert committed is expected

    # -- the store moves --------------------------------------------------------------

    @rule(
        move=st.sampled_from(["set_messages", "clear", "add_message", "ordinary_request"]),
        index=st.integers(0, len(HISTORIES) - 1),
        text=st.text(min_size=1, max_size=40),
        budget=st.sampled_from([300, 800, 5000]),
    )
    def move_store(self, move: str, index: int, text: str, budget: int) -> None:
        """``set_messages``/``clear`` reset the store (a new version); ``add_message`` only
        appends; an ordinary request may commit its own compaction (version + 1)."""
        store = self.store
        if move == "set_messages":
            anyio.run(store.set_messages, HISTORIES[index])
            self._reset(HISTORIES[index])
            self.candidates = self._candidates()
        elif move == "clear":
            anyio.run(store.clear)
            self._reset([])
        elif move == "add_message":
            anyio.run(store.add_message, {"role": "user", "content": text})
            self.history.append(("user", text))
        else:
            anyio.run(functools.partial(store.get_messages_for_request, token_budget=budget))
            if store._decisions is not self.decisions:
                assert store.version == (self.version[0], self.version[1] + 1)
                self.decisions = store._decisions
                self.version = store.version

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def store_agrees_with_model(self) -> None:
        assert self.store._decisions is self.decisions
        assert self.store.version == self.version
        assert self._contents(self.store.messages) == self.history

    @invariant()
    def transaction_agrees_with_model(self) -> None:
        if self.txn is None or self.model is None:
            return
        assert self.txn.state is self.model.state
        assert self.txn.staged is self.model.staged
        assert self.txn.conflict is self.model.conflict
        assert self.txn.is_terminal is (self.model.state in TERMINAL)
        assert self.txn.has_changes is (self.model.staged is not self.model.base)


TestTransactionMachine = TransactionMachine.TestCase
TestTransactionMachine.__doc__ = (
    "Random programs of legal and illegal events keep the store and the transaction equal to "
    "the reference model; the canonical history changes only by admission/reset."
)
