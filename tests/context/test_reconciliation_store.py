"""The count correction at the store (``counting/correction.py`` wired by ``store.py`` and
``meter.py``): which usage reports it takes, and when it forgets them.

Every test returns a view, reports (or not) the provider's usage for it through the
store's ``llm:response`` handler (or a claimed foreground recorder), then reads the
correction the next request applies from its meter stats: ``(count_scale,
count_samples)``. A report of ``SCALE`` x our estimate of the view gives ``(SCALE, 1)``;
nothing reconciled gives ``(1.0, 0)``."""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from tests.support import replaced

B = 50_000
"""A budget the history fits far within (no compaction)."""
SCALE = 1.2
NONE = (1.0, 0)
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful assistant. " * 20},
    {"role": "user", "content": "Please look at the build log and tell me what failed. " * 10},
    {"role": "assistant", "content": "The linker failed on a missing symbol. " * 15},
    {"role": "user", "content": "Which symbol, and from which object file? " * 10},
]
MORE: list[dict[str, Any]] = [
    {"role": "assistant", "content": "The symbol is defined in util.o, which is not linked. " * 8},
    {"role": "user", "content": "Add it to the link line, please."},
]


@dataclass(frozen=True)
class Model:
    """A provider that reports only its model (``get_model_info().id``)."""

    id: str

    def get_model_info(self) -> Any:
        return types.SimpleNamespace(id=self.id)


async def store(**config: Any) -> SimpleContextManager:
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(HISTORY))
    return manager


async def view(manager: SimpleContextManager, budget: int = B, provider: Any = None) -> int:
    """Return a view; our estimate of it."""
    messages = await manager.get_messages_for_request(token_budget=budget, provider=provider)
    return sum(estimate_message(message) for message in messages)


async def report(manager: SimpleContextManager, usage: object) -> None:
    await manager.on_llm_response("llm:response", {"usage": usage})


async def reconciled(manager: SimpleContextManager, budget: int = B, provider: Any = None) -> None:
    """A view, and the provider's report of it at ``SCALE`` times our estimate."""
    estimate = await view(manager, budget, provider)
    await report(manager, {"input_tokens": round(SCALE * estimate)})


async def correction(
    manager: SimpleContextManager, budget: int = B, provider: Any = None
) -> tuple[float, int]:
    """The correction the next request applies (it returns a view too)."""
    await view(manager, budget, provider)
    stats = manager.last_token_meter_stats
    assert stats is not None
    return round(stats["count_scale"], 2), stats["count_samples"]


@pytest.mark.anyio
async def test_a_report_scales_the_next_request() -> None:
    manager = await store()
    await reconciled(manager)
    assert await correction(manager) == (SCALE, 1)


@pytest.mark.anyio
async def test_cache_writes_count_in_the_reading() -> None:
    """The reading is ``input_tokens + cache_write_tokens``."""
    manager = await store()
    estimate = await view(manager)
    written = estimate // 2
    await report(
        manager, {"input_tokens": round(SCALE * estimate) - written, "cache_write_tokens": written}
    )
    assert await correction(manager) == (SCALE, 1)


def _garbage(estimate: int) -> list[object]:
    return [
        None,
        "1200",
        {"input_tokens": None},
        {"input_tokens": -5},
        {"input_tokens": str(estimate)},
        {"input_tokens": True},
        {"input_tokens": float(estimate)},
        {"cache_write_tokens": estimate},  # no input_tokens
        {"input_tokens": estimate, "cache_write_tokens": -1},
        {"input_tokens": 10 * estimate},  # ten times the view: not a count of it
        {"input_tokens": estimate // 10},
        {"input_tokens": 0},
    ]


GARBAGE_IDS = [
    "none",
    "string",
    "input-none",
    "negative",
    "input-string",
    "bool",
    "float",
    "no-input-tokens",
    "negative-cache-write",
    "10x-the-view",
    "a-tenth-of-the-view",
    "zero",
]


@pytest.mark.anyio
@pytest.mark.parametrize("which", range(len(GARBAGE_IDS)), ids=GARBAGE_IDS)
async def test_a_garbage_report_changes_nothing(which: int) -> None:
    """After one good report, a garbage report of the next view leaves the correction as
    it was."""
    manager = await store()
    await reconciled(manager)
    estimate = await view(manager)
    await report(manager, _garbage(estimate)[which])
    assert await correction(manager) == (SCALE, 1)


@pytest.mark.anyio
async def test_a_second_report_of_one_view_is_ignored() -> None:
    manager = await store()
    estimate = await view(manager)
    await report(manager, {"input_tokens": round(SCALE * estimate)})
    await report(manager, {"input_tokens": 2 * estimate})
    assert await correction(manager) == (SCALE, 1)


@pytest.mark.anyio
async def test_a_report_with_no_view_returned_is_ignored() -> None:
    manager = await store()
    await report(manager, {"input_tokens": 1_000})
    assert await correction(manager) == NONE


@pytest.mark.anyio
async def test_another_budget_starts_afresh() -> None:
    manager = await store()
    await reconciled(manager)
    assert await correction(manager, budget=B + 1_000) == NONE


@pytest.mark.anyio
async def test_a_budget_change_forgets_the_first_budgets_correction() -> None:
    """Back at the first budget after a view at another, the correction is gone."""
    manager = await store()
    await reconciled(manager)
    await view(manager, budget=B + 1_000)
    assert await correction(manager) == NONE


@pytest.mark.anyio
async def test_the_same_model_keeps_the_correction() -> None:
    """Another provider object reporting the same model: the same key."""
    manager = await store()
    await reconciled(manager, provider=Model("claude-sonnet-4-5"))
    assert await correction(manager, provider=Model("claude-sonnet-4-5")) == (SCALE, 1)


@pytest.mark.anyio
async def test_another_model_starts_afresh() -> None:
    manager = await store()
    await reconciled(manager, provider=Model("claude-sonnet-4-5"))
    assert await correction(manager, provider=Model("gpt-5")) == NONE


@pytest.mark.anyio
async def test_clear_forgets_the_correction() -> None:
    manager = await store()
    await reconciled(manager)
    await manager.clear()
    for message in copy.deepcopy(HISTORY):
        await manager.add_message(message)
    assert await correction(manager) == NONE


@pytest.mark.anyio
async def test_set_messages_with_another_history_forgets_the_correction() -> None:
    manager = await store()
    await reconciled(manager)
    await manager.set_messages(replaced(HISTORY))
    assert await correction(manager) == NONE


@pytest.mark.anyio
async def test_set_messages_extending_the_history_keeps_the_correction() -> None:
    manager = await store()
    await reconciled(manager)
    await manager.set_messages(copy.deepcopy(HISTORY + MORE))
    assert await correction(manager) == (SCALE, 1)


@pytest.mark.anyio
async def test_in_actual_mode_reports_do_not_scale_the_estimate() -> None:
    manager = await store(token_meter="actual")
    await reconciled(manager)
    assert await correction(manager) == NONE


@pytest.mark.anyio
async def test_a_claimed_foreground_recorder_feeds_the_correction() -> None:
    manager = await store()
    record = manager.claim_foreground_usage()
    estimate = await view(manager)
    assert record(input_tokens=round(SCALE * estimate))
    assert await correction(manager) == (SCALE, 1)


@pytest.mark.anyio
async def test_a_claimed_meter_takes_no_report_from_the_hook() -> None:
    """Once the orchestrator owns the meter, the ``llm:response`` listener is ignored."""
    manager = await store()
    manager.claim_foreground_usage()
    await reconciled(manager)
    assert await correction(manager) == NONE
