"""``SimpleContextManager``: the context store with the request negotiator wired in.

The two parts of the design stay apart: ``context`` (the store and its policy) never
imports ``negotiator``, and the negotiator reaches the store only through the seam the
store hands out per request (``context.negotiable.Negotiable``). This module composes
them into the class orchestrators mount.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .context.config import TOKEN_METER_ACTUAL
from .context.store import ContextStore
from .errors import TokenMeterError
from .negotiator.driver import negotiate
from .negotiator.envelopes import check_seams

__all__ = ("SimpleContextManager",)


class SimpleContextManager(ContextStore):
    """In-memory conversation context with view-only, transactional compaction.

    Constructor keywords are the configuration keys (see ``ContextConfig``) plus
    ``hooks``. Invalid values raise ``ValueError`` naming the key and value, except an
    unknown ``token_meter`` (warns, uses ``"estimate"``) and an invalid ``max_tokens``
    (warns, no cap).
    """

    async def get_measured_request_view(
        self,
        *,
        provider: Any,
        retain_contents: Sequence[str],
        count_view: Callable[[list[dict[str, Any]]], Awaitable[Any]],
        fit_output: Callable[[list[dict[str, Any]], Any], Awaitable[Any]] | None = None,
    ) -> dict[str, Any]:
        """Capability ``context.measured_request_view`` (``token_meter: "actual"`` only).

        The orchestrator's ``count_view(view)`` builds and counts the complete request and
        returns ``{"dispatch", "budget_decision"}``. Returns the result envelope
        ``{base_view, final_attempt, outcome, measured_before, measured_after,
        policy_budget, trigger, target, count_calls, transaction}``; ``outcome`` is one of
        ``not_needed | target_reached | protected_floor | reduced_output |
        measurement_unavailable``. Commit the ``transaction`` (a ``RequestTransaction``,
        when not None) immediately before dispatch, or roll it back.

        Raises:
            TokenMeterError: the store is not in ``token_meter: "actual"`` mode (a
                ``RuntimeError``).
            TypeError: a seam is not callable, or ``retain_contents`` is not a list of
                strings.
            CountContractError: ``count_view``/``fit_output`` returned a malformed envelope.
            ProviderLimitError: the request cannot fit (a ``ContextLengthError``); nothing
                staged is kept.
            TransactionConflictError: the history was replaced while the request was
                being planned or counted; nothing is kept.
        """
        if self.token_meter != TOKEN_METER_ACTUAL:
            raise TokenMeterError("measured request views require token_meter='actual'")
        check_seams(count_view, fit_output)
        seam = await self._open_negotiation(provider, retain_contents)
        return await negotiate(seam, count_view=count_view, fit_output=fit_output)
