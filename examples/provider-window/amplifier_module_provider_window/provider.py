"""``WindowProvider``: an offline provider with a hard context window.

Contract (the ``request_budget:provider_count`` decision, docs/design.md section 5.4):

- The allowance for a request's input is
  ``context_window - max_output_tokens - safety_margin_tokens``, where ``max_output_tokens``
  comes from ``request_options``, else ``request.max_output_tokens``, else the default.
- ``request_budget`` and ``recover_context_overflow`` count the complete request with the
  real o200k BPE and return ``{estimated_input_tokens, input_limit_tokens,
  context_token_budget, max_output_tokens, measurement}``; the count is exact, so
  ``estimated_input_tokens == measurement.input_tokens``. Both are "count calls".
- ``complete`` raises ``ContextLengthError`` when the counted input exceeds the allowance
  (nothing else changes); otherwise it answers from the conversation script (when one is
  registered) and emits ``llm:response`` with canonical usage, simulating prompt caching:
  ``cache_read_tokens`` is the prefix shared with the previous accepted request,
  ``input_tokens`` is gross (fresh + cache read) and ``cache_write_tokens`` is disjoint, so
  ``input_tokens + cache_write_tokens`` is the request's full count.
- ``advertised_context_window`` (default: the real window) is what ``get_info`` and
  ``list_models`` publish; a larger value models a provider whose published window is
  stale, which is how the demo provokes real overflows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from amplifier_core.llm_errors import ContextLengthError
from amplifier_core.message_models import (
    ChatRequest,
    ChatResponse,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
)
from amplifier_core.models import ModelInfo, ProviderInfo

from .counting import (
    RequestCount,
    common_prefix_tokens,
    count_messages,
    count_request,
    count_texts,
)

PROVIDER_COUNT_CAPABILITY = "request_budget:provider_count"
MEASUREMENT_SOURCE = "provider-window.o200k"
# A rebuild target is given in the caller's estimate units; leave room for estimate drift.
CONTEXT_BUDGET_SAFETY = 0.9


class ScriptedCall(Protocol):
    """One tool call the script makes the assistant ask for."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> Mapping[str, Any]: ...


class ScriptedReply(Protocol):
    """One assistant reply: text plus zero or more tool calls (none = final answer)."""

    @property
    def text(self) -> str: ...
    @property
    def tool_calls(self) -> Sequence[ScriptedCall]: ...


class ReplyScript(Protocol):
    """What the provider needs from a conversation script."""

    def locate_turn(self, text: str) -> int | None:
        """The turn a user prompt belongs to, or None for any other text."""
        ...

    def reply(self, turn: int, step: int) -> ScriptedReply:
        """The assistant's reply at ``step`` (0-based model call) of ``turn``."""
        ...


@dataclass
class ProviderStats:
    """Counters the demo reads. ``count_calls`` = request_budget + recover calls."""

    requests: int = 0
    completed: int = 0
    overflow_errors: int = 0
    count_calls: int = 0
    recover_calls: int = 0
    last_input_tokens: int | None = None
    max_accepted_input_tokens: int = 0
    overflow_sizes: list[int] = field(default_factory=list)
    exchanges: list[tuple[list[dict[str, Any]], str]] = field(default_factory=list)
    """Every answered request as the provider read it (its messages, dumped) and the
    signature of the thinking block its answer carried (the demo checks the prefix rule)."""


@dataclass(frozen=True)
class WindowSettings:
    """Validated provider configuration."""

    name: str = "window"
    model: str = "window-o200k"
    context_window: int = 32_000
    max_output_tokens: int = 4_000
    safety_margin_tokens: int = 512
    advertised_context_window: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> WindowSettings:
        """Read and validate ``config``; bad values raise ``ValueError`` naming the key."""
        config = dict(config or {})
        settings = cls(
            name=str(config.get("name", cls.name)),
            model=str(config.get("model", cls.model)),
            context_window=_positive_int(config, "context_window", cls.context_window),
            max_output_tokens=_positive_int(config, "max_output_tokens", cls.max_output_tokens),
            safety_margin_tokens=_positive_int(
                config, "safety_margin_tokens", cls.safety_margin_tokens, allow_zero=True
            ),
            advertised_context_window=_optional_positive_int(config, "advertised_context_window"),
        )
        if settings.max_output_tokens + settings.safety_margin_tokens >= settings.context_window:
            raise ValueError(
                "provider-window: max_output_tokens + safety_margin_tokens must be < context_window"
            )
        return settings

    @property
    def published_window(self) -> int:
        """The window the provider advertises (may differ from the enforced one)."""
        return self.advertised_context_window or self.context_window


def _positive_int(
    config: Mapping[str, Any], key: str, default: int, *, allow_zero: bool = False
) -> int:
    value = config.get(key, default)
    floor = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < floor:
        raise ValueError(f"provider-window: {key} must be an int >= {floor}, got {value!r}")
    return value


def _optional_positive_int(config: Mapping[str, Any], key: str) -> int | None:
    if config.get(key) is None:
        return None
    return _positive_int(config, key, 1)


class WindowProvider:
    """A provider with a hard input allowance, counted with o200k (see module contract)."""

    def __init__(
        self,
        settings: WindowSettings,
        *,
        hooks: Any | None = None,
        script_lookup: Callable[[], ReplyScript | None] | None = None,
    ) -> None:
        self.settings = settings
        self.stats = ProviderStats()
        self._hooks = hooks
        self._script_lookup = script_lookup
        self._cursor: tuple[int | None, int] = (None, 0)
        self._previous: RequestCount | None = None

    # -- Provider protocol -----------------------------------------------------------

    @property
    def name(self) -> str:
        """Provider name (the mount name)."""
        return self.settings.name

    @property
    def context_window(self) -> int:
        """The window ``complete`` enforces."""
        return self.settings.context_window

    def get_info(self) -> ProviderInfo:
        """Metadata; ``defaults`` carries the (advertised) window and output reserve."""
        return ProviderInfo(
            id=self.name,
            display_name="Window provider (offline, o200k)",
            capabilities=["tools", PROVIDER_COUNT_CAPABILITY],
            defaults={
                "model": self.settings.model,
                "context_window": self.settings.published_window,
                "max_output_tokens": self.settings.max_output_tokens,
            },
        )

    async def list_models(self) -> list[ModelInfo]:
        """The single scripted model."""
        return [  # noqa: ASYNC910 - a constant list (the protocol method is async)
            ModelInfo(
                id=self.settings.model,
                display_name="Scripted o200k model",
                context_window=self.settings.published_window,
                max_output_tokens=self.settings.max_output_tokens,
                capabilities=["tools"],
            )
        ]

    def parse_tool_calls(self, response: ChatResponse) -> list[ToolCall]:
        """Tool calls of ``response`` (empty when it is a final answer)."""
        return list(response.tool_calls or [])

    async def complete(self, request: ChatRequest, **kwargs: Any) -> ChatResponse:
        """Answer ``request`` or raise ``ContextLengthError`` if it exceeds the allowance."""
        started = time.perf_counter()
        self.stats.requests += 1
        counted = count_request(request)
        self.stats.last_input_tokens = counted.total
        limit = self.input_limit(self._max_output(request, kwargs))
        if counted.total > limit:
            self.stats.overflow_errors += 1
            self.stats.overflow_sizes.append(counted.total)
            raise ContextLengthError(
                f"prompt is too long: {counted.total} tokens > {limit} maximum",
                provider=self.name,
                model=self.settings.model,
                status_code=400,
            )
        reply = self._next_reply(request)
        usage = self._usage(counted, reply)
        self._previous = counted
        self.stats.completed += 1
        signature = f"{self.settings.name}-{id(self):x}-{self.stats.completed}"
        self.stats.exchanges.append(
            (
                [
                    message.model_dump(mode="json", exclude_none=True)
                    for message in request.messages
                ],
                signature,
            )
        )
        self.stats.max_accepted_input_tokens = max(
            self.stats.max_accepted_input_tokens, counted.total
        )
        await self._emit_response(usage, started)
        return _response(reply, usage, signature)

    # -- request_budget:provider_count -----------------------------------------------

    def input_limit(self, max_output_tokens: int) -> int:
        """The input allowance when ``max_output_tokens`` is reserved for the answer."""
        reserved = max_output_tokens + self.settings.safety_margin_tokens
        return max(0, self.settings.context_window - reserved)

    def request_budget(
        self,
        request: ChatRequest,
        *,
        context_estimate: int | None,
        request_options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Count ``request`` and return the budget decision (docs/design.md section 5.4)."""
        self.stats.count_calls += 1
        return self._decision(request, context_estimate, request_options)

    def recover_context_overflow(
        self,
        request: ChatRequest,
        error: BaseException,
        *,
        context_estimate: int | None,
        request_options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The rebuild target after ``error``: the same decision shape as request_budget."""
        self.stats.count_calls += 1
        self.stats.recover_calls += 1
        return self._decision(request, context_estimate, request_options)

    # -- helpers the demo uses (not count calls) ---------------------------------------

    def count_request_tokens(self, request: ChatRequest) -> int:
        """Exact count of ``request``; does not touch the stats."""
        return count_request(request).total

    def count_message_tokens(self, messages: Sequence[Message]) -> int:
        """Exact count of ``messages`` (with per-message overhead, no request framing)."""
        return sum(count_messages(messages)[0])

    # -- internals ---------------------------------------------------------------------

    def _max_output(self, request: ChatRequest, options: Mapping[str, Any] | None) -> int:
        for value in ((options or {}).get("max_output_tokens"), request.max_output_tokens):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return self.settings.max_output_tokens

    def _decision(
        self,
        request: ChatRequest,
        context_estimate: int | None,
        request_options: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        counted = count_request(request)
        max_output = self._max_output(request, request_options)
        limit = self.input_limit(max_output)
        return {
            "estimated_input_tokens": counted.total,
            "input_limit_tokens": limit,
            "context_token_budget": _context_target(counted, limit, context_estimate),
            "max_output_tokens": max_output,
            "measurement": {
                "kind": "provider_count",
                "source": MEASUREMENT_SOURCE,
                "input_tokens": counted.total,
            },
        }

    def _next_reply(self, request: ChatRequest) -> ScriptedReply | None:
        script = self._script_lookup() if self._script_lookup else None
        if script is None:
            return None
        turn = _locate_turn(script, request.messages)
        current, step = self._cursor
        if turn is None:
            turn = current
        if turn is None:
            return None
        if turn != current:
            step = 0
        self._cursor = (turn, step + 1)
        return script.reply(turn, step)

    def _usage(self, counted: RequestCount, reply: ScriptedReply | None) -> Usage:
        output = _output_tokens(reply)
        cache_read = common_prefix_tokens(self._previous, counted)
        fresh_tail = counted.per_message[-1] if counted.per_message else 0
        cache_write = max(0, counted.total - cache_read - fresh_tail)
        input_tokens = counted.total - cache_write
        return Usage(
            input_tokens=input_tokens,
            output_tokens=output,
            total_tokens=input_tokens + cache_write + output,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        )

    async def _emit_response(self, usage: Usage, started: float) -> None:
        if self._hooks is None:
            return  # noqa: ASYNC910 - no hooks: nothing to deliver
        payload = {
            "provider": self.name,
            "model": self.settings.model,
            "status": "ok",
            "duration_ms": int((time.perf_counter() - started) * 1000),
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_tokens": usage.cache_read_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
            },
        }
        await self._hooks.emit("llm:response", payload)


def _context_target(counted: RequestCount, limit: int, context_estimate: int | None) -> int:
    """The message budget to rebuild to, in the caller's estimate units.

    Framing (request overhead, tool specs) is taken off the limit; the rest is scaled by
    the caller's estimate-per-provider-token ratio when a usable estimate was given.
    """
    room = max(0, limit - (counted.total - counted.message_tokens))
    scale = 1.0
    if isinstance(context_estimate, int) and context_estimate > 0 and counted.message_tokens:
        scale = context_estimate / counted.message_tokens
    return int(room * scale * CONTEXT_BUDGET_SAFETY)


def _locate_turn(script: ReplyScript, messages: Sequence[Message]) -> int | None:
    for message in reversed(messages):
        if message.role == "user" and isinstance(message.content, str):
            turn = script.locate_turn(message.content)
            if turn is not None:
                return turn
    return None


def _output_tokens(reply: ScriptedReply | None) -> int:
    if reply is None:
        return 1
    texts = [reply.text]
    for call in reply.tool_calls:
        texts.extend([call.name, json.dumps(dict(call.arguments), ensure_ascii=False)])
    return max(1, count_texts(texts))


def _response(reply: ScriptedReply | None, usage: Usage, signature: str) -> ChatResponse:
    # Every answer thinks first, as a model with preserved thinking does: its signed block
    # is bound to this request (the demo checks that later requests send it validly).
    thinking = ThinkingBlock(thinking=f"Planning the reply ({signature}).", signature=signature)
    if reply is None:
        text = f"ok ({usage.input_tokens + (usage.cache_write_tokens or 0)} input tokens)"
        return ChatResponse(
            content=[thinking, TextBlock(text=text)], usage=usage, finish_reason="stop"
        )
    calls = [
        ToolCall(id=call.id, name=call.name, arguments=dict(call.arguments))
        for call in reply.tool_calls
    ]
    return ChatResponse(
        content=[thinking, TextBlock(text=reply.text)],
        tool_calls=calls or None,
        usage=usage,
        finish_reason="tool_use" if calls else "stop",
    )
