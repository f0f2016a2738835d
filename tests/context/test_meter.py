"""The real-usage token meter (docs/design.md section 2)."""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from amplifier_core import Usage

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.meter import TokenMeter, reading_from_usage
from tests.support import mounted

STATS_KEYS = {
    "mode",
    "source",
    "used_tokens",
    "estimated_tokens",
    "estimate_scope",
    "measured_tokens",
    "foreground_usage_stale",
    "budget",
    "ratio",
}
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


async def respond(cm: SimpleContextManager, data: Any) -> None:
    handler: Callable[[str, Any], Awaitable[object]] = cm.on_llm_response
    assert await handler("llm:response", data) is None  # a hook handler returns None


def reading(cm: SimpleContextManager) -> int | None:
    """The meter's reading, read afresh (mypy keeps a narrowed attribute narrowed)."""
    return cm.observable_state().measured


def meter_stats(cm: SimpleContextManager) -> dict[str, Any]:
    """The meter stats of the last request (there was one)."""
    stats = cm.last_token_meter_stats
    assert stats is not None
    return stats


def usage_model(input_tokens: int, **extra: Any) -> Usage:
    return Usage(input_tokens=input_tokens, output_tokens=1, total_tokens=input_tokens + 1, **extra)


class Hostile:
    """A usage object whose attributes explode."""

    @property
    def input_tokens(self) -> int:
        raise RuntimeError("no")


# -- recording -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_input_plus_cache_write() -> None:
    """A reading is input_tokens + cache_write_tokens (cache reads never added)."""
    cm = SimpleContextManager()
    await respond(
        cm,
        {"usage": {"input_tokens": 2, "cache_write_tokens": 161_165, "cache_read_tokens": 9}},
    )
    assert cm.observable_state().measured == 161_167


@pytest.mark.anyio
async def test_latest_reading_replaces() -> None:
    """Each valid reading replaces the previous one (not cumulative)."""
    cm = SimpleContextManager()
    await respond(cm, {"usage": {"input_tokens": 500}})
    assert cm.observable_state().measured == 500
    await respond(cm, {"usage": {"input_tokens": 100}})
    await respond(cm, {"usage": {"input_tokens": 250}})
    assert cm.observable_state().measured == 250


@pytest.mark.anyio
async def test_usage_as_an_amplifier_core_model() -> None:
    """Usage given as amplifier-core's Usage model is read by attribute."""
    cm = SimpleContextManager()
    await respond(cm, {"usage": usage_model(2, cache_write_tokens=161_165)})
    assert cm.observable_state().measured == 161_167
    await respond(cm, {"usage": usage_model(40)})  # cache_write_tokens None: input only
    assert cm.observable_state().measured == 40


@pytest.mark.anyio
async def test_usage_as_a_plain_object() -> None:
    """Any object with the attributes works; a missing cache_write_tokens counts as 0."""
    cm = SimpleContextManager()
    await respond(cm, {"usage": types.SimpleNamespace(input_tokens=7, cache_write_tokens=3)})
    assert cm.observable_state().measured == 10
    await respond(cm, {"usage": types.SimpleNamespace(input_tokens=8)})
    assert cm.observable_state().measured == 8


INVALID_DATA: list[Any] = [
    None,
    {},
    "usage",
    ["usage"],
    {"usage": None},
    {"usage": {}},
    {"usage": "input_tokens=5"},
    {"usage": 5},
    {"usage": {"input_tokens": None}},
    {"usage": {"input_tokens": -1}},
    {"usage": {"input_tokens": True}},
    {"usage": {"input_tokens": 5.0}},
    {"usage": {"input_tokens": "5"}},
    {"usage": {"input_tokens": 5, "cache_write_tokens": "bad"}},
    {"usage": {"input_tokens": 5, "cache_write_tokens": -3}},
    {"usage": {"input_tokens": 5, "cache_write_tokens": False}},
    {"usage": {"cache_write_tokens": 5}},
    {"usage": types.SimpleNamespace(input_tokens=-2)},
    {"usage": types.SimpleNamespace(output_tokens=2)},
    {"usage": Hostile()},
]


@pytest.mark.anyio
@pytest.mark.parametrize("data", INVALID_DATA, ids=lambda d: repr(d)[:40])
async def test_invalid_readings_are_ignored(data: Any) -> None:
    """An invalid payload leaves the reading unchanged and never raises."""
    cm = SimpleContextManager()
    await respond(cm, {"usage": {"input_tokens": 77}})
    await respond(cm, data)
    assert cm.observable_state().measured == 77


def test_reading_from_usage_pure() -> None:
    """The pure parser agrees with the listener on the edge cases."""
    assert reading_from_usage({"input_tokens": 0}) == 0
    assert reading_from_usage({"input_tokens": 3, "cache_write_tokens": None}) == 3
    assert reading_from_usage({"input_tokens": 3, "cache_write_tokens": 0}) == 3
    assert reading_from_usage(None) is None
    assert reading_from_usage({"input_tokens": 3, "cache_write_tokens": 1.5}) is None


@pytest.mark.anyio
async def test_recording_in_both_modes() -> None:
    """The listener records in estimate mode as well as in actual mode."""
    for mode in ("estimate", "actual"):
        cm = SimpleContextManager(token_meter=mode)
        await respond(cm, {"usage": {"input_tokens": 12}})
        assert cm.observable_state().measured == 12


@asyncio_only
@pytest.mark.anyio
async def test_real_emit_with_a_dumped_usage_model() -> None:
    """Through the real registry, a model_dump()ed Usage reaches the meter."""
    coordinator, context, _ = await mounted({})
    usage = usage_model(2, cache_write_tokens=161_165).model_dump()
    await coordinator.hooks.emit("llm:response", {"usage": usage})
    assert context.observable_state().measured == 161_167
    await coordinator.cleanup()


# -- gating ------------------------------------------------------------------------------------


async def tool_history(cm: SimpleContextManager) -> None:
    """A first human prompt, ten tool turns with ~8 KB results, a latest human prompt."""
    await cm.add_message({"role": "user", "content": "start"})
    for i in range(10):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        await cm.add_message({"role": "assistant", "content": None, "tool_calls": [call]})
        await cm.add_message(
            {"role": "tool", "tool_call_id": f"c{i}", "name": "read", "content": f"{i} " * 4000}
        )
    await cm.add_message({"role": "user", "content": "end"})


async def history_estimate() -> int:
    cm = SimpleContextManager(compaction_notice_enabled=False)
    await tool_history(cm)
    await cm.get_messages_for_request(token_budget=10_000_000)
    return int(meter_stats(cm)["estimated_tokens"])


async def gated(mode: str, measured: int | None, threshold: float, budget: int) -> Any:
    """Run one request on the tool history; return the manager."""
    cm = SimpleContextManager(
        max_tokens=budget,
        max_tokens_fallback=budget,
        compaction_notice_enabled=False,
        compact_threshold=threshold,
        target_usage=0.05,
        protected_tool_results=0,
        token_meter=mode,
    )
    await tool_history(cm)
    if measured is not None:
        await respond(cm, {"usage": {"input_tokens": measured}})
    await cm.get_messages_for_request()
    return cm


@pytest.mark.anyio
async def test_estimate_mode_ignores_a_huge_measurement() -> None:
    """In estimate mode a measurement far over budget does not trigger compaction."""
    estimate = await history_estimate()
    budget = estimate * 10
    cm = await gated("estimate", budget * 9, threshold=0.5, budget=budget)
    assert cm.last_compaction_stats is None
    stats = meter_stats(cm)
    assert stats["mode"] == "estimate"
    assert stats["source"] == "estimate"
    assert stats["measured_tokens"] == budget * 9
    assert stats["used_tokens"] == stats["estimated_tokens"] == estimate


@pytest.mark.anyio
async def test_actual_mode_gates_on_the_measurement() -> None:
    """In actual mode a measurement over the trigger compacts a small-estimate history."""
    estimate = await history_estimate()
    budget = estimate * 10
    measured = int(budget * 0.9)
    cm = await gated("actual", measured, threshold=0.5, budget=budget)
    assert cm.last_compaction_stats is not None
    stats = meter_stats(cm)
    assert stats["source"] == "measured"
    assert stats["used_tokens"] == measured
    assert stats["estimated_tokens"] == estimate
    assert stats["ratio"] == pytest.approx(measured / budget)


@pytest.mark.anyio
async def test_actual_mode_low_measurement_prevents_compaction() -> None:
    """In actual mode a low measurement keeps an over-trigger estimate from compacting."""
    estimate = await history_estimate()
    budget = estimate * 10
    compacting = await gated("estimate", None, threshold=0.05, budget=budget)
    assert compacting.last_compaction_stats is not None
    cm = await gated("actual", 100, threshold=0.05, budget=budget)
    assert cm.last_compaction_stats is None
    assert meter_stats(cm)["used_tokens"] == 100


@pytest.mark.anyio
async def test_actual_mode_without_a_measurement_uses_the_estimate() -> None:
    """Actual mode before any reading behaves as estimate mode."""
    cm = SimpleContextManager(token_meter="actual")
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request()
    stats = meter_stats(cm)
    assert stats["mode"] == "actual"
    assert stats["source"] == "estimate"
    assert stats["measured_tokens"] is None
    assert stats["used_tokens"] == stats["estimated_tokens"]


# -- foreground claim -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_claim_foreground_usage() -> None:
    """Claiming clears the hook reading; the recorder owns the meter; bad values go stale."""
    cm = SimpleContextManager(token_meter="actual")
    await cm.add_message({"role": "user", "content": "hello"})
    await respond(cm, {"usage": {"input_tokens": 17}})
    assert cm.observable_state().measured == 17
    recorder = cm.claim_foreground_usage()
    assert reading(cm) is None
    assert recorder(input_tokens=20, cache_write_tokens=3) is True
    assert reading(cm) == 23
    await respond(cm, {"usage": {"input_tokens": 999}})
    assert cm.observable_state().measured == 23
    assert recorder(input_tokens=True) is False
    assert cm.observable_state().measured == 23
    await cm.get_messages_for_request()
    stats = meter_stats(cm)
    assert stats["source"] == "owned_stale"
    assert stats["foreground_usage_stale"] is True
    assert stats["used_tokens"] == 23
    assert recorder(input_tokens=30) is True
    await cm.get_messages_for_request()
    assert meter_stats(cm)["source"] == "measured"
    assert meter_stats(cm)["foreground_usage_stale"] is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"input_tokens": -1},
        {"input_tokens": None},
        {"input_tokens": 1.0},
        {"input_tokens": "3"},
        {"input_tokens": 3, "cache_write_tokens": -1},
        {"input_tokens": 3, "cache_write_tokens": True},
        {"input_tokens": 3, "cache_write_tokens": "1"},
    ],
    ids=repr,
)
def test_recorder_rejects_invalid_values(kwargs: dict[str, Any]) -> None:
    """The recorder returns False, keeps the previous reading and marks it stale."""
    cm = SimpleContextManager()
    recorder = cm.claim_foreground_usage()
    assert recorder(input_tokens=5) is True
    assert recorder(**kwargs) is False
    assert cm.observable_state().measured == 5
    assert cm._meter.stale is True


def test_recorder_is_keyword_only() -> None:
    """The recorder takes keywords only."""
    recorder = SimpleContextManager().claim_foreground_usage()
    with pytest.raises(TypeError):
        recorder(5)


def test_second_claim_keeps_the_reading() -> None:
    """Claiming again returns a working recorder and does not clear the owned reading."""
    cm = SimpleContextManager()
    first = cm.claim_foreground_usage()
    assert first(input_tokens=11) is True
    second = cm.claim_foreground_usage()
    assert cm.observable_state().measured == 11
    assert second(input_tokens=12) is True
    assert cm.observable_state().measured == 12


@pytest.mark.anyio
async def test_clear_keeps_a_claim_and_marks_it_stale() -> None:
    """clear forgets the reading; a claimed meter stays claimed (hooks ignored) and stale."""
    cm = SimpleContextManager(token_meter="actual")
    recorder = cm.claim_foreground_usage()
    recorder(input_tokens=50)
    await cm.clear()
    assert cm.observable_state().measured is None
    await respond(cm, {"usage": {"input_tokens": 999}})
    assert cm.observable_state().measured is None
    assert cm._meter.stale is True


def test_token_meter_stats_directly() -> None:
    """TokenMeter.stats: no reading means estimate; a zero budget gives ratio None."""
    meter = TokenMeter()
    stats = meter.stats(mode="actual", estimated=10, budget=0, images_estimated=False)
    assert stats["source"] == "estimate"
    assert stats["ratio"] is None
    assert set(stats) == STATS_KEYS


# -- stats on every request -------------------------------------------------------------------


@pytest.mark.anyio
async def test_stats_set_on_every_request() -> None:
    """Every request sets the stats (no compaction needed); public property is the same."""
    cm = SimpleContextManager()
    assert (cm._last_token_meter_stats, cm.last_token_meter_stats) == (None, None)
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request()
    first = meter_stats(cm)
    assert first is cm._last_token_meter_stats
    assert set(first) >= STATS_KEYS
    assert cm.last_compaction_stats is None
    assert first["budget"] == 200_000 - 800
    assert first["ratio"] == pytest.approx(first["used_tokens"] / first["budget"])
    await cm.get_messages_for_request()
    second = cm.last_token_meter_stats
    assert second is not first
    assert second == first
    await cm.get_messages_for_request_retaining(retain_contents=[])
    assert cm.last_token_meter_stats is not second


@pytest.mark.anyio
async def test_stats_follow_admission() -> None:
    """Adding a message raises the estimated tokens of the next request's stats."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request()
    before = meter_stats(cm)["estimated_tokens"]
    await cm.add_message({"role": "assistant", "content": "a longer reply " * 20})
    await cm.get_messages_for_request()
    assert meter_stats(cm)["estimated_tokens"] > before


@pytest.mark.anyio
async def test_stats_on_an_empty_context() -> None:
    """Even an empty context publishes meter stats."""
    cm = SimpleContextManager()
    await cm.get_messages_for_request()
    stats = meter_stats(cm)
    assert set(stats) >= STATS_KEYS
    assert stats["mode"] == "estimate"
    assert stats["measured_tokens"] is None
