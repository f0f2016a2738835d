"""Per-size request timings and memory: the module, beside a model of the old module's work.

For a history of N messages (``benchmarks.histories``), measured in one process:

- **admission**: messages/s through ``add_message`` into a fresh manager (median run);
- **steady state**: ``get_messages_for_request`` with a budget so large nothing compacts
  (median of repeats);
- **first compaction**: the first request of a fresh manager (history loaded with
  ``set_messages`` outside the timed region) whose budget is half of the history's
  estimated tokens, so the request compacts (median over fresh managers);
- **negotiated, not needed**: ``get_measured_request_view`` (``token_meter: "actual"``)
  whose ``count_view`` answers at once with a count far below the trigger: the module's
  own cost of a negotiated request that compacts nothing (median);
- **sticky reuse**: requests after that compaction, one new message admitted between
  requests (outside the timed region), no new compaction (median);
- **memory**: the history's own size - tracemalloc's *current* after decoding the session
  JSON and admitting it with ``add_message``, the decoded list then dropped, so it is what
  the manager keeps (content, admitted dicts, classification, estimates) - and the extra
  memory one steady-state request allocates (tracemalloc *peak* during the request minus
  *current* before it; the returned view is still alive at the peak).

Every timed sample records wall-clock time (``time.perf_counter``; the latencies shown)
and the process's CPU time (``time.process_time``; the scaling verdicts, which must not
depend on what else the machine runs). Every timed sample runs after ``gc.collect()`` with the collector left enabled; the
benchmark's own data (the histories) is frozen out of the collector first (``prepare``).
Repeats are interleaved across the sizes (1k, 4k, 16k, 1k, 4k, 16k, ...), and the
baseline's steady-state / sticky samples with ours, so that a slow spell of the machine
hits every size and both sides alike and does not skew the ratios.

The OLD-MODULE MODEL (the ``baseline_*`` functions; "baseline" in the metric names) is not
the existing public module but a model of part of its per-request work (its request
assembly, ladder and ``len(str(message)) // 4`` estimator, as described below; docs/design.md
section 11), so every ratio to it is a lower bound of the speedup over that module:

- a steady-state request re-estimates every message with ``len(str(message)) // 4``
  (the trigger's measurement) and returns shallow copies of every message with a new
  metadata dict without ``_seq`` (``request_view(..., strip_sequence=True)``; the
  existing module's stored messages always carry ``_seq``, so it always copies). It runs
  on the stored messages (``get_messages()``: metadata with ``_seq`` and timestamp). The
  sticky-reuse model is the same work over the compacted view. Left out: the budget
  derivation, the first ``request_view`` pass, the protected-sequence scan, building the
  sticky view, the final budget check and ``context:budget`` emission.
- a compaction request: only the full-list re-estimations the existing module performs in
  it (the table sets them, alone, against our whole compaction request), each
  ``len(str(m)) // 4`` over the working list as it is at that point: 1 for the trigger
  (whole view), 1 for ``old_tokens`` (whole view), 1 per truncation wave it reaches
  (levels 1, 2, 4, 6: the wave's lazy total baseline), 1 per removal pass it reaches
  (levels 3, 5, 7: the per-pass precomputed estimates), 1 for the final over-budget check
  (final view). "Reaches" and
  the working list at each level come from replaying OUR ladder rung by rung on the same
  request (``ladder_for`` + ``Ladder.applying``), a proxy for the existing module's ladder.
  NOT counted (so the model is a lower bound): the existing module's whole ladder work
  (truncations, removals, stubs, level 8), the escalation gate's
  ``system_tokens + estimate(working)``, the removal pass's re-estimated return total and
  ``_seq`` in the replayed lists.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import eq
from typing import Any, TypeVar

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.history.history import SYSTEM, copy_message
from amplifier_module_context_simple.context.ladder.ladder import RUNG_COUNT
from amplifier_module_context_simple.context.slices import run_through
from benchmarks import histories

T = TypeVar("T")

SIZES: tuple[int, ...] = (1_000, 4_000, 16_000)
COMPACTION_BUDGET_FRACTION = 0.5
"""First-compaction budget: this fraction of the history's estimated tokens."""
STEADY_BUDGET_FACTOR = 4
"""Steady-state budget: this multiple of the history's estimated tokens (never compacts)."""


@dataclass(frozen=True)
class Repeats:
    """Timed samples per size (each repeat round times every size once)."""

    admission: int = 5
    steady: int = 21
    compaction: int = 5
    sticky: int = 15
    negotiated: int = 3
    baseline: int = 3
    reestimation: int = 1


METRICS: tuple[str, ...] = (
    "admission",
    "steady",
    "steady_base",
    "negotiated",
    "compaction",
    "reestimation",
    "sticky",
    "sticky_base",
    "json_dumps",
    "set_messages",
    "extend",
    "extend_stored",
    "get_messages",
    "compare_floor",
    "add_one",
    "view_copy",
)
"""Timed figures per size. ``steady_base`` / ``sticky_base``: the old-module model's request;
``reestimation``: the model's full-list re-estimations of a compaction request;
``extend`` / ``extend_stored``: a ``set_messages`` of the current history plus one message,
given as the caller's own dicts / as the list ``get_messages()`` returned; ``compare_floor``:
one ``==`` pass of the caller's list against shallow copies of its dicts, the least any
comparison by content reads (see ``measure``); ``view_copy``: a shallow copy of every
message of a steady-state view (no module code: how the machine scales that much work)."""


@dataclass(frozen=True)
class SizeResult:
    n: int
    json_mb: float
    tokens: int
    """Our estimator's total for the history."""
    wall: dict[str, float]
    """Median wall-clock seconds (``time.perf_counter``) per metric of ``METRICS``."""
    cpu: dict[str, float]
    """Median CPU seconds of this process (``time.process_time``) per metric."""
    compaction_level: int
    compaction_view: int
    """Messages in the compacted view."""
    reestimations: int
    """Full-list re-estimations the old-module model does in a compaction request."""
    sticky_view: int
    history_mem: int
    request_mem: int
    base_request_mem: int

    @property
    def admission_rate(self) -> float:
        return self.n / self.wall["admission"]


# -- the old-module model ----------------------------------------------------------------


def baseline_estimate(messages: Sequence[dict[str, Any]]) -> int:
    """The existing module's estimator: ``len(str(message)) // 4`` per message."""
    return sum(len(str(m)) // 4 for m in messages)


def baseline_request(stored: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A steady-state request of the existing module: re-estimate, then copy every message."""
    baseline_estimate(stored)
    out: list[dict[str, Any]] = []
    append = out.append
    for message in stored:
        copied = dict(message)
        metadata = message.get("metadata")
        copied["metadata"] = (
            {k: v for k, v in metadata.items() if k != "_seq"} if isinstance(metadata, dict) else {}
        )
        append(copied)
    return out


def baseline_reestimations(lists: Sequence[Sequence[dict[str, Any]]]) -> int:
    return sum(baseline_estimate(messages) for messages in lists)


async def compaction_lists(
    manager: SimpleContextManager, budget: int
) -> tuple[list[list[dict[str, Any]]], int]:
    """The working lists the existing module re-estimates in a compaction request.

    Replays our ladder rung by rung on ``manager``'s uncompacted history (nothing is
    committed). Returns the lists (see the module docstring) and the level reached.
    """
    # the store's own planning and ladder (private: the benchmark replays its internals)
    plan = await manager._plan_request(
        token_budget=budget, provider=None, retain=(), hard_fit=False
    )
    whole = [e.stored for e in manager._history.entries if e.public is not None]
    systems = [e.public for e in manager._history.entries if e.kind == SYSTEM and e.public]
    ladder = run_through(manager._policy.laddering(plan, plan.decisions, target=plan.limits.target))
    lists: list[list[dict[str, Any]]] = [whole, whole]  # trigger, old_tokens
    for rung in range(1, RUNG_COUNT + 1):
        if ladder.fits:
            break
        if rung < RUNG_COUNT:  # levels 1-7: a wave baseline or a removal pass precompute
            lists.append(systems + [item.message for item in ladder.view_items()])
        run_through(ladder.applying(rung))
    lists.append(systems + [item.message for item in ladder.view_items()])
    return lists, ladder.level


# -- timing helpers -------------------------------------------------------------------------


Sample = tuple[float, float]
"""(wall-clock seconds, CPU seconds of this process)."""


def _timed_sync(fn: Callable[[], object]) -> Sample:
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


async def _timed(fn: Callable[[], Awaitable[T]]) -> tuple[Sample, T]:
    """``((wall seconds, CPU seconds), result)`` of one awaited call, after ``gc.collect()``."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    result = await fn()
    return (time.perf_counter() - start, time.process_time() - cpu), result


# -- the measurements --------------------------------------------------------------------------


async def _admit(messages: Sequence[dict[str, Any]]) -> SimpleContextManager:
    manager = SimpleContextManager()
    for message in messages:
        await manager.add_message(message)
    return manager  # noqa: ASYNC910 - timed: no checkpoint of its own (the loop has them)


async def _instant_count(view: list[dict[str, Any]]) -> dict[str, Any]:
    count = 1_000
    return {  # noqa: ASYNC910 - the module's own cost: a count that answers at once
        "dispatch": None,
        "budget_decision": {
            "estimated_input_tokens": count,
            "input_limit_tokens": 10**9,
            "context_token_budget": 10**9,
            "measurement": {
                "kind": "provider_count",
                "source": "bench.instant",
                "input_tokens": count,
            },
        },
    }


def _shallow_copies(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(message) for message in messages]


def _follow_up(i: int) -> dict[str, Any]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"follow-up {i}: " + "ok " * 30,
    }


async def measure(sizes: Sequence[int], reps: Repeats) -> list[SizeResult]:
    """Every figure for every size (see the module docstring)."""
    sessions = {n: histories.history(n) for n in sizes}
    samples: dict[str, dict[int, list[Sample]]] = {k: {n: [] for n in sizes} for k in METRICS}

    # admission (the last manager of each size serves the steady state)
    managers: dict[int, SimpleContextManager] = {}
    for _ in range(reps.admission):
        for n in sizes:
            managers.pop(n, None)
            elapsed, managers[n] = await _timed(partial(_admit, sessions[n]))
            samples["admission"][n].append(elapsed)
    tokens = {n: sum(e.tokens for e in managers[n]._history.entries) for n in sizes}

    # session resume: a fresh set_messages next to json.dumps of the same list, then an
    # extending set_messages (+1 message) and one add_message on the resumed store
    for round_ in range(reps.admission):
        for n in sizes:
            messages = sessions[n]
            samples["json_dumps"][n].append(_timed_sync(partial(json.dumps, messages)))
            resumed = SimpleContextManager()
            elapsed, _ = await _timed(partial(resumed.set_messages, messages))
            samples["set_messages"][n].append(elapsed)
            extended = [*messages, _follow_up(2 * round_)]
            elapsed, _ = await _timed(partial(resumed.set_messages, extended))
            samples["extend"][n].append(elapsed)
            assert len(resumed._history) == n + 1
            elapsed, _ = await _timed(partial(resumed.add_message, _follow_up(2 * round_ + 1)))
            samples["add_one"][n].append(elapsed)
            # the re-set pattern of an orchestrator that holds no list of its own
            elapsed, got = await _timed(resumed.get_messages)
            samples["get_messages"][n].append(elapsed)
            got.append(_follow_up(2 * round_ + 2))
            elapsed, _ = await _timed(partial(resumed.set_messages, got))
            samples["extend_stored"][n].append(elapsed)
            assert len(resumed._history) == n + 3
            del resumed, got
            # The floor of any comparison by content: the store keeps its own top-level
            # and metadata dicts (the caller may edit its own in place), so deciding that
            # the caller's list starts with the history reads each caller dict against
            # the store's once. One C-level list == against shallow copies is that read.
            copies = [copy_message(message) for message in messages]
            samples["compare_floor"][n].append(_timed_sync(partial(eq, messages, copies)))
            del copies

    # steady state, ours and (interleaved, in the first rounds) the baseline on the stored
    # messages (metadata with _seq and timestamp, as the existing module stores them)
    big = {n: tokens[n] * STEADY_BUDGET_FACTOR for n in sizes}
    stored = {n: await managers[n].get_messages() for n in sizes}
    for n in sizes:
        await managers[n].get_messages_for_request(token_budget=big[n])  # first-request one-offs
    for i in range(reps.steady):
        for n in sizes:
            manager = managers[n]
            elapsed, view = await _timed(partial(manager.get_messages_for_request, big[n]))
            samples["steady"][n].append(elapsed)
            assert manager.last_compaction_stats is None and len(view) == n
            # the machine's own scaling for work of this shape: a new dict per message
            samples["view_copy"][n].append(_timed_sync(partial(_shallow_copies, view)))
            del view
            if i < reps.baseline:
                samples["steady_base"][n].append(_timed_sync(partial(baseline_request, stored[n])))
    stored.clear()

    # a negotiated request that needs no compaction (the module's own cost: count_view
    # answers at once with a count far below the trigger)
    for n in sizes:
        managers[n].token_meter = "actual"
    for _ in range(reps.negotiated):
        for n in sizes:
            manager = managers[n]
            elapsed, result = await _timed(
                partial(
                    manager.get_measured_request_view,
                    provider=None,
                    retain_contents=[],
                    count_view=_instant_count,
                )
            )
            samples["negotiated"][n].append(elapsed)
            assert result["outcome"] == "not_needed" and len(result["base_view"]) == n
            del result
    for n in sizes:
        managers[n].token_meter = "estimate"

    # the lists the baseline re-estimates in a compaction request
    lists_count: dict[int, int] = {}
    levels: dict[int, int] = {}
    half = {n: int(tokens[n] * COMPACTION_BUDGET_FRACTION) for n in sizes}
    for n in sizes:
        lists, levels[n] = await compaction_lists(managers[n], half[n])
        lists_count[n] = len(lists)
        for _ in range(reps.reestimation):
            samples["reestimation"][n].append(_timed_sync(partial(baseline_reestimations, lists)))
        del lists
    managers.clear()

    # first compaction on fresh managers
    fresh: dict[int, SimpleContextManager] = {}
    compacted: dict[int, int] = {}
    for _ in range(reps.compaction):
        for n in sizes:
            fresh.pop(n, None)
            manager = SimpleContextManager()
            await manager.set_messages(sessions[n])
            elapsed, view = await _timed(partial(manager.get_messages_for_request, half[n]))
            samples["compaction"][n].append(elapsed)
            stats = manager.last_compaction_stats
            assert stats is not None and stats["strategy_level"] == levels[n], (stats, levels[n])
            compacted[n] = len(view)
            fresh[n] = manager
            del view

    # sticky reuse: one new message between requests, no new compaction; the baseline
    # (interleaved, in the first rounds) on the view just returned
    committed = {n: fresh[n].last_compaction_stats for n in sizes}
    sticky_view: dict[int, int] = {}
    for i in range(reps.sticky):
        for n in sizes:
            manager = fresh[n]
            await manager.add_message(_follow_up(i))
            elapsed, view = await _timed(partial(manager.get_messages_for_request, half[n]))
            samples["sticky"][n].append(elapsed)
            sticky_view[n] = len(view)
            if i < reps.baseline:
                samples["sticky_base"][n].append(_timed_sync(partial(baseline_request, view)))
            del view
    for n in sizes:
        assert fresh[n].last_compaction_stats is committed[n], "a sticky request compacted again"
    fresh.clear()

    results: list[SizeResult] = []
    for n in sizes:
        history_mem, request_mem, base_request_mem = await measure_memory(sessions[n], big[n])
        results.append(
            SizeResult(
                n=n,
                json_mb=histories.text_bytes(sessions[n]) / 1e6,
                tokens=tokens[n],
                wall={k: statistics.median(w for w, _ in v[n]) for k, v in samples.items()},
                cpu={k: statistics.median(c for _, c in v[n]) for k, v in samples.items()},
                compaction_level=levels[n],
                compaction_view=compacted[n],
                reestimations=lists_count[n],
                sticky_view=sticky_view[n],
                history_mem=history_mem,
                request_mem=request_mem,
                base_request_mem=base_request_mem,
            )
        )
    return results  # noqa: ASYNC910 - the benchmark's only task: nothing cancels it


async def measure_memory(messages: Sequence[dict[str, Any]], budget: int) -> tuple[int, int, int]:
    """(history bytes, extra bytes of one steady request, extra bytes of a baseline one)."""
    blob = json.dumps(list(messages))
    gc.collect()
    tracemalloc.start()
    try:
        decoded = json.loads(blob)
        manager = await _admit(decoded)
        del decoded
        gc.collect()
        history_mem = tracemalloc.get_traced_memory()[0]
        await manager.get_messages_for_request(token_budget=budget)  # first-request one-offs
        stored = await manager.get_messages()
        gc.collect()

        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        view = await manager.get_messages_for_request(token_budget=budget)
        request_mem = tracemalloc.get_traced_memory()[1] - before
        del view
        gc.collect()

        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        base_view = baseline_request(stored)
        base_request_mem = tracemalloc.get_traced_memory()[1] - before
        del base_view, stored, manager
    finally:
        tracemalloc.stop()
    return history_mem, request_mem, base_request_mem


def prepare(sizes: Sequence[int] = SIZES) -> None:
    """Build the histories, then move every object alive so far out of the collector's
    reach (``gc.freeze``): the benchmark's own data must not make ``gc.collect()`` (run
    before every timed sample) or the collections inside a sample slower."""
    for n in sizes:
        histories.history(n)
    gc.collect()
    gc.freeze()


def run(sizes: Sequence[int] = SIZES, reps: Repeats | None = None) -> list[SizeResult]:
    prepare(sizes)
    return asyncio.run(measure(sizes, reps or Repeats()))


__all__ = [
    "METRICS",
    "SIZES",
    "Repeats",
    "SizeResult",
    "baseline_estimate",
    "baseline_request",
    "compaction_lists",
    "measure",
    "prepare",
    "run",
]
