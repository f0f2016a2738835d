"""A request that raises leaves no trace, including the "budget already emitted" mark.

Regression: a negotiated request cancelled while ``context:budget`` was being delivered
recorded the budget as emitted, so no later request ever emitted it.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from amplifier_module_context_simple import SimpleContextManager

pytestmark = pytest.mark.anyio


class CancellingHooks:
    """Records deliveries; cancels ``scope`` during the first ``context:budget`` one."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.delivered: list[str] = []
        self.interrupted = 0

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        if event == "context:budget" and self.scope is not None and not self.interrupted:
            self.interrupted += 1
            self.scope.cancel()
        await anyio.lowlevel.checkpoint()  # the delivery's await: the cancellation lands here
        self.delivered.append(event)


async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
    await anyio.lowlevel.checkpoint()
    return {
        "dispatch": view,
        "budget_decision": {
            "estimated_input_tokens": 100,
            "input_limit_tokens": 100_000,
            "context_token_budget": 100_000,
            "measurement": {"kind": "provider_count", "source": "test", "input_tokens": 100},
        },
    }


async def test_a_cancelled_budget_delivery_is_retried_by_the_next_request() -> None:
    hooks = CancellingHooks()
    manager = SimpleContextManager(token_meter="actual", hooks=hooks)
    await manager.set_messages([{"role": "user", "content": "hello"}])
    with anyio.CancelScope() as scope:
        hooks.scope = scope
        await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=count_view
        )
    assert scope.cancelled_caught and hooks.interrupted == 1
    assert hooks.delivered == []
    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view
    )
    assert result["outcome"] == "not_needed"
    assert hooks.delivered == ["context:budget"]
    await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view
    )
    assert hooks.delivered == ["context:budget"]  # unchanged budget: emitted once
