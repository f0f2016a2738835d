"""Reconciling our estimate with the provider's count, per session (estimate mode).

After every response the provider reports the input tokens it counted for the request
we built (``meter.py`` reads them from ``llm:response``). Our estimate of that view is
known when the view is returned. Their ratio is what the provider's units are worth in
ours: the *scale*. A view is over the provider's limit when ``estimate x scale`` is, so
the limits every rule compares with (trigger, target, the floor and hard-fit ceilings)
are divided by the scale, in our units.

Besides the scale, the rules that let a view come close to the whole budget (a reported
floor holding, a hard fit, a floor over the budget) keep a *margin* below it: the
estimator's error on one view. Before any report it is the default margin (the
``estimate_margin`` key: the error measured on the real conversations, docs/design.md 7.6);
once three reports are in, it is their own spread (the largest ratio over the median,
within ``[MIN_MARGIN, MAX_MARGIN]``).

Robustness, by rule:

- One reading per returned view. A reading is paired with the latest view returned and
  consumes it: a second reading, or a reading when no view is waiting (the orchestrator
  sent something else, the meter is owned elsewhere), is ignored.
- A ratio outside ``[1 / MAX_RATIO, MAX_RATIO]`` is not a count of that view (a garbage
  usage object, a request with another history) and is ignored.
- The scale is the median of the last ``WINDOW`` ratios, bounded to
  ``[MIN_SCALE, MAX_SCALE]``.
- It is sticky: the applied scale moves only when the median moves by more than
  ``STEP`` from it, so a trigger does not shift by a token every request.
- Everything is forgotten when the budget or the model changes (``key``), and on
  ``clear`` / ``set_messages`` with another history (``reset``).

The provider's reading covers what it adds to our view too (tool definitions, its own
framing): on a short view they weigh more and the ratio is higher. That errs on the safe
side, and by the time a view approaches its trigger the ratio is the large view's own.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Final

__all__ = (
    "MAX_MARGIN",
    "MAX_RATIO",
    "MAX_SCALE",
    "MIN_MARGIN",
    "MIN_SCALE",
    "STEP",
    "WINDOW",
    "CountCorrection",
    "Reconciler",
)

WINDOW: Final = 8
"""Ratios the scale is the median of (the latest ones)."""
MIN_SCALE: Final = 0.8
MAX_SCALE: Final = 1.5
"""The bounds of the applied scale: a provider counting a view at more than one and a half
times our estimate, or under four fifths of it, is not what the estimate was made for;
the bound keeps a run of bad readings from collapsing or inflating the budget."""
MAX_RATIO: Final = 3.0
"""A ratio beyond 3 (or under 1/3) is not a count of the view we returned."""
STEP: Final = 0.02
"""The applied scale changes only when the median moves by more than this."""
MIN_MARGIN: Final = 0.02
MAX_MARGIN: Final = 0.25
MARGIN_SAMPLES: Final = 3
"""Reports needed before the margin is the session's own spread."""


@dataclass(frozen=True, slots=True)
class CountCorrection:
    """How one request reads its limits: ``scale`` (provider tokens per estimated token)
    and ``margin`` (the headroom kept below the budget by the rules that approach it)."""

    scale: float = 1.0
    margin: float = 0.0
    samples: int = 0
    """Reports the scale rests on (0: none yet, the scale is 1)."""

    def estimated(self, provider_tokens: float) -> int:
        """``provider_tokens`` in our estimate's units (rounded down)."""
        return int(provider_tokens / self.scale)

    def ceiling(self, provider_tokens: float) -> int:
        """The most our estimate of a view may be for it to fit ``provider_tokens`` with
        the margin kept."""
        return int(provider_tokens / (self.scale * (1.0 + self.margin)))

    def stats(self) -> dict[str, float | int]:
        return {
            "count_scale": round(self.scale, 4),
            "count_margin": round(self.margin, 4),
            "count_samples": self.samples,
        }


NO_CORRECTION: Final = CountCorrection()


class Reconciler:
    """The per-session scale of our estimate against the provider's readings."""

    __slots__ = ("_applied", "_default_margin", "_key", "_pending", "_ratios")

    def __init__(self, default_margin: float) -> None:
        if not 0.0 <= default_margin < 1.0:
            raise ValueError(f"default_margin must be in [0, 1), got {default_margin!r}")
        self._default_margin = default_margin
        self._ratios: deque[float] = deque(maxlen=WINDOW)
        self._applied = 1.0
        self._key: object = None
        self._pending: int | None = None

    def correction(self, key: object, default_margin: float | None = None) -> CountCorrection:
        """The correction a request with this key (its budget and model) applies. A key
        other than the reports' gives the default: nothing reconciled yet.
        ``default_margin`` replaces the constructor's (the store passes its current
        ``estimate_margin``)."""
        default = self._default_margin if default_margin is None else default_margin
        if key != self._key or not self._ratios:
            return CountCorrection(1.0, default, 0)
        return CountCorrection(self._applied, self._margin(default), len(self._ratios))

    def returned(self, estimate: int, key: object) -> None:
        """A view estimated at ``estimate`` was returned for a request with ``key``: the
        next reading counts it."""
        if key != self._key:
            self._ratios.clear()
            self._applied = 1.0
            self._key = key
        self._pending = estimate if estimate > 0 else None

    def reported(self, reading: int | None) -> bool:
        """The provider's reading of the latest request; whether it was taken."""
        estimate, self._pending = self._pending, None
        if estimate is None or reading is None or reading <= 0:
            return False
        ratio = reading / estimate
        if not 1.0 / MAX_RATIO <= ratio <= MAX_RATIO:
            return False
        self._ratios.append(ratio)
        median = min(MAX_SCALE, max(MIN_SCALE, statistics.median(self._ratios)))
        if len(self._ratios) == 1 or abs(median - self._applied) > STEP:
            self._applied = median
        return True

    def reset(self) -> None:
        """Forget every report (a new history)."""
        self._ratios.clear()
        self._applied = 1.0
        self._key = None
        self._pending = None

    def _margin(self, default: float) -> float:
        if len(self._ratios) < MARGIN_SAMPLES:
            return default
        spread = max(self._ratios) / statistics.median(self._ratios) - 1.0
        return min(MAX_MARGIN, max(MIN_MARGIN, spread))
