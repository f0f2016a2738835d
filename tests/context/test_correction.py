"""The per-session count correction (``counting/correction.py``) and the cache's lifetime
(``counting/cache.py``), as units: what a sequence of readings makes of the scale and the
margin."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from amplifier_module_context_simple.context.counting.cache import CacheLife
from amplifier_module_context_simple.context.counting.correction import (
    MAX_MARGIN,
    MAX_SCALE,
    MIN_MARGIN,
    MIN_SCALE,
    WINDOW,
    CountCorrection,
    Reconciler,
)

KEY = (100_000, "claude-sonnet-4-5")


def fed(pairs: Sequence[tuple[int, int | None]], *, margin: float = 0.1) -> Reconciler:
    reconciler = Reconciler(margin)
    for estimate, reading in pairs:
        reconciler.returned(estimate, KEY)
        reconciler.reported(reading)
    return reconciler


def test_no_reading_gives_no_scale_and_the_default_margin() -> None:
    assert Reconciler(0.1).correction(KEY) == CountCorrection(1.0, 0.1, 0)


def test_the_scale_is_the_median_of_the_latest_ratios() -> None:
    reconciler = fed([(1000, 1100), (1000, 1300), (1000, 1200)])
    assert reconciler.correction(KEY).scale == pytest.approx(1.2)
    assert reconciler.correction(KEY).samples == 3


def test_only_the_window_of_latest_ratios_counts() -> None:
    reconciler = fed([(1000, 2000)] * WINDOW + [(1000, 1100)] * WINDOW)
    assert reconciler.correction(KEY).scale == pytest.approx(1.1)


def test_the_scale_is_bounded() -> None:
    assert fed([(1000, 2500)]).correction(KEY).scale == MAX_SCALE
    assert fed([(1000, 500)]).correction(KEY).scale == MIN_SCALE


def test_a_reading_that_is_not_a_count_of_the_view_is_ignored() -> None:
    reconciler = Reconciler(0.1)
    reconciler.returned(1000, KEY)
    assert not reconciler.reported(10_000)  # ten times the view: another request
    reconciler.returned(1000, KEY)
    assert not reconciler.reported(None)
    reconciler.returned(1000, KEY)
    assert not reconciler.reported(0)
    assert reconciler.correction(KEY).samples == 0


def test_one_reading_per_returned_view() -> None:
    reconciler = Reconciler(0.1)
    reconciler.returned(1000, KEY)
    assert reconciler.reported(1200)
    assert not reconciler.reported(1500)  # a second reading of the same view
    assert reconciler.correction(KEY).samples == 1
    assert reconciler.correction(KEY).scale == pytest.approx(1.2)


def test_the_applied_scale_is_sticky_within_a_step() -> None:
    reconciler = fed([(1000, 1200)])
    reconciler.returned(1000, KEY)
    reconciler.reported(1210)  # median 1.205: within a step of 1.2
    assert reconciler.correction(KEY).scale == pytest.approx(1.2)
    reconciler.returned(1000, KEY)
    reconciler.reported(1400)  # median 1.21: still within the step
    reconciler.returned(1000, KEY)
    reconciler.reported(1400)  # median 1.305: moves
    assert reconciler.correction(KEY).scale == pytest.approx(1.305)


def test_another_budget_or_model_forgets_the_readings() -> None:
    reconciler = fed([(1000, 1300)] * 3)
    assert reconciler.correction((50_000, "gpt-5")) == CountCorrection(1.0, 0.1, 0)
    reconciler.returned(1000, (50_000, "gpt-5"))
    assert reconciler.correction(KEY).samples == 0


def test_reset_forgets_everything() -> None:
    reconciler = fed([(1000, 1300)] * 3)
    reconciler.reset()
    assert reconciler.correction(KEY).samples == 0
    assert not reconciler.reported(1300)


def test_the_margin_is_the_sessions_spread_once_three_readings_are_in() -> None:
    assert fed([(1000, 1000), (1000, 1100)]).correction(KEY).margin == 0.1
    spread = fed([(1000, 1000), (1000, 1100), (1000, 1050)]).correction(KEY)
    assert spread.margin == pytest.approx(1100 / 1050 - 1)
    assert fed([(1000, 1000)] * 3).correction(KEY).margin == MIN_MARGIN
    assert fed([(1000, 1000)] * 2 + [(1000, 2900)]).correction(KEY).margin == MAX_MARGIN


def test_the_ceiling_keeps_the_margin_in_our_units() -> None:
    correction = CountCorrection(scale=1.25, margin=0.1, samples=4)
    assert correction.estimated(10_000) == 8000
    assert correction.ceiling(11_000) == 8000
    assert correction.stats() == {"count_scale": 1.25, "count_margin": 0.1, "count_samples": 4}


@pytest.mark.parametrize("margin", [-0.1, 1.0, math.nan])
def test_a_default_margin_out_of_range_is_refused(margin: float) -> None:
    with pytest.raises(ValueError, match="default_margin"):
        Reconciler(margin)


def test_the_cache_expires_only_after_its_lifetime() -> None:
    life = CacheLife()
    assert not life.expired(1000.0, 300.0)  # nothing cached yet
    life.returned(1000.0)
    assert not life.expired(1300.0, 300.0)
    assert life.expired(1300.5, 300.0)
    life.returned(1300.5)
    assert not life.expired(1500.0, 300.0)
    assert not CacheLife(last=0.0).expired(10_000.0, 0.0)
    life.reset()
    assert not life.expired(10_000.0, 300.0)
