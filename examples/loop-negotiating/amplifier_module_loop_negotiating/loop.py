"""``NegotiatingLoop``: one user turn = model calls and scripted tool runs until a final answer.

Three request paths, chosen by ``mode``:

- ``"legacy"``: ``context.get_messages_for_request(provider=provider)`` only. A provider
  ``ContextLengthError`` ends the turn (an unhandled overflow).
- ``"measured"``: capability ``context.measured_request_view`` with ``provider``,
  ``retain_contents=[]``, ``count_view`` and (only when the getter's signature has it)
  ``fit_output``. The returned transaction is committed immediately before dispatch and
  rolled back on any failure between the getter's return and the dispatch. Without the
  capability, or with a provider that cannot count, the loop says so (``degraded``) and
  uses the legacy path.
- ``"hardfit"``: capability ``context.request_retention`` with ``retain_contents=[]``; on a
  provider ``ContextLengthError`` it asks ``provider.recover_context_overflow`` for a target,
  rebuilds once with ``hard_fit=True, token_budget=<context_token_budget>`` and retries once.

``ContextLengthError`` is caught inside the loop (``RustSession`` would wrap it beyond
recognition): the turn ends with a ``[turn failed: ...]`` answer and the row records it.
Every provider request appends a ``RequestRow`` to ``rows``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amplifier_core.llm_errors import ContextLengthError
from amplifier_core.message_models import ChatRequest, ChatResponse, TextBlock, ToolCall

from .messages import (
    assistant_message,
    build_request,
    result_messages,
    rough_estimate,
    to_message,
)
from .negotiation import (
    FitCancelled,
    Negotiation,
    View,
    accepts_keyword,
    checked_dispatch,
    maybe_await,
    validate_decision,
)
from .records import EventLog, RequestRow

MODES = ("legacy", "measured", "hardfit")
MEASURED_CAPABILITY = "context.measured_request_view"
RETENTION_CAPABILITY = "context.request_retention"
PROVIDER_COUNT_CAPABILITY = "request_budget:provider_count"


class TurnCancelled(Exception):
    """The session was cancelled before a staged request could be dispatched."""


@dataclass(frozen=True)
class LoopSettings:
    """Validated orchestrator configuration."""

    mode: str = "legacy"
    max_iterations: int = 8
    provider: str | None = None
    script_capability: str = "example.conversation_script"

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> LoopSettings:
        """Read and validate ``config``; bad values raise ``ValueError`` naming the key."""
        config = dict(config or {})
        mode = config.get("mode", cls.mode)
        if mode not in MODES:
            raise ValueError(f"loop-negotiating: mode must be one of {MODES}, got {mode!r}")
        iterations = config.get("max_iterations", cls.max_iterations)
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"loop-negotiating: max_iterations must be >= 1, got {iterations!r}")
        provider = config.get("provider")
        return cls(
            mode=mode,
            max_iterations=iterations,
            provider=None if provider is None else str(provider),
            script_capability=str(config.get("script_capability", cls.script_capability)),
        )


class HistoryMeter:
    """Token count of the canonical history, counted incrementally (history only grows)."""

    def __init__(self) -> None:
        self.messages = 0
        self.tokens = 0

    async def measure(self, context: Any, provider: Any) -> tuple[int, int]:
        """``(tokens, messages)`` of ``context.get_messages()`` in the provider's units."""
        history = await context.get_messages()
        if len(history) < self.messages:
            self.messages, self.tokens = 0, 0
        fresh = history[self.messages :]
        self.tokens += _count_messages(provider, fresh)
        self.messages = len(history)
        return self.tokens, self.messages


def _count_messages(provider: Any, messages: Sequence[Mapping[str, Any]]) -> int:
    counter = getattr(provider, "count_message_tokens", None)
    if callable(counter):
        return int(counter([to_message(message) for message in messages]))
    return rough_estimate(messages)


def _count_request(provider: Any, request: ChatRequest) -> int | None:
    counter = getattr(provider, "count_request_tokens", None)
    return int(counter(request)) if callable(counter) else None


def _context_level(context: Any) -> int | None:
    for name in ("last_compaction_stats", "_last_compaction_stats"):
        stats = getattr(context, name, None)
        if isinstance(stats, Mapping) and isinstance(stats.get("strategy_level"), int):
            return int(stats["strategy_level"])
    return None


def _response_text(response: ChatResponse) -> str:
    return "".join(block.text for block in response.content if isinstance(block, TextBlock))


def _thinking(response: ChatResponse) -> list[dict[str, Any]]:
    """The response's thinking blocks as stored content blocks, in order."""
    return [
        block.model_dump(exclude_none=True)
        for block in response.content
        if getattr(block, "type", None) in ("thinking", "redacted_thinking")
    ]


def _provider_counts(provider: Any) -> int:
    stats = getattr(provider, "stats", None)
    return int(getattr(stats, "count_calls", 0) or 0)


def _advertises_count(provider: Any) -> bool:
    if not callable(getattr(provider, "request_budget", None)):
        return False
    try:
        capabilities = provider.get_info().capabilities or []
    except Exception:
        return False
    return PROVIDER_COUNT_CAPABILITY in capabilities


def _max_output(provider: Any) -> int | None:
    try:
        value = (provider.get_info().defaults or {}).get("max_output_tokens")
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _emit(hooks: Any, event: str, data: dict[str, Any]) -> None:
    if hooks is None:
        return  # noqa: ASYNC910 - no hooks: nothing to deliver
    await hooks.emit(event, data)


class NegotiatingLoop:
    """The orchestrator (see the module contract)."""

    def __init__(self, coordinator: Any, settings: LoopSettings) -> None:
        self.coordinator = coordinator
        self.settings = settings
        self.events = EventLog()
        self.rows: list[RequestRow] = []
        self.turns = 0
        self.unhandled_overflows = 0
        self.recovered_overflows = 0
        self.context_failures = 0
        self.degraded: str | None = None
        self._history = HistoryMeter()

    @property
    def mode(self) -> str:
        """The configured request path."""
        return self.settings.mode

    async def execute(
        self,
        prompt: str,
        context: Any,
        providers: Mapping[str, Any],
        tools: Mapping[str, Any],
        hooks: Any,
        **kwargs: Any,
    ) -> str:
        """Run one user turn and return the final assistant text (or a failure notice)."""
        coordinator = kwargs.get("coordinator") or self.coordinator
        provider = self._pick_provider(providers)
        self.turns += 1
        await _emit(hooks, "prompt:submit", {"prompt": prompt})
        await context.add_message({"role": "user", "content": prompt})
        text = ""
        for iteration in range(1, self.settings.max_iterations + 1):
            outcome = await self._one_request(iteration, context, provider, hooks, coordinator)
            if isinstance(outcome, str):
                return outcome
            text = _response_text(outcome)
            calls = list(provider.parse_tool_calls(outcome))
            await context.add_message(assistant_message(text, calls, _thinking(outcome)))
            if not calls:
                break
            outputs = [await self._run_tool(call, tools, hooks, coordinator) for call in calls]
            for message in result_messages(calls, outputs):
                await context.add_message(message)
        await _emit(hooks, "orchestrator:complete", {"orchestrator": "loop-negotiating"})
        return text

    # -- one request -------------------------------------------------------------------

    async def _one_request(
        self, iteration: int, context: Any, provider: Any, hooks: Any, coordinator: Any
    ) -> ChatResponse | str:
        """Build, negotiate and dispatch one request; a string means the turn failed."""
        row = await self._start_row(iteration, context, provider)
        try:
            return await self._request(row, context, provider, hooks, coordinator)
        except ContextLengthError as exc:
            return self._failed(row, exc)
        except (TurnCancelled, FitCancelled) as exc:
            row.note = f"cancelled: {exc}"
            return "[turn cancelled]"
        finally:
            self._finish_row(row, context, provider)

    async def _request(
        self, row: RequestRow, context: Any, provider: Any, hooks: Any, coordinator: Any
    ) -> ChatResponse:
        if self.mode == "measured":
            return await self._measured(row, context, provider, hooks, coordinator)
        if self.mode == "hardfit":
            return await self._hardfit(row, context, provider, hooks, coordinator)
        return await self._legacy(row, context, provider, hooks)

    async def _legacy(
        self, row: RequestRow, context: Any, provider: Any, hooks: Any
    ) -> ChatResponse:
        view = await context.get_messages_for_request(provider=provider)
        request = build_request(view, max_output_tokens=_max_output(provider))
        return await self._dispatch(row, provider, request, hooks)

    async def _measured(
        self, row: RequestRow, context: Any, provider: Any, hooks: Any, coordinator: Any
    ) -> ChatResponse:
        getter = coordinator.get_capability(MEASURED_CAPABILITY)
        if not callable(getter) or not _advertises_count(provider):
            self.degraded = (
                f"capability {MEASURED_CAPABILITY!r} is missing"
                if not callable(getter)
                else "the provider does not advertise request_budget:provider_count"
            )
            row.note = "measured unavailable, legacy path"
            return await self._legacy(row, context, provider, hooks)

        def is_cancelled() -> bool:
            return bool(coordinator.cancellation.is_cancelled)

        negotiation = Negotiation(
            provider,
            estimate=self._estimator(context),
            max_output_tokens=_max_output(provider),
            is_cancelled=is_cancelled,
        )
        kwargs: dict[str, Any] = {
            "provider": provider,
            "retain_contents": [],
            "count_view": negotiation.count_view,
        }
        if accepts_keyword(getter, "fit_output"):
            kwargs["fit_output"] = negotiation.fit_output
        result = await getter(**kwargs)
        request = await self._commit_measured(row, result, hooks, is_cancelled)
        return await self._dispatch(row, provider, request, hooks)

    async def _commit_measured(
        self, row: RequestRow, result: Any, hooks: Any, is_cancelled: Callable[[], bool]
    ) -> ChatRequest:
        """Validate the getter's result and commit its transaction; return the request.

        Everything between the getter's return and the dispatch happens here: any failure
        (or cancellation) rolls the transaction back before propagating.
        """
        transaction = result.get("transaction") if isinstance(result, Mapping) else None
        try:
            request, decision, envelope = checked_dispatch(result)
            self._record_negotiation(row, envelope)
            await _emit(hooks, "orchestrator:provider_budget", _budget_event(envelope, decision))
            if transaction is not None and not await transaction.commit(is_cancelled=is_cancelled):
                raise TurnCancelled("the staged compaction did not commit")
        except BaseException:
            if transaction is not None:
                transaction.rollback()
            raise
        return request

    async def _hardfit(
        self, row: RequestRow, context: Any, provider: Any, hooks: Any, coordinator: Any
    ) -> ChatResponse:
        retain = coordinator.get_capability(RETENTION_CAPABILITY)
        view = await self._retained_view(context, provider, retain)
        request = build_request(view, max_output_tokens=_max_output(provider))
        try:
            return await self._dispatch(row, provider, request, hooks)
        except ContextLengthError as error:
            recover = getattr(provider, "recover_context_overflow", None)
            if not (callable(retain) and accepts_keyword(retain, "hard_fit") and callable(recover)):
                raise
            decision = validate_decision(
                await maybe_await(
                    recover(request, error, context_estimate=self._estimator(context)(view))
                )
            )
            if decision is None:
                raise
            budget = decision["context_token_budget"]
            row.note = f"overflow at {row.rejected_tokens}; hard-fit rebuild to {budget}"
            view = await self._retained_view(
                context, provider, retain, token_budget=budget, hard_fit=True
            )
        request = build_request(view, max_output_tokens=_max_output(provider))
        response = await self._dispatch(row, provider, request, hooks)
        row.overflow = "recovered"
        self.recovered_overflows += 1
        return response

    async def _retained_view(
        self,
        context: Any,
        provider: Any,
        retain: Callable[..., Any] | None,
        *,
        token_budget: int | None = None,
        hard_fit: bool = False,
    ) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"provider": provider}
        if token_budget is not None:
            kwargs["token_budget"] = token_budget
        if not callable(retain):
            return list(await context.get_messages_for_request(**kwargs))
        if hard_fit:
            kwargs["hard_fit"] = True
        return list(await retain(retain_contents=[], **kwargs))

    async def _dispatch(
        self, row: RequestRow, provider: Any, request: ChatRequest, hooks: Any
    ) -> ChatResponse:
        row.view_messages = len(request.messages)
        row.view_tokens = _count_request(provider, request)
        await _emit(
            hooks, "provider:request", {"provider": provider.name, "iteration": row.iteration}
        )
        try:
            response: ChatResponse = await provider.complete(request)
        except ContextLengthError:
            row.overflow = "provider"
            row.rejected_tokens = row.view_tokens
            raise
        usage = response.usage.model_dump() if response.usage is not None else None
        await _emit(hooks, "provider:response", {"provider": provider.name, "usage": usage})
        return response

    # -- tools -------------------------------------------------------------------------

    async def _run_tool(
        self, call: ToolCall, tools: Mapping[str, Any], hooks: Any, coordinator: Any
    ) -> str:
        """The scripted output for ``call``; else a mounted tool's; else an error text."""
        await _emit(hooks, "tool:pre", {"tool_name": call.name, "tool_call_id": call.id})
        output = self._scripted_output(call, coordinator)
        if output is None:
            tool = (tools or {}).get(call.name)
            output = await _execute(tool, call) if tool is not None else _unavailable(call)
        await _emit(hooks, "tool:post", {"tool_name": call.name, "tool_call_id": call.id})
        return output

    def _scripted_output(self, call: ToolCall, coordinator: Any) -> str | None:
        script = coordinator.get_capability(self.settings.script_capability)
        scripted = getattr(script, "tool_output", None)
        output = scripted(call.id) if callable(scripted) else None
        return output if isinstance(output, str) else None

    # -- rows --------------------------------------------------------------------------

    async def _start_row(self, iteration: int, context: Any, provider: Any) -> RequestRow:
        self.events.drain()
        tokens, messages = await self._history.measure(context, provider)
        row = RequestRow(
            number=len(self.rows) + 1,
            turn=self.turns,
            iteration=iteration,
            mode=self.mode,
            history_tokens=tokens,
            history_messages=messages,
            window=int(getattr(provider, "context_window", 0) or 0),
            count_calls=-_provider_counts(provider),
        )
        limit = getattr(provider, "input_limit", None)
        if callable(limit) and _max_output(provider) is not None:
            row.input_limit = int(limit(_max_output(provider)))
        self.rows.append(row)
        return row

    def _finish_row(self, row: RequestRow, context: Any, provider: Any) -> None:
        row.count_calls += _provider_counts(provider)
        row.level = _context_level(context)
        for event, label in self.events.drain():
            row.events.append(label)
            row.compactions += event == "context:compaction"
        if not row.outcome:
            row.outcome = "-" if row.level is None else f"level {row.level}"

    def _record_negotiation(self, row: RequestRow, envelope: Mapping[str, Any]) -> None:
        row.outcome = str(envelope.get("outcome", "?"))
        row.measured_after = envelope.get("measured_after")

    def _failed(self, row: RequestRow, error: ContextLengthError) -> str:
        if row.overflow == "provider":
            row.overflow = "unhandled"
            self.unhandled_overflows += 1
        else:
            row.overflow = "context"
            self.context_failures += 1
        row.note = str(error)[:120]
        return f"[turn failed: {error}]"

    # -- helpers -----------------------------------------------------------------------

    def _pick_provider(self, providers: Mapping[str, Any]) -> Any:
        if not providers:
            raise RuntimeError("loop-negotiating: no provider is mounted")
        if self.settings.provider is not None:
            return providers[self.settings.provider]
        return next(iter(providers.values()))

    def _estimator(self, context: Any) -> Callable[[View], int | None]:
        """The ``context_estimate`` to hand the provider, in the context's own units.

        Uses the context's ``estimate_tokens(messages)`` when it exposes one; otherwise
        None (the provider then treats its own count as the context's units) rather than a
        guess in some third unit.
        """
        for name in ("estimate_tokens", "estimate_messages"):
            own = getattr(context, name, None)
            if callable(own):
                return lambda view: _as_int(own(list(view)))
        return lambda view: None


async def _execute(tool: Any, call: ToolCall) -> str:
    """A mounted tool's output for ``call``, as text."""
    result = await tool.execute(dict(call.arguments))
    value = getattr(result, "output", result)
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _unavailable(call: ToolCall) -> str:
    return json.dumps({"error": f"tool {call.name!r} is not available"})


def _as_int(value: Any) -> int | None:
    tokens = getattr(value, "tokens", value)
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def _budget_event(
    envelope: Mapping[str, Any], decision: Mapping[str, Any] | None
) -> dict[str, Any]:
    keys = ("outcome", "measured_before", "measured_after", "policy_budget", "trigger", "target")
    event: dict[str, Any] = {key: envelope.get(key) for key in keys}
    event["count_calls"] = envelope.get("count_calls")
    if decision is not None:
        event["estimated_input_tokens"] = decision["estimated_input_tokens"]
        event["input_limit_tokens"] = decision["input_limit_tokens"]
        event["context_token_budget"] = decision["context_token_budget"]
        fits = decision["estimated_input_tokens"] <= decision["input_limit_tokens"]
        event["result"] = "fits" if fits else "oversized"
    return event
