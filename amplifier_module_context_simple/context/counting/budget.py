"""The effective token budget and where it came from.

Priority order (the existing public module's, kept; docs/design.md section 2): an explicit
``token_budget``; ``provider.get_model_info()``; ``provider.get_info().defaults``;
``max_tokens_fallback``. A provider window becomes
``context_window - int(max_output_tokens * output_reserve_fraction) - 4096``. The result is
then capped at ``max_tokens`` when one is configured (``min`` can only lower a budget).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..._values import int_at_least

__all__ = (
    "WINDOW_SAFETY_MARGIN",
    "LearnedLimit",
    "apply_learned_limit",
    "derive_budget",
    "window_of",
)


logger = logging.getLogger(__name__)

WINDOW_SAFETY_MARGIN: Final = 4096


def _positive_int(value: object) -> int | None:
    return int_at_least(value, 1)


def _window_from(provider: Any) -> tuple[str, int, int] | None:
    """(source, context_window, max_output_tokens) from a provider, or None."""
    try:
        get_model_info = getattr(provider, "get_model_info", None)
        if callable(get_model_info):
            info = get_model_info()
            if info:
                window = _positive_int(getattr(info, "context_window", None))
                output = _positive_int(getattr(info, "max_output_tokens", None))
                if window and output:
                    return "provider_model_info", window, output
    except Exception:  # a provider bug must not break the request; fall through
        logger.debug("context-simple: provider.get_model_info() failed", exc_info=True)
    try:
        get_info = getattr(provider, "get_info", None)
        if callable(get_info):
            defaults = getattr(get_info(), "defaults", None) or {}
            if isinstance(defaults, Mapping):
                window = _positive_int(defaults.get("context_window"))
                output = _positive_int(defaults.get("max_output_tokens"))
                if window and output:
                    return "provider_defaults", window, output
    except Exception:
        logger.debug("context-simple: provider.get_info() failed", exc_info=True)
    return None


def derive_budget(
    *,
    token_budget: int | None,
    provider: Any,
    max_tokens: int | None,
    max_tokens_fallback: int,
    output_reserve_fraction: float,
) -> dict[str, Any]:
    """Return the budget provenance dict; ``["effective_budget"]`` is the budget.

    Keys: ``source`` (``explicit | provider_model_info | provider_defaults |
    max_tokens_fallback``), for provider sources ``context_window``, ``max_output_tokens``,
    ``reserved_output``; always ``derived_budget``, ``max_tokens``, ``max_tokens_fallback``,
    ``capped``, ``effective_budget``.

    Raises:
        ValueError: ``token_budget`` is given but is not a positive integer.
    """
    provenance: dict[str, Any]
    if token_budget is not None:
        explicit = _positive_int(token_budget)
        if explicit is None:
            raise ValueError(f"invalid token_budget={token_budget!r}: expected a positive integer")
        provenance = {"source": "explicit"}
        derived = explicit
    else:
        window = _window_from(provider) if provider is not None else None
        if window is not None:
            source, context_window, max_output = window
            reserved = int(max_output * output_reserve_fraction)
            derived = context_window - reserved - WINDOW_SAFETY_MARGIN
            provenance = {
                "source": source,
                "context_window": context_window,
                "max_output_tokens": max_output,
                "reserved_output": reserved,
            }
            if derived <= 0:
                # A window too small for the reserve and the safety margin is still a real
                # window: never answer it with the (much larger) fallback.
                derived = max(1, context_window - reserved)
                provenance["window_too_small"] = True
        else:
            provenance = {"source": "max_tokens_fallback"}
            derived = max_tokens_fallback
    capped = max_tokens is not None and derived > max_tokens
    provenance.update(
        derived_budget=derived,
        max_tokens=max_tokens,
        max_tokens_fallback=max_tokens_fallback,
        capped=capped,
        effective_budget=max_tokens if capped and max_tokens is not None else derived,
    )
    return provenance


@dataclass(frozen=True, slots=True)
class LearnedLimit:
    """A provider's real input limit, learned from a provider-directed hard-fit rebuild.

    Deployments, gateways and per-organisation limits often enforce less than the window
    a provider advertises. Once a rebuild was directed at ``limit`` (``hard_fit=True``
    with the provider's ``token_budget``), later requests use it as a cap on their budget,
    as long as the provider still reports the same ``window``; ``clear`` and
    ``set_messages`` forget it.
    """

    limit: int
    window: tuple[object, ...]
    """What the provider reported when the limit was learned (source, window, output)."""


def window_of(provider: Any) -> tuple[object, ...]:
    """What ``provider`` reports of its window: (source, context_window, max_output)."""
    window = _window_from(provider) if provider is not None else None
    return window if window is not None else ("none",)


def apply_learned_limit(
    provenance: dict[str, Any], learned: LearnedLimit | None, window: tuple[object, ...]
) -> dict[str, Any]:
    """``provenance`` capped at a learned limit that still applies (a new dict if so)."""
    if learned is None or learned.window != window:
        return provenance
    if provenance["effective_budget"] <= learned.limit:
        return provenance
    return {
        **provenance,
        "source": "provider_limit",
        "learned_limit": learned.limit,
        "effective_budget": learned.limit,
    }
