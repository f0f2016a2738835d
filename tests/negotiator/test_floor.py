"""The negotiated path past the rungs and ``fit_output``: the protected floor is reduced.

The provider here is the o200k example provider's counter (``counting.count_request``
over ``build_request(view)``), which shares nothing with the module's estimator.
"""

from __future__ import annotations

import copy
from typing import Any

import anyio.lowlevel
import pytest
from amplifier_module_loop_negotiating.messages import build_request
from amplifier_module_provider_window.counting import count_request

from amplifier_module_context_simple import ContextLengthError, SimpleContextManager
from amplifier_module_context_simple.testing.provider_rules import check_provider_valid
from tests.context.strategies import calls, fill, results
from tests.support import provider_count_envelope

pytestmark = pytest.mark.anyio


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def session(fmt: str) -> list[dict[str, Any]]:
    """Six tool rounds of ~12k-character file views between two human prompts."""
    messages: list[dict[str, Any]] = [human("first: fix the failing build")]
    for k in range(6):
        messages.append(calls(fmt, [f"c{k}"]))
        messages += results(fmt, {f"c{k}": f"r{k} " + fill("code", 12_000)})
    messages.append(human("latest: and now run the tests"))
    return messages


def counted(view: list[dict[str, Any]]) -> int:
    return count_request(build_request(view)).total


class Provider:
    """``count_view`` and ``fit_output`` of a provider whose hard limit is ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: list[int] = []
        self.fits = 0

    async def count_view(self, view: list[dict[str, Any]]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()  # a provider count is an await
        check_provider_valid(view, "openai")
        check_provider_valid(view, "anthropic")
        tokens = counted(view)
        self.counts.append(tokens)
        return provider_count_envelope(view, tokens, self.limit, "o200k")

    async def fit_output(self, view: list[dict[str, Any]], attempt: Any) -> None:
        await anyio.lowlevel.checkpoint()  # a provider count is an await
        self.fits += 1  # no smaller output cap makes this request fit


async def negotiate(
    messages: list[dict[str, Any]], provider: Provider
) -> tuple[SimpleContextManager, dict[str, Any]]:
    manager = SimpleContextManager(token_meter="actual", max_tokens=provider.limit)
    await manager.set_messages(copy.deepcopy(messages))
    result = await manager.get_measured_request_view(
        provider=None,
        retain_contents=[],
        count_view=provider.count_view,
        fit_output=provider.fit_output,
    )
    return manager, result


@pytest.mark.parametrize("fmt", ["openai", "amplifier", "anthropic"])
async def test_a_floor_over_the_limit_is_reduced_after_fit_output_finds_no_fit(fmt: str) -> None:
    messages = session(fmt)
    provider = Provider(limit=5000)
    manager, result = await negotiate(messages, provider)
    assert provider.fits == 1
    assert result["outcome"] == "protected_floor"
    final = counted(result["base_view"])
    assert final <= provider.limit
    assert provider.counts[-1] == final
    assert await result["transaction"].commit()
    stats = manager.last_compaction_stats
    assert stats is not None and stats["protected_results_truncated"] > 0
    view = result["base_view"]
    assert view[0]["content"] == messages[0]["content"]
    assert any(m.get("content") == messages[-1]["content"] for m in view)


async def test_only_an_irreducible_set_over_the_limit_fails_closed() -> None:
    """The two human prompts alone are over the limit: ``ContextLengthError``, nothing
    staged survives (no stats, no decisions)."""
    messages = session("openai")
    messages[0] = human("first " + fill("prose", 20_000))
    provider = Provider(limit=3000)
    manager = SimpleContextManager(token_meter="actual", max_tokens=provider.limit)
    await manager.set_messages(copy.deepcopy(messages))
    assert counted([messages[0], messages[-1]]) > provider.limit
    with pytest.raises(ContextLengthError, match="required content was not discarded"):
        await manager.get_measured_request_view(
            provider=None,
            retain_contents=[],
            count_view=provider.count_view,
            fit_output=provider.fit_output,
        )
    assert manager.last_compaction_stats is None
    assert not manager.observable_state().removed and not manager.observable_state().truncated
