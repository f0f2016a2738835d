"""Configuration keys, their defaults and their validation.

Validation is strict with two documented exceptions, kept so that existing configurations
keep loading: an unknown ``token_meter`` warns and falls back to ``"estimate"``, and an
invalid ``max_tokens`` (bool, non-int, <= 0) warns and means "no cap". Every other invalid value
raises ``ValueError`` naming the key and the value. Unknown keys produce one warning
listing them and are otherwise ignored.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._values import int_at_least, is_int, is_number

__all__ = (
    "CONFIG_KEYS",
    "DEFAULT_MAX_TOKENS_FALLBACK",
    "DEFAULT_MAX_TOOL_RESULT_BYTES",
    "INGRESS_MARKER_TEMPLATE",
    "MIN_MAX_TOOL_RESULT_BYTES",
    "TOKEN_METER_ACTUAL",
    "TOKEN_METER_ESTIMATE",
    "VERBOSITIES",
    "ContextConfig",
    "validated_max_tokens",
    "validated_token_meter",
)


logger = logging.getLogger(__name__)

TOKEN_METER_ESTIMATE: Final = "estimate"
TOKEN_METER_ACTUAL: Final = "actual"
VERBOSITIES: Final = frozenset({"minimal", "normal", "verbose"})

DEFAULT_MAX_TOKENS_FALLBACK: Final = 200_000
DEFAULT_MAX_TOOL_RESULT_BYTES: Final = 128 * 1024

# The ingress marker with the largest possible byte count must fit inside the cap.
INGRESS_MARKER_TEMPLATE: Final = (
    "[tool-result truncated at ingress: original_text_utf8_bytes={original}; "
    "retrieve missing content using narrower read/query parameters; "
    "do not repeat state-changing actions just to recover output.]"
)
MIN_MAX_TOOL_RESULT_BYTES: Final = len(
    INGRESS_MARKER_TEMPLATE.format(original=sys.maxsize).encode("utf-8")
)


@dataclass(frozen=True, slots=True)
class ContextConfig:
    """Validated configuration of one ``SimpleContextManager``."""

    max_tokens: int | None = None
    max_tokens_fallback: int = DEFAULT_MAX_TOKENS_FALLBACK
    compact_threshold: float = 0.92
    target_usage: float = 0.50
    protected_recent: float = 0.30
    protected_tool_results: int = 5
    truncate_chars: int = 250
    compaction_notice_enabled: bool = True
    compaction_notice_token_reserve: int = 800
    compaction_notice_verbosity: str = "normal"
    compaction_notice_min_level: int = 1
    output_reserve_fraction: float = 0.5
    token_meter: str = TOKEN_METER_ESTIMATE
    max_tool_result_bytes: int = DEFAULT_MAX_TOOL_RESULT_BYTES
    count_every_rung: bool = False
    learn_provider_limits: bool = True
    preserved_thinking: bool | str = "auto"
    """Whether the model checks the prefix of thinking sent back (``thinking.py``):
    ``"auto"`` reads the provider's report; ``true``/``false`` force it."""
    estimate_margin: float = 0.06
    """Headroom, as a fraction, that the rules letting a view approach the whole budget (a
    reported floor holding, a floor over the budget, hard fit) keep below it until the
    session's own usage reports size it (``counting/correction.py``). 0.06 covers our
    estimator's error on one message of the real conversations: it estimates 10% of them
    5.5% or more under an independent count (docs/design.md 7.6)."""
    cache_lifetime: float = 300.0
    """Seconds the provider's prompt cache lives after its last use (300: Anthropic's and
    OpenAI's default; 3600 for a 1-hour cache); 0 turns idle-aware compaction off."""
    idle_compact_at: float = 0.8
    """Idle-aware compaction: after a gap longer than ``cache_lifetime`` (the cache is
    gone, so the request writes its whole view anyway), a view at or above this fraction
    of the trigger compacts now rather than a few requests later, on a warm cache
    (``RequestPolicy.compaction_due``; docs/design.md 7.6 has the figures). 0.8 was chosen by a
    sweep (0.6 to 0.9) on the two long timestamped sessions at 32k, 128k and 163,904
    tokens with the 5-minute cache: every value billed less than the rule off on every
    case; 0.8 saves 9.8% in all (at least 4.9% per case) for 4.2% less mean context kept,
    where lower values save little more per context lost and 0.85 saves 7.0% (1.5% on one
    case)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _CHECKS[field.name](field.name, getattr(self, field.name))

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> ContextConfig:
        """Build a config from a mount ``config`` dict, applying the lenient exceptions.

        Raises:
            ValueError: a key has a wrong type or an out-of-range value (names both).
        """
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise TypeError(f"config must be a mapping, got {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in raw if k not in known)
        if unknown:
            logger.warning("context-simple: ignoring unknown config keys: %s", ", ".join(unknown))
        values = {k: v for k, v in raw.items() if k in known}
        if "max_tokens" in values:
            values["max_tokens"] = validated_max_tokens(values["max_tokens"])
        if "token_meter" in values:
            values["token_meter"] = validated_token_meter(values["token_meter"])
        return cls(**values)


CONFIG_KEYS: Final = tuple(field.name for field in dataclasses.fields(ContextConfig))
"""The configuration keys, in ``ContextConfig``'s order: the constructor's keywords and the
manager's configuration attributes (``ContextStore``), the replay's ``--set`` keys."""


def validated_max_tokens(raw: object) -> int | None:
    """``max_tokens`` is a cap; anything but a positive int means "no cap" (with a warning)."""
    if raw is None:
        return None
    checked = int_at_least(raw, 1)
    if checked is None:
        logger.warning("context-simple: ignoring invalid max_tokens %r; no cap applies", raw)
    return checked


def validated_token_meter(raw: object) -> str:
    """An unknown ``token_meter`` falls back to ``"estimate"`` with a warning."""
    if raw in (TOKEN_METER_ESTIMATE, TOKEN_METER_ACTUAL):
        return str(raw)
    logger.warning("context-simple: unknown token_meter %r; using 'estimate'", raw)
    return TOKEN_METER_ESTIMATE


def _bad(key: str, value: object, expected: str) -> ValueError:
    return ValueError(f"invalid {key}={value!r}: expected {expected}")


def _positive_int(key: str, value: object) -> None:
    if not is_int(value) or value <= 0:
        raise _bad(key, value, "a positive integer")


def _non_negative_int(key: str, value: object) -> None:
    if not is_int(value) or value < 0:
        raise _bad(key, value, "a non-negative integer")


def _fraction_open(key: str, value: object) -> None:
    if not is_number(value) or not 0 < value <= 1:
        raise _bad(key, value, "a number in (0, 1]")


def _fraction_closed(key: str, value: object) -> None:
    if not is_number(value) or not 0 <= value <= 1:
        raise _bad(key, value, "a number in [0, 1]")


def _margin(key: str, value: object) -> None:
    if not is_number(value) or not 0 <= value <= 0.5:
        raise _bad(key, value, "a number in [0, 0.5]")


def _seconds(key: str, value: object) -> None:
    if not is_number(value) or value < 0:
        raise _bad(key, value, "a non-negative number of seconds")


def _boolean(key: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _bad(key, value, "true or false")


def _preserved_thinking(key: str, value: object) -> None:
    if value != "auto" and not isinstance(value, bool):
        raise _bad(key, value, '"auto", true or false')


def _max_tokens(key: str, value: object) -> None:
    if value is not None:
        _positive_int(key, value)


def _verbosity(key: str, value: object) -> None:
    if value not in VERBOSITIES:
        raise _bad(key, value, f"one of {sorted(VERBOSITIES)}")


def _token_meter(key: str, value: object) -> None:
    if value not in (TOKEN_METER_ESTIMATE, TOKEN_METER_ACTUAL):
        raise _bad(key, value, "'estimate' or 'actual'")


def _tool_result_bytes(key: str, value: object) -> None:
    if not is_int(value) or value < MIN_MAX_TOOL_RESULT_BYTES:
        raise _bad(
            key,
            value,
            f"an integer at least {MIN_MAX_TOOL_RESULT_BYTES} so the ingress truncation "
            "marker fits",
        )


_CHECKS: Final = {
    "max_tokens": _max_tokens,
    "max_tokens_fallback": _positive_int,
    "compact_threshold": _fraction_open,
    "target_usage": _fraction_open,
    "protected_recent": _fraction_closed,
    "protected_tool_results": _non_negative_int,
    "truncate_chars": _non_negative_int,
    "compaction_notice_enabled": _boolean,
    "compaction_notice_token_reserve": _non_negative_int,
    "compaction_notice_verbosity": _verbosity,
    "compaction_notice_min_level": _non_negative_int,
    "output_reserve_fraction": _fraction_closed,
    "token_meter": _token_meter,
    "max_tool_result_bytes": _tool_result_bytes,
    "count_every_rung": _boolean,
    "learn_provider_limits": _boolean,
    "preserved_thinking": _preserved_thinking,
    "estimate_margin": _margin,
    "cache_lifetime": _seconds,
    "idle_compact_at": _fraction_open,
}
