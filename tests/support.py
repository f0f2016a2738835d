"""Test support: a real amplifier-core coordinator and an event recorder on its hooks."""

from __future__ import annotations

import copy
import itertools
import types
from dataclasses import dataclass, field
from typing import Any

from amplifier_core import ModuleCoordinator

import amplifier_module_context_simple as module


def make_coordinator() -> Any:
    """A real ``ModuleCoordinator`` with its real (Rust) hook registry."""
    session = types.SimpleNamespace(
        session_id="test-session",
        parent_id=None,
        config={"session": {"orchestrator": "none", "context": "context-simple"}},
    )
    coordinator = ModuleCoordinator(session=session)
    coordinator.hooks.set_default_fields(session_id=coordinator.session_id, parent_id=None)
    return coordinator


@dataclass
class EventRecorder:
    """Registers on real hooks and records ``(event, data)`` pairs as delivered."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def attach(self, hooks: Any, *names: str) -> None:
        for name in names:
            hooks.register(name, self._handler, priority=100, name=f"recorder-{name}")

    async def _handler(self, event: str, data: dict[str, Any]) -> None:  # noqa: ASYNC910 - an observer adds no await point to a delivery
        self.events.append((event, data))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [data for name, data in self.events if name == event]


async def mounted(config: dict[str, Any] | None = None, *events: str) -> tuple[Any, Any, Any]:
    """Mount the module on a real coordinator; return (coordinator, context, recorder)."""
    coordinator = make_coordinator()
    recorder = EventRecorder()
    recorder.attach(coordinator.hooks, *(events or ("context:compaction", "context:budget")))
    cleanup = await module.mount(coordinator, config or {})
    coordinator.register_cleanup(cleanup)
    return coordinator, coordinator.get("context"), recorder


def provider_count_envelope(
    view: list[dict[str, Any]], tokens: int, limit: int, source: str
) -> dict[str, Any]:
    """The ``count_view`` envelope of a provider that measured ``tokens`` against a hard
    ``limit`` (its hard-safe estimate is the count itself)."""
    return {
        "dispatch": view,
        "budget_decision": {
            "estimated_input_tokens": tokens,
            "input_limit_tokens": limit,
            "context_token_budget": limit,
            "measurement": {"kind": "provider_count", "source": source, "input_tokens": tokens},
        },
    }


def replaced(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` as an *unrelated* list for ``set_messages``: the first message differs,
    so the store replaces its history (re-setting a list that starts with the current
    history only extends it, keeping the sticky decisions)."""
    out = copy.deepcopy(history)
    if not out:  # an empty list never extends a history: replacing with it is a reset
        return out
    first = dict(out[0])
    first["content"] = f"{first.get('content')} (another session {next(_SESSIONS)})"
    out[0] = first
    return out


_SESSIONS = itertools.count(1)
