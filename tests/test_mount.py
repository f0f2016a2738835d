"""``mount`` on a real amplifier-core ``ModuleCoordinator`` (docs/design.md section 1)."""

from __future__ import annotations

import importlib.metadata
import logging
import math
import types
from typing import Any

import anyio.lowlevel
import pytest

import amplifier_module_context_simple as module
from amplifier_module_context_simple import SimpleContextManager, mount
from amplifier_module_context_simple.testing import RecordingHooks
from tests.support import make_coordinator, mounted

LOGGER = "amplifier_module_context_simple"
METER = "context-simple-meter"


@pytest.fixture
def anyio_backend() -> str:
    """The kernel's coordinator and hook registry are asyncio-only."""
    return "asyncio"


class BareCoordinator:
    """A coordinator-like object with only ``mount`` (no hooks, no capabilities)."""

    def __init__(self, hooks: Any = None, *, with_hooks_attr: bool = False) -> None:
        self.mounts: list[tuple[str, Any]] = []
        if with_hooks_attr:
            self.hooks = hooks

    async def mount(self, point: str, obj: Any) -> None:
        await anyio.lowlevel.checkpoint()
        self.mounts.append((point, obj))


# -- mount point and listener -------------------------------------------------------------


@pytest.mark.anyio
async def test_mount_point_is_context() -> None:
    """``coordinator.get("context")`` is the mounted SimpleContextManager with real hooks."""
    coordinator = make_coordinator()
    cleanup = await mount(coordinator, {})
    context = coordinator.get("context")
    assert isinstance(context, SimpleContextManager)
    assert context.hooks is coordinator.hooks
    await cleanup()


@pytest.mark.anyio
async def test_one_meter_listener_is_registered() -> None:
    """Exactly one ``llm:response`` listener named context-simple-meter, nothing else."""
    coordinator = make_coordinator()
    before = coordinator.hooks.list_handlers()
    cleanup = await mount(coordinator, {})
    after = coordinator.hooks.list_handlers()
    assert after.get("llm:response", []).count(METER) == 1
    added = {
        event: [h for h in handlers if h not in before.get(event, [])]
        for event, handlers in after.items()
    }
    assert {event: names for event, names in added.items() if names} == {"llm:response": [METER]}
    await cleanup()


@pytest.mark.anyio
async def test_meter_listener_priority_is_50() -> None:
    """The real registry orders the meter after priority 49 and before priority 51."""
    coordinator = make_coordinator()

    async def probe(event: str, data: dict[str, Any]) -> None:
        return None  # noqa: ASYNC910 - a no-op handler: only its registration is under test

    coordinator.hooks.register("llm:response", probe, priority=51, name="probe-51")
    coordinator.hooks.register("llm:response", probe, priority=49, name="probe-49")
    cleanup = await mount(coordinator, {})
    assert coordinator.hooks.list_handlers("llm:response")["llm:response"] == [
        "probe-49",
        METER,
        "probe-51",
    ]
    await cleanup()


@pytest.mark.anyio
async def test_registration_arguments_exactly() -> None:
    """mount registers once: event llm:response, name context-simple-meter, priority 50."""
    hooks = RecordingHooks()
    coordinator = BareCoordinator(hooks, with_hooks_attr=True)
    await mount(coordinator, {})
    assert len(hooks.registrations) == 1
    registration = hooks.registrations[0]
    assert registration.event == "llm:response"
    assert registration.name == METER
    assert registration.priority == 50


@pytest.mark.anyio
@pytest.mark.parametrize("token_meter", ["estimate", "actual"])
async def test_listener_registered_in_every_meter_mode(token_meter: str) -> None:
    """The listener is registered regardless of token_meter."""
    hooks = RecordingHooks()
    coordinator = BareCoordinator(hooks, with_hooks_attr=True)
    await mount(coordinator, {"token_meter": token_meter})
    assert [r.name for r in hooks.registrations] == [METER]


@pytest.mark.anyio
async def test_handler_returns_none_and_records() -> None:
    """The registered handler returns None (never a value the kernel could read as DENY)."""
    hooks = RecordingHooks()
    coordinator = BareCoordinator(hooks, with_hooks_attr=True)
    await mount(coordinator, {})
    context = coordinator.mounts[0][1]
    handler = hooks.registrations[0].handler
    assert await handler("llm:response", {"usage": {"input_tokens": 12}}) is None
    assert await handler("llm:response", None) is None
    assert await handler("llm:response", {"usage": "garbage"}) is None
    assert context.observable_state().measured == 12


@pytest.mark.anyio
async def test_real_llm_response_updates_the_meter() -> None:
    """A real emitted llm:response reaches the meter and the kernel continues."""
    coordinator, context, _ = await mounted({})
    result = await coordinator.hooks.emit(
        "llm:response", {"usage": {"input_tokens": 2, "cache_write_tokens": 161_165}}
    )
    assert result.action == "continue"
    assert context.observable_state().measured == 161_167
    await context.get_messages_for_request()
    assert context.last_token_meter_stats["measured_tokens"] == 161_167
    await coordinator.cleanup()


@pytest.mark.anyio
async def test_real_llm_response_with_bad_usage_is_ignored() -> None:
    """Malformed usage through the real registry changes nothing and does not deny."""
    coordinator, context, _ = await mounted({})
    await coordinator.hooks.emit("llm:response", {"usage": {"input_tokens": 40}})
    data: dict[str, Any]
    for data in ({}, {"usage": {}}, {"usage": {"input_tokens": -1}}, {"usage": "x"}):
        result = await coordinator.hooks.emit("llm:response", data)
        assert result.action == "continue"
    assert context.observable_state().measured == 40
    await coordinator.cleanup()


# -- capabilities -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_capabilities_registered_as_bound_methods() -> None:
    """request_retention and foreground_usage are the manager's bound methods."""
    coordinator, context, _ = await mounted({})
    retention = coordinator.get_capability("context.request_retention")
    usage = coordinator.get_capability("context.foreground_usage")
    assert retention == context.get_messages_for_request_retaining
    assert retention.__self__ is context
    assert usage == context.claim_foreground_usage
    assert usage.__self__ is context
    await coordinator.cleanup()


@pytest.mark.anyio
async def test_capabilities_work_on_an_empty_context() -> None:
    """Retention on an empty context returns []; the usage capability returns a recorder."""
    coordinator, context, _ = await mounted({})
    retention = coordinator.get_capability("context.request_retention")
    assert await retention(retain_contents=[]) == []
    assert await context.get_messages_for_request() == []
    recorder = coordinator.get_capability("context.foreground_usage")()
    assert recorder(input_tokens=10) is True
    assert context.observable_state().measured == 10
    await coordinator.cleanup()


@pytest.mark.anyio
@pytest.mark.parametrize("config", [{}, {"token_meter": "estimate"}, {"token_meter": "bogus"}])
async def test_measured_view_absent_unless_actual(config: dict[str, Any]) -> None:
    """Without token_meter "actual" the measured-view capability is not registered."""
    coordinator, _, _ = await mounted(config)
    assert coordinator.get_capability("context.measured_request_view") is None
    assert coordinator.get_capability("context.request_retention") is not None
    await coordinator.cleanup()


@pytest.mark.anyio
async def test_measured_view_registered_with_actual() -> None:
    """With token_meter "actual" the measured-view capability is the bound method."""
    coordinator, context, _ = await mounted({"token_meter": "actual"})
    measured = coordinator.get_capability("context.measured_request_view")
    assert measured is not None
    assert measured == context.get_measured_request_view
    await coordinator.cleanup()


# -- cleanup --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_cleanup_unregisters_and_is_safe_twice() -> None:
    """cleanup removes the meter listener; a second call is a no-op; others stay."""
    coordinator = make_coordinator()

    async def other(event: str, data: dict[str, Any]) -> None:
        return None  # noqa: ASYNC910 - a no-op handler: only its registration is under test

    coordinator.hooks.register("llm:response", other, priority=10, name="other")
    cleanup = await mount(coordinator, {})
    context = coordinator.get("context")
    await cleanup()
    assert coordinator.hooks.list_handlers("llm:response")["llm:response"] == ["other"]
    await cleanup()
    assert coordinator.hooks.list_handlers("llm:response")["llm:response"] == ["other"]
    await coordinator.hooks.emit("llm:response", {"usage": {"input_tokens": 99}})
    assert context.observable_state().measured is None


@pytest.mark.anyio
async def test_cleanup_with_recording_hooks_unregisters_once() -> None:
    """Calling cleanup twice calls the registry's unregister exactly once."""
    hooks = RecordingHooks()
    cleanup = await mount(BareCoordinator(hooks, with_hooks_attr=True), {})
    await cleanup()
    await cleanup()
    assert hooks.unregistered == 1


@pytest.mark.anyio
async def test_cleanup_registered_with_coordinator_runs_cleanly() -> None:
    """The coordinator's own cleanup (after ours) tolerates the double call."""
    coordinator = make_coordinator()
    cleanup = await mount(coordinator, {})
    coordinator.register_cleanup(cleanup)
    await cleanup()
    await coordinator.cleanup()
    assert METER not in coordinator.hooks.list_handlers().get("llm:response", [])


# -- coordinator-like objects ---------------------------------------------------------------


@pytest.mark.anyio
async def test_mount_without_hooks_or_capabilities() -> None:
    """A coordinator with only ``mount`` works; cleanup is a safe no-op (twice)."""
    coordinator = BareCoordinator()
    cleanup = await mount(coordinator)
    assert [point for point, _ in coordinator.mounts] == ["context"]
    context = coordinator.mounts[0][1]
    assert isinstance(context, SimpleContextManager)
    assert context.hooks is None
    await cleanup()
    await cleanup()


@pytest.mark.anyio
async def test_mount_with_hooks_none() -> None:
    """``coordinator.hooks = None`` registers nothing and cleanup still works."""
    coordinator = BareCoordinator(None, with_hooks_attr=True)
    cleanup = await mount(coordinator, {})
    assert len(coordinator.mounts) == 1
    await cleanup()
    await cleanup()


@pytest.mark.anyio
async def test_mount_with_non_callable_register_capability() -> None:
    """A non-callable ``register_capability`` attribute is ignored."""
    coordinator = BareCoordinator()
    coordinator.register_capability = None  # type: ignore[attr-defined]  # added by the test
    cleanup = await mount(coordinator, {})
    assert len(coordinator.mounts) == 1
    await cleanup()


@pytest.mark.anyio
async def test_mount_registers_capabilities_on_a_plain_coordinator() -> None:
    """A callable ``register_capability`` receives exactly the two default capabilities."""
    registered: dict[str, Any] = {}
    coordinator = BareCoordinator()
    coordinator.register_capability = registered.__setitem__  # type: ignore[attr-defined]  # added by the test
    await mount(coordinator, {})
    context = coordinator.mounts[0][1]
    assert registered == {
        "context.request_retention": context.get_messages_for_request_retaining,
        "context.foreground_usage": context.claim_foreground_usage,
    }


@pytest.mark.anyio
async def test_mount_registers_measured_view_on_a_plain_coordinator() -> None:
    """With "actual", a plain coordinator receives the measured-view capability too."""
    registered: dict[str, Any] = {}
    coordinator = BareCoordinator()
    coordinator.register_capability = registered.__setitem__  # type: ignore[attr-defined]  # added by the test
    await mount(coordinator, {"token_meter": "actual"})
    context = coordinator.mounts[0][1]
    assert registered["context.measured_request_view"] == context.get_measured_request_view
    assert len(registered) == 3


# -- configuration at mount ---------------------------------------------------------------


@pytest.mark.anyio
async def test_mount_applies_config() -> None:
    """Config values reach the mounted instance."""
    _, context, _ = await mounted(
        {"max_tool_result_bytes": 131_082, "max_tokens": 123_456, "compact_threshold": 0.8}
    )
    assert context.max_tool_result_bytes == 131_082
    assert context.max_tokens == 123_456
    assert context.compact_threshold == 0.8


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("compact_threshold", 1.5),
        ("compact_threshold", math.nan),
        ("target_usage", 0),
        ("protected_tool_results", -1),
        ("truncate_chars", True),
        ("max_tokens_fallback", "200000"),
        ("compaction_notice_enabled", "yes"),
        ("compaction_notice_verbosity", "loud"),
        ("output_reserve_fraction", 2),
        ("max_tool_result_bytes", 204),
        ("max_tool_result_bytes", True),
        ("max_tool_result_bytes", "131072"),
    ],
)
async def test_invalid_config_at_mount_raises(key: str, value: object) -> None:
    """Invalid config raises ValueError naming key and value; nothing is mounted."""
    coordinator = make_coordinator()
    with pytest.raises(ValueError) as error:
        await mount(coordinator, {key: value})
    assert key in str(error.value)
    assert repr(value) in str(error.value)
    assert coordinator.get("context") is None
    assert METER not in coordinator.hooks.list_handlers().get("llm:response", [])
    assert coordinator.get_capability("context.request_retention") is None


@pytest.mark.anyio
async def test_unknown_token_meter_at_mount(caplog: pytest.LogCaptureFixture) -> None:
    """An unknown token_meter warns and the instance uses "estimate"."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, context, _ = await mounted({"token_meter": "bogus"})
    assert context.token_meter == "estimate"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "unknown token_meter" in warnings[0]
    assert "'bogus'" in warnings[0]


@pytest.mark.anyio
@pytest.mark.parametrize("value", [0, -1, "500000", 1.5, True, False], ids=repr)
async def test_invalid_max_tokens_at_mount(value: object, caplog: pytest.LogCaptureFixture) -> None:
    """An invalid max_tokens at mount warns and means no cap."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, context, _ = await mounted({"max_tokens": value})
    assert context.max_tokens is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "max_tokens" in warnings[0]


@pytest.mark.anyio
async def test_unknown_keys_at_mount_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """Unknown keys produce exactly one warning listing every one of them."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, context, _ = await mounted(
            {"max_tokenz": 1, "compact_treshold": 0.5, "truncate_chars": 9}
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "max_tokenz" in warnings[0]
    assert "compact_treshold" in warnings[0]
    assert context.truncate_chars == 9


@pytest.mark.anyio
async def test_no_warning_for_known_keys(caplog: pytest.LogCaptureFixture) -> None:
    """A fully valid config mounts without any warning."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await mounted({"max_tokens": 1000, "token_meter": "estimate", "truncate_chars": 10})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.anyio
async def test_mount_with_none_config_uses_defaults() -> None:
    """``config=None`` means all defaults."""
    coordinator = BareCoordinator()
    await mount(coordinator, None)
    context = coordinator.mounts[0][1]
    assert context.config == module.ContextConfig()


# -- module metadata ------------------------------------------------------------------------


def test_module_type() -> None:
    """The package declares itself an Amplifier context module."""
    assert module.__amplifier_module_type__ == "context"


def test_entry_point_resolves_to_mount() -> None:
    """Entry point ``context-simple`` in group amplifier.modules loads ``mount``."""
    points = importlib.metadata.entry_points(group="amplifier.modules", name="context-simple")
    assert len(points) == 1
    (point,) = points
    assert point.value == "amplifier_module_context_simple:mount"
    assert point.load() is mount


def test_mount_is_a_coroutine_function() -> None:
    """mount is ``async def`` as the kernel's loader expects."""
    import inspect

    assert inspect.iscoroutinefunction(mount)
    assert isinstance(module, types.ModuleType)
