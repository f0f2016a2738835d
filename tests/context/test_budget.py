"""Budget derivation and the ``context:budget`` event (docs/design.md section 2)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.config import ContextConfig
from amplifier_module_context_simple.context.counting.budget import derive_budget
from amplifier_module_context_simple.context.policy.plan import Limits
from amplifier_module_context_simple.testing import RecordingHooks
from tests.support import mounted

BUDGET = "context:budget"
COMPACTION = "context:compaction"
KERNEL_FIELDS = {"session_id", "parent_id", "timestamp"}
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


# -- fake providers ----------------------------------------------------------------------------


class DefaultsProvider:
    """A provider publishing its window through ``get_info().defaults``."""

    def __init__(self, defaults: Any) -> None:
        self.defaults = defaults

    def get_info(self) -> Any:
        return types.SimpleNamespace(defaults=self.defaults)


class ModelInfoProvider(DefaultsProvider):
    """A provider with ``get_model_info()`` (and, optionally, defaults too)."""

    def __init__(self, info: Any, defaults: Any = None) -> None:
        super().__init__(defaults)
        self.info = info

    def get_model_info(self) -> Any:
        return self.info


class RaisingProvider:
    def get_model_info(self) -> Any:
        raise RuntimeError("model info unavailable")

    def get_info(self) -> Any:
        raise RuntimeError("info unavailable")


def window(context_window: Any, max_output_tokens: Any) -> Any:
    return types.SimpleNamespace(context_window=context_window, max_output_tokens=max_output_tokens)


def defaults(context_window: Any, max_output_tokens: Any) -> DefaultsProvider:
    return DefaultsProvider(
        {"context_window": context_window, "max_output_tokens": max_output_tokens}
    )


def model_info(context_window: Any, max_output_tokens: Any) -> ModelInfoProvider:
    return ModelInfoProvider(window(context_window, max_output_tokens))


class RaisingHooks:
    async def emit(self, event: str, data: dict[str, Any]) -> None:
        raise RuntimeError("hook bus down")


async def budget_event(
    provider: Any = None, token_budget: int | None = None, **config: Any
) -> dict[str, Any]:
    """The single ``context:budget`` payload of one request on a one-message context."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks, **config)
    await cm.add_message({"role": "user", "content": "hello"})
    view = await cm.get_messages_for_request(token_budget=token_budget, provider=provider)
    assert view
    (payload,) = hooks.named(BUDGET)
    return payload


# -- derivation --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_no_provider_uses_the_fallback() -> None:
    """No provider and defaults: source max_tokens_fallback, budget 200,000."""
    assert await budget_event() == {
        "source": "max_tokens_fallback",
        "derived_budget": 200_000,
        "max_tokens": None,
        "max_tokens_fallback": 200_000,
        "capped": False,
        "effective_budget": 200_000,
    }


@pytest.mark.anyio
async def test_provider_defaults() -> None:
    """``get_info().defaults`` 1,048,576 / 65,536 gives 1,011,712 from provider_defaults."""
    assert await budget_event(defaults(1_048_576, 65_536)) == {
        "source": "provider_defaults",
        "context_window": 1_048_576,
        "max_output_tokens": 65_536,
        "reserved_output": 32_768,
        "derived_budget": 1_011_712,
        "max_tokens": None,
        "max_tokens_fallback": 200_000,
        "capped": False,
        "effective_budget": 1_011_712,
    }


@pytest.mark.anyio
async def test_provider_model_info() -> None:
    """``get_model_info()`` 1,000,000 / 128,000 gives 931,904 from provider_model_info."""
    payload = await budget_event(model_info(1_000_000, 128_000))
    assert payload["source"] == "provider_model_info"
    assert payload["effective_budget"] == 931_904
    assert payload["reserved_output"] == 64_000


@pytest.mark.anyio
async def test_model_info_wins_over_defaults() -> None:
    """get_model_info is consulted before get_info().defaults."""
    provider = ModelInfoProvider(
        window(1_000_000, 128_000), {"context_window": 200_000, "max_output_tokens": 64_000}
    )
    payload = await budget_event(provider)
    assert payload["source"] == "provider_model_info"
    assert payload["effective_budget"] == 931_904


@pytest.mark.anyio
async def test_cap_below_the_window() -> None:
    """max_tokens below the derived budget caps it and says so."""
    payload = await budget_event(defaults(1_048_576, 65_536), max_tokens=500_000)
    assert payload["capped"] is True
    assert payload["effective_budget"] == 500_000
    assert payload["derived_budget"] == 1_011_712
    assert payload["max_tokens"] == 500_000


@pytest.mark.anyio
async def test_cap_above_the_window_is_a_no_op() -> None:
    """max_tokens above the derived budget changes nothing."""
    payload = await budget_event(model_info(1_000_000, 128_000), max_tokens=5_000_000)
    assert payload["capped"] is False
    assert payload["effective_budget"] == 931_904


@pytest.mark.anyio
async def test_explicit_budget_wins() -> None:
    """An explicit token_budget wins over provider and cap; source explicit."""
    payload = await budget_event(
        model_info(1_000_000, 128_000), token_budget=70_000, max_tokens=300_000
    )
    assert payload["source"] == "explicit"
    assert payload["effective_budget"] == 70_000
    assert payload["capped"] is False
    assert "context_window" not in payload


@pytest.mark.anyio
async def test_cap_applies_to_an_explicit_budget() -> None:
    """The cap applies on the explicit path too."""
    payload = await budget_event(token_budget=400_000, max_tokens=300_000)
    assert payload["source"] == "explicit"
    assert payload["derived_budget"] == 400_000
    assert payload["capped"] is True
    assert payload["effective_budget"] == 300_000


@pytest.mark.anyio
async def test_fallback_value_and_its_cap() -> None:
    """Empty defaults fall back to max_tokens_fallback, which the cap still bounds."""
    assert (await budget_event(DefaultsProvider({}), max_tokens_fallback=300_000))[
        "effective_budget"
    ] == 300_000
    payload = await budget_event(
        DefaultsProvider({}), max_tokens=50_000, max_tokens_fallback=300_000
    )
    assert payload["source"] == "max_tokens_fallback"
    assert payload["capped"] is True
    assert payload["effective_budget"] == 50_000


@pytest.mark.anyio
async def test_output_reserve_fraction() -> None:
    """output_reserve_fraction 0.25 of 64,000 reserves 16,000: 200,000-16,000-4,096."""
    payload = await budget_event(defaults(200_000, 64_000), output_reserve_fraction=0.25)
    assert payload["reserved_output"] == 16_000
    assert payload["effective_budget"] == 179_904


@pytest.mark.anyio
async def test_default_reserve_for_a_200k_window() -> None:
    """200,000 / 64,000 with the default fraction gives 163,904."""
    assert (await budget_event(defaults(200_000, 64_000)))["effective_budget"] == 163_904


@pytest.mark.anyio
async def test_model_info_none_falls_through_to_defaults() -> None:
    """get_model_info() returning None falls through to valid defaults."""
    provider = ModelInfoProvider(None, {"context_window": 200_000, "max_output_tokens": 64_000})
    payload = await budget_event(provider)
    assert payload["source"] == "provider_defaults"
    assert payload["effective_budget"] == 163_904


@pytest.mark.anyio
async def test_model_info_raising_falls_through_to_defaults() -> None:
    """A raising get_model_info falls through to get_info().defaults."""

    class Provider(DefaultsProvider):
        def get_model_info(self) -> Any:
            raise RuntimeError("boom")

    payload = await budget_event(Provider({"context_window": 200_000, "max_output_tokens": 64_000}))
    assert payload["source"] == "provider_defaults"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "provider",
    [
        RaisingProvider(),
        DefaultsProvider(None),
        DefaultsProvider("not a mapping"),
        defaults(None, 64_000),
        defaults(200_000, 0),
        defaults(True, 64_000),
        defaults("200000", 64_000),
        defaults(-5, 64_000),
        model_info(0, 0),
        ModelInfoProvider(window(True, 100)),
        object(),
    ],
    ids=[
        "raising",
        "defaults-none",
        "defaults-str",
        "no-window",
        "zero-output",
        "bool-window",
        "str-window",
        "negative-window",
        "zero-model-info",
        "bool-model-info",
        "bare-object",
    ],
)
async def test_unusable_provider_falls_back(provider: Any) -> None:
    """A provider that raises or publishes no usable window lands on the fallback."""
    payload = await budget_event(provider)
    assert payload["source"] == "max_tokens_fallback"
    assert payload["effective_budget"] == 200_000


@pytest.mark.anyio
async def test_window_too_small_for_its_reserve_is_not_answered_with_the_fallback() -> None:
    """A window too small for reserve + margin budgets what it has, never the 200k fallback.

    Regression: a 4,000-token window used to fall back to 200,000 tokens, so a smaller
    window gave a larger budget.
    """
    payload = await budget_event(defaults(4_000, 1_000))
    assert payload["source"] == "provider_defaults"
    assert payload["window_too_small"] is True
    assert payload["effective_budget"] == 4_000 - 500


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1000"], ids=repr)
async def test_invalid_explicit_budget_raises(bad: Any) -> None:
    """An invalid token_budget raises ValueError naming it; nothing is emitted."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})
    with pytest.raises(ValueError, match="token_budget"):
        await cm.get_messages_for_request(token_budget=bad)
    assert hooks.events == []
    assert cm.last_token_meter_stats is None


def test_derive_budget_directly() -> None:
    """The pure function gives the same numbers the request path reports."""
    provenance = derive_budget(
        token_budget=None,
        provider=defaults(200_000, 64_000),
        max_tokens=100_000,
        max_tokens_fallback=200_000,
        output_reserve_fraction=0.5,
    )
    assert provenance["effective_budget"] == 100_000
    assert provenance["derived_budget"] == 163_904
    assert provenance["capped"] is True


# -- the event: on change only, at the return boundary ----------------------------------------


@pytest.mark.anyio
async def test_emitted_on_change_only() -> None:
    """Five identical requests emit one event; a new provider window emits a second."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})
    big = defaults(1_048_576, 65_536)
    for _ in range(5):
        await cm.get_messages_for_request(provider=big)
    assert len(hooks.named(BUDGET)) == 1
    await cm.get_messages_for_request(provider=defaults(200_000, 64_000))
    events = hooks.named(BUDGET)
    assert len(events) == 2
    assert events[1]["effective_budget"] == 163_904
    await cm.get_messages_for_request(provider=big)
    assert len(hooks.named(BUDGET)) == 3


@pytest.mark.anyio
async def test_cap_change_emits_again() -> None:
    """Changing max_tokens between requests changes the provenance and re-emits."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request()
    cm.max_tokens = 10_000
    await cm.get_messages_for_request()
    events = hooks.named(BUDGET)
    assert [e["effective_budget"] for e in events] == [200_000, 10_000]
    assert events[1]["capped"] is True


@pytest.mark.anyio
async def test_emitted_on_an_empty_context() -> None:
    """Even an empty context reports its budget on the first request."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    assert await cm.get_messages_for_request() == []
    assert len(hooks.named(BUDGET)) == 1


@pytest.mark.anyio
async def test_emitted_after_the_request_committed() -> None:
    """When context:budget is delivered, the request's meter stats are already published."""
    seen: list[Any] = []
    cm: SimpleContextManager

    def on_emit(event: str, data: dict[str, Any]) -> None:
        if event == BUDGET:
            seen.append(cm.last_token_meter_stats)

    cm = SimpleContextManager(hooks=RecordingHooks(on_emit))
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request(provider=defaults(200_000, 64_000))
    assert seen
    assert seen[0] is not None
    assert seen[0]["budget"] == 163_904 - 800


@pytest.mark.anyio
async def test_budget_event_follows_compaction_event() -> None:
    """In a compacting request, context:budget is delivered last, at the return boundary."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks, max_tokens=800, compact_threshold=0.1)
    for i in range(10):
        await cm.add_message({"role": "user", "content": f"q{i} " + "q" * 200})
        await cm.add_message({"role": "assistant", "content": f"a{i} " + "a" * 200})
    await cm.get_messages_for_request()
    names = [name for name, _ in hooks.events]
    assert names == [COMPACTION, BUDGET]


@pytest.mark.anyio
async def test_failed_request_emits_nothing() -> None:
    """A request that raises before returning emits no context:budget; the next one does."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})

    async def broken() -> str:
        raise RuntimeError("factory failed")

    await cm.set_system_prompt_factory(broken)
    with pytest.raises(RuntimeError, match="factory failed"):
        await cm.get_messages_for_request()
    assert hooks.events == []
    assert cm.last_token_meter_stats is None

    async def working() -> str:
        await anyio.lowlevel.checkpoint()
        return "system"

    await cm.set_system_prompt_factory(working)
    await cm.get_messages_for_request()
    assert len(hooks.named(BUDGET)) == 1


@pytest.mark.anyio
async def test_missing_retained_content_emits_nothing() -> None:
    """A retaining request naming a missing body raises and emits no budget event."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})
    with pytest.raises(ValueError):
        await cm.get_messages_for_request_retaining(retain_contents=["never admitted"])
    assert hooks.events == []


@pytest.mark.anyio
async def test_cancelled_request_emits_nothing() -> None:
    """A request cancelled while awaiting the system prompt factory emits nothing."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})
    started = anyio.Event()

    async def slow() -> str:
        started.set()
        await anyio.sleep_forever()
        return "unreachable"

    await cm.set_system_prompt_factory(slow)
    async with anyio.create_task_group() as group:
        group.start_soon(cm.get_messages_for_request)
        await started.wait()
        group.cancel_scope.cancel()
    assert hooks.events == []
    assert cm.last_token_meter_stats is None


@pytest.mark.anyio
async def test_raising_emit_still_returns_the_view() -> None:
    """Hooks whose emit raises do not break the request."""
    cm = SimpleContextManager(hooks=RaisingHooks())
    await cm.add_message({"role": "user", "content": "hello"})
    view = await cm.get_messages_for_request(provider=defaults(200_000, 64_000))
    assert [m["content"] for m in view] == ["hello"]


@pytest.mark.anyio
async def test_no_hooks_is_fine_and_marks_emitted() -> None:
    """Without hooks the request works and the last-emitted marker still advances."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "hello"})
    assert await cm.get_messages_for_request()
    hooks = RecordingHooks()
    cm.hooks = hooks
    await cm.get_messages_for_request()
    assert hooks.named(BUDGET) == []


@pytest.mark.anyio
async def test_payload_is_a_copy() -> None:
    """A listener mutating the payload does not suppress or alter later change detection."""
    hooks = RecordingHooks(lambda event, data: data.clear())
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request()
    await cm.get_messages_for_request()
    assert len(hooks.named(BUDGET)) == 1


@asyncio_only
@pytest.mark.anyio
async def test_budget_event_through_real_hooks() -> None:
    """Through the real registry the payload carries the provenance (plus kernel fields)."""
    coordinator, context, recorder = await mounted({"max_tokens": 500_000}, BUDGET)
    await context.add_message({"role": "user", "content": "hello"})
    for _ in range(3):
        await context.get_messages_for_request(provider=defaults(1_048_576, 65_536))
    (payload,) = recorder.named(BUDGET)
    assert {k: v for k, v in payload.items() if k not in KERNEL_FIELDS} == {
        "source": "provider_defaults",
        "context_window": 1_048_576,
        "max_output_tokens": 65_536,
        "reserved_output": 32_768,
        "derived_budget": 1_011_712,
        "max_tokens": 500_000,
        "max_tokens_fallback": 200_000,
        "capped": True,
        "effective_budget": 500_000,
    }
    await coordinator.cleanup()


@pytest.mark.anyio
async def test_meter_budget_is_after_the_notice_reserve() -> None:
    """The meter's budget is the policy budget: the budget minus the 800-token notice
    reserve."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "hello"})
    await cm.get_messages_for_request(provider=defaults(200_000, 64_000))
    stats = cm.last_token_meter_stats
    assert stats is not None and stats["budget"] == 163_104
    cm.compaction_notice_enabled = False
    await cm.get_messages_for_request(provider=defaults(200_000, 64_000))
    stats = cm.last_token_meter_stats
    assert stats is not None and stats["budget"] == 163_904


def test_the_limits_are_the_budget_arithmetic_of_a_request() -> None:
    """``Limits.of``: the notice reserve (at most a quarter of the budget, none with notices
    off), B = budget - reserve, the trigger ``compact_threshold`` x B and the target
    ``int(target_usage`` x B) (all of B for hard fit)."""
    config = ContextConfig()
    limits = Limits.of(25_904, config)
    assert (limits.budget, limits.notice_reserve, limits.policy_budget) == (25_904, 800, 25_104)
    assert (limits.compact_threshold, limits.trigger) == (0.92, 25_104 * 0.92)
    assert (limits.target, limits.nominal_target, limits.estimated_budget) == (
        12_552,
        12_552,
        25_904,
    )
    assert limits.ceiling == int(25_904 / 1.06), "the default margin below the whole budget"
    small = Limits.of(2_654, config)
    assert (small.notice_reserve, small.policy_budget, small.trigger_tokens) == (663, 1_991, 1_832)
    assert Limits.of(2_654, config, hard_fit=True).target == 1_991
    off = Limits.of(2_654, ContextConfig(compaction_notice_enabled=False))
    assert (off.notice_reserve, off.policy_budget, off.target) == (0, 2_654, 1_327)


@pytest.mark.parametrize("threshold", [0.07, 0.5, 0.7, 0.92, 0.99, 1.0])
def test_trigger_tokens_are_the_fewest_used_tokens_that_reach_the_trigger(threshold: float) -> None:
    """``trigger_tokens`` is where ``reached`` (the ordinary path's ratio) turns true, also
    where ``compact_threshold`` x B rounds up (100 x 0.07 = 7.000000000000001)."""
    config = ContextConfig(compact_threshold=threshold, compaction_notice_enabled=False)
    for budget in [*range(1, 400), 2_654, 25_904, 163_904]:
        limits = Limits.of(budget, config)
        tokens = limits.trigger_tokens
        assert limits.reached(tokens) and not limits.reached(tokens - 1), (budget, tokens)
    edge = Limits.of(100, dataclasses.replace(config, compact_threshold=0.07))
    assert (edge.trigger, edge.trigger_tokens) == (7.000000000000001, 7)
