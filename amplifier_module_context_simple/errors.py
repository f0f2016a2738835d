"""The errors this package raises. One class per failure; each docstring says when.

Fail-closed request errors subclass amplifier-core's ``ContextLengthError`` so that
orchestrators catching the kernel's class catch ours. amplifier-core is host-provided;
when it is not importable (a bare install used outside a host) a local stand-in with the
same constructor is used so the module still imports and reports errors clearly.
"""

from __future__ import annotations

from typing import Any

try:
    from amplifier_core.llm_errors import ContextLengthError
except ImportError:  # pragma: no cover - amplifier-core is host-provided

    class ContextLengthError(Exception):  # type: ignore[no-redef]  # stand-in when absent
        """Stand-in for ``amplifier_core.llm_errors.ContextLengthError``."""

        def __init__(self, message: str, **_: Any) -> None:
            super().__init__(message)


__all__ = (
    "ContextLengthError",
    "CountContractError",
    "InvalidMessageError",
    "ProviderLimitError",
    "RequiredContentTooLargeError",
    "RetainedContentMissingError",
    "TokenMeterError",
    "TransactionConflictError",
    "TransactionStateError",
)


class InvalidMessageError(ValueError):
    """Raised when a message offered for admission has the wrong shape.

    Nothing is admitted when this is raised (for ``set_messages``: the whole batch is
    rejected and the previous history stays).
    """

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        self.index = index
        self.reason = reason
        where = f"message {index}: " if index is not None else ""
        super().__init__(f"{where}{reason}")


class RetainedContentMissingError(ContextLengthError, ValueError):
    """Raised when a request names a retained body that no admitted envelope carries.

    Both a ``ContextLengthError`` (the kernel's class, which orchestrators catch for every
    request that cannot fit) and a ``ValueError`` (what older callers caught), so either
    ``except`` clause works.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)


class RequiredContentTooLargeError(ContextLengthError):
    """Raised when protected/required content alone cannot fit the request budget.

    ``required`` (also ``estimated``) is our estimate of what had to be sent, ``budget``
    (also ``limit``) the budget it had to fit, ``rung`` the deepest reduction reached
    (0 before compaction; 9 once the protected floor itself was reduced) and ``reason``
    a short code: ``"required_over_budget"`` (checked before compaction),
    ``"hard_fit_over_budget"`` or ``"final_over_budget"`` (the view with its notice).
    The canonical history and every committed decision are unchanged.
    """

    def __init__(
        self,
        message: str,
        *,
        budget: int | None = None,
        required: int | None = None,
        rung: int = 0,
        reason: str = "required_over_budget",
    ):
        super().__init__(message)
        self.budget = budget
        self.required = required
        self.rung = rung
        self.reason = reason

    @property
    def estimated(self) -> int | None:
        return self.required

    @property
    def limit(self) -> int | None:
        return self.budget


class CountContractError(TypeError):
    """Raised when ``count_view`` or ``fit_output`` returns a malformed envelope."""


class TransactionStateError(RuntimeError):
    """Raised when a transaction event is illegal in the transaction's current state.

    The transaction and the store are unchanged when this is raised.
    """

    def __init__(self, event: str, state: str) -> None:
        self.event = event
        self.state = state
        super().__init__(f"can't {event} when state={state}")


class TransactionConflictError(RuntimeError):
    """Raised when the store moved under a request that was planned against it.

    By the synchronous commit step (``ContextStore._commit``) when another commit,
    ``set_messages`` or ``clear`` came since the request was planned, and by a negotiation
    whose history was replaced while it was planned or counted. The orchestrator-facing
    ``commit()`` reports the first case as ``False`` instead; see
    ``RequestTransaction.commit``.
    """


class TokenMeterError(RuntimeError):
    """Raised when a negotiated (measured) request is asked of a store whose
    ``token_meter`` is not ``"actual"``: only such a store negotiates provider counts."""


class ProviderLimitError(ContextLengthError):
    """Raised when a negotiated request cannot fit the provider's input limit.

    ``estimated`` and ``limit`` are the provider's figures for the last request counted
    (None when unknown), ``rung`` the deepest reduction reached (0-8; 9 once the protected
    floor itself was reduced) and ``reason`` a short code: ``"oversize_unmeasured"``,
    ``"recount_unavailable"`` or ``"irreducible_over_limit"`` (docs/design.md section 9).
    A ``fit_output`` result still over the limit is not an error: the protected floor is
    reduced instead.
    Nothing staged is kept when this is raised.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        estimated: int | None = None,
        limit: int | None = None,
        rung: int = 0,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.estimated = estimated
        self.limit = limit
        self.rung = rung
