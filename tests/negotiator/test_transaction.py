"""The negotiated request's transaction: the table, commit/rollback rules, isolation,
conflicts, and the narrow handle orchestrators hold.

docs/design.md section 5.3, and where we differ from the existing public module: ``commit`` applies the staged
decisions synchronously *first* and then delivers ``context:compaction`` (the commit
stands once delivery started); a version conflict makes ``commit`` return False with
nothing applied and ``transaction.conflict`` True.

The table (``TRANSITIONS``) is tested by behaviour, entry by entry: the machine
(``_Machine``, the driver's API) is driven to every state along legal events and sent
every event; a legal one must move to the entry's state and perform exactly the entry's
effects (STAGE stages the given candidate, DISCARD restores the base, CHECK_HISTORY stops
a request whose history was replaced, APPLY commits through the store), an illegal one
must raise ``TransactionStateError`` and change nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.policy.negotiable import Candidate, Negotiable
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.errors import (
    TransactionConflictError,
    TransactionStateError,
)
from amplifier_module_context_simple.negotiator.transaction import (
    TERMINAL,
    TRANSITIONS,
    Effect,
    RequestTransaction,
    TxnEvent,
    TxnState,
    _Machine,
)
from amplifier_module_context_simple.testing import RecordingHooks, snapshot
from tests.negotiator.orchestrator import (
    FakeProvider,
    LocalCoordinator,
    Orchestrator,
    conversation,
    mount_context,
    proportional,
)
from tests.support import replaced

S, E = TxnState, TxnEvent

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Summarise the repository."},
    {"role": "assistant", "content": "Reading.", "tool_calls": [{"id": "a", "type": "function"}]},
    {"role": "tool", "tool_call_id": "a", "content": "x" * 900},
    {"role": "assistant", "content": "Done reading."},
    {"role": "user", "content": "Thanks, continue."},
]

PAIRS = list(itertools.product(TxnState, TxnEvent))
PAIR_IDS = [f"{s.name}-{e.name}" for s, e in PAIRS]
ENTRIES = [(s, e) for s, e in PAIRS if e in TRANSITIONS[s]]
ENTRY_IDS = [f"{s.name}-{e.name}" for s, e in ENTRIES]

API: dict[str, TxnEvent] = {
    "stage": E.REDUCE,
    "counting": E.COUNT,
    "counted": E.RECORD,
    "fitting": E.FIT,
    "fitted": E.FITTED,
    "no_fit": E.NO_FIT,
    "finish": E.FINISH,
    "rollback": E.ROLLBACK,
}
"""The driver's synchronous API: each method fires one event."""
TAKES_CANDIDATE = frozenset({"stage", "fitted", "finish"})


async def admitted_store() -> SimpleContextManager:
    """A store with ``HISTORY`` admitted (no protected tool result, so rungs change it)."""
    store = SimpleContextManager(token_meter="actual", max_tokens=4000, protected_tool_results=0)
    await store.set_messages(HISTORY)
    return store


@dataclasses.dataclass
class Setup:
    """A machine driven to a state over a real planned request."""

    store: SimpleContextManager
    seam: Negotiable
    machine: _Machine
    first: Candidate
    """A reduced candidate, staged on the way."""
    other: Candidate
    """A further reduced candidate: what the event under test stages, if it stages."""
    final: Candidate
    """``first`` with its compaction stats: what READY and COMMITTED hold."""

    def observe(self) -> tuple[Any, ...]:
        machine, store = self.machine, self.store
        return (machine.state, machine.staged, machine.conflict, snapshot(store), store._decisions)


# The legal events that take a fresh machine (base staged) to each state.
PATHS: dict[TxnState, list[str]] = {
    S.STAGED: ["stage"],
    S.COUNTING: ["stage", "counting"],
    S.COUNTED: ["stage", "counting", "counted"],
    S.FITTING: ["stage", "counting", "counted", "fitting"],
    S.READY: ["stage", "counting", "counted", "finish"],
    S.COMMITTED: ["stage", "counting", "counted", "finish", "commit step"],
    S.ROLLED_BACK: ["stage", "rollback"],
}


async def setup_in(state: TxnState) -> Setup:
    store = await admitted_store()
    seam = await store._open_negotiation(None, [])
    reduced = [c for rung in seam.rungs if (c := run_through(seam.stepping(rung))) is not None]
    assert len(reduced) >= 2, "the history must give two distinct reductions"
    first, other = reduced[0], reduced[1]
    final = run_through(seam.finalising(first, outcome="target_reached"))
    assert final.stats is not None
    machine = _Machine(seam)
    assert machine.state is S.STAGED and machine.staged is seam.base
    for step in PATHS[state]:
        if step == "commit step":
            machine._fire(E.COMMIT)
        elif step == "finish":
            machine.finish(final)
        elif step in TAKES_CANDIDATE:
            getattr(machine, step)(first)
        else:
            getattr(machine, step)()
    assert machine.state is state
    return Setup(store, seam, machine, first, other, final)


def make(state: TxnState) -> Setup:
    """``setup_in`` for the synchronous table tests."""
    return anyio.run(setup_in, state)


def check_transition(t: Setup, state: TxnState, event: TxnEvent, act: Callable[[], None]) -> None:
    """``act()`` fires ``event`` in ``state``: legal -> the entry's next state and exactly its
    effects; illegal -> ``TransactionStateError`` naming both, and nothing changed."""
    machine, store, seam = t.machine, t.store, t.seam
    before = t.observe()
    staged = machine.staged
    entry = TRANSITIONS[state].get(event)
    if entry is None:
        with pytest.raises(TransactionStateError) as caught:
            act()
        assert caught.value.event == event.value and caught.value.state == state.name
        assert f"can't {event.value} when state={state.name}" == str(caught.value)
        assert t.observe() == before
        assert machine.staged is staged and store._decisions is before[4]
        return
    target, effects = entry
    epoch, version = store.version
    act()
    assert machine.state is target
    if Effect.STAGE in effects:
        expected = t.other
    elif Effect.DISCARD in effects:
        expected = seam.base
    else:
        expected = staged
    assert machine.staged is expected
    assert machine.has_changes is (expected is not seam.base)
    assert machine.conflict is False
    if Effect.APPLY in effects:  # the store takes the staged decisions, the version moves
        assert store._decisions is staged.decisions
        assert store.last_compaction_stats is staged.stats
        assert store.version == (epoch, version + 1)
        assert snapshot(store).history == before[3].history
    else:
        assert snapshot(store) == before[3] and store._decisions is before[4]


# -- the table -------------------------------------------------------------------------------


def test_the_table_covers_every_state_and_ends_in_the_terminal_states() -> None:
    """Every state has its row; every state can be rolled back (the live ones discard, the
    terminal ones stay); from a terminal state no event leads out; every state is reached
    from STAGED and every non-terminal one can still end COMMITTED and ROLLED_BACK."""
    assert set(TRANSITIONS) == set(TxnState)
    assert frozenset({S.COMMITTED, S.ROLLED_BACK}) == TERMINAL
    for state in TxnState:
        target, effects = TRANSITIONS[state][E.ROLLBACK]
        if state in TERMINAL:
            assert (target, effects) == (state, ())
            assert all(TRANSITIONS[state][e] == (state, ()) for e in TRANSITIONS[state])
        else:
            assert (target, effects) == (S.ROLLED_BACK, (Effect.DISCARD,))

    def reachable(start: TxnState) -> set[TxnState]:
        seen, todo = {start}, [start]
        while todo:
            for target, _ in TRANSITIONS[todo.pop()].values():
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    assert reachable(S.STAGED) == set(TxnState)
    for state in set(TxnState) - TERMINAL:
        assert reachable(state) >= TERMINAL


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=PAIR_IDS)
def test_every_state_event_pair(state: TxnState, event: TxnEvent) -> None:
    """``_fire`` (the one transition function): a legal event moves to the entry's state and
    performs exactly its effects; an illegal one raises ``TransactionStateError`` naming
    event and state, and changes nothing (state, staged candidate, conflict flag, store)."""
    t = make(state)
    check_transition(t, state, event, lambda: t.machine._fire(event, t.other))


@pytest.mark.parametrize(
    ("state", "method"),
    list(itertools.product(TxnState, API)),
    ids=[f"{s.name}-{m}" for s, m in itertools.product(TxnState, API)],
)
def test_every_driver_method_in_every_state(state: TxnState, method: str) -> None:
    """Each method of the driver's API fires its event and nothing else: in every state it
    does exactly what the table says for that event."""
    t = make(state)
    call = getattr(t.machine, method)
    if method in TAKES_CANDIDATE:
        check_transition(t, state, API[method], lambda: call(t.other))
    else:
        check_transition(t, state, API[method], call)


async def _set_messages(store: SimpleContextManager) -> None:
    await store.set_messages(replaced(HISTORY))


async def _clear(store: SimpleContextManager) -> None:
    await store.clear()


async def _another_commit(store: SimpleContextManager) -> None:
    """Another request commits first (the version moves; the history is the same)."""
    seam = await store._open_negotiation(None, [])
    reduced = next(c for rung in seam.rungs if (c := run_through(seam.stepping(rung))) is not None)
    seam.claim_commit()(reduced)  # as its transaction would


async def _add_message(store: SimpleContextManager) -> None:
    await store.add_message({"role": "user", "content": "one more thing"})


STORE_MOVES: dict[str, tuple[Callable[[SimpleContextManager], Any], bool, bool]] = {
    # name: (move, replaces the history, moves the version)
    "set_messages": (_set_messages, True, True),
    "clear": (_clear, True, True),
    "another_commit": (_another_commit, False, True),
    "add_message": (_add_message, False, False),
}


@pytest.mark.parametrize("move", list(STORE_MOVES))
@pytest.mark.parametrize(("state", "event"), ENTRIES, ids=ENTRY_IDS)
def test_every_entry_after_the_store_moved(state: TxnState, event: TxnEvent, move: str) -> None:
    """The checks are exactly the table's. After the history was replaced (``set_messages``,
    ``clear``) an entry with CHECK_HISTORY raises ``TransactionConflictError`` and ends
    ROLLED_BACK with the base staged (not a commit conflict); after the version moved
    (those, or another commit) the APPLY entry conflicts (``conflict`` True, nothing
    applied); every other entry, and every entry after an append, proceeds as usual."""
    t = make(state)
    machine, store, seam = t.machine, t.store, t.seam
    action, replaced, versioned = STORE_MOVES[move]
    anyio.run(action, store)
    moved, decisions = snapshot(store), store._decisions
    staged = machine.staged
    target, effects = TRANSITIONS[state][event]
    if replaced and Effect.CHECK_HISTORY in effects:
        with pytest.raises(TransactionConflictError, match="history was replaced"):
            machine._fire(event, t.other)
        assert machine.state is S.ROLLED_BACK and machine.staged is seam.base
        assert not machine.has_changes and not machine.conflict
    elif versioned and Effect.APPLY in effects:
        with pytest.raises(TransactionConflictError, match="nothing was applied"):
            machine._fire(event, t.other)
        assert machine.state is S.ROLLED_BACK and machine.staged is seam.base
        assert not machine.has_changes and machine.conflict
    else:
        machine._fire(event, t.other)
        assert machine.state is target and not machine.conflict
        if Effect.STAGE in effects:
            assert machine.staged is t.other
        elif Effect.DISCARD in effects:
            assert machine.staged is seam.base
        else:
            assert machine.staged is staged
        if Effect.APPLY in effects:
            assert store._decisions is staged.decisions
            assert store.version == (moved.version[0], moved.version[1] + 1)
            return
    assert snapshot(store) == moved and store._decisions is decisions


@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
def test_stage_only_where_the_table_reduces(state: TxnState) -> None:
    """``stage`` (the REDUCE event) replaces the staged candidate in STAGED and COUNTED (a
    rung applied: STAGED again, not yet counted); while counting or fitting, once READY and
    once terminal it raises ``TransactionStateError`` and changes nothing."""
    t = make(state)
    before = t.observe()
    if state in (S.STAGED, S.COUNTED):
        t.machine.stage(t.other)
        assert t.machine.staged is t.other and t.machine.state is S.STAGED
        assert t.machine.has_changes
    else:
        with pytest.raises(TransactionStateError, match=f"can't reduce when state={state.name}"):
            t.machine.stage(t.other)
        assert t.observe() == before


@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
def test_the_commit_step_only_from_ready(state: TxnState) -> None:
    """The synchronous commit step (COMMIT through ``_fire``) applies only from READY: the
    store takes the staged object and its version moves by one. Once terminal it is a
    no-op; from a live state it raises and changes nothing."""
    t = make(state)
    before = t.observe()
    if state is S.READY:
        epoch, version = t.store.version
        t.machine._fire(E.COMMIT)
        assert t.machine.state is S.COMMITTED
        assert t.store._decisions is t.final.decisions
        assert t.store.version == (epoch, version + 1)
    elif state in TERMINAL:
        t.machine._fire(E.COMMIT)
        assert t.observe() == before
    else:
        with pytest.raises(TransactionStateError, match=f"can't commit when state={state.name}"):
            t.machine._fire(E.COMMIT)
        assert t.observe() == before


@pytest.mark.parametrize("via", ["machine", "handle"])
@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
def test_rollback_discards_or_is_a_noop(state: TxnState, via: str) -> None:
    """``rollback`` (the machine's, or the handle's) from a non-terminal state ends
    ROLLED_BACK with the base staged again and the store untouched; from a terminal state
    it is a no-op."""
    t = make(state)
    before = t.observe()
    if via == "machine":
        t.machine.rollback()
    else:
        RequestTransaction(t.machine).rollback()
    if state in TERMINAL:
        assert t.observe() == before
    else:
        assert t.machine.state is S.ROLLED_BACK and not t.machine.has_changes
        assert t.machine.staged is t.seam.base
        assert snapshot(t.store) == before[3] and t.store._decisions is before[4]


@pytest.mark.anyio
@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
async def test_commit_in_every_state(state: TxnState, anyio_backend: str) -> None:
    """``await handle.commit()``: READY -> True, applied, ``context:compaction`` delivered;
    COMMITTED -> True (idempotent); ROLLED_BACK -> False; a live non-READY state ->
    ``TransactionStateError``, nothing changes."""
    t = await setup_in(state)
    handle = RequestTransaction(t.machine)
    hooks = RecordingHooks()
    t.store.hooks = hooks
    before = t.observe()
    if state not in TERMINAL and state is not S.READY:
        with pytest.raises(TransactionStateError, match=f"can't commit when state={state.name}"):
            await handle.commit()
        assert t.observe() == before and hooks.started == []
        return
    committed = await handle.commit()
    assert committed is (state is not S.ROLLED_BACK)
    if state is S.READY:
        assert handle.state is S.COMMITTED and t.store._decisions is t.final.decisions
        assert t.store.last_compaction_stats is handle.stats is t.final.stats
        assert hooks.events == [("context:compaction", t.final.stats)]
    else:
        assert t.observe() == before and hooks.started == []


def test_the_commit_step_on_a_moved_store_conflicts() -> None:
    """The commit step after the store moved raises ``TransactionConflictError``; the
    transaction is ROLLED_BACK with ``conflict`` set and nothing is applied."""
    t = make(S.READY)
    anyio.run(t.store.set_messages, replaced(HISTORY))
    before = snapshot(t.store)
    with pytest.raises(TransactionConflictError, match="nothing was applied"):
        t.machine._fire(E.COMMIT)
    assert t.machine.state is S.ROLLED_BACK and t.machine.conflict and not t.machine.has_changes
    assert snapshot(t.store) == before


async def ready_without_changes() -> tuple[SimpleContextManager, _Machine]:
    """A machine that finished on the committed view itself (nothing staged)."""
    store = await admitted_store()
    seam = await store._open_negotiation(None, [])
    machine = _Machine(seam)
    machine.finish(seam.base)
    assert machine.state is S.READY and not machine.has_changes
    return store, machine


@pytest.mark.anyio
async def test_commit_without_changes_keeps_the_version(anyio_backend: str) -> None:
    """Committing a transaction that staged nothing new ends COMMITTED and leaves the store
    (and its version) as it was."""
    store, machine = await ready_without_changes()
    before = snapshot(store)
    handle = RequestTransaction(machine)
    assert await handle.commit() is True
    assert handle.state is S.COMMITTED and snapshot(store) == before


@pytest.mark.anyio
async def test_commit_without_changes_on_a_moved_store_conflicts(anyio_backend: str) -> None:
    """The commit step checks the store's version even when nothing is staged (the table's
    APPLY: "check the store's version, then apply"; ``commit`` answers False "when the
    store changed since planning"): after ``set_messages`` the commit returns False with
    ``conflict`` set, ROLLED_BACK, and the store as the move left it."""
    store, machine = await ready_without_changes()
    await store.set_messages(replaced(HISTORY))
    before = snapshot(store)
    handle = RequestTransaction(machine)
    assert await handle.commit() is False
    assert handle.conflict and handle.state is S.ROLLED_BACK
    assert snapshot(store) == before


# -- the handle --------------------------------------------------------------------------------

HANDLE_API = {"commit", "rollback", "state", "conflict", "has_changes", "stats"}


@contextlib.contextmanager
def machines() -> Iterator[list[_Machine]]:
    """Every ``_Machine`` created inside the block (the handle does not expose its own)."""
    created: list[_Machine] = []
    original = _Machine.__init__

    def init(self: _Machine, seam: Negotiable) -> None:
        original(self, seam)
        created.append(self)

    _Machine.__init__ = init  # type: ignore[method-assign]  # recording; restored below
    try:
        yield created
    finally:
        _Machine.__init__ = original  # type: ignore[method-assign]  # the original back


# -- isolation and conflicts, on a real negotiation ------------------------------------------

# ~9000 characters of history; the fake provider counts one token per character, so the
# measured path compacts (trigger 8464, target 4600) while the ordinary path, whose own
# estimate is far lower, does not.
NEGOTIATED = conversation(6, size=1200, rounds=1)
CONFIG = {"max_tokens": 10_000, "protected_tool_results": 1}


async def negotiated(
    backend: str,
) -> tuple[Any, SimpleContextManager, Any, Orchestrator, Any, _Machine]:
    """A store whose measured request staged a compaction: (coord, ctx, recorder, orch,
    result, the request's machine)."""
    coordinator, context, recorder = await mount_context(backend, CONFIG)
    await context.set_messages(NEGOTIATED)
    orchestrator = Orchestrator(coordinator, FakeProvider(proportional(1.0, limit=20_000)))
    with machines() as created:
        result = await context.get_measured_request_view(
            provider=orchestrator.provider,
            retain_contents=[],
            count_view=orchestrator.count_view,
        )
    assert result["outcome"] == "target_reached"
    txn = result["transaction"]
    assert txn is not None and txn.state is S.READY and txn.has_changes
    (machine,) = created  # one negotiation, one machine
    assert machine.state is S.READY and machine.staged.stats is txn.stats
    return coordinator, context, recorder, orchestrator, result, machine


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
    _, context, _, _, result, machine = await negotiated(anyio_backend)
    txn = result["transaction"]
    before = snapshot(context)
    view = await context.get_messages_for_request()
    assert view == await plain_view(anyio_backend)
    assert len(view) > len(result["base_view"])  # the staged view really is smaller
    # the ordinary request refreshed the meter stats and committed nothing
    assert snapshot(context).differences(before) == ["meter", "meter_ref"]
    assert txn.state is S.READY
    assert await txn.commit() is True
    assert (
        context._decisions is machine.staged.decisions
        and context.observable_state().removed != frozenset()
    )
    assert context.last_compaction_stats is txn.stats


@pytest.mark.anyio
async def test_second_negotiation_sees_committed_state_and_wins(anyio_backend: str) -> None:
    """A second negotiation while the first is READY counts the committed view (not the
    first's staged one); after it commits, the first's commit returns False with
    ``conflict`` set and nothing of its own applied."""
    _, context, recorder, orchestrator, first, _ = await negotiated(anyio_backend)
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


async def _set_negotiated_messages(context: SimpleContextManager) -> None:
    await context.set_messages(replaced(NEGOTIATED))


async def _ordinary_compaction(context: SimpleContextManager) -> None:
    await context.get_messages_for_request(token_budget=2000)
    assert context.last_compaction_stats is not None


MOVES = {
    "set_messages": _set_negotiated_messages,
    "clear": _clear,
    "ordinary_compaction": _ordinary_compaction,
}


@pytest.mark.anyio
@pytest.mark.parametrize("move", list(MOVES))
async def test_commit_after_the_store_moved_conflicts(move: str, anyio_backend: str) -> None:
    """A commit after ``set_messages``, ``clear`` or another commit (an ordinary request that
    compacted) returns False, sets ``conflict``, applies nothing and delivers nothing."""
    _, context, recorder, _, result, _ = await negotiated(anyio_backend)
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
    _, context, _, _, result, machine = await negotiated(anyio_backend)
    await context.add_message({"role": "user", "content": "one more thing"})
    txn = result["transaction"]
    assert await txn.commit() is True and not txn.conflict
    assert context._decisions is machine.staged.decisions
    view = await context.get_messages_for_request()
    assert [m["content"] for m in view].count("one more thing") == 1


@pytest.mark.anyio
async def test_commit_is_idempotent_and_rollback_after_commit_is_a_noop(anyio_backend: str) -> None:
    """(the existing module's behaviour, kept) ``commit`` -> True and the decisions are kept; ``rollback`` afterwards
    changes nothing; ``commit`` again -> True; exactly one ``context:compaction`` event,
    carrying the staged stats (as the existing module's)."""
    _, context, recorder, _, result, _ = await negotiated(anyio_backend)
    txn = result["transaction"]
    staged_stats: dict[str, Any] | None = txn.stats
    assert staged_stats is not None
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
    """(the existing module's behaviour, kept) After ``rollback``, ``commit`` -> False and the store is as before."""
    _, context, recorder, _, result, _ = await negotiated(anyio_backend)
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
    _, context, recorder, _, result, _ = await negotiated(anyio_backend)
    before = snapshot(context)
    txn = result["transaction"]
    assert await txn.commit(is_cancelled=lambda: True) is False
    assert txn.state is S.ROLLED_BACK and not txn.conflict
    assert snapshot(context) == before and recorder.named("context:compaction") == []
    assert await txn.commit() is False


@pytest.mark.anyio
async def test_the_handle_cannot_drive_the_machine(anyio_backend: str) -> None:
    """The handle an orchestrator holds offers ``commit``, ``rollback`` and read-only
    state, nothing else: no way to fire an event, stage, apply or read the staged
    decisions; its machine sits in a name-mangled slot, not a public attribute; no
    attribute can be added or set. So a rolled back handle can only answer ``commit()``
    with False, applying and delivering nothing."""
    _, context, recorder, _, result, machine = await negotiated(anyio_backend)
    txn = result["transaction"]
    assert isinstance(txn, RequestTransaction)
    for name in ("fire", "_fire", "stage", "apply", "staged", "is_terminal", "finish", "machine"):
        assert not hasattr(txn, name), name
    assert {name for name in dir(txn) if not name.startswith("_")} == HANDLE_API
    assert RequestTransaction.__slots__ == ("__machine",)
    assert not hasattr(txn, "__dict__") and not hasattr(txn, "__machine")
    assert [name for name in dir(txn) if "machine" in name.lower()] == [
        "_RequestTransaction__machine"
    ]
    for name in HANDLE_API - {"commit", "rollback"}:
        assert not isinstance(getattr(txn, name), _Machine)
        with pytest.raises(AttributeError):
            setattr(txn, name, getattr(txn, name))
    with pytest.raises(AttributeError):
        txn.fire = lambda event: None  # type: ignore[attr-defined]  # refused: the point
    before = snapshot(context)
    txn.rollback()
    assert txn.state is S.ROLLED_BACK and machine.state is S.ROLLED_BACK
    assert await txn.commit() is False
    assert txn.state is S.ROLLED_BACK and not txn.conflict and not txn.has_changes
    assert snapshot(context) == before and context.last_compaction_stats is None
    assert recorder.named("context:compaction") == []


class PredicateError(Exception):
    pass


def raising_predicate() -> bool:
    raise PredicateError("is_cancelled failed")


def state_now(txn: RequestTransaction) -> TxnState:
    """``txn.state`` read afresh: mypy keeps an asserted state across a transition."""
    return txn.state


@pytest.mark.anyio
@pytest.mark.parametrize("then", ["rollback", "commit"])
async def test_raising_predicate_propagates_and_leaves_it_ready(
    then: str, anyio_backend: str
) -> None:
    """(the existing module's behaviour, kept) A raising ``is_cancelled`` propagates and leaves the transaction READY
    with nothing applied; a later ``rollback`` restores nothing-applied for good, a later
    ``commit`` still commits."""
    _, context, _, _, result, machine = await negotiated(anyio_backend)
    before = snapshot(context)
    txn = result["transaction"]
    with pytest.raises(PredicateError):
        await txn.commit(is_cancelled=raising_predicate)
    assert txn.state is S.READY and snapshot(context) == before
    if then == "rollback":
        txn.rollback()
        assert state_now(txn) is S.ROLLED_BACK and snapshot(context) == before
    else:
        assert await txn.commit() is True
        assert context._decisions is machine.staged.decisions


@pytest.mark.anyio
async def test_commit_in_a_cancelled_scope_applies_nothing(anyio_backend: str) -> None:
    """A commit awaited inside an already-cancelled scope raises the cancellation at its
    checkpoint, before the commit step: READY, nothing applied (the caller rolls back)."""
    _, context, _, _, result, _ = await negotiated(anyio_backend)
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
        else:
            await anyio.lowlevel.checkpoint()  # any other delivery: an ordinary await
        self.delivered.append(event)


@pytest.mark.anyio
async def test_commit_stands_once_delivery_started(anyio_backend: str) -> None:
    """(our rule, docs/design.md section 5.3) The decisions are applied before ``context:compaction`` is
    delivered: while the delivery blocks the store already shows them, ``is_cancelled``
    turning True and a concurrent ``rollback`` change nothing, and ``commit`` returns True."""
    _, context, _, _, result, machine = await negotiated(anyio_backend)
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
        assert txn.state is S.COMMITTED and context._decisions is machine.staged.decisions
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
    _, context, _, _, result, machine = await negotiated(anyio_backend)
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
    assert context._decisions is machine.staged.decisions


# -- through the orchestrator --------------------------------------------------------------


@pytest.mark.anyio
async def test_orchestrator_commits_before_dispatch(anyio_backend: str) -> None:
    """The orchestrator commits immediately before dispatch: ``context:compaction`` precedes
    the dispatch, the dispatched view is ``base_view`` and the store holds the decisions."""
    coordinator, context, recorder = await mount_context(anyio_backend, CONFIG)
    await context.set_messages(NEGOTIATED)
    orchestrator = Orchestrator(coordinator, FakeProvider(proportional(1.0, limit=20_000)))
    with machines() as created:
        outcome = await orchestrator.run()
    (machine,) = created
    assert outcome.committed is True and outcome.dispatched
    dispatch, view = orchestrator.dispatched[0]
    assert view is outcome.result["base_view"]
    assert dispatch is outcome.result["final_attempt"]["dispatch"]
    assert dispatch.messages == view
    names = [name for name, _ in recorder.events]
    assert names == ["context:budget", "orchestrator:provider_budget", "context:compaction"]
    assert context._decisions is machine.staged.decisions
    assert context.last_compaction_stats is outcome.result["transaction"].stats


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
    # the getter returned (its meter stats and budget delivery stand), nothing committed
    assert snapshot(context).differences(before) == ["meter", "budget_mark", "meter_ref"]
    assert recorder.named("context:compaction") == []
    assert outcome.result["transaction"].state is S.ROLLED_BACK


def test_local_coordinator_mirrors_the_kernel_surface() -> None:
    """The trio stand-in exposes what ``mount`` and the orchestrator use."""
    coordinator = LocalCoordinator()
    for name in ("hooks", "cancellation", "mount", "get", "register_capability", "get_capability"):
        assert hasattr(coordinator, name)
    assert coordinator.cancellation.is_cancelled is False
