"""The loop's side of the measured (negotiated) path (docs/design.md section 5.4).

``Negotiation`` holds one request's callbacks for ``context.measured_request_view``:

- ``count_view(view)`` builds the complete ``ChatRequest`` for a candidate view, asks
  ``provider.request_budget`` for a decision and returns ``{"dispatch": request,
  "budget_decision": decision}``. A ``None`` decision is passed through (the context then
  treats the count as unavailable); a malformed one raises ``ContextLengthError``.
- ``fit_output(view, attempt)`` walks the output-cap ladder (``output_cap_candidates``):
  each candidate is a deep copy of the counted request with a smaller
  ``max_output_tokens`` (and, below 10,000, a degraded-context system reminder), counted
  again; the first that fits is returned as ``{"dispatch", "budget_decision",
  "count_calls"}``, None when none fits. Cancellation is checked before and after every
  count and raises ``FitCancelled``.
- ``checked_dispatch(result)`` validates the getter's result envelope and returns the
  exact request to dispatch with its decision; a known oversize request raises
  ``ContextLengthError``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from amplifier_core.llm_errors import ContextLengthError
from amplifier_core.message_models import ChatRequest, Message

from .messages import build_request

OUTPUT_CAP_FACTORS = (0.50, 0.40, 0.30, 0.20, 0.10)
OUTPUT_CAP_FLOOR = 1_000
DEGRADED_BELOW = 10_000
DEGRADED_REMINDER = (
    '<system-reminder source="orchestrator-context-degraded">\n'
    "The answer budget for this request was reduced to {cap} tokens so that the required "
    "conversation fits the model's input limit. Answer concisely.\n"
    "</system-reminder>"
)
REQUIRED_DECISION_KEYS = ("estimated_input_tokens", "input_limit_tokens", "context_token_budget")

View = Sequence[Mapping[str, Any]]


class FitCancelled(BaseException):
    """Raised out of ``fit_output`` when the session is cancelled mid-ladder."""


def output_cap_candidates(original: int | None) -> list[int]:
    """Strictly decreasing output caps to try: 50/40/30/20/10 % of ``original``, then 1000.

    None or <= 1000 gives no candidates (there is nothing to give back).
    """
    if original is None or original <= OUTPUT_CAP_FLOOR:
        return []
    caps: list[int] = []
    last = original
    for factor in OUTPUT_CAP_FACTORS:
        cap = max(OUTPUT_CAP_FLOOR, int(original * factor))
        if cap < last:
            caps.append(cap)
            last = cap
    if last > OUTPUT_CAP_FLOOR:
        caps.append(OUTPUT_CAP_FLOOR)
    return caps


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_decision(decision: Any) -> dict[str, Any] | None:
    """None passes through; otherwise the decision must carry the three required ints."""
    if decision is None:
        return None
    if not isinstance(decision, Mapping):
        raise ContextLengthError("Provider budget decision is not a mapping")
    for key in REQUIRED_DECISION_KEYS:
        if not _is_count(decision.get(key)):
            raise ContextLengthError(f"Provider budget decision has no valid {key}")
    return dict(decision)


def usable_count(decision: Mapping[str, Any] | None) -> int | None:
    """The provider's input count when the decision carries a usable measurement."""
    if decision is None:
        return None
    measurement = decision.get("measurement")
    if not isinstance(measurement, Mapping) or measurement.get("kind") != "provider_count":
        return None
    source, tokens = measurement.get("source"), measurement.get("input_tokens")
    if not isinstance(source, str) or not source or not _is_count(tokens):
        return None
    return tokens if decision["estimated_input_tokens"] >= tokens else None


def accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` takes ``name`` by keyword (explicitly or via ``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return True
        if parameter.name == name and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY:
            return True
    return False


async def maybe_await(value: Any) -> Any:
    """``await value`` when it is awaitable, else ``value``."""
    if inspect.isawaitable(value):
        return await value
    return value  # noqa: ASYNC910 - a plain value: nothing to await, no cancellation point


class Negotiation:
    """The callbacks for one measured request (see the module contract)."""

    def __init__(
        self,
        provider: Any,
        *,
        estimate: Callable[[View], int | None],
        max_output_tokens: int | None,
        is_cancelled: Callable[[], bool],
    ) -> None:
        self.provider = provider
        self.estimate = estimate
        self.max_output_tokens = max_output_tokens
        self.is_cancelled = is_cancelled
        self.fit_calls = 0

    async def _count(
        self, request: ChatRequest, view: View, options: Mapping[str, Any] | None
    ) -> dict[str, Any] | None:
        kwargs: dict[str, Any] = {"context_estimate": self.estimate(view)}
        if options is not None:
            kwargs["request_options"] = dict(options)
        decision = await maybe_await(self.provider.request_budget(request, **kwargs))
        return validate_decision(decision)

    async def count_view(self, view: View) -> dict[str, Any]:
        """Build and count the complete request for ``view``."""
        request = build_request(view, max_output_tokens=self.max_output_tokens)
        decision = await self._count(request, view, None)
        return {"dispatch": request, "budget_decision": decision}

    async def fit_output(self, view: View, attempt: Mapping[str, Any]) -> dict[str, Any] | None:
        """Try smaller output caps until the counted request fits (None: none does)."""
        self.fit_calls += 1
        dispatch = attempt.get("dispatch")
        if not isinstance(dispatch, ChatRequest):
            raise ContextLengthError("measured output fitting needs a ChatRequest dispatch")
        if usable_count(validate_decision(attempt.get("budget_decision"))) is None:
            raise ContextLengthError("measured output fitting needs a usable provider count")
        for calls, cap in enumerate(output_cap_candidates(dispatch.max_output_tokens), 1):
            self._check_cancelled()
            candidate = _with_output_cap(dispatch, cap)
            decision = await self._count(candidate, view, {"max_output_tokens": cap})
            self._check_cancelled()
            if usable_count(decision) is None or decision is None:
                raise ContextLengthError(
                    "Provider count became unavailable during measured output fitting"
                )
            if decision.get("max_output_tokens") != cap:
                raise ContextLengthError("Provider did not honor the measured output cap")
            if decision["estimated_input_tokens"] <= decision["input_limit_tokens"]:
                return {"dispatch": candidate, "budget_decision": decision, "count_calls": calls}
        return None  # noqa: ASYNC910 - no smaller cap to count (no provider call)

    def _check_cancelled(self) -> None:
        if self.is_cancelled():
            raise FitCancelled("cancelled during measured output fitting")


def _with_output_cap(request: ChatRequest, cap: int) -> ChatRequest:
    candidate = request.model_copy(deep=True, update={"max_output_tokens": cap})
    if cap < DEGRADED_BELOW:
        leading = 0
        while leading < len(candidate.messages) and candidate.messages[leading].role == "system":
            leading += 1
        reminder = Message(role="system", content=DEGRADED_REMINDER.format(cap=cap))
        candidate.messages.insert(leading, reminder)
    return candidate


def checked_dispatch(result: Any) -> tuple[ChatRequest, dict[str, Any] | None, dict[str, Any]]:
    """The request to dispatch, its decision and the envelope, from a getter result."""
    if not isinstance(result, Mapping):
        raise ContextLengthError("measured request view returned no result envelope")
    attempt = result.get("final_attempt")
    if not isinstance(attempt, Mapping) or not isinstance(attempt.get("dispatch"), ChatRequest):
        raise ContextLengthError("measured request view returned no ChatRequest dispatch")
    decision = validate_decision(attempt.get("budget_decision"))
    if decision is not None and decision["estimated_input_tokens"] > decision["input_limit_tokens"]:
        raise ContextLengthError("Provider request exceeds its input budget at measured dispatch")
    return attempt["dispatch"], decision, dict(result)
