"""What the orchestrator's seams return, read and checked: ``count_view`` envelopes
(``{dispatch, budget_decision}``) and ``fit_output`` results.

Garbage from a seam is a ``CountContractError`` (a ``TypeError``) naming the problem; a
well-formed decision without a usable provider count is ``Unmeasured`` (the negotiation
then falls back to our estimate). Nothing here awaits or touches the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._values import int_at_least
from ..context.policy.negotiable import Candidate
from ..errors import CountContractError

__all__ = (
    "Attempt",
    "CountView",
    "Decision",
    "FitOutput",
    "Fitted",
    "Measured",
    "Unmeasured",
    "check_seams",
    "read_decision",
    "read_fitted",
)

CountView = Callable[[list[dict[str, Any]]], Awaitable[Any]]
FitOutput = Callable[[list[dict[str, Any]], Any], Awaitable[Any]]


def _count(value: object) -> int | None:
    """A non-negative integer (never a bool), else None."""
    return int_at_least(value, 0)


@dataclass(frozen=True, slots=True)
class Measured:
    """A ``budget_decision`` with a usable provider count."""

    count: int
    """The provider's measured input count."""
    estimated: int
    """The provider's hard-safe input estimate (``estimated_input_tokens``, >= count)."""
    limit: int
    """The provider's hard input limit (``input_limit_tokens``)."""
    source: str

    @property
    def oversize(self) -> bool:
        """Known to exceed the provider's hard input limit."""
        return self.estimated > self.limit


@dataclass(frozen=True, slots=True)
class Unmeasured:
    """A ``budget_decision`` without a usable count (``estimated``/``limit`` are None when
    there was no decision at all)."""

    estimated: int | None = None
    limit: int | None = None

    @property
    def oversize(self) -> bool:
        return self.estimated is not None and self.limit is not None and self.estimated > self.limit


Decision = Measured | Unmeasured


def read_decision(envelope: object) -> Decision:
    """Validate a ``{dispatch, budget_decision}`` envelope.

    Raises:
        CountContractError: the envelope or decision is malformed (a ``TypeError``).
    """
    if not isinstance(envelope, Mapping) or "dispatch" not in envelope:
        raise CountContractError("count_view must return {dispatch, budget_decision}")
    decision = envelope.get("budget_decision")
    if decision is None:
        return Unmeasured()
    if not isinstance(decision, Mapping):
        raise CountContractError(
            f"budget_decision must be a dict or None, got {type(decision).__name__}"
        )
    estimated = _count(decision.get("estimated_input_tokens"))
    limit = _count(decision.get("input_limit_tokens"))
    if estimated is None or limit is None:
        raise CountContractError(
            "estimated_input_tokens and input_limit_tokens must be non-negative integers, got "
            f"{decision.get('estimated_input_tokens')!r} and {decision.get('input_limit_tokens')!r}"
        )
    measurement = decision.get("measurement")
    if not isinstance(measurement, Mapping) or measurement.get("kind") != "provider_count":
        return Unmeasured(estimated, limit)
    source = measurement.get("source")
    count = _count(measurement.get("input_tokens"))
    if not isinstance(source, str) or not source or count is None or estimated < count:
        return Unmeasured(estimated, limit)
    return Measured(count, estimated, limit, source)


@dataclass(frozen=True, slots=True)
class Fitted:
    """A decoded ``fit_output`` result."""

    measured: Measured
    calls: int
    """Provider counts ``fit_output`` spent (``count_calls``)."""


def read_fitted(result: object) -> Fitted:
    """Validate a ``fit_output`` result (it may still be over the limit: see ``oversize``).

    Raises:
        CountContractError: malformed result or unusable measurement.
    """
    if not isinstance(result, Mapping) or "dispatch" not in result:
        raise CountContractError("fit_output must return {dispatch, budget_decision, count_calls}")
    calls = _count(result.get("count_calls"))
    if calls is None or calls == 0:
        raise CountContractError(
            f"fit_output count_calls must be a positive integer: {result.get('count_calls')!r}"
        )
    decision = read_decision(result)
    if not isinstance(decision, Measured):
        raise CountContractError("fit_output must return a usable provider_count measurement")
    return Fitted(decision, calls)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One counted candidate: the exact view and envelope, and what the provider said."""

    candidate: Candidate
    envelope: Any
    decision: Decision

    @property
    def view(self) -> list[dict[str, Any]]:
        return self.candidate.view

    @property
    def count(self) -> int | None:
        """The provider's input count, or None when the measurement is unusable."""
        return self.decision.count if isinstance(self.decision, Measured) else None

    @property
    def oversize(self) -> bool:
        return self.decision.oversize


def check_seams(count_view: object, fit_output: object) -> None:
    """Reject seams that are not callable, before anything is planned.

    Raises:
        TypeError: ``count_view`` is not callable, or ``fit_output`` is neither callable
            nor None.
    """
    if not callable(count_view):
        raise TypeError("count_view must be an async callable")
    if fit_output is not None and not callable(fit_output):
        raise TypeError("fit_output must be an async callable or None")
