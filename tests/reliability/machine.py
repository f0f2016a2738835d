"""The stateful model of the store (docs/design.md section 10), on asyncio and on trio.

Hypothesis has no async stateful testing, so every rule runs its async work with
``portal.call`` (anyio's blocking portal on the machine's backend). One machine drives one
store through everything that changes it, against two models written from the contract
(docs/design.md sections 3.1 and 5.3), independently of the implementation's tables:

- ``ReferenceStore`` (``testing``): the canonical history and the version;
- the committed decisions: the very object the last commit made the store's (an ordinary
  request's own, a transaction's staged one), reset by ``set_messages``/``clear``;
- the preserved-thinking rule (``testing.thinking_oracle.PrefixLedger``): the model answers
  the view of the latest request (when it returned one that a provider accepts, and
  before anything else is admitted or requested) with an assistant message carrying
  thinking blocks, and every
  later view must show each block with the prefix it was produced with and leave out none
  that could have been sent validly (a replaced or cleared history starts over);
- ``MODEL_TABLE``: the transaction machine (states, events, their effects) of one request
  the model *drives* through its internal API - every driver method (``stage``,
  ``counting``, ``counted``, ``fitting``, ``fitted``, ``no_fit``, ``finish``,
  ``rollback``) and every event through the transition function ``_fire`` from every state,
  legal and illegal, with real candidates of the planned request; ``commit`` through the
  machine or the orchestrator's ``RequestTransaction`` handle, with a predicate that says
  "not cancelled", "cancelled" or raises.

Rules interleave admissions (valid, in the three tool formats, and junk),
``set_messages`` (extending or replacing), ``clear``, ordinary and retaining requests,
negotiations that commit, roll back, leak a READY transaction (committed later, after
other commits - a conflict - or never), illegal events on finished transactions, faulty
negotiations and requests (an error or a cancellation at a chosen await point), and the
driven transaction. Invariants after every step: the history and the version agree with
``ReferenceStore``; the committed decisions are the model's (the same object); no
transaction but the driven one is left live; a leaked READY transaction changes nothing;
the driven machine and its handle agree with the model (state, staged candidate, conflict
flag, changes); every view met the view invariants when it was returned.
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
import anyio.from_thread
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amplifier_module_context_simple import ContextLengthError, SimpleContextManager
from amplifier_module_context_simple.context.ladder.decisions import Decisions
from amplifier_module_context_simple.context.policy.negotiable import Candidate
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.errors import (
    TransactionConflictError,
    TransactionStateError,
)
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
from amplifier_module_context_simple.testing.thinking_oracle import PrefixLedger
from tests.negotiator.orchestrator import counting, proportional
from tests.negotiator.test_transaction import API, TAKES_CANDIDATE
from tests.reliability.harness import EXAMPLES, LIMIT, describe, track_transactions
from tests.reliability.strategies import BODIES, FORMATS, History, histories, junk_messages

S, E = TxnState, TxnEvent

LEGAL: dict[TxnState, frozenset[TxnEvent]] = {
    TxnState.READY: frozenset({TxnEvent.COMMIT, TxnEvent.ROLLBACK}),
    TxnState.COMMITTED: frozenset({TxnEvent.COMMIT, TxnEvent.ROLLBACK}),
    TxnState.ROLLED_BACK: frozenset({TxnEvent.COMMIT, TxnEvent.ROLLBACK}),
}
"""From the transaction's documented rules (docs/design.md section 5.3; not the implementation's table): what may happen to a finished one
(once terminal, ``commit`` and ``rollback`` are no-ops)."""

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
"""The transaction's table as the model reads docs/design.md section 5.3 and the transaction module's
documentation: state -> event -> (next state, effects in order). Missing: illegal."""
LIVE = frozenset({S.STAGED, S.COUNTING, S.COUNTED, S.FITTING})


class PredicateError(Exception):
    """What a raising ``is_cancelled`` predicate raises."""


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
    """The model of the driven transaction."""

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


@dataclass
class Driven:
    """The transaction the model drives through the machine's internal API."""

    machine: _Machine
    handle: RequestTransaction
    model: ModelTxn
    candidates: list[Candidate]


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
        self.decisions = self.manager._decisions
        """The committed decisions the model expects: the very object."""
        self.admitted: list[Any] = []
        self.leaked: list[tuple[RequestTransaction, tuple[int, int]]] = []
        """READY handles never committed, with the store version they were planned on."""
        self.ids = 0
        self.driven: Driven | None = None
        self.thinking = PrefixLedger()
        self.sent: list[dict[str, Any]] | None = None
        """The last view a request returned for sending (what the next answer answers)."""
        self.thoughts = 0
        self.answerable = False

    def teardown(self) -> None:
        self._stack.close()

    # -- helpers -----------------------------------------------------------------------

    def check_view(self, view: Any, *, sent: bool = True, **kwargs: Any) -> None:
        report = check_view_invariants(self.admitted, view, **kwargs)
        json.dumps(view)
        EXAMPLES["T8 views checked"] += 1
        verdict = self.thinking.check(view)
        assert verdict.invalid == (), f"thinking shown with another prefix: {verdict.invalid}"
        assert verdict.left_out == 0, "thinking left out that could have been sent validly"
        if verdict.shown:
            EXAMPLES["T8 views showing thinking"] += 1
        # (a view with calls still waiting for results is not one a provider answers)
        self.answerable = not report.pending
        if sent and self.answerable:
            self.sent = view

    def note_version(self, before: tuple[int, int]) -> None:
        """An ordinary request may commit its own compaction (the commit counter moves by 1,
        and the store's decisions are the request's own new object)."""
        now = self.manager.version
        assert now[0] == before[0], "a request changed the history epoch"
        assert now[1] - before[1] in (0, 1), "a request committed more than once"
        if now[1] != before[1]:
            self.model.note_commit()
            assert self.manager._decisions is not self.decisions, "a commit kept the decisions"
            self.decisions = self.manager._decisions

    def note_reset(self, replaced: bool) -> None:
        """After ``set_messages``/``clear``: a replaced history starts with no decisions
        (and its views are a new base: nothing it shows was produced by an earlier view)."""
        if not replaced:
            return
        self.thinking = PrefixLedger()
        self.sent = None
        assert self.manager._decisions == Decisions(), "a reset kept sticky decisions"
        self.decisions = self.manager._decisions
        if self.driven is not None:
            self.driven.model.replaced = True

    def note_commit(self, transaction: RequestTransaction) -> None:
        """A transaction committed: the store's decisions are its staged ones."""
        self.model.note_commit()
        staged = self.machine(transaction).staged.decisions
        assert self.manager._decisions is staged
        assert self.manager.last_compaction_stats is transaction.stats
        self.decisions = staged

    def admit(self, message: Any) -> bool:
        self.sent = None  # an answer answers the view it follows directly
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
        self.sent = None  # a new request: only its own view can be answered

        async def go() -> dict[str, Any]:
            return await self.manager.get_measured_request_view(
                provider=None,
                retain_contents=[],
                count_view=counting(proportional(scale, limit=LIMIT)),
            )

        result: dict[str, Any] = self.portal.call(go)
        self.check_view(result["base_view"], sent=False)
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

    @precondition(lambda self: self.sent is not None)
    @rule(fmt=st.sampled_from(["anthropic", "amplifier"]), calls=st.integers(0, 2))
    def answer(self, fmt: str, calls: int) -> None:
        """The model answers the last view it was sent: thinking (and text, and calls)."""
        assert self.sent is not None
        self.thoughts += 1
        blocks: list[dict[str, Any]] = [
            {
                "type": "thinking",
                "thinking": f"thought {self.thoughts} " + "reasoning " * 40,
                "signature": f"sig-{self.thoughts}",
            },
            {"type": "text", "text": f"answer {self.thoughts}"},
        ]
        ids = self.fresh_ids(fmt, calls)
        message: dict[str, Any] = {"role": "assistant", "content": blocks}
        if fmt == "anthropic":
            blocks += [{"type": "tool_use", "id": i, "name": "grep", "input": {}} for i in ids]
        elif ids:
            blocks[0]["visibility"] = "internal"
            blocks += [{"type": "tool_call", "id": i, "name": "read", "input": {}} for i in ids]
            message["tool_calls"] = [{"id": i, "tool": "read", "arguments": {}} for i in ids]
        view, self.sent = self.sent, None
        if not self.admit(message):
            return
        self.thinking.answered(view, message)
        EXAMPLES["T8 answers with thinking"] += 1
        for call_id in ids:
            self.admit(_result(fmt, call_id, 600))

    @rule(body=st.sampled_from(BODIES))
    def add_envelope(self, body: str) -> None:
        metadata = {"ephemeral": True, "persisted": True, "source": "hook"}
        self.admit({"role": "user", "content": body, "metadata": metadata})

    @rule(message=junk_messages)
    def add_junk(self, message: Any) -> None:
        EXAMPLES["T8 junk admitted" if self.admit(message) else "T8 junk rejected"] += 1

    @rule(history=histories(max_turns=3), extend=st.booleans())
    def set_messages(self, history: History, extend: bool) -> None:
        """Re-set the admitted list plus more (an extension: nothing resets) or another list
        (a replacement)."""
        messages = [*self.admitted, *history.messages] if extend else history.messages
        self.sent = None
        self.portal.call(self.manager.set_messages, messages)
        self.note_reset(self.model.set(messages))
        self.admitted = list(messages)

    @rule()
    def clear(self) -> None:
        self.portal.call(self.manager.clear)
        self.model.clear()
        self.note_reset(True)
        self.admitted = []

    # -- requests ------------------------------------------------------------------------

    @rule(budget=st.integers(900, 8000))
    def ordinary(self, budget: int) -> None:
        self.sent = None  # a new request: only its own view can be answered
        version = self.manager.version
        view = self.portal.call(lambda: self.manager.get_messages_for_request(token_budget=budget))
        self.note_version(version)
        self.check_view(view)

    @rule(budget=st.integers(900, 8000), hard_fit=st.booleans(), retain=st.booleans())
    def retaining(self, budget: int, hard_fit: bool, retain: bool) -> None:
        self.sent = None  # a new request: only its own view can be answered
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
            self.note_commit(transaction)
        if self.answerable:
            self.sent = result["base_view"]

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
            self.note_commit(transaction)
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
        self.sent = None  # a new request: only its own view can be answered
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
                        return error  # noqa: ASYNC910 - a checkpoint in the scope could turn it into a cancellation
                return None  # cancelled
            finally:
                self.manager.hooks = self.hooks

        result = self.portal.call(go)
        after = snapshot(self.manager)
        if isinstance(result, dict):
            self.check_view(result["base_view"], sent=False)
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
        self.sent = None  # a new request: only its own view can be answered
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

    # -- the driven transaction (T7) ---------------------------------------------------------

    def apply_model(self, model: ModelTxn) -> bool:
        """The model's APPLY: check the version, then the staged decisions are the store's."""
        if model.version != self.model.version:
            model.conflict = True
            model.discard()
            return False
        if model.changes:
            self.decisions = model.staged.decisions
            self.model.note_commit()
        return True

    def expect(self, event: TxnEvent, candidate: Candidate, act: Any) -> None:
        """``act()`` fires ``event`` on the driven machine: the model's entry says what must
        happen (an illegal event raises, naming itself and the state, and changes nothing)."""
        assert self.driven is not None
        model, machine = self.driven.model, self.driven.machine
        entry = MODEL_TABLE[model.state].get(event)
        if entry is None:
            state, staged = machine.state, machine.staged
            try:
                act()
            except TransactionStateError as error:
                assert (error.event, error.state) == (event.value, model.state.name)
            else:
                raise AssertionError(f"{event} was accepted in {model.state}")
            assert machine.state is state and machine.staged is staged, (
                f"an illegal event changed the transaction: {event} in {state}"
            )
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
            elif effect == APPLY and not self.apply_model(model):
                try:
                    act()
                except TransactionConflictError:
                    return
                raise AssertionError("the commit step on a moved store did not conflict")
        act()
        model.state = target

    @precondition(lambda self: self.driven is None or self.driven.model.state in TERMINAL)
    @rule()
    def begin(self) -> None:
        """Plan a request on the store as it is now; its candidates are real reductions."""
        seam = self.portal.call(self.manager._open_negotiation, None, [])
        reduced = [c for rung in seam.rungs if (c := run_through(seam.stepping(rung))) is not None]
        finalised = [
            run_through(seam.finalising(c, outcome="target_reached")) for c in reduced[-2:]
        ]
        machine = _Machine(seam)
        model = ModelTxn(S.STAGED, seam.base, seam.base, self.model.version)
        candidates = [seam.base, *reduced, *finalised]
        self.driven = Driven(machine, RequestTransaction(machine), model, candidates)

    @precondition(lambda self: self.driven is not None)
    @rule(method=st.sampled_from(sorted(API)), index=st.integers(0, 15))
    def drive(self, method: str, index: int) -> None:
        """One call of the driver's API, legal or not."""
        assert self.driven is not None
        candidate = self.driven.candidates[index % len(self.driven.candidates)]
        call = getattr(self.driven.machine, method)
        if method in TAKES_CANDIDATE:
            self.expect(API[method], candidate, functools.partial(call, candidate))
        else:
            self.expect(API[method], candidate, call)

    @precondition(lambda self: self.driven is not None)
    @rule(walk=st.integers(0, 4), data=st.data())
    def fire_events(self, walk: int, data: st.DataObject) -> None:
        """Walk up to ``walk`` legal non-terminal events (so programs reach every state), then
        fire any event, legal or not, through the transition function."""
        assert self.driven is not None
        driven = self.driven

        def fire(event: TxnEvent) -> None:
            candidate = data.draw(st.sampled_from(driven.candidates), label="candidate")
            self.expect(event, candidate, lambda: driven.machine._fire(event, candidate))

        for _ in range(walk):
            table = MODEL_TABLE[driven.model.state]
            legal = sorted((e for e in table if table[e][0] not in TERMINAL), key=lambda e: e.value)
            if not legal:
                break
            fire(data.draw(st.sampled_from(legal), label="legal event"))
        fire(data.draw(st.sampled_from(list(TxnEvent)), label="any event"))

    @precondition(lambda self: self.driven is not None and self.driven.model.state not in TERMINAL)
    @rule(goal=st.sampled_from([*sorted(LIVE, key=lambda s: s.value), S.READY]), data=st.data())
    def reach(self, goal: TxnState, data: st.DataObject) -> None:
        """Drive the machine along the model's shortest non-terminal path to ``goal`` (if
        there is one) through the driver's API, so every state's events get fired."""
        assert self.driven is not None
        driven = self.driven
        paths: dict[TxnState, list[TxnEvent]] = {driven.model.state: []}
        todo = [driven.model.state]
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
            if driven.model.state in TERMINAL:
                break  # a check stopped the request on the way
            candidate = data.draw(st.sampled_from(driven.candidates), label="candidate")
            call = getattr(driven.machine, methods[event])
            if methods[event] in TAKES_CANDIDATE:
                self.expect(event, candidate, functools.partial(call, candidate))
            else:
                self.expect(event, candidate, call)

    @precondition(lambda self: self.driven is not None)
    @rule()
    def commit_step(self) -> None:
        """The synchronous commit step: COMMIT through ``_fire``."""
        assert self.driven is not None
        machine = self.driven.machine
        self.expect(E.COMMIT, self.driven.candidates[0], lambda: machine._fire(E.COMMIT))

    @precondition(lambda self: self.driven is not None)
    @rule(via=st.sampled_from(["machine", "handle"]))
    def rollback_driven(self, via: str) -> None:
        assert self.driven is not None
        driven = self.driven
        rollback = driven.machine.rollback if via == "machine" else driven.handle.rollback
        self.expect(E.ROLLBACK, driven.candidates[0], rollback)

    @precondition(lambda self: self.driven is not None)
    @rule(
        kind=st.sampled_from(["none", "not_cancelled", "cancelled", "raises"]),
        via=st.sampled_from(["machine", "handle"]),
    )
    def commit_driven(self, kind: str, via: str) -> None:
        """``commit`` (the async one, through the portal) in any state."""
        assert self.driven is not None
        driven, model = self.driven, self.driven.model
        if via == "machine":
            call = functools.partial(driven.machine.commit, predicate(kind))
        else:
            call = functools.partial(driven.handle.commit, is_cancelled=predicate(kind))
        if model.state in LIVE:
            try:
                self.portal.call(call)
            except TransactionStateError as error:
                assert (error.event, error.state) == (E.COMMIT.value, model.state.name)
                return
            raise AssertionError(f"commit was accepted in {model.state}")
        if model.state in TERMINAL:
            assert self.portal.call(call) is (model.state is S.COMMITTED)
            return
        if kind == "raises":
            try:
                self.portal.call(call)
            except PredicateError:
                return  # still READY, nothing applied
            raise AssertionError("a raising predicate was swallowed")
        committed = self.portal.call(call)
        if kind == "cancelled":
            model.discard()
            expected = False
        else:
            expected = self.apply_model(model)
            if expected:
                model.state = S.COMMITTED
        assert committed is expected

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def history_and_version_agree_with_the_model(self) -> None:
        self.model.check(self.manager)

    @invariant()
    def the_committed_decisions_are_the_models(self) -> None:
        assert self.manager._decisions is self.decisions

    @invariant()
    def no_transaction_but_the_driven_one_is_left_live(self) -> None:
        driven = self.driven.machine if self.driven is not None else None
        for machine in self.ledger.created:
            if machine is driven:
                continue
            assert machine.state in TERMINAL or machine.state is TxnState.READY, describe(machine)

    @invariant()
    def the_driven_transaction_agrees_with_the_model(self) -> None:
        if self.driven is None:
            return
        machine, handle, model = self.driven.machine, self.driven.handle, self.driven.model
        assert machine.state is model.state
        assert machine.staged is model.staged
        assert machine.conflict is model.conflict
        assert machine.has_changes is model.changes
        assert handle.state is model.state and handle.conflict is model.conflict
        assert handle.has_changes is model.changes and handle.stats is model.staged.stats

    @invariant()
    def leaked_transactions_change_nothing(self) -> None:
        for transaction, _ in self.leaked:
            assert transaction.state is TxnState.READY
            assert self.manager._decisions is not self.machine(transaction).staged.decisions


class TrioStoreMachine(StoreMachine):
    backend: ClassVar[str] = "trio"
