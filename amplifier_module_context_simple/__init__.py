"""amplifier-module-context-simple: in-memory context with view-only, negotiated compaction.

``mount`` is the Amplifier entry point (group ``amplifier.modules``, name
``context-simple``). Everything else here is a re-export.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .context.config import (
    DEFAULT_MAX_TOKENS_FALLBACK as DEFAULT_MAX_TOKENS_FALLBACK,
)
from .context.config import (
    DEFAULT_MAX_TOOL_RESULT_BYTES as DEFAULT_MAX_TOOL_RESULT_BYTES,
)
from .context.config import TOKEN_METER_ACTUAL as TOKEN_METER_ACTUAL
from .context.config import TOKEN_METER_ESTIMATE as TOKEN_METER_ESTIMATE
from .context.config import ContextConfig as ContextConfig
from .context.config import validated_max_tokens as _validated_max_tokens
from .errors import ContextLengthError as ContextLengthError
from .errors import CountContractError as CountContractError
from .errors import InvalidMessageError as InvalidMessageError
from .errors import ProviderLimitError as ProviderLimitError
from .errors import RequiredContentTooLargeError as RequiredContentTooLargeError
from .errors import RetainedContentMissingError as RetainedContentMissingError
from .errors import TokenMeterError as TokenMeterError
from .errors import TransactionConflictError as TransactionConflictError
from .errors import TransactionStateError as TransactionStateError
from .manager import SimpleContextManager as SimpleContextManager
from .negotiator.transaction import RequestTransaction as RequestTransaction
from .negotiator.transaction import TxnState as TxnState

__amplifier_module_type__ = "context"

__all__ = (
    "DEFAULT_MAX_TOKENS_FALLBACK",
    "DEFAULT_MAX_TOOL_RESULT_BYTES",
    "TOKEN_METER_ACTUAL",
    "TOKEN_METER_ESTIMATE",
    "ContextConfig",
    "ContextLengthError",
    "CountContractError",
    "InvalidMessageError",
    "ProviderLimitError",
    "RequestTransaction",
    "RequiredContentTooLargeError",
    "RetainedContentMissingError",
    "SimpleContextManager",
    "TokenMeterError",
    "TransactionConflictError",
    "TransactionStateError",
    "TxnState",
    "_validated_max_tokens",
    "mount",
)

logger = logging.getLogger(__name__)

METER_HOOK_NAME = "context-simple-meter"
METER_HOOK_PRIORITY = 50


async def mount(
    coordinator: Any, config: dict[str, Any] | None = None
) -> Callable[[], Awaitable[None]]:
    """Mount a ``SimpleContextManager`` at the ``"context"`` mount point.

    Registers the ``llm:response`` meter listener (when the coordinator has hooks) and the
    capabilities ``context.request_retention``, ``context.foreground_usage`` and, only
    with ``token_meter: "actual"``, ``context.measured_request_view``.

    Returns:
        An async cleanup that unregisters the listener; safe to call twice.

    Raises:
        ValueError: invalid configuration (the key and value are named).
    """
    hooks = getattr(coordinator, "hooks", None)
    context = SimpleContextManager.from_config(config, hooks=hooks)
    unregister: Callable[[], Any] | None = None
    if hooks is not None:

        async def on_llm_response(event: str, data: Any) -> None:
            await context.on_llm_response(event, data)

        unregister = hooks.register(
            "llm:response",
            on_llm_response,
            priority=METER_HOOK_PRIORITY,
            name=METER_HOOK_NAME,
        )
    await coordinator.mount("context", context)
    register = getattr(coordinator, "register_capability", None)
    if callable(register):
        register("context.request_retention", context.get_messages_for_request_retaining)
        register("context.foreground_usage", context.claim_foreground_usage)
        if context.token_meter == TOKEN_METER_ACTUAL:
            register("context.measured_request_view", context.get_measured_request_view)
    logger.info("Mounted SimpleContextManager (token_meter=%r)", context.token_meter)

    async def cleanup() -> None:  # noqa: ASYNC910 - teardown must not be cancellable halfway
        nonlocal unregister
        if unregister is not None:
            callback, unregister = unregister, None
            callback()

    return cleanup
