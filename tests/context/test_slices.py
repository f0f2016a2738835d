"""Planning in slices (issue 14): paused plans, stale plans, the planning lock.

The work of a request that grows with the history is planned in slices that yield to the
event loop (``context/slices.py``). These tests pace every plan with a zero budget (a
checkpoint at every pause point) through a checkpoint that can move the store at its
k-th call, for every k the request reaches:

- ordinary, retaining and hard-fit requests re-plan when the store moved (``set_messages``,
  ``clear``, ``add_message``, another commit, a configuration change): what they return
  and commit equals what the same request returns and commits on a twin store that saw
  the same move *before* the request (the request happened as a whole, at its commit
  step, on the moved store); a history that keeps changing ends in one unpaced plan;
- a negotiated request stops with ``TransactionConflictError`` when the history was
  replaced while it planned, leaving the store exactly as the move left it; after another
  commit its own commit is a conflict; an admission does not concern it (the request is
  for the planned prefix);
- small histories yield exactly as often as an unpaced request; pause points grow with
  the history; paced and unpaced plans give the same result;
- one paced plan at a time per event loop; the lock is released by a plan that raised or
  was cancelled.
"""

from __future__ import annotations

import ast
import gc
import math
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import amplifier_module_context_simple as package
from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context import store as store_module
from amplifier_module_context_simple.context.slices import (
    QUEUED_SLICE_SECONDS,
    Pacer,
    chunking,
    planning_lock,
    run_through,
    walking,
)
from amplifier_module_context_simple.errors import (
    RetainedContentMissingError,
    TransactionConflictError,
)
from amplifier_module_context_simple.negotiator.transaction import (
    RequestTransaction,
    TxnState,
)
from amplifier_module_context_simple.testing import (
    freeze,
    run_cancelling_after_step,
    snapshot,
)
from benchmarks import histories
from tests.negotiator.orchestrator import counting, proportional
from tests.reliability.harness import (
    LIMIT,
    REMINDER,
    mixed_history,
    track_transactions,
)
from tests.support import replaced

pytestmark = pytest.mark.anyio

HISTORY = mixed_history(1200)
OTHER = replaced(mixed_history(900))
CONFIG: dict[str, Any] = {"protected_tool_results": 1, "token_meter": "actual", "max_tokens": 3000}
STAMPED = "2025-06-11T09:30:00.000+00:00"
"""An explicit admission timestamp, so a store and its twin admit the same message."""

Request = Callable[[SimpleContextManager], Awaitable[Any]]
REQUESTS: dict[str, Request] = {
    "ordinary": lambda m: m.get_messages_for_request(token_budget=2400),
    "retaining": lambda m: m.get_messages_for_request_retaining(
        retain_contents=[REMINDER], token_budget=2400
    ),
    "hard_fit": lambda m: m.get_messages_for_request_retaining(
        retain_contents=[REMINDER], token_budget=1800, hard_fit=True
    ),
}


def follow_up(i: int = 0) -> dict[str, Any]:
    return {"role": "user", "content": f"one more thing ({i})", "metadata": {"timestamp": STAMPED}}


class Interference:
    """A pacer checkpoint that runs ``move`` at its ``at``-th call (``every``: at each call
    from then on), then checkpoints."""

    def __init__(
        self, at: int = 0, move: Callable[[], Awaitable[None]] | None = None, *, every: bool = False
    ) -> None:
        self.at, self.move, self.every = at, move, every
        self.pauses = 0
        self.moves = 0

    async def __call__(self) -> None:
        self.pauses += 1
        due = self.pauses == self.at or (self.every and self.pauses >= self.at)
        if due and self.move is not None:
            self.moves += 1
            await self.move()
        await anyio.lowlevel.checkpoint()


async def loaded(messages: list[dict[str, Any]] = HISTORY) -> SimpleContextManager:
    manager = SimpleContextManager(**CONFIG)
    await manager.set_messages(messages)
    return manager


async def ready_transaction(manager: SimpleContextManager) -> RequestTransaction:
    """A negotiated request planned on ``manager`` as it is now, READY to commit."""
    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
    )
    transaction = result["transaction"]
    assert isinstance(transaction, RequestTransaction) and transaction.has_changes
    return transaction


Move = Callable[[SimpleContextManager, RequestTransaction], Awaitable[None]]


async def _set_messages(manager: SimpleContextManager, other: RequestTransaction) -> None:
    await manager.set_messages(OTHER)


async def _clear(manager: SimpleContextManager, other: RequestTransaction) -> None:
    await manager.clear()


async def _add_message(manager: SimpleContextManager, other: RequestTransaction) -> None:
    await manager.add_message(follow_up())


async def _another_commit(manager: SimpleContextManager, other: RequestTransaction) -> None:
    assert await other.commit() is True


async def _reconfigure(manager: SimpleContextManager, other: RequestTransaction) -> None:
    manager.target_usage = 0.3
    manager.max_tokens = 2000  # below the requests' 2400: the budget is derived again
    await anyio.lowlevel.checkpoint()


MOVES: dict[str, Move] = {
    "set_messages": _set_messages,
    "clear": _clear,
    "add_message": _add_message,
    "another_commit": _another_commit,
    "reconfigure": _reconfigure,
}


async def outcome(run: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
    """``("returned", frozen value)`` or ``("raised", error type)``."""
    try:
        value = await run()
    except (RetainedContentMissingError, TransactionConflictError) as error:
        return "raised", type(error)  # noqa: ASYNC910 - the awaited request raised: its outcome
    return "returned", freeze(value)


async def pause_points(request: Request, *, prepared: bool = True) -> int:
    """How many pause points ``request`` reaches on a fresh store (zero budget), after a
    negotiated request was ``prepared`` on it (as the tests' stores are)."""
    manager = await loaded()
    if prepared:
        await ready_transaction(manager)
    counter = Interference()
    manager._pacer = Pacer(0.0, counter)
    await request(manager)
    return counter.pauses


# -- ordinary, retaining and hard-fit requests: re-planned ------------------------------------


async def check_replanned(kind: str, move: str) -> None:
    """At every pause point of the request, the store moves. The request returns (or
    raises) and commits exactly what it does on a twin store that moved first."""
    request, act = REQUESTS[kind], MOVES[move]
    points = await pause_points(request)
    assert points >= 8, f"the request pauses too rarely to test ({points})"
    for k in range(1, points + 1):
        twin = await loaded()
        await act(twin, await ready_transaction(twin))
        expected = await outcome(partial(request, twin))

        manager = await loaded()
        other = await ready_transaction(manager)
        interference = Interference(k, partial(act, manager, other))
        manager._pacer = Pacer(0.0, interference)
        got = await outcome(partial(request, manager))
        assert interference.moves == 1, (k, points)
        assert got == expected, (kind, move, k)
        assert snapshot(manager) == snapshot(twin), (kind, move, k)


@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_a_stale_ordinary_plan_is_replanned_never_applied(
    kind: str, move: str, anyio_backend: str
) -> None:
    """At every pause point of an ordinary, retaining or hard-fit request the store moves
    (``set_messages``, ``clear``, ``add_message``, another commit, a configuration change):
    the request returns (or raises) and commits exactly what it does on a twin store that
    moved first."""
    await check_replanned(kind, move)


async def test_a_history_that_keeps_changing_ends_in_one_unpaced_plan(anyio_backend: str) -> None:
    """An admission at every pause point: the request re-plans ``PACED_PLANS`` times, then
    plans once without pausing, and returns the view of everything admitted."""
    manager = await loaded()
    appended: list[dict[str, Any]] = []

    async def admit() -> None:
        appended.append(follow_up(len(appended)))
        await manager.add_message(appended[-1])

    interference = Interference(1, admit, every=True)
    manager._pacer = Pacer(0.0, interference)
    view = await REQUESTS["ordinary"](manager)
    assert interference.moves == interference.pauses >= store_module.PACED_PLANS

    twin = await loaded()
    for message in appended:
        await twin.add_message(message)
    assert freeze(view) == freeze(await REQUESTS["ordinary"](twin))
    assert snapshot(manager) == snapshot(twin)


@pytest.mark.parametrize("move", ["set_messages", "add_message"])
async def test_the_replanning_test_catches_a_store_that_does_not_replan(
    move: str, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """MUTANT: the staleness check is blind (a plan is never stale). The test above finds
    it: the request raises at its commit (its version moved) or returns the view of a
    history that is no longer the store's."""
    monkeypatch.setattr(store_module.ContextStore, "_stamp", lambda self: ())
    with pytest.raises(AssertionError):
        await check_replanned("ordinary", move)


# -- the negotiated request: stopped, or a conflict at commit ---------------------------------


async def negotiate(manager: SimpleContextManager) -> dict[str, Any]:
    return await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
    )


@pytest.mark.parametrize("move", ["set_messages", "clear"])
async def test_a_negotiation_whose_history_was_replaced_while_it_planned_stops(
    move: str, anyio_backend: str
) -> None:
    """At every pause point: ``TransactionConflictError``; every transaction created is
    rolled back and the store is exactly as the move left it."""
    points = await pause_points(negotiate)
    assert points >= 8, points
    for k in range(1, points + 1):
        twin = await loaded()
        await MOVES[move](twin, await ready_transaction(twin))

        manager = await loaded()
        other = await ready_transaction(manager)
        interference = Interference(k, partial(MOVES[move], manager, other))
        manager._pacer = Pacer(0.0, interference)
        with track_transactions() as ledger, pytest.raises(TransactionConflictError):
            await negotiate(manager)
        assert interference.moves == 1, (k, points)
        assert all(m.state is TxnState.ROLLED_BACK for m in ledger.created), k
        assert snapshot(manager) == snapshot(twin), (move, k)


async def test_another_commit_while_a_negotiation_planned_makes_its_commit_a_conflict(
    anyio_backend: str,
) -> None:
    """At every pause point another transaction commits: the negotiation returns, and its
    commit answers False with ``conflict`` set, applying nothing."""
    points = await pause_points(negotiate)
    for k in range(1, points + 1):
        twin = await loaded()
        twin_other = await ready_transaction(twin)
        assert await twin_other.commit() is True

        manager = await loaded()
        other = await ready_transaction(manager)
        interference = Interference(k, partial(_another_commit, manager, other))
        manager._pacer = Pacer(0.0, interference)
        result = await negotiate(manager)
        assert interference.moves == 1, k
        transaction = result["transaction"]
        assert isinstance(transaction, RequestTransaction)
        assert await transaction.commit() is False and transaction.conflict, k
        assert snapshot(manager) == snapshot(twin), k


async def test_an_admission_while_a_negotiation_planned_does_not_concern_it(
    anyio_backend: str,
) -> None:
    """At every pause point a message is admitted: the negotiation (for the planned
    prefix) returns and commits as if the message had come right after it."""
    points = await pause_points(negotiate, prepared=False)
    for k in range(1, points + 1):
        twin = await loaded()
        twin_result = await negotiate(twin)
        await twin.add_message(follow_up())
        assert await twin_result["transaction"].commit() is True

        manager = await loaded()
        interference = Interference(k, partial(manager.add_message, follow_up()))
        manager._pacer = Pacer(0.0, interference)
        result = await negotiate(manager)
        assert interference.moves == 1, k
        assert freeze(result["base_view"]) == freeze(twin_result["base_view"]), k
        assert await result["transaction"].commit() is True, k
        assert snapshot(manager) == snapshot(twin), k


# -- no cost for small histories; pause points grow with the history ------------------------


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("n", [1_000, 2_000])
async def test_a_steady_request_on_a_small_history_yields_as_often_as_an_unpaced_one(
    n: int, anyio_backend: str
) -> None:
    """A steady-state request (nothing to compact) on 1k and 2k benchmark messages takes
    exactly the scheduler steps of the same request planned without pausing. (The
    collector is off for the two requests: a full pass in the test process would count as
    the request's CPU time.)"""
    manager = SimpleContextManager()
    await manager.set_messages(histories.history(n))
    big = 10**9
    await manager.get_messages_for_request(token_budget=big)  # the first-request one-offs
    steps = []
    gc.disable()
    try:
        for pacer in (Pacer(), Pacer(math.inf)):
            manager._pacer = pacer
            run = await run_cancelling_after_step(
                10**9, lambda: manager.get_messages_for_request(token_budget=big)
            )
            assert run.returned and manager.last_compaction_stats is None
            steps.append(run.steps)
    finally:
        gc.enable()
    assert steps[0] == steps[1], steps


async def test_pause_points_grow_with_the_history(anyio_backend: str) -> None:
    """A first compaction on 4k messages pauses at least 2.5 times as often as on 1k: the
    work between two pause points does not grow with the history."""
    counts = []
    for n in (1_000, 4_000):
        manager = SimpleContextManager()
        await manager.set_messages(histories.history(n))
        budget = sum(e.tokens for e in manager._history.entries) // 2
        counter = Interference()
        manager._pacer = Pacer(0.0, counter)
        await manager.get_messages_for_request(token_budget=budget)
        assert manager.last_compaction_stats is not None
        counts.append(counter.pauses)
    assert counts[1] >= 2.5 * counts[0], counts


@pytest.mark.parametrize("kind", [*REQUESTS, "negotiated"])
async def test_paced_and_unpaced_plans_give_the_same_result(kind: str, anyio_backend: str) -> None:
    """The same request on twin stores, paused at every pause point or never: the same
    view, the same committed state."""
    results = []
    for pacer in (Pacer(0.0), Pacer(math.inf)):
        manager = await loaded()
        manager._pacer = pacer
        if kind == "negotiated":
            result = await negotiate(manager)
            assert await result["transaction"].commit() is True
            value = freeze(result["base_view"])
        else:
            value = freeze(await REQUESTS[kind](manager))
        assert manager.last_compaction_stats is not None
        results.append((value, snapshot(manager)))
    assert results[0] == results[1]


# -- the pacer and the planning lock -------------------------------------------------------------


def steps_of(log: list[str], name: str, count: int) -> Any:
    """``count`` pause points, each logged as ``name``; returns ``name``."""
    for _ in range(count):
        log.append(f"{name} step")
        yield
    return name


def step_functions() -> list[tuple[str, str]]:
    """(module, name) of every public function or method of the runtime package that is
    annotated to return ``Steps[...]``."""
    root = Path(package.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if "testing" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.returns is not None:
                returns = ast.unparse(node.returns)
                if returns.startswith("Steps[") and not node.name.startswith("_"):
                    found.append((str(path.relative_to(root)), node.name))
    return found


def test_a_public_step_function_is_named_with_a_gerund() -> None:
    """docs/design.md section 8: what returns steps says so in its name (one of its words
    ends in -ing), and no public synchronous twin runs it through beside it."""
    found = step_functions()
    assert len(found) >= 15, found
    assert [f for f in found if not any(w.endswith("ing") for w in f[1].split("_"))] == []
    names = {name for _, name in found}
    twins = {"climb", "apply", "merged", "step", "finalised"}
    root = Path(package.__file__).parent
    for path in root.rglob("*.py"):
        defined = {
            node.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef)
        }
        assert not defined & twins, (path, defined & twins)
    assert {"climbing", "applying", "merging", "stepping", "finalising"} <= names


def trace(steps: Any, log: list[Any]) -> Any:
    """Run ``steps`` through, logging a ``"pause"`` at each pause point; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        log.append("pause")


def test_a_walk_pauses_before_every_stride_th_item_and_resumes_where_it_stopped() -> None:
    log: list[Any] = []
    assert trace(walking(range(10), log.append, stride=4), log) is None
    assert log == [0, 1, 2, "pause", 3, 4, 5, 6, "pause", 7, 8, 9]
    # stopped at the first item act returns true for (not done), then resumed there: the
    # pause points are where the whole walk has them
    log.clear()
    stop = {5}

    def act(item: int) -> bool:
        if item in stop:
            return True
        log.append(item)
        return False

    assert trace(walking(list(range(10)), act, stride=4), log) == 5
    stop.clear()
    assert trace(walking(list(range(10)), act, stride=4, start=5), log) is None
    assert log == [0, 1, 2, "pause", 3, 4, 5, 6, "pause", 7, 8, 9]
    # any iterable from the start; a resumed walk needs a sequence
    log.clear()
    assert trace(walking(iter("abc"), log.append, stride=2), log) is None
    assert log == ["a", "pause", "b", "c"]
    with pytest.raises(TypeError, match="sequence"):
        run_through(walking(iter("abc"), log.append, start=1))


def test_chunking_pauses_after_each_chunk_or_only_between_them() -> None:
    log: list[Any] = []
    assert (
        trace(chunking(list(range(7)), lambda c, o: log.append((list(c), o)), size=3), log) is None
    )
    assert log == [([0, 1, 2], 0), "pause", ([3, 4, 5], 3), "pause", ([6], 6), "pause"]
    log.clear()
    steps = chunking(
        list(range(7)), lambda c, o: log.append((list(c), o)), size=3, start=1, between=True
    )
    assert trace(steps, log) is None
    assert log == [([1, 2, 3], 1), "pause", ([4, 5, 6], 4)]


async def test_run_through_and_a_zero_budget_pacer_reach_every_pause_point(
    anyio_backend: str,
) -> None:
    log: list[str] = []
    assert run_through(steps_of(log, "a", 3)) == "a"
    counter = Interference()
    assert await Pacer(0.0, counter).run(steps_of(log, "b", 3)) == "b"
    assert counter.pauses == 3
    counter = Interference()
    assert await Pacer(math.inf, counter).run(steps_of(log, "c", 3)) == "c"
    assert counter.pauses == 0
    with pytest.raises(ValueError, match="slice budget"):
        Pacer(-1.0)


async def test_paced_plans_run_one_after_another(anyio_backend: str) -> None:
    """Plan B starts while plan A is paused: B pauses once (its short first slice), then
    waits for the planning lock until A is done (the backends may order the steps of one
    scheduling round differently; the queueing is the same)."""
    log: list[str] = []
    a_paused = anyio.Event()

    async def checkpoint_a() -> None:
        log.append("A pause")
        a_paused.set()
        await anyio.lowlevel.checkpoint()

    async def checkpoint_b() -> None:
        log.append("B pause")
        await anyio.lowlevel.checkpoint()

    async def run_b() -> None:
        await a_paused.wait()
        assert planning_lock().locked() and QUEUED_SLICE_SECONDS > 0
        await Pacer(0.0, checkpoint_b).run(steps_of(log, "B", 3))

    async with anyio.create_task_group() as group:
        group.start_soon(Pacer(0.0, checkpoint_a).run, steps_of(log, "A", 4))
        group.start_soon(run_b)
    assert sorted(log) == sorted(["A step", "A pause"] * 4 + ["B step", "B pause"] * 3)
    last_a = max(i for i, event in enumerate(log) if event.startswith("A"))
    b_events = [i for i, event in enumerate(log) if event.startswith("B")]
    assert log[b_events[0]] == "B step" and log[b_events[1]] == "B pause", log
    assert b_events[1] < last_a < b_events[2], log  # B paused once, then waited for A
    assert not planning_lock().locked()


async def test_a_plan_that_raises_or_is_cancelled_releases_the_lock(anyio_backend: str) -> None:
    def failing() -> Any:
        yield
        yield
        raise LookupError("a step failed")

    with pytest.raises(LookupError):
        await Pacer(0.0).run(failing())
    assert not planning_lock().locked()

    with anyio.CancelScope() as scope:

        async def cancelling() -> None:
            scope.cancel()
            await anyio.lowlevel.checkpoint()

        await Pacer(0.0, cancelling).run(steps_of([], "x", 3))
    assert scope.cancelled_caught and not planning_lock().locked()


async def test_a_cancelled_request_leaves_no_plan_behind(anyio_backend: str) -> None:
    """Cancelled at a pause point in the middle of a negotiation, a request changes
    nothing, leaves its transaction rolled back, holds no lock, and the same request then
    returns what it returns on a twin store."""
    middle = await pause_points(negotiate, prepared=False) // 2
    manager = await loaded()
    before = snapshot(manager)
    with anyio.CancelScope() as scope:

        async def cancel() -> None:  # noqa: ASYNC910 - the pacer checkpoints right after it
            scope.cancel()

        manager._pacer = Pacer(0.0, Interference(middle, cancel))
        with track_transactions() as ledger:
            await negotiate(manager)
    assert scope.cancelled_caught and not planning_lock().locked()
    assert [m.state for m in ledger.created] == [TxnState.ROLLED_BACK]
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    twin = await loaded()
    assert freeze(await REQUESTS["ordinary"](manager)) == freeze(await REQUESTS["ordinary"](twin))
