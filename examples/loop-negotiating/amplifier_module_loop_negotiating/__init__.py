"""Amplifier orchestrator module ``loop-negotiating``: legacy, measured and hard-fit requests.

``mount(coordinator, config)`` mounts one ``NegotiatingLoop`` at ``"orchestrator"`` and
registers observers (returning None) for ``context:compaction`` and ``context:budget`` so
each recorded request row lists the context events it caused. Config keys: ``mode``
(``"legacy"`` | ``"measured"`` | ``"hardfit"``, default legacy), ``max_iterations`` (model
calls per turn, default 8), ``provider`` (name; default the first mounted),
``script_capability`` (the coordinator capability holding the conversation script that
supplies tool outputs, default ``"example.conversation_script"``). Returns a cleanup that
unregisters the observers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .loop import MODES, LoopSettings, NegotiatingLoop
from .negotiation import Negotiation, output_cap_candidates
from .records import OBSERVED_EVENTS, EventLog, RequestRow

__amplifier_module_type__ = "orchestrator"

__all__ = (
    "MODES",
    "EventLog",
    "LoopSettings",
    "NegotiatingLoop",
    "Negotiation",
    "RequestRow",
    "mount",
    "output_cap_candidates",
)


async def mount(coordinator: Any, config: dict[str, Any] | None = None) -> Callable[[], None]:
    """Mount the loop; returns a cleanup that unregisters its event observers."""
    loop = NegotiatingLoop(coordinator, LoopSettings.from_config(config))
    await coordinator.mount("orchestrator", loop)
    hooks = getattr(coordinator, "hooks", None)
    unregister: list[Callable[[], Any]] = []
    if hooks is not None:
        unregister = [
            hooks.register(event, loop.events.handler, priority=1000, name=f"loop-{event}")
            for event in OBSERVED_EVENTS
        ]

    def cleanup() -> None:
        for undo in unregister:
            undo()

    return cleanup
