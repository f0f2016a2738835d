"""The real-usage token meter.

The ``llm:response`` listener records the provider's own reading for the latest request:
``input_tokens + cache_write_tokens`` (``input_tokens`` is gross, fresh + cache read;
cache writes are billed disjointly; ``cache_read_tokens`` is never added again). Usage
may arrive as a dict or as an object with attributes; invalid readings are ignored and
the listener never raises.

An orchestrator that measures the foreground request itself may claim the meter
(capability ``context.foreground_usage``); from then on the listener is ignored and the
orchestrator's recorder is the only source. A recorder call with an invalid value keeps
the previous reading but marks it stale.

Every reading taken, from the listener or the recorder, is also passed to ``listener``
(the store's count correction, ``correction.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..._values import int_at_least

__all__ = (
    "TokenMeter",
    "reading_from_usage",
)


def _count(value: object) -> int | None:
    return int_at_least(value, 0)


def _field(usage: object, key: str) -> tuple[bool, object]:
    if isinstance(usage, Mapping):
        return key in usage, usage.get(key)
    if hasattr(usage, key):
        return True, getattr(usage, key)
    return False, None


def reading_from_usage(usage: object) -> int | None:
    """``input_tokens + cache_write_tokens`` from a usage payload, or None if unusable."""
    if usage is None:
        return None
    _, raw_input = _field(usage, "input_tokens")
    input_tokens = _count(raw_input)
    if input_tokens is None:
        return None
    present, raw_write = _field(usage, "cache_write_tokens")
    if not present or raw_write is None:
        return input_tokens
    cache_write = _count(raw_write)
    return None if cache_write is None else input_tokens + cache_write


@dataclass(slots=True)
class TokenMeter:
    """Latest measured request size, plus the foreground-claim state."""

    measured: int | None = None
    claimed: bool = False
    stale: bool = False
    listener: Callable[[int], object] | None = None
    """Told every reading taken (it must not raise)."""

    def on_llm_response(self, data: object) -> None:
        """Record a provider reading from an ``llm:response`` payload (never raises)."""
        if self.claimed:
            return
        try:
            usage = data.get("usage") if isinstance(data, Mapping) else None
            reading = reading_from_usage(usage)
        except Exception:  # a hostile usage object must not break the hook chain
            return
        if reading is not None:
            self._took(reading)

    def claim(self) -> Callable[..., bool]:
        """Claim the meter for the foreground orchestrator; return its recorder."""
        if not self.claimed:
            self.claimed = True
            self.measured = None
            self.stale = False
        return self._record

    def _record(self, *, input_tokens: object, cache_write_tokens: object = 0) -> bool:
        reading = reading_from_usage(
            {"input_tokens": input_tokens, "cache_write_tokens": cache_write_tokens}
        )
        if reading is None:
            self.stale = True
            return False
        self._took(reading)
        self.stale = False
        return True

    def _took(self, reading: int) -> None:
        self.measured = reading
        if self.listener is not None:
            self.listener(reading)

    def reset(self) -> None:
        """Forget the reading (``clear``); a claimed meter stays claimed and goes stale."""
        self.measured = None
        self.stale = self.claimed

    def stats(
        self, *, mode: str, estimated: int, budget: int, images_estimated: bool
    ) -> dict[str, Any]:
        """The ``_last_token_meter_stats`` dict for one request."""
        use_measured = mode == "actual" and self.measured is not None
        used = self.measured if use_measured and self.measured is not None else estimated
        if use_measured:
            source = "owned_stale" if self.claimed and self.stale else "measured"
        else:
            source = "estimate"
        return {
            "mode": mode,
            "source": source,
            "used_tokens": used,
            "estimated_tokens": estimated,
            "estimate_scope": "images_estimated" if images_estimated else "all_text",
            "measured_tokens": self.measured,
            "foreground_usage_stale": self.stale,
            "budget": budget,
            "ratio": (used / budget) if budget > 0 else None,
        }
