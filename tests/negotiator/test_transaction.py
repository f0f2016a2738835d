"""``RequestTransaction``: the transition table, commit/rollback rules, isolation, conflicts.

CONTRACT 8.2 and our differences from REFERENCE 6.5: ``commit`` applies the staged
decisions synchronously *first* and then delivers ``context:compaction`` (the commit
stands once delivery started); a version conflict makes ``commit`` return False with
nothing applied and ``transaction.conflict`` True.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.decisions import Decisions
from amplifier_module_context_simple.errors import (
    TransactionConflictError,
    TransactionStateError,
)
from amplifier_module_context_simple.negotiator.transaction import (
    TERMINAL,
    TRANSITIONS,
    RequestTransaction,
    TxnEvent,
    TxnState,
)
from tests.negotiator.faults import snapshot
from tests.negotiator.orchestrator import (
    FakeProvider,
    LocalCoordinator,
    Orchestrator,
    conversation,
    mount_context,
    proportional,
)

S, E = TxnState, TxnEvent

# The diagram of the transaction module's docstring and CONTRACT 8.2, written out
# independently of ``TRANSITIONS``.
DOCUMENTED = {
    S.STAGED: {
        E.COUNT: S.COUNTING,
        E.REDUCE: S.STAGED,
        E.FINISH: S.READY,
        E.ROLLBACK: S.ROLLED_BACK,
    },
    S.COUNTING: {E.RECORD: S.COUNTED, E.ROLLBACK: S.ROLLED_BACK},
    S.COUNTED: {
        E.REDUCE: S.STAGED,
        E.FIT: S.FITTING,
        E.FINISH: S.READY,
        E.ROLLBACK: S.ROLLED_BACK,
    },
    S.FITTING: {E.FITTED: S.READY, E.REDUCE: S.STAGED, E.ROLLBACK: S.ROLLED_BACK},
    S.READY: {E.COMMIT: S.COMMITTED, E.ROLLBACK: S.ROLLED_BACK},
    S.COMMITTED: {},
    S.ROLLED_BACK: {},
}

LIVE = (S.STAGED, S.COUNTING, S.COUNTED, S.FITTING)

HISTORY = [
    {"role": "user", "content": "Summarise the repository."},
    {"role": "assistant", "content": "Reading.", "tool_calls": [{"id": "a", "type": "function"}]},
    {"role": "tool", "tool_call_id": "a", "content": "x" * 900},
    {"role": "assistant", "content": "Done reading."},
    {"role": "user", "content": "Thanks, continue."},
]
STAGED = Decisions(removed=frozenset({1, 2}), overrides={1: None, 2: None}, level=3)


async def admitted_store() -> SimpleContextManager:
    """A store with ``HISTORY`` admitted."""
    store = SimpleContextManager(token_meter="actual", max_tokens=4000)
    await store.set_messages(HISTORY)
    return store


def make_store() -> SimpleContextManager:
    """``admitted_store()`` for the synchronous table tests."""
    return anyio.run(admitted_store)


def transaction_in(store: SimpleContextManager, state: TxnState) -> RequestTransaction:
    """A transaction with ``STAGED`` staged, driven to ``state`` along legal events."""
    txn = RequestTransaction(store, store._decisions, store.version)
    txn.stage(STAGED)
    path = {
        S.STAGED: [],
        S.COUNTING: [E.COUNT],
        S.COUNTED: [E.COUNT, E.RECORD],
        S.FITTING: [E.COUNT, E.RECORD, E.FIT],
        S.READY: [E.FINISH],
        S.COMMITTED: [E.FINISH],
        S.ROLLED_BACK: [],
    }[state]
    for event in path:
        txn.fire(event)
    if state is S.COMMITTED:
        txn.apply()
    elif state is S.ROLLED_BACK:
        txn.rollback()
    assert txn.state is state
    return txn


def observe(txn: RequestTransaction, store: SimpleContextManager) -> tuple[Any, ...]:
    return (txn.state, txn.staged, txn.conflict, snapshot(store), store._decisions)


# -- the table ---------------------------------------------------------------------------


def test_transition_table_is_the_documented_one() -> None:
    """``TRANSITIONS`` equals the documented diagram; terminal states have no way out and
    every other state can roll back."""
    assert {s: dict(m) for s, m in TRANSITIONS.items()} == DOCUMENTED
    assert {s for s in TxnState if not TRANSITIONS[s]} == set(TERMINAL)
    assert all(E.ROLLBACK in TRANSITIONS[s] for s in TxnState if s not in TERMINAL)


@pytest.mark.parametrize(
    ("state", "event"),
    list(itertools.product(TxnState, TxnEvent)),
    ids=[f"{s.name}-{e.name}" for s, e in itertools.product(TxnState, TxnEvent)],
)
def test_every_state_event_pair(state: TxnState, event: TxnEvent) -> None:
    """A legal event moves the state as ``TRANSITIONS`` says and touches nothing else; an
    illegal one raises ``TransactionStateError`` naming event and state, and changes
    nothing (state, staged decisions, conflict flag, store snapshot)."""
    store = make_store()
    txn = transaction_in(store, state)
    before = observe(txn, store)
    if event in TRANSITIONS[state]:
        assert txn.fire(event) is TRANSITIONS[state][event]
        assert txn.state is TRANSITIONS[state][event]
        assert observe(txn, store)[1:] == before[1:]
        assert txn.staged is before[1] and store._decisions is before[4]
    else:
        with pytest.raises(TransactionStateError) as caught:
            txn.fire(event)
        assert caught.value.event == event.value and caught.value.state == state.name
        assert f"can't {event.value} when state={state.name}" == str(caught.value)
        assert observe(txn, store) == before
        assert txn.staged is before[1] and store._decisions is before[4]


@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
def test_stage_only_while_live(state: TxnState) -> None:
    """``stage`` replaces the staged decisions in a live state; elsewhere it raises
    ``TransactionStateError`` and changes nothing."""
    store = make_store()
    txn = transaction_in(store, state)
    other = Decisions(level=1, overrides={})
    before = observe(txn, store)
    if state in LIVE:
        txn.stage(other)
        assert txn.staged is other and txn.state is state and txn.has_changes
    else:
        with pytest.raises(TransactionStateError, match=f"can't stage when state={state.name}"):
            txn.stage(other)
        assert observe(txn, store) == before


@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
def test_apply_only_when_ready(state: TxnState) -> None:
    """The synchronous ``apply`` commits only from READY (the store takes the staged object
    and its version moves by one); elsewhere it raises and changes nothing."""
    store = make_store()
    txn = transaction_in(store, state)
    before = observe(txn, store)
    if state is S.READY:
        epoch, version = store.version
        txn.apply()
        assert txn.state is S.COMMITTED
        assert store._decisions is STAGED and store.version == (epoch, version + 1)
    else:
        with pytest.raises(TransactionStateError, match=f"can't commit when state={state.name}"):
            txn.apply()
        assert observe(txn, store) == before


@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
def test_rollback_discards_or_is_a_noop(state: TxnState) -> None:
    """``rollback`` from a non-terminal state ends ROLLED_BACK with the base staged again and
    the store untouched; from a terminal state it is a no-op."""
    store = make_store()
    txn = transaction_in(store, state)
    before = observe(txn, store)
    txn.rollback()
    if state in TERMINAL:
        assert observe(txn, store) == before
    else:
        assert txn.state is S.ROLLED_BACK and not txn.has_changes
        assert snapshot(store) == before[3] and store._decisions is before[4]


@pytest.mark.anyio
@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
async def test_commit_in_every_state(state: TxnState, anyio_backend: str) -> None:
    """``await commit()``: READY -> True and applied; COMMITTED -> True (idempotent);
    ROLLED_BACK -> False; a live non-READY state -> ``TransactionStateError``, nothing changes."""
    store = await admitted_store()
    txn = transaction_in(store, state)
    before = observe(txn, store)
    if state in LIVE:
        with pytest.raises(TransactionStateError, match=f"can't commit when state={state.name}"):
            await txn.commit()
        assert observe(txn, store) == before
        return
    committed = await txn.commit()
    assert committed is (state is not S.ROLLED_BACK)
    if state is S.READY:
        assert txn.state is S.COMMITTED and store._decisions is STAGED
    else:
        assert observe(txn, store) == before


def test_apply_on_a_moved_store_conflicts() -> None:
    """``apply`` after the store moved raises ``TransactionConflictError``; the transaction is
    ROLLED_BACK with ``conflict`` set and nothing is applied."""
    store = make_store()
    txn = transaction_in(store, S.READY)
    anyio.run(store.set_messages, HISTORY)
    before = snapshot(store)
    with pytest.raises(TransactionConflictError, match="nothing was applied"):
        txn.apply()
    assert txn.state is S.ROLLED_BACK and txn.conflict and not txn.has_changes
    assert snapshot(store) == before


@pytest.mark.anyio
async def test_commit_without_changes_keeps_the_version() -> None:
    """Committing a transaction that staged nothing new ends COMMITTED and leaves the store
    (and its version) as it was."""
    store = await admitted_store()
    txn = RequestTransaction(store, store._decisions, store.version)
    txn.fire(E.FINISH)
    before = snapshot(store)
    assert await txn.commit() is True
    assert txn.state is S.COMMITTED and snapshot(store) == before


# -- isolation and conflicts, on a real negotiation ------------------------------------------

# ~9000 characters of history; the fake provider counts one token per character, so the
# measured path compacts (trigger 8464, target 4600) while the ordinary path, whose own
# estimate is far lower, does not.
NEGOTIATED = conversation(6, size=1200, rounds=1)
CONFIG = {"max_tokens": 10_000, "protected_tool_results": 1}


async def negotiated(backend: str) -> tuple[Any, SimpleContextManager, Any, Orchestrator, Any]:
    """A store whose measured request staged a compaction: (coord, ctx, recorder, orch, result)."""
    coordinator, context, recorder = await mount_context(backend, CONFIG)
    await context.set_messages(NEGOTIATED)
    orchestrator = Orchestrator(coordinator, FakeProvider(proportional(1.0, limit=20_000)))
    result = await context.get_measured_request_view(
        provider=orchestrator.provider,
        retain_contents=[],
        count_view=orchestrator.count_view,
    )
    assert result["outcome"] == "target_reached"
    txn = result["transaction"]
    assert txn is not None and txn.state is S.READY and txn.has_changes
    return coordinator, context, recorder, orchestrator, result


async def plain_view(backend: str) -> list[dict[str, Any]]:
    """The ordinary view of ``NEGOTIATED`` on a store that never compacted."""
    _, context, _ = await mount_context(backend, CONFIG)
    await context.set_messages(NEGOTIATED)
    return await context.get_messages_for_request()


def reduced(view: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in view if "compaction" in (m.get("metadata") or {})]


@pytest.mark.anyio
async def test_ready_transaction_is_invisible_to_ordinary_requests(anyio_backend: str) -> None:
    """While a transaction is READY, an ordinary request sees committed state only (none of
    the staged removals), the store does not move, and the transaction still commits."""
    _, context, _, _, result = await negotiated(anyio_backend)
    txn = result["transaction"]
    before = snapshot(context)
    view = await context.get_messages_for_request()
    assert view == await plain_view(anyio_backend)
    assert len(view) > len(result["base_view"])  # the staged view really is smaller
    assert snapshot(context) == before and txn.state is S.READY
    assert await txn.commit() is True
    assert context._removed_seqs == txn.staged.removed != frozenset()


@pytest.mark.anyio
async def test_second_negotiation_sees_committed_state_and_wins(anyio_backend: str) -> None:
    """A second negotiation while the first is READY counts the committed view (not the
    first's staged one); after it commits, the first's commit returns False with
    ``conflict`` set and nothing of its own applied."""
    _, context, recorder, orchestrator, first = await negotiated(anyio_backend)
    first_views = list(orchestrator.provider.counted)
    second = await context.get_measured_request_view(
        provider=orchestrator.provider,
        retain_contents=[],
        count_view=orchestrator.count_view,
    )
    second_views = orchestrator.provider.counted[len(first_views) :]
    assert second_views[0] == first_views[0]  # the committed (uncompacted) view
    assert await second["transaction"].commit() is True
    after_second = snapshot(context)
    stats = context.last_compaction_stats
    assert stats is second["transaction"].stats
    txn = first["transaction"]
    assert await txn.commit() is False
    assert txn.conflict and txn.state is S.ROLLED_BACK
    assert snapshot(context) == after_second and context.last_compaction_stats is stats
    assert len(recorder.named("context:compaction")) == 1


async def _set_messages(context: SimpleContextManager) -> None:
    await context.set_messages(NEGOTIATED)


async def _clear(context: SimpleContextManager) -> None:
    await context.clear()


async def _ordinary_compaction(context: SimpleContextManager) -> None:
    await context.get_messages_for_request(token_budget=2000)
    assert context.last_compaction_stats is not None


MOVES = {
    "set_messages": _set_messages,
    "clear": _clear,
    "ordinary_compaction": _ordinary_compaction,
}


@pytest.mark.anyio
@pytest.mark.parametrize("move", list(MOVES))
async def test_commit_after_the_store_moved_conflicts(move: str, anyio_backend: str) -> None:
    """A commit after ``set_messages``, ``clear`` or another commit (an ordinary request that
    compacted) returns False, sets ``conflict``, applies nothing and delivers nothing."""
    _, context, recorder, _, result = await negotiated(anyio_backend)
    await MOVES[move](context)
    before = snapshot(context)
    stats = context.last_compaction_stats
    events = len(recorder.named("context:compaction"))
    txn = result["transaction"]
    assert await txn.commit() is False
    assert txn.conflict and txn.state is S.ROLLED_BACK
    assert snapshot(context) == before and context.last_compaction_stats is stats
    assert len(recorder.named("context:compaction")) == events
    assert await txn.commit() is False  # and it stays that way


@pytest.mark.anyio
async def test_admission_between_staging_and_commit_is_not_a_conflict(anyio_backend: str) -> None:
    """``add_message`` does not move the store version: the staged decisions (keyed by
    sequence id) still commit, and the new message is kept complete."""
    _, context, _, _, result = await negotiated(anyio_backend)
    await context.add_message({"role": "user", "content": "one more thing"})
    txn = result["transaction"]
    assert await txn.commit() is True and not txn.conflict
    assert context._removed_seqs == txn.staged.removed
    view = await context.get_messages_for_request()
    assert [m["content"] for m in view].count("one more thing") == 1


@pytest.mark.anyio
async def test_commit_is_idempotent_and_rollback_after_commit_is_a_noop(anyio_backend: str) -> None:
    """(REFERENCE 103) ``commit`` -> True and the decisions are kept; ``rollback`` afterwards
    changes nothing; ``commit`` again -> True; exactly one ``context:compaction`` event,
    carrying the staged stats (REFERENCE 113)."""
    _, context, recorder, _, result = await negotiated(anyio_backend)
    txn = result["transaction"]
    staged_stats = txn.stats
    assert await txn.commit() is True
    after = snapshot(context)
    assert context.last_compaction_stats is staged_stats
    txn.rollback()
    assert txn.state is S.COMMITTED and snapshot(context) == after
    assert await txn.commit() is True
    assert snapshot(context) == after
    events = recorder.named("context:compaction")
    assert len(events) == 1
    assert {k: events[0][k] for k in staged_stats} == staged_stats


@pytest.mark.anyio
async def test_rolled_back_transaction_does_not_commit(anyio_backend: str) -> None:
    """(REFERENCE 103) After ``rollback``, ``commit`` -> False and the store is as before."""
    _, context, recorder, _, result = await negotiated(anyio_backend)
    before = snapshot(context)
    txn = result["transaction"]
    txn.rollback()
    assert await txn.commit() is False
    assert snapshot(context) == before and context.last_compaction_stats is None
    assert recorder.named("context:compaction") == []


@pytest.mark.anyio
async def test_commit_when_cancelled_applies_nothing(anyio_backend: str) -> None:
    """``commit(is_cancelled=lambda: True)`` -> False, ROLLED_BACK (not a conflict), nothing
    applied, no event; a later commit stays False."""
    _, context, recorder, _, result = await negotiated(anyio_backend)
    before = snapshot(context)
    txn = result["transaction"]
    assert await txn.commit(is_cancelled=lambda: True) is False
    assert txn.state is S.ROLLED_BACK and not txn.conflict
    assert snapshot(context) == before and recorder.named("context:compaction") == []
    assert await txn.commit() is False


class PredicateError(Exception):
    pass


def raising_predicate() -> bool:
    raise PredicateError("is_cancelled failed")


@pytest.mark.anyio
@pytest.mark.parametrize("then", ["rollback", "commit"])
async def test_raising_predicate_propagates_and_leaves_it_ready(
    then: str, anyio_backend: str
) -> None:
    """(REFERENCE 105) A raising ``is_cancelled`` propagates and leaves the transaction READY
    with nothing applied; a later ``rollback`` restores nothing-applied for good, a later
    ``commit`` still commits."""
    _, context, _, _, result = await negotiated(anyio_backend)
    before = snapshot(context)
    txn = result["transaction"]
    with pytest.raises(PredicateError):
        await txn.commit(is_cancelled=raising_predicate)
    assert txn.state is S.READY and snapshot(context) == before
    if then == "rollback":
        txn.rollback()
        assert txn.state is S.ROLLED_BACK and snapshot(context) == before
    else:
        assert await txn.commit() is True
        assert context._removed_seqs == txn.staged.removed


@pytest.mark.anyio
async def test_commit_in_a_cancelled_scope_applies_nothing(anyio_backend: str) -> None:
    """A commit awaited inside an already-cancelled scope raises the cancellation at its
    checkpoint, before the commit step: READY, nothing applied (the caller rolls back)."""
    _, context, _, _, result = await negotiated(anyio_backend)
    before = snapshot(context)
    txn = result["transaction"]
    with anyio.CancelScope() as scope:
        scope.cancel()
        await txn.commit()
    assert scope.cancelled_caught
    assert txn.state is S.READY and snapshot(context) == before
    txn.rollback()
    assert snapshot(context) == before


class BlockingHooks:
    """Hooks whose ``context:compaction`` delivery blocks until released."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.delivered: list[str] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        if event == "context:compaction":
            self.entered.set()
            await self.release.wait()
        self.delivered.append(event)


@pytest.mark.anyio
async def test_commit_stands_once_delivery_started(anyio_backend: str) -> None:
    """(REFERENCE 104, our rule) The decisions are applied before ``context:compaction`` is
    delivered: while the delivery blocks the store already shows them, ``is_cancelled``
    turning True and a concurrent ``rollback`` change nothing, and ``commit`` returns True."""
    _, context, _, _, result = await negotiated(anyio_backend)
    hooks = BlockingHooks()
    context.hooks = hooks
    txn = result["transaction"]
    cancelled = False
    outcome: list[bool] = []

    async def commit() -> None:
        outcome.append(await txn.commit(is_cancelled=lambda: cancelled))

    async with anyio.create_task_group() as tg:
        tg.start_soon(commit)
        await hooks.entered.wait()
        assert txn.state is S.COMMITTED and context._removed_seqs == txn.staged.removed
        after = snapshot(context)
        cancelled = True
        txn.rollback()
        hooks.release.set()
    assert outcome == [True] and txn.state is S.COMMITTED
    assert snapshot(context) == after and hooks.delivered == ["context:compaction"]


@pytest.mark.anyio
async def test_cancellation_during_delivery_keeps_the_commit(anyio_backend: str) -> None:
    """A cancellation delivered while ``context:compaction`` is being delivered propagates,
    and the commit stands (COMMITTED, decisions and stats kept)."""
    _, context, _, _, result = await negotiated(anyio_backend)
    hooks = BlockingHooks()
    context.hooks = hooks
    txn = result["transaction"]
    with anyio.CancelScope() as scope:

        async def cancel_when_delivering() -> None:
            await hooks.entered.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_when_delivering)
            await txn.commit()
    assert scope.cancelled_caught
    assert txn.state is S.COMMITTED and context.last_compaction_stats is txn.stats
    assert context._removed_seqs == txn.staged.removed


# -- through the orchestrator --------------------------------------------------------------


@pytest.mark.anyio
async def test_orchestrator_commits_before_dispatch(anyio_backend: str) -> None:
    """The orchestrator commits immediately before dispatch: ``context:compaction`` precedes
    the dispatch, the dispatched view is ``base_view`` and the store holds the decisions."""
    coordinator, context, recorder = await mount_context(anyio_backend, CONFIG)
    await context.set_messages(NEGOTIATED)
    orchestrator = Orchestrator(coordinator, FakeProvider(proportional(1.0, limit=20_000)))
    outcome = await orchestrator.run()
    assert outcome.committed is True and outcome.dispatched
    dispatch, view = orchestrator.dispatched[0]
    assert view is outcome.result["base_view"]
    assert dispatch is outcome.result["final_attempt"]["dispatch"]
    assert dispatch.messages == view
    names = [name for name, _ in recorder.events]
    assert names == ["context:budget", "orchestrator:provider_budget", "context:compaction"]
    assert context._removed_seqs == outcome.result["transaction"].staged.removed


@pytest.mark.anyio
async def test_orchestrator_skips_dispatch_when_the_session_is_cancelled(
    anyio_backend: str,
) -> None:
    """With the coordinator's cancellation requested, ``commit`` returns False: no dispatch,
    nothing applied, no ``context:compaction``."""
    coordinator, context, recorder = await mount_context(anyio_backend, CONFIG)
    await context.set_messages(NEGOTIATED)
    before = snapshot(context)
    coordinator.cancellation.request_graceful()
    orchestrator = Orchestrator(coordinator, FakeProvider(proportional(1.0, limit=20_000)))
    outcome = await orchestrator.run()
    assert outcome.committed is False and not outcome.dispatched
    assert orchestrator.dispatched == []
    assert snapshot(context) == before and recorder.named("context:compaction") == []
    assert outcome.result["transaction"].state is S.ROLLED_BACK


def test_local_coordinator_mirrors_the_kernel_surface() -> None:
    """The trio stand-in exposes what ``mount`` and the orchestrator use."""
    coordinator = LocalCoordinator()
    for name in ("hooks", "cancellation", "mount", "get", "register_capability", "get_capability"):
        assert hasattr(coordinator, name)
    assert coordinator.cancellation.is_cancelled is False
