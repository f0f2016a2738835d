"""The baseline trimmers' views: what a trimmer that drops the oldest messages sends.

A trimmer keeps the system messages and drops the oldest other messages in units (an
assistant message with the results of its calls; never a result without its call),
always keeping the newest unit. ``trimmed_views`` is the one trimmer, with a trigger and
a target; ``sliding_window_view`` (per request) and ``hysteresis_views`` are its two
settings, and ``equal_context_target`` searches the per-request target that keeps as
much context, on average, as a given mean.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from ..context.counting.estimate import estimate_message
from ..context.formats import tool_ids
from .bill import Measure

__all__ = (
    "EQUAL_CONTEXT_TOLERANCE",
    "equal_context_target",
    "hysteresis_views",
    "memoized",
    "sliding_window_view",
    "trimmed_views",
)

EQUAL_CONTEXT_TOLERANCE: Final = 0.01
"""How far (relative) the equal-context trimmer's mean view may be from the module's for
``replay_equal_context`` to report the two as matched."""


def _units(messages: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Non-system messages in droppable units: an assistant message with the results that
    answer its calls is one unit; a message carrying only results that answer no call in
    the unit before it (an orphan) is left out - a trimmer never sends a result alone."""
    units: list[list[Mapping[str, Any]]] = []
    open_calls: set[str] = set()
    for message in messages:
        if message.get("role") == "system":
            continue
        calls, results, only_results = tool_ids(message)
        if results and units and open_calls.intersection(results):
            units[-1].append(message)
            continue
        if results and only_results:
            continue  # answers no call of the unit before it
        units.append([message])
        open_calls = set(calls)
    return units


def memoized(measure: Measure) -> Measure:
    """``measure`` remembered per message object (each kept alive, so no id is reused)."""
    memo: dict[int, tuple[Mapping[str, Any], int]] = {}

    def counted(message: Mapping[str, Any]) -> int:
        hit = memo.get(id(message))
        if hit is None:
            hit = memo[id(message)] = (message, measure(message))
        return hit[1]

    return counted


def _trimmed_start(fixed: int, sizes: Sequence[int], start: int, target: float) -> int:
    """The first unit kept when dropping the oldest units from ``start`` on until
    ``fixed`` + the rest fit ``target``; never past the newest unit."""
    used = fixed + sum(sizes[start:])
    while start < len(sizes) - 1 and used > target:
        used -= sizes[start]
        start += 1
    return start


def trimmed_views(
    histories: Iterable[Sequence[Mapping[str, Any]]],
    *,
    trigger: float,
    target: float,
    measure: Measure = estimate_message,
) -> Iterator[list[Mapping[str, Any]]]:
    """The views a trimmer sends, one per history (each history extends the one before it,
    messages only appended, as a session's does).

    The view is the system messages, then every unit (``_units``: a call with its results,
    never a result alone) since the trimmer's last trim. When that exceeds ``trigger``
    tokens (counted by ``measure``), it trims: drops the oldest units until the view fits
    ``target``. The newest unit is always kept, even when it alone does not fit.

    ``trigger == target`` is the per-request trimmer (``sliding_window_view`` on every
    request: the largest suffix of units that fits); ``trigger`` = B and ``target`` = f x B
    the trimmer with hysteresis (``hysteresis_views``).

    Raises:
        ValueError: ``target`` is negative or above ``trigger``.
    """
    if not 0 <= target <= trigger:
        raise ValueError(f"need 0 <= target <= trigger, got target {target}, trigger {trigger}")
    return _trimmed(histories, trigger, target, memoized(measure))


def _trimmed(
    histories: Iterable[Sequence[Mapping[str, Any]]], trigger: float, target: float, size: Measure
) -> Iterator[list[Mapping[str, Any]]]:
    start = 0  # the first unit sent: the trimmer's state between requests
    for messages in histories:
        system = [m for m in messages if m.get("role") == "system"]
        units = _units(messages)
        fixed = sum(map(size, system))
        sizes = [sum(map(size, unit)) for unit in units]
        if fixed + sum(sizes[start:]) > trigger:
            start = _trimmed_start(fixed, sizes, start, target)
        yield [*system, *(m for unit in units[start:] for m in unit)]


def sliding_window_view(
    messages: Sequence[Mapping[str, Any]], target: float, measure: Measure = estimate_message
) -> list[Mapping[str, Any]]:
    """The view a per-request trimmer sends: system messages, then the newest units of
    ``messages`` (``_units``) that fit ``target`` tokens (``measure``) with them, dropping
    the oldest first. The newest unit is always kept, even when it alone does not fit."""
    return next(trimmed_views([messages], trigger=target, target=target, measure=measure))


def hysteresis_views(
    histories: Iterable[Sequence[Mapping[str, Any]]],
    budget: float,
    fraction: float,
    measure: Measure = estimate_message,
) -> Iterator[list[Mapping[str, Any]]]:
    """The trimmer with hysteresis: it sends everything since its last trim, and only when
    that exceeds ``budget`` trims to ``fraction`` x ``budget`` (``trimmed_views``).

    Raises:
        ValueError: ``fraction`` outside (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return trimmed_views(histories, trigger=budget, target=fraction * budget, measure=measure)


def equal_context_target(
    histories: Sequence[Sequence[Mapping[str, Any]]],
    mean: float,
    measure: Measure = estimate_message,
) -> tuple[int, float]:
    """The integer target whose per-request trimmer's mean view tokens come closest to
    ``mean``, and that mean; ties go to the smaller target. Deterministic.

    The mean view is a non-decreasing step function of the target (a larger target keeps
    a longer suffix of every history), so bisection over [0, the largest history] finds
    the smallest target reaching ``mean``; the closer of it and the target below wins. The
    gap left is at most one step of that function: the units one more token of target
    admits, averaged over the requests.
    """
    size = memoized(measure)

    @functools.cache
    def mean_at(target: int) -> float:
        views = trimmed_views(histories, trigger=target, target=target, measure=size)
        return sum(size(m) for view in views for m in view) / len(histories)

    low, high = 0, max(sum(map(size, history)) for history in histories)
    if mean_at(high) < mean:
        return high, mean_at(high)
    while low < high:  # the smallest target whose mean reaches ``mean``
        middle = (low + high) // 2
        if mean_at(middle) >= mean:
            high = middle
        else:
            low = middle + 1
    candidates = [(abs(mean_at(t) - mean), t) for t in (low - 1, low) if t >= 0]
    _, best = min(candidates)
    return best, mean_at(best)
