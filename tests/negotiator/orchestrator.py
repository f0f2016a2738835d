"""A test orchestrator for the negotiated path, shaped like loop-streaming (docs/design.md section 5.4).

``Orchestrator.run`` does what the real loop does around one provider request:

1. ``coordinator.get_capability("context.measured_request_view")``;
2. calls it with ``provider``, ``retain_contents`` and its own ``count_view`` (which builds
   a request, asks the fake provider's ``request_budget`` and returns ``{dispatch,
   budget_decision}``), adding ``fit_output`` only when the getter's signature has a
   ``fit_output`` parameter;
3. validates the result (a dict, ``base_view`` a list of dicts, a final attempt with a
   ``dispatch``), reports it on the hooks (``orchestrator:provider_budget``) and rolls the
   transaction back on any failure or cancellation in that window;
4. ``await transaction.commit(is_cancelled=lambda: coordinator.cancellation.is_cancelled)``
   immediately before dispatch, and skips dispatch when that returns False.

The kernel's ``ModuleCoordinator`` (Rust) and its hook registry run on asyncio only, so on
the trio backend the module is mounted the same way on ``LocalCoordinator``, a small
Python stand-in with the same surface (hooks, cancellation, capabilities, mount points).

A ``FaultPlan`` (``amplifier_module_context_simple.testing``) given to the orchestrator
makes ``count_view``, ``fit_output`` and its report ``emit`` seams.

The fake provider's counting rules (``proportional``, ``unavailable``, ``decision``) and
``fitted`` are the whole suite's: ``counting(rule)`` is a bare ``count_view`` (no provider
object, no orchestrator) for tests that call the store directly.
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio.lowlevel

import amplifier_module_context_simple as module
from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.testing import FaultPlan
from tests.support import EventRecorder, mounted

SOURCE: Final = "test.provider.count"
CAPABILITY: Final = "context.measured_request_view"
PROVIDER_COUNT: Final = "request_budget:provider_count"

Decision = dict[str, Any] | None
Rule = Callable[[list[dict[str, Any]]], Decision]
"""The fake provider's counting rule: the counted view -> a budget decision (or None)."""
FitRule = Callable[[list[dict[str, Any]], Any], Awaitable[Any]]
CountView = Callable[[list[dict[str, Any]]], Awaitable[dict[str, Any]]]


# -- budget decisions and counting rules ----------------------------------------------------


def decision(
    count: int | None,
    *,
    estimated: Any = None,
    limit: Any = 1000,
    kind: str = "provider_count",
    source: str = SOURCE,
) -> dict[str, Any]:
    """A ``request_budget`` decision; ``count=None`` omits the measurement."""
    body: dict[str, Any] = {
        "estimated_input_tokens": (count or 0) if estimated is None else estimated,
        "input_limit_tokens": limit,
        "context_token_budget": limit,
    }
    if count is not None:
        body["measurement"] = {"kind": kind, "source": source, "input_tokens": count}
    return body


def envelope(count: int | None, **kwargs: Any) -> dict[str, Any]:
    """A ``{dispatch, budget_decision}`` envelope around ``decision(count, **kwargs)``."""
    return {"dispatch": FakeRequest([]), "budget_decision": decision(count, **kwargs)}


def view_chars(view: Sequence[dict[str, Any]]) -> int:
    """A provider-independent size of a view (what the fake provider counts)."""
    return sum(len(json.dumps(m, sort_keys=True, default=str)) for m in view)


def proportional(scale: float, *, limit: int = 1000, oversize: bool = False) -> Rule:
    """Count ``chars * scale``; ``oversize`` reports ``estimated = limit + 1`` throughout."""

    def rule(view: list[dict[str, Any]]) -> Decision:
        count = int(view_chars(view) * scale)
        estimated = max(count, limit + 1) if oversize else count
        return decision(count, estimated=estimated, limit=limit)

    return rule


def denser(scale: float, factor: float, *, below: int, limit: int = 1000) -> Rule:
    """Count ``chars * scale``, times ``factor`` once the view has fewer than ``below``
    messages or a reduced one: a provider whose count / estimate ratio rises as the view
    shrinks, so a ratio calibrated on the full view under-predicts a reduced view."""

    def rule(view: list[dict[str, Any]]) -> Decision:
        reduced = len(view) < below or any("compaction" in (m.get("metadata") or {}) for m in view)
        return decision(int(view_chars(view) * scale * (factor if reduced else 1)), limit=limit)

    return rule


def unavailable(*, estimated: int = 0, limit: int = 1000) -> Rule:
    """A provider that never has a usable count (old-style estimate/limit only)."""

    def rule(view: list[dict[str, Any]]) -> Decision:
        return decision(None, estimated=estimated, limit=limit)

    return rule


def fitted(count: int, *, calls: int = 1, limit: int = 1000) -> FitRule:
    """A ``fit_output`` that always finds an output cap at which ``count`` fits."""

    async def fit(view: list[dict[str, Any]], attempt: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return {
            "dispatch": FakeRequest(view, max_output_tokens=1000),
            "budget_decision": decision(count, limit=limit),
            "count_calls": calls,
        }

    return fit


def counted(rule: Rule, view: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``{dispatch, budget_decision}`` envelope a ``count_view`` returns for ``view``
    counted by the fake provider's ``rule``."""
    return {"dispatch": FakeRequest(list(view)), "budget_decision": rule(view)}


def counting(rule: Rule) -> CountView:
    """A bare ``count_view`` counting with ``rule`` (``Orchestrator.count_view`` without the
    provider object)."""

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return counted(rule, view)

    return count_view


# -- histories -----------------------------------------------------------------------------


def tool_turns(
    turns: int, *, size: int = 800, prefix: str = "c", start: int = 0
) -> list[dict[str, Any]]:
    """``turns`` assistant tool calls, each answered by a ``size``-character tool result."""
    messages: list[dict[str, Any]] = []
    for i in range(start, start + turns):
        call_id = f"{prefix}{i}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Let me look at part {i}.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    }
                ],
            }
        )
        body = f"result {i}: " + ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
        messages.append({"role": "tool", "tool_call_id": call_id, "content": body})
    return messages


def conversation(turns: int, *, size: int = 800, rounds: int = 1) -> list[dict[str, Any]]:
    """``rounds`` rounds of (human prompt, ``turns`` tool turns, assistant answer), then a prompt."""
    messages: list[dict[str, Any]] = []
    for r in range(rounds):
        messages.append({"role": "user", "content": f"Question {r}: please summarise the files."})
        messages.extend(tool_turns(turns, size=size, prefix=f"r{r}c"))
        messages.append({"role": "assistant", "content": f"Summary {r}: " + "detail " * 40})
    messages.append({"role": "user", "content": "And now the next step, please."})
    return messages


# -- the fake provider -----------------------------------------------------------------------


@dataclass
class FakeRequest:
    """Stands in for ``ChatRequest``: the dispatch object ``count_view`` builds."""

    messages: list[dict[str, Any]]
    max_output_tokens: int | None = None


class FakeProvider:
    """Advertises ``request_budget:provider_count``; counts with ``rule``."""

    name = "fake"

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.counted: list[list[dict[str, Any]]] = []

    def get_info(self) -> Any:
        return types.SimpleNamespace(capabilities=[PROVIDER_COUNT], defaults={})

    async def request_budget(
        self, request: FakeRequest, *, context_estimate: int, request_options: Any = None
    ) -> Decision:
        self.counted.append(request.messages)
        return self.rule(request.messages)  # noqa: ASYNC910 - counts inline: Orchestrator._seam is the await point


# -- a Python stand-in coordinator (trio) ----------------------------------------------------


class LocalHooks:
    """A minimal hook registry: ``register`` returns an unregister callable; ``emit`` awaits
    every handler in priority order."""

    def __init__(self) -> None:
        self._handlers: list[tuple[int, int, str, Callable[..., Awaitable[Any]]]] = []
        self._next = 0

    def register(
        self,
        event: str,
        handler: Callable[..., Awaitable[Any]],
        priority: int = 0,
        name: str | None = None,
    ) -> Callable[[], None]:
        entry = (priority, self._next, event, handler)
        self._next += 1
        self._handlers.append(entry)
        self._handlers.sort(key=lambda e: (e[0], e[1]))

        def unregister() -> None:
            if entry in self._handlers:
                self._handlers.remove(entry)

        return unregister

    async def emit(self, event: str, data: dict[str, Any]) -> None:  # noqa: ASYNC910 - awaits only its handlers: no extra trio step
        for _, _, name, handler in list(self._handlers):
            if name == event:
                await handler(event, dict(data))


class LocalCancellation:
    def __init__(self) -> None:
        self.is_cancelled = False

    def request_graceful(self) -> None:
        self.is_cancelled = True

    def reset(self) -> None:
        self.is_cancelled = False


class LocalCoordinator:
    """The parts of ``ModuleCoordinator`` that ``mount`` and ``Orchestrator`` use."""

    def __init__(self) -> None:
        self.hooks = LocalHooks()
        self.cancellation = LocalCancellation()
        self._mounted: dict[str, Any] = {}
        self._capabilities: dict[str, Any] = {}
        self._cleanups: list[Any] = []

    async def mount(self, point: str, obj: Any) -> None:
        await anyio.lowlevel.checkpoint()
        self._mounted[point] = obj

    def get(self, point: str) -> Any:
        return self._mounted.get(point)

    def register_capability(self, name: str, value: Any) -> None:
        self._capabilities[name] = value

    def get_capability(self, name: str) -> Any:
        return self._capabilities.get(name)

    def register_cleanup(self, cleanup: Any) -> None:
        self._cleanups.append(cleanup)


async def mount_context(
    backend: str, config: dict[str, Any] | None = None, *events: str
) -> tuple[Any, SimpleContextManager, EventRecorder]:
    """Mount the module (real coordinator on asyncio, ``LocalCoordinator`` on trio)."""
    config = {"token_meter": "actual", **(config or {})}
    events = events or ("context:compaction", "context:budget", "orchestrator:provider_budget")
    if backend == "asyncio":
        coordinator, context, recorder = await mounted(config, *events)
        return coordinator, context, recorder
    coordinator = LocalCoordinator()
    recorder = EventRecorder()
    recorder.attach(coordinator.hooks, *events)
    cleanup = await module.mount(coordinator, config)
    coordinator.register_cleanup(cleanup)
    return coordinator, coordinator.get("context"), recorder


# -- the orchestrator ------------------------------------------------------------------------


class OrchestratorError(RuntimeError):
    """The getter's result failed the orchestrator's validation (the transaction was rolled back)."""


def accepts_fit_output(getter: Callable[..., Any]) -> bool:
    """Whether ``getter`` has a ``fit_output`` keyword (inspection failure -> no)."""
    try:
        parameter = inspect.signature(getter).parameters.get("fit_output")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


@dataclass
class Outcome:
    result: dict[str, Any]
    committed: bool | None
    """None when there was no transaction to commit."""
    dispatched: bool


@dataclass
class Orchestrator:
    coordinator: Any
    provider: FakeProvider
    fit: FitRule | None = None
    plan: FaultPlan | None = None
    retain: Sequence[str] = ()
    report: bool = True
    dispatched: list[tuple[Any, list[dict[str, Any]]]] = field(default_factory=list)
    fit_calls: list[tuple[list[dict[str, Any]], Any]] = field(default_factory=list)
    transaction: Any = None
    """The last transaction the getter returned (for post-mortem assertions)."""
    on_result: Callable[[], None] | None = None
    """Called right after the getter returned, before anything else awaits (a sweep
    records the store's state there: ``testing.Prepared.reached``)."""

    async def _seam(self, label: str) -> None:  # noqa: ASYNC910 - no plan: no await point (see the module docstring)
        if self.plan is not None:
            await self.plan.hit(label)

    async def count_view(self, base_view: list[dict[str, Any]]) -> dict[str, Any]:
        await self._seam("count_view")
        request = FakeRequest(list(base_view))
        budget = await self.provider.request_budget(request, context_estimate=0)
        return {"dispatch": request, "budget_decision": budget}

    async def fit_output(self, base_view: list[dict[str, Any]], attempt: Any) -> Any:
        await self._seam("fit_output")
        self.fit_calls.append((base_view, attempt))
        assert self.fit is not None
        return await self.fit(base_view, attempt)

    async def run(self) -> Outcome:
        """One provider request on the negotiated path; see the module docstring."""
        coordinator = self.coordinator
        getter = coordinator.get_capability(CAPABILITY)
        if not callable(getter):
            raise OrchestratorError(f"{CAPABILITY} is not registered")
        kwargs: dict[str, Any] = {
            "provider": self.provider,
            "retain_contents": list(self.retain),
            "count_view": self.count_view,
        }
        if self.fit is not None and accepts_fit_output(getter):
            kwargs["fit_output"] = self.fit_output
        result = await getter(**kwargs)
        if self.on_result is not None:
            self.on_result()
        transaction = result.get("transaction") if isinstance(result, dict) else None
        self.transaction = transaction
        try:
            self._validate(result)
            if self.report:
                await self._report(result)
        except BaseException:
            if transaction is not None:
                transaction.rollback()
            raise
        committed: bool | None = None
        if transaction is not None:
            try:
                committed = await transaction.commit(
                    is_cancelled=lambda: coordinator.cancellation.is_cancelled
                )
            except BaseException:
                transaction.rollback()  # a no-op once the commit stands
                raise
            if not committed:
                transaction.rollback()
                return Outcome(result, committed, dispatched=False)
        elif coordinator.cancellation.is_cancelled:
            return Outcome(result, committed, dispatched=False)
        # "Dispatch": the fake provider call, immediately after the commit, no await between.
        self.dispatched.append((result["final_attempt"]["dispatch"], result["base_view"]))
        return Outcome(result, committed, dispatched=True)

    @staticmethod
    def _validate(result: Any) -> None:
        if not isinstance(result, dict):
            raise OrchestratorError(f"measured view must be a dict, got {type(result).__name__}")
        view = result.get("base_view")
        if not isinstance(view, list) or not all(isinstance(m, dict) for m in view):
            raise OrchestratorError("measured base_view must be a list of message dicts")
        attempt = result.get("final_attempt")
        if not isinstance(attempt, dict) or "dispatch" not in attempt:
            raise OrchestratorError("measured final_attempt must carry a dispatch")

    async def _report(self, result: dict[str, Any]) -> None:
        await self._seam("emit:orchestrator:provider_budget")
        payload = {
            key: result[key]
            for key in (
                "outcome",
                "measured_before",
                "measured_after",
                "policy_budget",
                "trigger",
                "target",
                "count_calls",
            )
        }
        await self.coordinator.hooks.emit("orchestrator:provider_budget", payload)
