"""Amplifier provider module ``provider-window``: a hard context window, counted with o200k.

``mount(coordinator, config)`` mounts one ``WindowProvider`` at ``"providers"`` under
``config["name"]`` (default ``"window"``). Config keys: ``context_window`` (32000),
``max_output_tokens`` (4000), ``safety_margin_tokens`` (512), ``advertised_context_window``
(default: the real window), ``model``, ``script_capability`` (the coordinator capability
holding a conversation script, default ``"example.conversation_script"``; without one the
provider answers with a short fixed text). Returns None (nothing to clean up).
"""

from __future__ import annotations

from typing import Any

from .provider import (
    MEASUREMENT_SOURCE,
    PROVIDER_COUNT_CAPABILITY,
    ProviderStats,
    ReplyScript,
    WindowProvider,
    WindowSettings,
)

__amplifier_module_type__ = "provider"

DEFAULT_SCRIPT_CAPABILITY = "example.conversation_script"

__all__ = (
    "DEFAULT_SCRIPT_CAPABILITY",
    "MEASUREMENT_SOURCE",
    "PROVIDER_COUNT_CAPABILITY",
    "ProviderStats",
    "WindowProvider",
    "WindowSettings",
    "mount",
)


async def mount(coordinator: Any, config: dict[str, Any] | None = None) -> None:
    """Mount a ``WindowProvider`` built from ``config`` (bad values raise ``ValueError``)."""
    config = dict(config or {})
    capability = str(config.pop("script_capability", DEFAULT_SCRIPT_CAPABILITY))
    settings = WindowSettings.from_config(config)

    def script_lookup() -> ReplyScript | None:
        script: ReplyScript | None = coordinator.get_capability(capability)
        return script

    provider = WindowProvider(
        settings, hooks=getattr(coordinator, "hooks", None), script_lookup=script_lookup
    )
    await coordinator.mount("providers", provider, name=settings.name)
