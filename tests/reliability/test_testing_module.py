"""Unit tests of ``amplifier_module_context_simple.testing``: the oracle must accept valid
views and name each broken invariant, in all three tool formats; the fault plan, the
snapshot, the model and the hooks must behave as documented."""

from __future__ import annotations

import copy
import math
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.testing import (
    CANCEL,
    ERROR,
    NATIVE,
    FaultPlan,
    FaultyHooks,
    InjectedFault,
    ReferenceStore,
    ViewInvariantError,
    check_view_invariants,
    faulty_count_view,
    faulty_factory,
    faulty_fit_output,
    freeze,
    run_cancelling_after_step,
    snapshot,
)
from tests.reliability.harness import (
    REMINDER,
    amplifier_round,
    anthropic_round,
    envelope,
    openai_round,
)

ROUNDS = {
    "openai": lambda: openai_round(["c1", "c2"], 50),
    "amplifier": lambda: amplifier_round(["a1", "a2"], 50),
    "anthropic": lambda: anthropic_round(["t1", "t2"], 50, split=True),
}
FORMATS = sorted(ROUNDS)


def conversation(fmt: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "first question"},
        *ROUNDS[fmt](),
        {"role": "assistant", "content": "answer"},
        envelope(),
        {"role": "user", "content": "latest question"},
    ]


def view_of(history: list[dict[str, Any]], *drop: int) -> list[dict[str, Any]]:
    return [copy.deepcopy(m) for i, m in enumerate(history) if i not in drop]


def code_of(history: list[Any], view: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ViewInvariantError) as raised:
        check_view_invariants(history, view, **kwargs)
    return raised.value.item, raised.value.code


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_view_and_a_whole_group_removed_are_valid(fmt: str) -> None:
    history = conversation(fmt)
    report = check_view_invariants(history, view_of(history), retained=[REMINDER])
    assert report.systems == 1 and report.mapping == tuple(range(1, len(history)))
    calls = [i for i, m in enumerate(history) if m.get("role") == "assistant"][:1]
    group = calls + list(range(calls[0] + 1, calls[0] + 3))
    check_view_invariants(history, view_of(history, *group))


@pytest.mark.parametrize("fmt", FORMATS)
def test_pairing_is_checked_by_id_both_ways(fmt: str) -> None:
    history = conversation(fmt)
    call = 2
    assert code_of(history, view_of(history, call)) == (1, "result-without-call")
    assert code_of(history, view_of(history, call + 2)) == (1, "call-without-results")
    # a result moved before its call is an orphan in the history: never in a view
    swapped = view_of(history)
    swapped[call], swapped[call + 1] = swapped[call + 1], swapped[call]
    assert code_of(history, swapped)[0] == 1


def test_a_pending_call_may_be_shown_without_results() -> None:
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "p1", "tool": "x"}]},
    ]
    assert check_view_invariants(history, view_of(history)).pending == {"p1"}


def test_results_split_around_another_message_pair_by_id() -> None:
    history = [
        {"role": "user", "content": "go"},
        *openai_round(["c1", "c2"], 40)[:2],
        {"role": "user", "content": "machine note", "metadata": {"source": "hook"}},
        openai_round(["c1", "c2"], 40)[2],
        {"role": "user", "content": "latest"},
    ]
    check_view_invariants(history, view_of(history))
    # adjacency would drop the call with its neighbour and keep the far result
    assert code_of(history, view_of(history, 1, 2)) == (1, "result-without-call")
    assert code_of(history, view_of(history, 4))[0] == 1


@pytest.mark.parametrize(
    ("result", "code"),
    [
        ({"role": "tool", "content": "x"}, "result-without-id"),
        ({"role": "tool", "tool_call_id": 3, "content": "x"}, "result-without-id"),
        (
            {"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
            "result-without-id",
        ),
        ({"role": "tool", "tool_call_id": "nobody", "content": "x"}, "result-without-call"),
    ],
)
def test_results_without_a_valid_call(result: dict[str, Any], code: str) -> None:
    history = [{"role": "user", "content": "a"}, result, {"role": "user", "content": "b"}]
    assert code_of(history, view_of(history)) == (1, code)


@pytest.mark.parametrize("fmt", FORMATS)
def test_order_invention_and_leaks(fmt: str) -> None:
    history = conversation(fmt)
    late = view_of(history)
    late.append(late.pop(0))
    assert code_of(history, late) == (3, "system-late")
    swapped = view_of(history)
    swapped[-1], swapped[-2] = swapped[-2], swapped[-1]
    assert code_of(history, swapped)[0] == 4
    invented = view_of(history)
    invented.insert(-1, {"role": "assistant", "content": "never said"})
    assert code_of(history, invented) == (4, "invented")
    leaking = view_of(history)
    leaking[1]["metadata"] = {"_seq": 1}
    assert code_of(history, leaking) == (4, "bookkeeping-leak")


@pytest.mark.parametrize("fmt", FORMATS)
def test_protected_content(fmt: str) -> None:
    history = conversation(fmt)
    assert code_of(history, view_of(history, len(history) - 1))[0] == 2  # latest human
    assert code_of(history, view_of(history, 1)) == (2, "protected")  # first human
    assert code_of(history, view_of(history, 0)) == (2, "systems")
    envelope_at = len(history) - 2
    assert code_of(history, view_of(history, envelope_at), retained=[REMINDER]) == (
        2,
        "protected",
    )
    assert code_of(history, view_of(history), retained=["not admitted"])[1] == "retained-missing"
    factory = [{"role": "system", "content": "factory"}, *view_of(history)[1:]]
    check_view_invariants(history, factory, factory_text="factory")
    assert code_of(history, factory)[1] == "systems"


def test_reduced_forms_and_the_notice() -> None:
    history = [
        {"role": "user", "content": "first " * 40},
        *openai_round(["c1"], 900),
        {"role": "user", "content": "latest"},
    ]
    view = view_of(history)
    view[2] = {**view[2], "content": "[truncated] " + history[2]["content"][:40] + "…"}
    view[2]["metadata"] = {"compaction": {"form": "truncated", "original_tokens": 225}}
    assert check_view_invariants(history, view, truncate_chars=40).reduced == (2,)
    assert code_of(history, view, truncate_chars=80) == (4, "invented")
    notice = {
        "role": "user",
        "content": "<system-reminder>condensed</system-reminder>",
        "metadata": {"source": "context-compaction", "ephemeral": True},
    }
    assert check_view_invariants(history, [*view, notice]).notice
    pending = [*history, {"role": "assistant", "content": "", "tool_calls": [{"id": "p"}]}]
    assert code_of(pending, [*view_of(pending), notice]) == (3, "notice-unsafe")


def test_serialisation_isolation_and_canonical() -> None:
    history = conversation("openai")
    broken = view_of(history)
    broken[1]["extra"] = object()
    assert code_of(history, broken) == (9, "json")
    shared = view_of(history)
    shared[1] = history[1]
    assert code_of(history, shared) == (7, "shared-dict")
    twice = view_of(history)
    twice.insert(2, twice[1])
    assert code_of(history, twice)[0] in (4, 7)
    changed = copy.deepcopy(history)
    changed[1]["content"] = "edited"
    assert code_of(history, view_of(history), canonical=changed) == (6, "canonical-changed")
    assert code_of(history, "not a list") == (4, "not-a-list")


@pytest.mark.anyio
@pytest.mark.parametrize("via_add", [False, True])
async def test_views_check_against_the_stored_history(via_add: bool, anyio_backend: str) -> None:
    """With ``get_messages()`` as the history (``_seq``, stamped timestamps) views still pass."""
    history = conversation("anthropic")
    manager = SimpleContextManager()
    if via_add:
        for message in history:
            await manager.add_message(message)
    else:
        await manager.set_messages(history)
    view = await manager.get_messages_for_request()
    stored = await manager.get_messages()
    check_view_invariants(stored, view, canonical=await manager.get_messages())
    check_view_invariants(history, view)


# -- the fault plan and the seams ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_fault_plan_counts_and_fires(anyio_backend: str) -> None:
    plan = FaultPlan(2, ERROR, persistent=True, always={"emit:x": ERROR})
    await plan.hit("a")
    with pytest.raises(InjectedFault) as raised:
        await plan.hit("b")
    assert (raised.value.label, raised.value.hit) == ("b", 2)
    with pytest.raises(InjectedFault):
        await plan.hit("c")
    assert plan.labels == ["a", "b", "c"] and plan.fired_label == "b"
    assert plan.last_fired_label == "c"
    plan.disarm()
    await plan.hit("d")
    assert plan.hits == 3
    plan.arm()
    with pytest.raises(InjectedFault):
        await plan.hit("emit:x")
    with pytest.raises(ValueError, match="kind"):
        FaultPlan(1, "explode")
    with pytest.raises(ValueError, match="fail_at"):
        FaultPlan(-1)


@pytest.mark.anyio
async def test_a_cancelling_plan_cancels_its_scope(anyio_backend: str) -> None:
    plan = FaultPlan(1, CANCEL)
    with pytest.raises(RuntimeError, match="CancelScope"):
        plan.hit_nowait("a")
    plan = FaultPlan(1, CANCEL)
    with anyio.CancelScope() as scope:
        plan.scope = scope
        await plan.hit("a")
        pytest.fail("not cancelled")
    assert scope.cancelled_caught and plan.fired == [(1, "a", CANCEL)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_native_cancellation_needs_asyncio(anyio_backend: str) -> None:
    with pytest.raises(RuntimeError, match="asyncio"):
        await FaultPlan(1, NATIVE).hit("a")


@pytest.mark.anyio
async def test_seam_wrappers_and_hooks(anyio_backend: str) -> None:
    plan = FaultPlan()

    async def count(view: list[dict[str, Any]]) -> Any:
        return len(view)

    async def fit(view: list[dict[str, Any]], attempt: Any) -> Any:
        return attempt

    assert await faulty_count_view(plan, count)([{}]) == 1
    assert await faulty_fit_output(plan, fit)([], 7) == 7
    assert await faulty_factory(plan, "p")() == "p"
    hooks = FaultyHooks(FaultPlan(2, ERROR))
    await hooks.emit("one", {"n": 1})
    with pytest.raises(InjectedFault):
        await hooks.emit("two", {})
    assert hooks.started == ["one", "two"] and hooks.interrupted == ["two"]
    assert hooks.named("one") == [{"n": 1}]
    assert plan.labels == ["count_view", "fit_output", "factory"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_step_canceller_reaches_every_checkpoint(anyio_backend: str) -> None:
    async def three_checkpoints() -> str:
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        return "done"

    outcomes = []
    for k in range(1, 10):
        run = await run_cancelling_after_step(k, three_checkpoints)
        outcomes.append((run.cancelled, run.returned))
        if run.steps < k:
            break
    assert outcomes == [(True, False)] * 4 + [(False, True)]


# -- snapshots and the model -------------------------------------------------------------------


def test_freeze_is_exact() -> None:
    assert freeze({"a": [1, {"b": 2}]}) == freeze({"a": [1, {"b": 2}]})
    assert freeze({"a": 1, "b": 2}) == freeze({"b": 2, "a": 1})
    assert freeze({"a": True}) != freeze({"a": 1})
    assert freeze({"a": 1.0}) != freeze({"a": 1})
    assert freeze([math.nan]) == freeze([math.nan])
    assert freeze({"a": [1]}) != freeze({"a": {"0": 1}})


@pytest.mark.anyio
async def test_snapshots_compare_values_and_objects(anyio_backend: str) -> None:
    manager = SimpleContextManager(protected_tool_results=1)
    await manager.set_messages(conversation("openai") * 4)
    before = snapshot(manager)
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    await manager.get_messages_for_request(token_budget=1200)
    after = snapshot(manager)
    assert after != before
    assert {"version", "stats", "level", "meter"} <= set(after.differences(before))


@pytest.mark.anyio
async def test_the_reference_store_models_admission(anyio_backend: str) -> None:
    manager = SimpleContextManager()
    model = ReferenceStore()
    history = conversation("amplifier")
    await manager.set_messages(history)
    model.set(history)
    model.check(manager)
    message = {"role": "user", "content": "more", "metadata": {"k": 1}}
    await manager.add_message(message)
    model.add(message)
    model.check(manager)
    await manager.add_message({"role": "user", "content": "timed", "metadata": {"timestamp": "t"}})
    assert model.mismatches(manager.messages)  # the model has not seen it
    model.add({"role": "user", "content": "timed", "metadata": {"timestamp": "t"}})
    model.check(manager)
    await manager.clear()
    model.clear()
    model.check(manager)
    model.note_commit()
    with pytest.raises(AssertionError, match="version"):
        model.check(manager)
