"""The T8 state machine: the async store driven through an anyio blocking portal.

Hypothesis has no async stateful testing, so every rule runs its async work with
``portal.call`` (anyio's blocking portal on the chosen backend; RELIABILITY T8). Rules
interleave admissions (valid, in the three tool formats, and junk), ``set_messages``,
``clear``, ordinary and retaining requests, negotiations that commit, roll back, leak a
READY transaction (committed later, after other commits - a conflict - or never), illegal
transaction events, and faulty negotiations and requests (an error or a cancellation at a
chosen await point). Invariants after every step: the canonical history and the version
agree with ``ReferenceStore``; no transaction is left in a live state; a leaked READY
transaction changes nothing; every view met the view invariants when it was returned.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, ClassVar

import anyio
import anyio.from_thread
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amplifier_module_context_simple import ContextLengthError, SimpleContextManager
from amplifier_module_context_simple.errors import TransactionStateError
from amplifier_module_context_simple.negotiator.transaction import (
    TERMINAL,
    RequestTransaction,
    TxnEvent,
    TxnState,
    _Machine,
)
from amplifier_module_context_simple.testing import (
    CANCEL,
    ERROR,
    FaultPlan,
    FaultyHooks,
    ReferenceStore,
    check_view_invariants,
    faulty_count_view,
    snapshot,
)
from tests.negotiator.orchestrator import counting, proportional
from tests.reliability.harness import EXAMPLES, LIMIT, describe, track_transactions
from tests.reliability.strategies import BODIES, FORMATS, History, histories, junk_messages

LEGAL: dict[TxnState, frozenset[TxnEvent]] = {
    TxnState.READY: frozenset({TxnEvent.COMMIT, TxnEvent.ROLLBACK}),
    TxnState.COMMITTED: frozenset({TxnEvent.COMMIT, TxnEvent.ROLLBACK}),
    TxnState.ROLLED_BACK: frozenset({TxnEvent.COMMIT, TxnEvent.ROLLBACK}),
}
"""From CONTRACT 8.2 (not the implementation's table): what may happen to a finished one
(once terminal, ``commit`` and ``rollback`` are no-ops)."""


def _call(fmt: str, ids: list[str]) -> dict[str, Any]:
    if fmt == "openai":
        calls = [
            {"id": i, "type": "function", "function": {"name": "read", "arguments": "{}"}}
            for i in ids
        ]
        return {"role": "assistant", "content": "", "tool_calls": calls}
    if fmt == "amplifier":
        calls = [{"id": i, "tool": "read", "arguments": {}} for i in ids]
        return {"role": "assistant", "content": "calling", "tool_calls": calls}
    blocks = [{"type": "tool_use", "id": i, "name": "grep", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def _result(fmt: str, call_id: str, size: int) -> dict[str, Any]:
    body = f"result {call_id}: " + "lorem ipsum dolor sit amet " * (size // 27)
    if fmt == "anthropic":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": body}],
        }
    return {"role": "tool", "tool_call_id": call_id, "content": body}


class StoreMachine(RuleBasedStateMachine):
    backend: ClassVar[str] = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self.portal = self._stack.enter_context(
            anyio.from_thread.start_blocking_portal(self.backend)
        )
        self.ledger = self._stack.enter_context(track_transactions())
        self.hooks = FaultyHooks()
        self.manager = SimpleContextManager(
            token_meter="actual", max_tokens=6000, protected_tool_results=1, hooks=self.hooks
        )
        self.model = ReferenceStore()
        self.admitted: list[Any] = []
        self.leaked: list[tuple[RequestTransaction, tuple[int, int]]] = []
        """READY handles never committed, with the store version they were planned on."""
        self.ids = 0

    def teardown(self) -> None:
        self._stack.close()

    # -- helpers -----------------------------------------------------------------------

    def check_view(self, view: Any, **kwargs: Any) -> None:
        check_view_invariants(self.admitted, view, **kwargs)
        json.dumps(view)
        EXAMPLES["T8 views checked"] += 1

    def note_version(self, before: tuple[int, int]) -> None:
        """An ordinary request may commit its own compaction (the commit counter moves by 1)."""
        now = self.manager.version
        assert now[0] == before[0], "a request changed the history epoch"
        assert now[1] - before[1] in (0, 1), "a request committed more than once"
        if now[1] != before[1]:
            self.model.note_commit()

    def admit(self, message: Any) -> bool:
        before = snapshot(self.manager)
        try:
            self.portal.call(self.manager.add_message, message)
        except (ValueError, TypeError):
            assert snapshot(self.manager) == before, "a rejected message changed the store"
            return False
        self.model.add(message)
        self.admitted.append(message)
        return True

    def fresh_ids(self, fmt: str, n: int) -> list[str]:
        ids = []
        for _ in range(n):
            self.ids += 1
            ids.append(f"{fmt[:3]}_{self.ids}")
        return ids

    def machine(self, transaction: RequestTransaction) -> _Machine:
        return self.ledger.machine_of(transaction)

    def negotiate(self, scale: float) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            return await self.manager.get_measured_request_view(
                provider=None,
                retain_contents=[],
                count_view=counting(proportional(scale, limit=LIMIT)),
            )

        result = self.portal.call(go)
        self.check_view(result["base_view"])
        return result

    # -- admissions ---------------------------------------------------------------------

    @rule(size=st.sampled_from([10, 200, 1500]))
    def add_prompt(self, size: int) -> None:
        self.admit({"role": "user", "content": "prompt " + "word " * (size // 5)})

    @rule(
        fmt=st.sampled_from(FORMATS),
        n=st.integers(1, 3),
        size=st.sampled_from([20, 600, 3000]),
        answered=st.integers(0, 3),
    )
    def add_tool_round(self, fmt: str, n: int, size: int, answered: int) -> None:
        ids = self.fresh_ids(fmt, n)
        self.admit(_call(fmt, ids))
        for call_id in reversed(ids[: max(answered, 1) if answered else n]):
            self.admit(_result(fmt, call_id, size))

    @rule(body=st.sampled_from(BODIES))
    def add_envelope(self, body: str) -> None:
        metadata = {"ephemeral": True, "persisted": True, "source": "hook"}
        self.admit({"role": "user", "content": body, "metadata": metadata})

    @rule(message=junk_messages)
    def add_junk(self, message: Any) -> None:
        EXAMPLES["T8 junk admitted" if self.admit(message) else "T8 junk rejected"] += 1

    @rule(history=histories(max_turns=3))
    def set_messages(self, history: History) -> None:
        self.portal.call(self.manager.set_messages, history.messages)
        self.model.set(history.messages)
        self.admitted = list(history.messages)

    @rule()
    def clear(self) -> None:
        self.portal.call(self.manager.clear)
        self.model.clear()
        self.admitted = []

    # -- requests ------------------------------------------------------------------------

    @rule(budget=st.integers(900, 8000))
    def ordinary(self, budget: int) -> None:
        version = self.manager.version
        view = self.portal.call(lambda: self.manager.get_messages_for_request(token_budget=budget))
        self.note_version(version)
        self.check_view(view)

    @rule(budget=st.integers(900, 8000), hard_fit=st.booleans(), retain=st.booleans())
    def retaining(self, budget: int, hard_fit: bool, retain: bool) -> None:
        bodies = (
            sorted(
                {
                    m["content"]
                    for m in self.admitted
                    if isinstance(m, dict)
                    and m.get("content") in BODIES
                    and isinstance(m.get("metadata"), dict)
                    and m["metadata"].get("persisted") is True
                    and m["metadata"].get("ephemeral") is True
                    and m.get("role") == "user"
                }
            )
            if retain
            else []
        )
        before = snapshot(self.manager)

        async def go() -> Any:
            return await self.manager.get_messages_for_request_retaining(
                retain_contents=bodies, token_budget=budget, hard_fit=hard_fit
            )

        try:
            view = self.portal.call(go)
        except ContextLengthError:
            after = snapshot(self.manager)
            assert after == before and after.same_objects(before), "fail-closed left a trace"
            EXAMPLES["T8 retaining requests that failed closed"] += 1
            return
        self.note_version(before.version)
        self.check_view(view, retained=bodies)

    @rule(scale=st.sampled_from([0.05, 0.3, 1.0]))
    def negotiate_then_commit(self, scale: float) -> None:
        result = self.negotiate(scale)
        transaction = result["transaction"]
        if transaction is not None:
            assert self.portal.call(transaction.commit) is True
            assert self.manager._decisions is self.machine(transaction).staged.decisions
            assert self.manager.last_compaction_stats is transaction.stats
            self.model.note_commit()

    @rule(scale=st.sampled_from([0.05, 0.3, 1.0]))
    def negotiate_then_rollback(self, scale: float) -> None:
        decisions, version = self.manager._decisions, self.manager.version
        result = self.negotiate(scale)
        transaction = result["transaction"]
        if transaction is not None:
            transaction.rollback()
            assert transaction.state is TxnState.ROLLED_BACK
            assert self.portal.call(transaction.commit) is False
        assert self.manager._decisions is decisions and self.manager.version == version

    @rule(scale=st.sampled_from([0.3, 1.0]))
    def negotiate_and_leak(self, scale: float) -> None:
        version = self.manager.version  # the version the negotiation plans on
        transaction = self.negotiate(scale)["transaction"]
        if transaction is not None:
            self.leaked.append((transaction, version))

    @precondition(lambda self: bool(self.leaked))
    @rule(data=st.data())
    def commit_leaked(self, data: st.DataObject) -> None:
        transaction, version = self.leaked.pop(data.draw(st.integers(0, len(self.leaked) - 1)))
        current = self.manager.version == version
        before = snapshot(self.manager)
        committed = self.portal.call(transaction.commit)
        assert committed is current, "a stale transaction committed, or a fresh one did not"
        if committed:
            self.model.note_commit()
            assert self.manager._decisions is self.machine(transaction).staged.decisions
            assert self.manager.last_compaction_stats is transaction.stats
        else:
            assert transaction.conflict and transaction.state is TxnState.ROLLED_BACK
            after = snapshot(self.manager)
            assert after == before and after.same_objects(before), "a conflict applied something"
        EXAMPLES["T8 leaked commits " + ("applied" if committed else "in conflict")] += 1

    @precondition(lambda self: bool(self.ledger.created))
    @rule(event=st.sampled_from(list(TxnEvent)))
    def illegal_event(self, event: TxnEvent) -> None:
        """h11's rule, on every finished transaction: an illegal event raises and nothing
        happens (transaction and store); a finished one's ``commit``/``rollback`` is a no-op."""
        before = snapshot(self.manager)
        for machine in [m for m in self.ledger.created if m.state in LEGAL]:
            state, staged = machine.state, machine.staged
            if event in LEGAL[state]:
                if state not in TERMINAL:
                    continue
                machine._fire(event)  # a no-op once terminal
                outcome = "T8 no-op events on finished transactions"
                change = f"a no-op event changed the transaction: {event} in {state}"
            else:
                try:
                    machine._fire(event)
                except TransactionStateError as error:
                    assert (error.event, error.state) == (event.value, state.name), error
                else:
                    raise AssertionError(f"{event} was accepted in {state}")
                outcome = "T8 illegal events refused"
                change = f"an illegal event changed the transaction: {event} in {state}"
            assert machine.state is state and machine.staged is staged, change
            after = snapshot(self.manager)
            assert after == before and after.same_objects(before), (
                f"{event} in {state} moved the store"
            )
            EXAMPLES[outcome] += 1

    @rule(
        k=st.integers(1, 8),
        kind=st.sampled_from([ERROR, CANCEL]),
        scale=st.sampled_from([0.3, 1.0]),
        persistent=st.booleans(),
    )
    def faulty_negotiation(self, k: int, kind: str, scale: float, persistent: bool) -> None:
        plan = FaultPlan(k, kind, persistent)
        hooks = FaultyHooks(plan)
        count_view = faulty_count_view(plan, counting(proportional(scale, limit=LIMIT)))
        before = snapshot(self.manager)

        async def go() -> Any:
            self.manager.hooks = hooks
            try:
                with anyio.CancelScope() as scope:
                    plan.scope = scope
                    try:
                        return await self.manager.get_measured_request_view(
                            provider=None, retain_contents=[], count_view=count_view
                        )
                    except Exception as error:
                        return error
                return None  # cancelled
            finally:
                self.manager.hooks = self.hooks

        result = self.portal.call(go)
        after = snapshot(self.manager)
        if isinstance(result, dict):
            self.check_view(result["base_view"])
            if result["transaction"] is not None:
                result["transaction"].rollback()
            EXAMPLES["T8 faulty negotiations that returned"] += 1
            return
        assert result is None or isinstance(result, Exception), result
        assert after == before and after.same_objects(before), plan.fired
        EXAMPLES["T8 faulty negotiations that left no trace"] += 1

    @rule(
        k=st.integers(1, 3),
        kind=st.sampled_from([ERROR, CANCEL]),
        budget=st.integers(900, 8000),
    )
    def faulty_ordinary(self, k: int, kind: str, budget: int) -> None:
        plan = FaultPlan(k, kind)
        hooks = FaultyHooks(plan)
        before = snapshot(self.manager)

        async def go() -> Any:
            self.manager.hooks = hooks
            try:
                with anyio.CancelScope() as scope:
                    plan.scope = scope
                    return await self.manager.get_messages_for_request(token_budget=budget)
                return None
            finally:
                self.manager.hooks = self.hooks

        view = self.portal.call(go)
        if view is not None:
            self.note_version(before.version)
            self.check_view(view)
        elif hooks.interrupted:
            self.note_version(before.version)  # cancelled in delivery: the commit stands
        else:
            after = snapshot(self.manager)
            assert after == before and after.same_objects(before)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def history_and_version_agree_with_the_model(self) -> None:
        self.model.check(self.manager)

    @invariant()
    def no_transaction_is_left_live(self) -> None:
        for machine in self.ledger.created:
            assert machine.state in TERMINAL or machine.state is TxnState.READY, describe(machine)

    @invariant()
    def leaked_transactions_change_nothing(self) -> None:
        for transaction, _ in self.leaked:
            assert transaction.state is TxnState.READY
            assert self.manager._decisions is not self.machine(transaction).staged.decisions


class TrioStoreMachine(StoreMachine):
    backend: ClassVar[str] = "trio"
