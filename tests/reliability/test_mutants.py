"""Testing the tests (docs/design.md section 10): one planted mutant per harness, which it must catch.

Each test monkeypatches one deliberate bug into the package, runs the harness unchanged
against it, and asserts that the harness reports a failure (and, where it matters, that a
weaker harness does not - which is why both exist):

==========================  ===============================================  ===============
harness                     planted mutant                                   caught by
==========================  ===============================================  ===============
T1 sweep (commit)           commit delivers ``context:compaction`` first     anyio cancel
T1 sweep (commit)           commit applies before its cancellation check     anyio cancel
T1 sweep (ordinary)         the ordinary path awaits again after its commit  anyio cancel
T1/T2 sweep (negotiated)    the driver does not roll back on BaseException   ledger check
T4 native sweep             commit delivers first inside an anyio shield     native only
T5 step sweep               an await outside the seams before delivery       trio steps only
T3 compound                 the driver replaces the original error           error typing
T6 bad values               count validation removed                         result check
T8 state machine            an illegal event mutates before raising          h11 rule
T9 properties               tool groups ignored (each message alone)         invariant 1
T9 properties               synthesized results never rendered               invariant 1
T9 properties               the view builder leaks ``_seq``                  invariant 4
T10 properties              admission validation removed                     error typing
T12 concurrency             commit ignores the store version                 first wins
T13 checkpoints             entries only check for cancellation (no yield)   assert_checkpoints
T1 sweep (snapshot)         the budget mark set before its delivery          snapshot: budget_mark
T1 sweep (retry)            the same, with the mark hidden from the snapshot retry events
T1 sweep (snapshot)         meter stats published before the last delivery   snapshot: meter
T1 sweep (snapshot)         the floor mark recorded after delivery           snapshot: floor
T1 sweep (snapshot)         the learned limit recorded after delivery        snapshot: learned_limit
T1 sweep (snapshot)         sticky decisions committed after delivery        snapshot: decisions
==========================  ===============================================  ===============

Each mutant test names what catches it: the exception type and, for a view invariant, its
item and code; for a sweep, ``SweepFailure.code`` and the snapshot ``fields`` that differ.
"""

from __future__ import annotations

import array
import dataclasses
import traceback
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

import amplifier_module_context_simple.context.history.history as history_module
import amplifier_module_context_simple.context.store as manager_module
import amplifier_module_context_simple.negotiator.envelopes as envelopes_module
from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.ladder.decisions import Decisions
from amplifier_module_context_simple.context.ladder.ladder import Ladder
from amplifier_module_context_simple.context.ladder.rows import Groups
from amplifier_module_context_simple.context.policy.policy import RequestPolicy
from amplifier_module_context_simple.context.rendering.render import Rendered
from amplifier_module_context_simple.context.slices import Steps
from amplifier_module_context_simple.context.store import ContextStore
from amplifier_module_context_simple.errors import (
    CountContractError,
    TransactionConflictError,
)
from amplifier_module_context_simple.negotiator.driver import Negotiation
from amplifier_module_context_simple.negotiator.transaction import (
    TRANSITIONS,
    TxnEvent,
    TxnState,
    _Machine,
)
from amplifier_module_context_simple.testing import (
    BUDGET_EVENT,
    CANCEL,
    COMPACTION_EVENT,
    ERROR,
    NATIVE,
    FaultPlan,
    Prepared,
    Snapshot,
    SweepFailure,
    ViewInvariantError,
    step_sweep,
)
from tests.negotiator.orchestrator import counted, proportional
from tests.reliability.harness import EXAMPLES, LIMIT, Operation, build, checker, track_transactions
from tests.reliability.machine import StoreMachine
from tests.reliability.operations import OPERATION, boundary, run_sweep
from tests.reliability.scenarios import (
    cases,
    concurrent_negotiations,
    configs,
    corrupted_scenario,
    measured_store,
    negotiate_and_judge,
    scenario,
)
from tests.reliability.strategies import corrupted

COMMIT = OPERATION["commit/target-reached"]
ORDINARY = OPERATION["ordinary/compacting"]
MEASURED = OPERATION["measured/target-reached"]
SEARCH = settings(
    max_examples=300,
    database=None,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: we only need "it fails"
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True)
def _keep_the_summary_clean() -> Any:
    """Mutant runs do not count toward the examples reported for the real properties."""
    saved = EXAMPLES.copy()
    yield
    EXAMPLES.clear()
    EXAMPLES.update(saved)


def finds_failure(strategy: Any, body: Any) -> BaseException | None:
    """Run ``body(example)`` (async) over ``strategy`` like a property; return the failure."""

    @SEARCH
    @given(example=strategy)
    def prop(example: Any) -> None:
        anyio.run(body, example)

    try:
        prop()
    except Exception as error:
        return error
    return None


# -- T1/T2/T4: the sweeps ------------------------------------------------------------------------


async def commit_delivering_first(self: _Machine, is_cancelled: Any) -> bool:
    await anyio.lowlevel.checkpoint_if_cancelled()
    if self.state is TxnState.COMMITTED:
        return True
    if self.state is TxnState.ROLLED_BACK:
        return False
    if is_cancelled is not None and is_cancelled():
        self.rollback()
        return False
    stats = self.staged.stats
    if self.has_changes and stats is not None:
        await self._seam.deliver_compaction(stats)  # MUTANT: delivered before applying
    try:
        self._fire(TxnEvent.COMMIT)
    except TransactionConflictError:
        return False
    return True


async def commit_applying_first(self: _Machine, is_cancelled: Any) -> bool:
    if self.state is TxnState.READY:
        try:
            self._fire(TxnEvent.COMMIT)  # MUTANT: applied before the cancellation check
        except TransactionConflictError:
            return False  # noqa: ASYNC910 - the mutant: its commit step precedes any checkpoint
    await anyio.lowlevel.checkpoint_if_cancelled()
    if is_cancelled is not None and is_cancelled():
        return False
    stats = self.staged.stats
    if self.has_changes and stats is not None:
        await self._seam.deliver_compaction(stats)
    return self.state is TxnState.COMMITTED


async def commit_shielded_delivery_first(self: _Machine, is_cancelled: Any) -> bool:
    await anyio.lowlevel.checkpoint_if_cancelled()
    if self.state is not TxnState.READY:
        return self.state is TxnState.COMMITTED
    if is_cancelled is not None and is_cancelled():
        self.rollback()
        return False
    stats = self.staged.stats
    if self.has_changes and stats is not None:
        with anyio.CancelScope(shield=True):  # MUTANT: "safe" because shielded...
            await self._seam.deliver_compaction(stats)
    try:
        self._fire(TxnEvent.COMMIT)
    except TransactionConflictError:
        return False
    return True


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mutant", "failure"),
    [
        # cancelled while delivering: nothing applied, though delivery had started
        (commit_delivering_first, "a fault interrupting a boundary delivery must keep the commit"),
        # cancelled at the checkpoint after the commit step: applied, yet it raised
        (commit_applying_first, "raised but store != before"),
    ],
    ids=["deliver-first", "apply-first"],
)
async def test_the_commit_sweep_catches_a_misordered_commit(
    mutant: Any, failure: str, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    await run_sweep(COMMIT, None, CANCEL, False)  # the real commit passes
    monkeypatch.setattr(_Machine, "commit", mutant)
    with pytest.raises(SweepFailure, match=failure):
        await run_sweep(COMMIT, None, CANCEL, False)


@pytest.mark.anyio
async def test_the_ordinary_sweep_catches_an_await_after_the_commit(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    original = SimpleContextManager.get_messages_for_request

    async def awaits_after_commit(
        self: SimpleContextManager, token_budget: Any = None, provider: Any = None
    ) -> list[dict[str, Any]]:
        view = await original(self, token_budget=token_budget, provider=provider)
        if self._factory is not None:
            await self._factory()  # MUTANT: an await after the commit, outside delivery
        return view

    monkeypatch.setattr(SimpleContextManager, "get_messages_for_request", awaits_after_commit)
    with pytest.raises(SweepFailure, match="raised but store != before"):
        await run_sweep(ORDINARY, None, CANCEL, False)


@pytest.mark.anyio
async def test_the_negotiation_sweep_catches_a_missing_rollback(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    async def run_without_rollback(self: Negotiation) -> dict[str, Any]:
        result = await self._run()  # MUTANT: no rollback on BaseException
        await self.seam.close(self.final, result["measured_after"])
        return result

    monkeypatch.setattr(Negotiation, "run", run_without_rollback)
    with pytest.raises(AssertionError, match="state=COUNTING"):
        await run_sweep(MEASURED, None, CANCEL, False)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_only_the_native_sweep_catches_a_shielded_delivery_before_the_commit(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """Native ``Task.cancel()`` pierces anyio shields (asyncio cancels the task itself, not a scope); docs/design.md section 10."""
    monkeypatch.setattr(_Machine, "commit", commit_shielded_delivery_first)
    await run_sweep(COMMIT, None, CANCEL, False)  # the shield fools the anyio sweep
    with pytest.raises(SweepFailure, match="boundary delivery must keep the commit"):
        await run_sweep(COMMIT, None, NATIVE, False)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_only_the_step_sweep_catches_an_await_outside_the_seams(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    original = SimpleContextManager._emit

    async def emit_after_a_pause(self: SimpleContextManager, event: str, data: Any) -> bool:
        await anyio.lowlevel.checkpoint()  # MUTANT: an await between commit and delivery
        return await original(self, event, data)

    monkeypatch.setattr(SimpleContextManager, "_emit", emit_after_a_pause)
    await run_sweep(ORDINARY, None, CANCEL, False)  # invisible to the seam sweep
    with track_transactions() as ledger:

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            return await build(ORDINARY, plan, ledger)

        with pytest.raises(SweepFailure, match="raised but store != before"):
            await step_sweep(
                ORDINARY.name, prepare, boundary=boundary(ORDINARY), check=checker(ORDINARY, ledger)
            )


# -- the snapshot covers every mark that changes a later request ----------------------------------
#
# ``testing.snapshot`` is the store's ``observable_state()``. Each mutant below re-plants a
# trace that an older, narrower snapshot could not see (the first is the real defect the
# budget-emission mark hid: "raised -> before" while the mark had moved); the shipped sweep
# must name the check that fails and exactly the snapshot fields that differ.

HARD_FIT = OPERATION["hard-fit"]
FLOOR = OPERATION["ordinary/floor"]


async def emit_budget_marking_first(self: ContextStore, provenance: dict[str, Any]) -> None:
    if provenance == self._last_emitted_budget:
        return  # noqa: ASYNC910 - as ContextStore._emit_budget: delivery adds no checkpoint
    self._last_emitted_budget = provenance  # MUTANT: marked before the delivery
    await self._emit(BUDGET_EVENT, dict(provenance))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("op", "code"),
    [(MEASURED, "raised-not-before"), (ORDINARY, "boundary-not-after")],
    ids=["measured", "ordinary"],
)
async def test_the_sweep_catches_a_budget_mark_set_before_delivery(
    op: Operation, code: str, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """A request cancelled while ``context:budget`` is delivered must leave the mark as it
    was (the next request delivers the budget again)."""
    await run_sweep(op, None, CANCEL, False)  # the real store passes
    monkeypatch.setattr(ContextStore, "_emit_budget", emit_budget_marking_first)
    with pytest.raises(SweepFailure) as caught:
        await run_sweep(op, None, CANCEL, False)
    assert (caught.value.code, caught.value.fields) == (code, ("budget_mark",))


@pytest.mark.anyio
async def test_the_retry_check_catches_a_budget_leak_the_snapshot_cannot_see(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """The same leak, hidden from the snapshot: the run that raised looks untouched, but
    the clean retry emits no ``context:budget`` where the reference run did."""
    original = ContextStore.observable_state

    def without_the_mark(self: ContextStore) -> Snapshot:
        return dataclasses.replace(original(self), budget_mark=None)

    monkeypatch.setattr(ContextStore, "observable_state", without_the_mark)
    await run_sweep(MEASURED, None, CANCEL, False)  # the real store passes
    monkeypatch.setattr(ContextStore, "_emit_budget", emit_budget_marking_first)
    with pytest.raises(SweepFailure, match=r"\[\] != \['context:budget'\]") as caught:
        await run_sweep(MEASURED, None, CANCEL, False)
    assert caught.value.code == "retry-events"


@pytest.mark.anyio
async def test_the_sweep_catches_meter_stats_published_before_delivery(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """A negotiated request cancelled in its last delivery keeps the meter stats of the
    last request that returned."""

    async def close_publishing_first(
        self: ContextStore, plan: Any, estimated: int, synthesized: int, *args: Any
    ) -> None:
        self._publish_meter(estimated, plan, synthesized=synthesized)
        await self._emit_budget(plan.provenance)  # MUTANT: published before the delivery
        self._learned = plan.limit

    monkeypatch.setattr(ContextStore, "_close_negotiated", close_publishing_first)
    with pytest.raises(SweepFailure) as caught:
        await run_sweep(MEASURED, None, CANCEL, False)
    assert (caught.value.code, caught.value.fields) == ("raised-not-before", ("meter", "meter_ref"))


def emit_without(field: str) -> Callable[..., Any]:
    """A store ``_emit`` that withholds the store's ``field`` while ``context:compaction`` is
    delivered and records it once the delivery completed (MUTANT: a mark made after the
    commit boundary, so a cancellation in the delivery loses it)."""
    original = ContextStore._emit

    async def emit(self: ContextStore, event: str, data: dict[str, Any]) -> bool:
        if event != COMPACTION_EVENT:
            return await original(self, event, data)
        owner = self._compactor if field == "floor" else self
        kept = getattr(owner, field)
        setattr(owner, field, None)
        delivered = await original(self, event, data)
        setattr(owner, field, kept)
        return delivered

    return emit


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("op", "field", "fields"),
    [(FLOOR, "floor", ("floor",)), (HARD_FIT, "_learned", ("learned_limit",))],
    ids=["floor-mark", "learned-limit"],
)
async def test_the_sweep_catches_a_mark_recorded_after_delivery(
    op: Operation,
    field: str,
    fields: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    anyio_backend: str,
) -> None:
    """Once ``context:compaction`` delivery starts the request stands whole: its floor mark
    (no storm next time) and the provider limit it learned are part of the commit."""
    await run_sweep(op, None, CANCEL, False)  # the real store passes
    monkeypatch.setattr(ContextStore, "_emit", emit_without(field))
    with pytest.raises(SweepFailure) as caught:
        await run_sweep(op, None, CANCEL, False)
    assert (caught.value.code, caught.value.fields) == ("boundary-not-after", fields)


@pytest.mark.anyio
async def test_the_sweep_catches_sticky_decisions_committed_after_delivery(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """The ordinary path commits its sticky decisions before delivering
    ``context:compaction``; committing them only once the delivery completed loses them
    when the caller is cancelled during delivery."""
    request_inputs = ContextStore._request_inputs
    emit = ContextStore._emit

    async def planning(self: ContextStore, **kwargs: Any) -> Any:
        # what was committed when the request began planning (before its own commit)
        inputs = await request_inputs(self, **kwargs)
        self.__dict__["mutant_committed"] = (self._decisions, self._commit_version)
        return inputs

    async def emit_committing_late(self: ContextStore, event: str, data: dict[str, Any]) -> bool:
        if event != COMPACTION_EVENT:
            return await emit(self, event, data)
        committed = (self._decisions, self._commit_version)
        self._decisions, self._commit_version = self.__dict__["mutant_committed"]
        delivered = await emit(self, event, data)  # MUTANT: committed once delivered
        self._decisions, self._commit_version = committed
        return delivered

    monkeypatch.setattr(ContextStore, "_request_inputs", planning)
    monkeypatch.setattr(ContextStore, "_emit", emit_committing_late)
    with pytest.raises(SweepFailure) as caught:
        await run_sweep(ORDINARY, None, CANCEL, False)
    assert caught.value.code == "boundary-not-after"
    assert caught.value.fields == ("version", "removed", "level", "overrides", "stats")


# -- T3 and T6 ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_compound_harness_catches_a_replaced_error(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    async def run_replacing_errors(self: Negotiation) -> dict[str, Any]:
        try:
            result = await self._run()
            await self.seam.close(self.final, result["measured_after"])
        except BaseException as error:
            self._machine.rollback()
            raise CountContractError("negotiation failed") from error  # MUTANT
        return result

    monkeypatch.setattr(Negotiation, "run", run_replacing_errors)
    with pytest.raises(SweepFailure, match="undocumented error type CountContractError"):
        await run_sweep(MEASURED, None, ERROR, False)


@pytest.mark.anyio
async def test_the_bad_value_harness_catches_missing_count_validation(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """Without count validation, bad counts reach the result (the T6 result check rejects
    them) or crash the driver with an undocumented error type (error typing)."""
    for value in (True, -1, 1.5, "12", None):

        async def count_view(view: list[dict[str, Any]], value: Any = value) -> Any:
            await anyio.lowlevel.checkpoint()
            envelope = counted(proportional(0.3, limit=LIMIT), view)
            envelope["budget_decision"]["measurement"]["input_tokens"] = value
            envelope["budget_decision"]["estimated_input_tokens"] = value
            return envelope

        # the real driver rejects every one of them, typed
        assert await negotiate_and_judge(await measured_store(), count_view) == (
            "CountContractError"
        )
    monkeypatch.setattr(envelopes_module, "_count", lambda value: value)  # MUTANT
    caught: dict[str, str] = {}
    for value in (True, -1, 1.5, "12", None):

        async def count_view(view: list[dict[str, Any]], value: Any = value) -> Any:
            await anyio.lowlevel.checkpoint()
            envelope = counted(proportional(0.3, limit=LIMIT), view)
            envelope["budget_decision"]["measurement"]["input_tokens"] = value
            envelope["budget_decision"]["estimated_input_tokens"] = value
            return envelope

        try:
            await negotiate_and_judge(await measured_store(), count_view)
        except AssertionError as error:
            line = traceback.extract_tb(error.__traceback__)[-1].line or ""
            caught[repr(value)] = "result check" if "_count_field(" in line else line
        except Exception as error:
            caught[repr(value)] = f"untyped {type(error).__name__}"
    assert caught == {
        "True": "result check",  # a bool is no count: measured_before=True
        "-1": "result check",
        "1.5": "result check",
        "'12'": "untyped TypeError",  # the driver compares a str with the trigger
        # (None still fails typed: the missing estimate is rejected before the count)
    }, caught


# -- T8 -------------------------------------------------------------------------------------------


def test_the_state_machine_catches_an_illegal_event_with_an_effect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = _Machine._fire

    def fire_with_effect(self: _Machine, event: TxnEvent, candidate: Any = None) -> None:
        if event not in TRANSITIONS[self.state]:
            self._staged = self._base  # MUTANT: an effect before the legality error
        original(self, event, candidate)

    monkeypatch.setattr(_Machine, "_fire", fire_with_effect)
    with pytest.raises(AssertionError, match="an illegal event changed"):
        run_state_machine_as_test(
            StoreMachine, settings=settings(SEARCH, max_examples=200, stateful_step_count=25)
        )


# -- T9/T10 ---------------------------------------------------------------------------------------


def ungrouped(self: Ladder) -> Steps[Groups]:
    """MUTANT: every message is a tool group of its own (pairing ignored)."""
    rows = self.rows
    for row in self.live:
        rows.group[row] = rows.seq[row]
    yield
    return Groups({}, {}, array.array("q"))


def test_the_view_properties_catch_ungrouped_removal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removal that ignores tool groups leaves calls or results alone: invariant 1.

    (The former mutant, pairing by adjacency, is no longer a defect: views now place a
    call's results right after it, so in the working view adjacency and id agree.)"""
    monkeypatch.setattr(Ladder, "_groups", ungrouped)
    failure = finds_failure(cases(), scenario)
    assert isinstance(failure, ViewInvariantError) and failure.item == 1, failure


def test_the_view_properties_catch_missing_synthesized_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call a later turn left unanswered, shown without synthesized results: invariant 1."""
    monkeypatch.setattr(
        history_module, "synthesized_results", lambda message, missing, stored=None: []
    )
    failure = finds_failure(cases(), scenario)
    assert isinstance(failure, ViewInvariantError) and failure.item == 1, failure


def test_the_view_properties_catch_a_leaked_sequence_id(monkeypatch: pytest.MonkeyPatch) -> None:
    original = RequestPolicy.rendering

    def leaking_render(
        self: RequestPolicy, plan: Any, decisions: Any, **kwargs: Any
    ) -> Steps[Rendered]:
        rendered = yield from original(self, plan, decisions, **kwargs)
        for position, message in enumerate(rendered.messages):
            if message.get("role") != "system":  # MUTANT: bookkeeping reaches the view
                message["metadata"] = {**(message.get("metadata") or {}), "_seq": position}
        return rendered

    monkeypatch.setattr(RequestPolicy, "rendering", leaking_render)
    failure = finds_failure(cases(), scenario)
    assert isinstance(failure, ViewInvariantError) and failure.code == "bookkeeping-leak", failure


def test_the_corruption_properties_catch_missing_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_validation(message: object, index: int | None = None) -> Any:
        return message  # MUTANT: admission trusts its input

    monkeypatch.setattr(history_module, "validate_message", no_validation)
    monkeypatch.setattr(manager_module, "validate_message", no_validation)
    examples = st.tuples(corrupted(), st.booleans(), configs, st.floats(0.02, 1.2))

    async def body(example: Any) -> None:
        data, via_add, config, fraction = example
        await corrupted_scenario(data, via_add, config, fraction, [])

    failure = finds_failure(examples, body)
    # The unvalidated store admits junk: a message with no role escapes admission as an
    # undocumented KeyError (a role that is a list fails before any change, as a TypeError
    # the scenario takes for a rejection: the entries share one MessageInfo per kind of
    # message, and a list cannot be a key).
    assert isinstance(failure, KeyError) and failure.args == ("role",), failure


# -- T12 ------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_concurrency_harness_catches_a_commit_without_version_check(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    def commit_unchecked(
        self: ContextStore, decisions: Decisions, version: Any, planned: Any = None
    ) -> None:
        self._decisions = decisions  # MUTANT: no version check
        self._commit_version += 1

    arguments = ([[0], [1, 0], [2]], [0, 1, 2, 3], [0.3, 0.5, 0.3, 0.3])
    await concurrent_negotiations(*arguments)  # the real commit passes
    monkeypatch.setattr(ContextStore, "_commit", commit_unchecked)
    with pytest.raises(AssertionError, match="commits won"):
        await concurrent_negotiations(*arguments)


# -- T13 ------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_checkpoint_harness_catches_a_cancel_point_without_a_yield(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    import trio.testing

    manager = SimpleContextManager()
    await manager.set_messages([{"role": "user", "content": "hello"}])
    with trio.testing.assert_checkpoints():
        await manager.get_messages_for_request()  # the real entry is a full checkpoint
    # MUTANT: every entry checkpoint becomes a bare cancellation check (only the manager
    # runs inside the block: no factory, no hooks)
    monkeypatch.setattr(anyio.lowlevel, "checkpoint", anyio.lowlevel.checkpoint_if_cancelled)
    with pytest.raises(AssertionError, match="did not yield"), trio.testing.assert_checkpoints():
        await manager.get_messages_for_request()
