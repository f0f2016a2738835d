"""Stateful model test of the transaction machine against a small reference model
(RELIABILITY T7).

Hypothesis drives one store and the machines (``_Machine``, the negotiation driver's
internal API) of requests planned on it: every driver method (``stage``, ``counting``,
``counted``, ``fitting``, ``fitted``, ``no_fit``, ``finish``, ``rollback``) and every event
through the transition function ``_fire`` from every state (legal and illegal), with real
candidates of the planned request; ``commit`` through the machine or through the
orchestrator's ``RequestTransaction`` handle (a synchronous wrapper runs it with
``anyio.run`` on either backend, with a predicate that says "not cancelled", "cancelled"
or raises); and the store moves that matter (``set_messages``, ``clear``, ``add_message``,
an ordinary request that may commit its own compaction). The model is written from
CONTRACT 8.2 and the transaction module's documented table (states, events and their
effects), independently of ``TRANSITIONS``.

Invariants after every step: the store's committed decisions are the model's (the same
object), its version is the model's, the canonical history is the model's (it only ever
changes by admission, ``set_messages`` or ``clear``), the live machine agrees with the
model's (state, staged candidate, conflict flag, changes) and its handle reads the same.
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
from amplifier_module_context_simple.context.negotiable import Candidate
from amplifier_module_context_simple.errors import (
    TransactionConflictError,
    TransactionStateError,
)
from amplifier_module_context_simple.negotiator.transaction import (
    RequestTransaction,
    TxnEvent,
    TxnState,
    _Machine,
)
from tests.negotiator.orchestrator import conversation
from tests.negotiator.test_transaction import API, TAKES_CANDIDATE
from tests.support import replaced

S, E = TxnState, TxnEvent

STAGE, CHECK, APPLY, DISCARD = "stage", "check history", "apply", "discard"
ROLLBACK = (S.ROLLED_BACK, (DISCARD,))
MODEL_TABLE: dict[TxnState, dict[TxnEvent, tuple[TxnState, tuple[str, ...]]]] = {
    S.STAGED: {
        E.REDUCE: (S.STAGED, (CHECK, STAGE)),
        E.COUNT: (S.COUNTING, ()),
        E.FINISH: (S.READY, (CHECK, STAGE)),
        E.ROLLBACK: ROLLBACK,
    },
    S.COUNTING: {E.RECORD: (S.COUNTED, (CHECK,)), E.ROLLBACK: ROLLBACK},
    S.COUNTED: {
        E.REDUCE: (S.STAGED, (CHECK, STAGE)),
        E.FIT: (S.FITTING, ()),
        E.FINISH: (S.READY, (CHECK, STAGE)),
        E.ROLLBACK: ROLLBACK,
    },
    S.FITTING: {
        E.FITTED: (S.READY, (CHECK, STAGE)),
        E.NO_FIT: (S.COUNTED, (CHECK,)),
        E.ROLLBACK: ROLLBACK,
    },
    S.READY: {E.COMMIT: (S.COMMITTED, (APPLY,)), E.ROLLBACK: ROLLBACK},
    S.COMMITTED: {E.COMMIT: (S.COMMITTED, ()), E.ROLLBACK: (S.COMMITTED, ())},
    S.ROLLED_BACK: {E.COMMIT: (S.ROLLED_BACK, ()), E.ROLLBACK: (S.ROLLED_BACK, ())},
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
    base: Candidate
    staged: Candidate
    version: tuple[int, int]
    """The store version the request was planned on."""
    replaced: bool = False
    """``set_messages``/``clear`` replaced the history since planning."""
    conflict: bool = False

    @property
    def changes(self) -> bool:
        return self.staged.decisions is not self.base.decisions

    def discard(self) -> None:
        self.state = S.ROLLED_BACK
        self.staged = self.base


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = SimpleContextManager(
            token_meter="actual", max_tokens=2000, protected_tool_results=1
        )
        anyio.run(self.store.set_messages, HISTORIES[0])
        self.history = self._contents(HISTORIES[0])
        self.decisions = self.store._decisions
        self.version = self.store.version
        self.machine: _Machine | None = None
        self.handle: RequestTransaction | None = None
        self.model: ModelTxn | None = None
        self.candidates: list[Candidate] = []

    # -- helpers ------------------------------------------------------------------

    @staticmethod
    def _contents(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        return [(m["role"], m.get("content")) for m in messages]

    def _reset(self, messages: list[dict[str, Any]]) -> None:
        epoch, commit = self.version
        assert self.store._decisions == Decisions()
        self.decisions = self.store._decisions
        self.version = (epoch + 1, commit + 1)
        self.history = self._contents(messages)
        if self.model is not None:
            self.model.replaced = True

    def _apply(self) -> bool:
        """The model's APPLY: check the version, then the staged decisions are the store's."""
        model = self.model
        assert model is not None
        if model.version != self.version:
            model.conflict = True
            model.discard()
            return False
        if model.changes:
            self.decisions = model.staged.decisions
            self.version = (self.version[0], self.version[1] + 1)
        return True

    def expect(self, event: TxnEvent, candidate: Candidate, act: Any) -> None:
        """``act()`` fires ``event``: the model's entry says what must happen."""
        model = self.model
        assert model is not None
        entry = MODEL_TABLE[model.state].get(event)
        if entry is None:
            try:
                act()
            except TransactionStateError as error:
                assert (error.event, error.state) == (event.value, model.state.name)
            else:
                raise AssertionError(f"{event} was accepted in {model.state}")
            return
        target, effects = entry
        for effect in effects:
            if effect == STAGE:
                model.staged = candidate
            elif effect == DISCARD:
                model.staged = model.base
            elif effect == CHECK and model.replaced:
                model.discard()
                try:
                    act()
                except TransactionConflictError:
                    return
                raise AssertionError(f"{event} after the history was replaced did not stop")
            elif effect == APPLY and not self._apply():
                try:
                    act()
                except TransactionConflictError:
                    return
                raise AssertionError("the commit step on a moved store did not conflict")
        act()
        model.state = target

    # -- transactions ---------------------------------------------------------------

    @initialize()
    def first(self) -> None:
        self.begin()

    @precondition(lambda self: self.model is None or self.model.state in TERMINAL)
    @rule()
    def begin(self) -> None:
        """Plan a request on the store as it is now; its candidates are real reductions."""
        seam = anyio.run(self.store.open_negotiation, None, [])
        reduced = [c for rung in seam.rungs if (c := seam.step(rung)) is not None]
        finalised = [seam.finalised(c, outcome="target_reached") for c in reduced[-2:]]
        self.candidates = [seam.base, *reduced, *finalised]
        self.machine = _Machine(seam)
        self.handle = RequestTransaction(self.machine)
        self.model = ModelTxn(S.STAGED, seam.base, seam.base, self.version)

    @precondition(lambda self: self.machine is not None)
    @rule(method=st.sampled_from(sorted(API)), index=st.integers(0, 15))
    def drive(self, method: str, index: int) -> None:
        """One call of the driver's API, legal or not."""
        assert self.machine is not None
        candidate = self.candidates[index % len(self.candidates)]
        call = getattr(self.machine, method)
        if method in TAKES_CANDIDATE:
            self.expect(API[method], candidate, lambda: call(candidate))
        else:
            self.expect(API[method], candidate, call)

    @precondition(lambda self: self.machine is not None)
    @rule(walk=st.integers(0, 4), data=st.data())
    def fire_events(self, walk: int, data: st.DataObject) -> None:
        """Walk up to ``walk`` legal non-terminal events (so programs reach every state), then
        fire any event, legal or not, through the transition function."""
        assert self.machine is not None and self.model is not None
        machine = self.machine

        def fire(event: TxnEvent) -> None:
            candidate = data.draw(st.sampled_from(self.candidates), label="candidate")
            self.expect(event, candidate, lambda: machine._fire(event, candidate))

        for _ in range(walk):
            table = MODEL_TABLE[self.model.state]
            legal = sorted((e for e in table if table[e][0] not in TERMINAL), key=lambda e: e.value)
            if not legal:
                break
            fire(data.draw(st.sampled_from(legal), label="legal event"))
        fire(data.draw(st.sampled_from(list(TxnEvent)), label="any event"))

    @precondition(lambda self: self.model is not None and self.model.state not in TERMINAL)
    @rule(goal=st.sampled_from([*sorted(LIVE, key=lambda s: s.value), S.READY]), data=st.data())
    def reach(self, goal: TxnState, data: st.DataObject) -> None:
        """Drive the machine along the model's shortest non-terminal path to ``goal`` (if
        there is one) through the driver's API, so every state's events get fired."""
        assert self.machine is not None and self.model is not None
        paths: dict[TxnState, list[TxnEvent]] = {self.model.state: []}
        todo = [self.model.state]
        while todo:
            state = todo.pop(0)
            for event, (following, _) in sorted(
                MODEL_TABLE[state].items(), key=lambda item: item[0].value
            ):
                if following not in TERMINAL and following not in paths:
                    paths[following] = [*paths[state], event]
                    todo.append(following)
        methods = {event: method for method, event in API.items()}
        for event in paths.get(goal, []):
            if self.model.state in TERMINAL:
                break  # a check stopped the request on the way
            candidate = data.draw(st.sampled_from(self.candidates), label="candidate")
            call = getattr(self.machine, methods[event])
            if methods[event] in TAKES_CANDIDATE:
                self.expect(event, candidate, functools.partial(call, candidate))
            else:
                self.expect(event, candidate, call)

    @precondition(lambda self: self.machine is not None)
    @rule()
    def commit_step(self) -> None:
        """The synchronous commit step: COMMIT through ``_fire``."""
        assert self.machine is not None
        machine = self.machine
        self.expect(E.COMMIT, self.candidates[0], lambda: machine._fire(E.COMMIT))

    @precondition(lambda self: self.machine is not None)
    @rule(via=st.sampled_from(["machine", "handle"]))
    def rollback(self, via: str) -> None:
        assert self.machine is not None and self.handle is not None
        rollback = self.machine.rollback if via == "machine" else self.handle.rollback
        self.expect(E.ROLLBACK, self.candidates[0], rollback)

    @precondition(lambda self: self.machine is not None)
    @rule(
        kind=st.sampled_from(["none", "not_cancelled", "cancelled", "raises"]),
        backend=st.sampled_from(["asyncio", "trio"]),
        via=st.sampled_from(["machine", "handle"]),
    )
    def commit(self, kind: str, backend: str, via: str) -> None:
        assert self.machine is not None and self.handle is not None and self.model is not None
        model = self.model
        if via == "machine":
            call = functools.partial(self.machine.commit, predicate(kind))
        else:
            call = functools.partial(self.handle.commit, is_cancelled=predicate(kind))
        if model.state in LIVE:
            try:
                anyio.run(call, backend=backend)
            except TransactionStateError as error:
                assert (error.event, error.state) == (E.COMMIT.value, model.state.name)
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
        else:
            expected = self._apply()
            if expected:
                model.state = S.COMMITTED
        assert committed is expected

    # -- the store moves --------------------------------------------------------------

    @rule(
        move=st.sampled_from(["set_messages", "clear", "add_message", "ordinary_request"]),
        index=st.integers(0, len(HISTORIES) - 1),
        text=st.text(min_size=1, max_size=40),
        budget=st.sampled_from([300, 800, 5000]),
    )
    def move_store(self, move: str, index: int, text: str, budget: int) -> None:
        """``set_messages``/``clear`` replace the history (a new version); ``add_message``
        only appends; an ordinary request may commit its own compaction (version + 1)."""
        store = self.store
        if move == "set_messages":
            history = replaced(HISTORIES[index])
            anyio.run(store.set_messages, history)
            self._reset(history)
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
        if self.machine is None or self.handle is None or self.model is None:
            return
        machine, handle, model = self.machine, self.handle, self.model
        assert machine.state is model.state
        assert machine.staged is model.staged
        assert machine.conflict is model.conflict
        assert machine.has_changes is model.changes
        assert handle.state is model.state and handle.conflict is model.conflict
        assert handle.has_changes is model.changes and handle.stats is model.staged.stats


TestTransactionMachine = TransactionMachine.TestCase
TestTransactionMachine.__doc__ = (
    "Random programs of legal and illegal events keep the store and the transaction equal to "
    "the reference model; the canonical history changes only by admission/reset."
)
