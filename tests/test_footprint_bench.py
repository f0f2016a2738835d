"""The footprint benchmark's own helpers (``benchmarks.footprint``, ``benchmarks.census``):
the census counts exactly the containers made after it, a measured size survives the
trip from its subprocess as JSON, and each target passes at its limit and fails past it."""

from __future__ import annotations

import dataclasses

from benchmarks.census import Census
from benchmarks.footprint import Footprint, Lag, from_json, targets, to_json

N = 16_000


def _footprint(*, added: float, peak: float, collect: float, gap: float, ten: float) -> Footprint:
    """A 16k-message result whose target figures are the given ones."""
    json_chars = 10_000_000
    return Footprint(
        n=N,
        json_chars=json_chars,
        objects_startup=30_000,
        objects_alone=50_000,
        objects_loaded=50_000 + round(added * N),
        peak=round(peak * json_chars),
        gc_startup=(0.02, 0.02),
        gc_alone=(0.04, 0.04),
        gc_loaded=(0.04 * collect, 0.04 * collect),
        set_messages=0.2,
        first_request=0.4,
        lags=(
            Lag(1, False, gap, gap, gap, 1, 3),
            Lag(1, True, 0.001, 0.001, 0.0, 0, 3),
            Lag(10, False, gap * ten, gap * ten, gap * ten, 1, 12),
            Lag(10, True, 0.002, 0.002, 0.0, 0, 12),
        ),
    )


def test_census_counts_exactly_the_containers_made_after_it() -> None:
    """100 tuples each holding a new list, in one list (the call's own bound method and
    frame-level objects are not containers of these types)."""
    census = Census()
    made: list[tuple[int, list[int]]] = [(i, []) for i in range(100)]
    counts = Census.by_type(census.new())
    assert (counts["tuple"], counts["list"]) == (100, 101), len(made)


def test_a_measured_size_survives_its_json_trip() -> None:
    result = _footprint(added=3.9, peak=0.78, collect=2.2, gap=0.155, ten=2.9)
    assert from_json(to_json(result)) == result


def test_every_target_passes_at_its_limit() -> None:
    at_limit = _footprint(added=1.0, peak=0.5, collect=1.5, gap=0.030, ten=3.0)
    assert [ok for *_, ok in targets([at_limit])] == [True] * 5


def test_every_target_fails_past_its_limit() -> None:
    past = _footprint(added=1.01, peak=0.51, collect=1.51, gap=0.031, ten=3.01)
    assert [ok for *_, ok in targets([past])] == [False] * 5


def test_the_targets_judge_the_largest_size() -> None:
    small = dataclasses.replace(
        _footprint(added=9.0, peak=9.0, collect=9.0, gap=1.0, ten=9.0), n=1_000
    )
    large = _footprint(added=0.5, peak=0.25, collect=1.0, gap=0.010, ten=2.0)
    assert [ok for *_, ok in targets([small, large])] == [True] * 5
