"""Baseline runs: a trimmer (``trimmers``) replayed on the requests of a module run, its
views counted and billed like the module's so the two compare at the same budget.

``replay_sliding_window`` (per-request trim to ``target_usage`` x B, or F x B),
``replay_hysteresis`` (trim only over B, to F x B) and ``replay_equal_context`` (the
per-request target that keeps as much context as the module) all go through
``replay_trimmer`` and ``baseline_run``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..testing.thinking_oracle import PrefixLedger
from .bill import cache_use, keyed_view
from .runs import RequestRecord, Run, new_record
from .transcript import Transcript, request_histories
from .trimmers import EQUAL_CONTEXT_TOLERANCE, equal_context_target, memoized, trimmed_views

__all__ = (
    "baseline_run",
    "replay_equal_context",
    "replay_hysteresis",
    "replay_sliding_window",
    "replay_trimmer",
)


def baseline_run(
    module_run: Run,
    histories: Sequence[Sequence[Mapping[str, Any]]],
    views: Iterable[Sequence[Mapping[str, Any]]],
    *,
    name: str,
    description: str,
) -> Run:
    """A baseline's ``Run``: its ``views`` of ``histories`` billed like ``module_run``
    (same budget, prices and measure), its requests made at the same times: where a
    request of ``module_run`` found the cache expired (``CacheUse.expired``), the same
    request of the baseline does too.

    Raises:
        ValueError: ``module_run``'s cache expired, and its requests are not as many as
            ``histories``.
    """
    measure = memoized(module_run.measure)
    cold = [record.cache.expired for record in module_run.records]
    timed = any(cold)
    if timed and len(cold) != len(histories):
        raise ValueError(
            f"{len(histories)} histories for the {len(cold)} timed requests of {module_run.name}"
        )
    records: list[RequestRecord] = []
    previous: list[tuple[str, int]] | None = None
    ledger = PrefixLedger()
    answered: tuple[Sequence[Mapping[str, Any]], int] | None = None
    for history, view in zip(histories, views, strict=True):
        if answered is not None and len(history) > answered[1]:
            # the message after the last request's history answered that request's view
            answer = history[answered[1]]
            if answer.get("role") == "assistant":
                ledger.answered(answered[0], answer)
        keyed = keyed_view(view, measure)
        tokens = sum(map(measure, history))
        verdict = ledger.check(view)
        record = new_record(len(records) + 1, len(history), tokens, keyed, None, previous, verdict)
        if timed and cold[len(records)]:
            record = dataclasses.replace(record, cache=cache_use(previous, keyed, expired=True))
        records.append(record)
        previous = keyed
        answered = (view, len(history))
    return dataclasses.replace(module_run, name=name, records=records, baseline=description)


def replay_trimmer(
    transcript: Transcript,
    module_run: Run,
    *,
    name: str,
    trigger: float,
    target: float,
    description: str,
) -> Run:
    """A trimmer (``trimmed_views``) on the requests of ``module_run``'s replay: the same
    admitted messages (after the module's tool-result ingress cap), counted and billed
    with ``module_run``'s measure and prices."""
    histories = request_histories(transcript, module_run.config)
    views = trimmed_views(histories, trigger=trigger, target=target, measure=module_run.measure)
    return baseline_run(module_run, histories, views, name=name, description=description)


def replay_sliding_window(
    transcript: Transcript,
    module_run: Run,
    *,
    name: str = "sliding",
    fraction: float | None = None,
) -> Run:
    """The per-request trimmer at ``fraction`` x ``module_run``'s effective budget; without
    ``fraction``, at the module's compaction target, ``target_usage`` x budget."""
    budget: int = module_run.budget["effective_budget"]
    if fraction is None:
        target = int(budget * module_run.config.target_usage)
        what = f"target_usage x budget = {target:,}"
    else:
        target = int(budget * fraction)
        what = f"{fraction:g} x budget = {target:,}"
    description = f"sliding window to {what} (per-request trim)"
    return replay_trimmer(
        transcript, module_run, name=name, trigger=target, target=target, description=description
    )


def replay_hysteresis(
    transcript: Transcript, module_run: Run, fraction: float, *, name: str
) -> Run:
    """The trimmer with hysteresis (``hysteresis_views``) at ``module_run``'s effective
    budget B: it trims only when the view would exceed B, to ``fraction`` x B."""
    budget: int = module_run.budget["effective_budget"]
    target = int(budget * fraction)
    description = (
        f"hysteresis: sends all since its last trim; over budget {budget:,} "
        f"trims to {fraction:g} x budget = {target:,}"
    )
    return replay_trimmer(
        transcript, module_run, name=name, trigger=budget, target=target, description=description
    )


def replay_equal_context(transcript: Transcript, module_run: Run, *, name: str = "equal") -> Run:
    """The per-request trimmer whose target makes its mean view tokens equal
    ``module_run``'s (``equal_context_target``): the bill at equal context. Its description
    gives both means and whether they are within ``EQUAL_CONTEXT_TOLERANCE``."""
    histories = request_histories(transcript, module_run.config)
    wanted = module_run.mean_view_tokens
    target, got = equal_context_target(histories, wanted, module_run.measure)
    gap = (got - wanted) / wanted if wanted else 0.0
    verdict = (
        "" if abs(gap) <= EQUAL_CONTEXT_TOLERANCE else f", NOT within {EQUAL_CONTEXT_TOLERANCE:.0%}"
    )
    description = (
        f"sliding window to {target:,} (per-request trim), the target whose mean view "
        f"{got:,.1f} is closest to {module_run.name}'s {wanted:,.1f} ({gap:+.2%}{verdict})"
    )
    views = trimmed_views(histories, trigger=target, target=target, measure=module_run.measure)
    return baseline_run(module_run, histories, views, name=name, description=description)
