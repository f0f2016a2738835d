"""Learned provider limits: a provider-directed hard-fit rebuild caps later budgets.

A provider whose real limit is below the window it advertises overflows; the
orchestrator rebuilds once with ``hard_fit=True`` at the provider's ``token_budget``. From
then on the store uses that limit as a cap on derived budgets, reports it in
``context:budget`` (``source: "provider_limit"``, ``learned_limit``) and in the meter stats,
until the provider reports another window, the history is cleared or replaced, or the
config turns it off.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import RequiredContentTooLargeError, SimpleContextManager

pytestmark = pytest.mark.anyio

WINDOW = 40_000
OUTPUT = 4_000
LIMIT = 20_000


class Provider:
    """Advertises ``window`` through ``get_info().defaults``."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window

    def get_info(self) -> Any:
        return SimpleNamespace(
            defaults={"context_window": self.window, "max_output_tokens": OUTPUT}
        )


class Hooks:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        await checkpoint()
        self.events.append((event, data))

    def budgets(self) -> list[dict[str, Any]]:
        return [data for name, data in self.events if name == "context:budget"]


async def learned(**config: Any) -> tuple[SimpleContextManager, Hooks, Provider]:
    hooks = Hooks()
    manager = SimpleContextManager(hooks=hooks, **config)
    await manager.set_messages([{"role": "user", "content": "hello"}])
    provider = Provider()
    await manager.get_messages_for_request(provider=provider)
    await manager.get_messages_for_request_retaining(
        retain_contents=[], provider=provider, token_budget=LIMIT, hard_fit=True
    )
    return manager, hooks, provider


def derived(window: int = WINDOW) -> int:
    return window - int(OUTPUT * 0.5) - 4096


async def test_a_hard_fit_rebuild_caps_later_budgets_and_is_reported() -> None:
    manager, hooks, provider = await learned()
    assert hooks.budgets()[0]["effective_budget"] == derived() > LIMIT
    await manager.get_messages_for_request(provider=provider)
    last = hooks.budgets()[-1]
    assert (last["source"], last["learned_limit"], last["effective_budget"]) == (
        "provider_limit",
        LIMIT,
        LIMIT,
    )
    assert last["derived_budget"] == derived()
    assert manager.last_token_meter_stats is not None
    assert manager.last_token_meter_stats["provider_limit"] == LIMIT
    assert manager.last_token_meter_stats["budget"] == LIMIT - min(800, LIMIT // 4)


async def test_a_provider_reporting_another_window_forgets_the_limit() -> None:
    manager, hooks, _ = await learned()
    await manager.get_messages_for_request(provider=Provider(window=60_000))
    assert hooks.budgets()[-1]["source"] == "provider_defaults"
    assert hooks.budgets()[-1]["effective_budget"] == derived(60_000)
    await manager.get_messages_for_request(provider=Provider())  # the old one again
    assert hooks.budgets()[-1]["effective_budget"] == derived()
    assert manager.last_token_meter_stats is not None
    assert manager.last_token_meter_stats["provider_limit"] is None


@pytest.mark.parametrize("reset", ["clear", "set_messages"])
async def test_clear_and_set_messages_forget_the_limit(reset: str) -> None:
    manager, hooks, provider = await learned()
    if reset == "clear":
        await manager.clear()
    else:
        await manager.set_messages([{"role": "user", "content": "another session"}])
    await manager.get_messages_for_request(provider=provider)
    assert hooks.budgets()[-1]["source"] == "provider_defaults"
    assert hooks.budgets()[-1]["effective_budget"] == derived()


async def test_the_config_key_turns_it_off() -> None:
    manager, hooks, provider = await learned(learn_provider_limits=False)
    await manager.get_messages_for_request(provider=provider)
    assert hooks.budgets()[-1]["source"] == "provider_defaults"
    assert manager.last_token_meter_stats is not None
    assert manager.last_token_meter_stats["provider_limit"] is None


async def test_a_limit_above_the_derived_budget_changes_nothing() -> None:
    """A learned limit only ever lowers a budget."""
    hooks = Hooks()
    manager = SimpleContextManager(hooks=hooks)
    await manager.set_messages([{"role": "user", "content": "hello"}])
    provider = Provider()
    await manager.get_messages_for_request_retaining(
        retain_contents=[], provider=provider, token_budget=derived() + 5000, hard_fit=True
    )
    await manager.get_messages_for_request(provider=provider)
    assert hooks.budgets()[-1]["source"] == "provider_defaults"
    assert hooks.budgets()[-1]["effective_budget"] == derived()


async def test_a_failed_rebuild_learns_nothing() -> None:
    """A hard-fit rebuild that fails closed leaves no trace, the limit included."""
    hooks = Hooks()
    manager = SimpleContextManager(hooks=hooks)
    await manager.set_messages([{"role": "user", "content": "word " * 5000}])
    provider = Provider()
    with pytest.raises(RequiredContentTooLargeError):
        await manager.get_messages_for_request_retaining(
            retain_contents=[], provider=provider, token_budget=100, hard_fit=True
        )
    await manager.get_messages_for_request(provider=provider)
    assert hooks.budgets()[-1]["source"] == "provider_defaults"
