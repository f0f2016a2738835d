"""Shared pieces of the reliability suite: fixed histories in all three tool formats, the
operations the sweeps enumerate, a transaction ledger, and the summary collector.

The summary lines (await points per sweep, examples per property) are printed at the end
of the run by ``pytest_terminal_summary`` in this directory's ``conftest.py``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.lowlevel

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.negotiator.transaction import (
    TERMINAL,
    RequestTransaction,
    TxnState,
    _Machine,
)
from amplifier_module_context_simple.testing import (
    ERROR,
    FaultPlan,
    FaultyHooks,
    Prepared,
    SweepReport,
    Trial,
    check_view_invariants,
    faulty_count_view,
    faulty_factory,
    faulty_fit_output,
)
from tests.negotiator.orchestrator import Rule, counting

if TYPE_CHECKING:
    from hypothesis import settings

# -- the summary collector ------------------------------------------------------------------

RECORDS: list[str] = []
"""Summary lines printed at the end of the session."""
EXAMPLES: Counter[str] = Counter()
"""Examples run per property (hypothesis calls of the test body)."""


def record(backend: str, report: SweepReport) -> None:
    RECORDS.append(f"{backend:<7} {report.summary()}")


# -- histories ---------------------------------------------------------------------------------

PROMPT = "You are a careful assistant. Answer briefly and cite the files you read."
REMINDER = (
    "<system-reminder>Keep the test suite green; never skip a failing test.</system-reminder>"
)


def text(tag: str, size: int) -> str:
    unit = "lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    return (f"{tag}: " + unit * (size // len(unit) + 1))[:size]


def openai_call(cid: str, name: str = "read") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def amplifier_call(cid: str, name: str = "read") -> dict[str, Any]:
    return {"id": cid, "tool": name, "arguments": {"path": f"src/{cid}.py"}}


def tool_result(cid: str, size: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": text(f"result {cid}", size)}


def block_result(cid: str, size: int) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": cid, "content": text(f"result {cid}", size)}


def openai_round(ids: Sequence[str], size: int) -> list[dict[str, Any]]:
    """Parallel OpenAI calls answered in reverse order (pairing is by id)."""
    call = {"role": "assistant", "content": "", "tool_calls": [openai_call(i) for i in ids]}
    return [call, *(tool_result(i, size) for i in reversed(ids))]


def amplifier_round(ids: Sequence[str], size: int) -> list[dict[str, Any]]:
    call = {
        "role": "assistant",
        "content": "Reading the files.",
        "tool_calls": [amplifier_call(i) for i in ids],
    }
    return [call, *(tool_result(i, size) for i in ids)]


def anthropic_round(ids: Sequence[str], size: int, *, split: bool = False) -> list[dict[str, Any]]:
    """Anthropic ``tool_use`` blocks; results in one user message or split across several."""
    call = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            *({"type": "tool_use", "id": i, "name": "grep", "input": {"q": i}} for i in ids),
        ],
    }
    if split:
        return [call, *({"role": "user", "content": [block_result(i, size)]} for i in ids)]
    return [call, {"role": "user", "content": [block_result(i, size) for i in ids]}]


def envelope(body: str = REMINDER) -> dict[str, Any]:
    return {
        "role": "user",
        "content": body,
        "metadata": {"ephemeral": True, "persisted": True, "source": "hook"},
    }


def mixed_history(size: int = 900, *, pending: bool = False) -> list[dict[str, Any]]:
    """A small conversation mixing all three tool formats (about 2,600 estimated tokens)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Stored system prompt: be terse."},
        {"role": "user", "content": "Question 0: please summarise the repository layout."},
        *openai_round(["call_1", "call_2"], size),
        *amplifier_round(["amp_3"], size),
        {"role": "assistant", "content": "Summary 0: " + text("s0", 300)},
        envelope(),
        {"role": "user", "content": "Question 1: and where are the tests?"},
        *anthropic_round(["toolu_4", "toolu_5"], size),
        *anthropic_round(["toolu_6", "toolu_7"], size, split=True),
        {"role": "assistant", "content": "Summary 1: " + text("s1", 300)},
        {"role": "user", "content": "Question 2: now run the next step, please."},
    ]
    if pending:
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [openai_call("call_9")]},
        ]
    return messages


def small_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Hello, what is in README.md?"},
        *openai_round(["call_1"], 200),
        {"role": "assistant", "content": "It describes the module."},
        {"role": "user", "content": "Thanks. Next question."},
    ]


# -- the fake provider: the reference orchestrator's (tests/negotiator/orchestrator.py) ----------

LIMIT = 100_000
"""The fake provider's input limit in this suite: far above every view, so only the
policy budget (``max_tokens``) decides (the negotiator's own tests use 1000)."""


# -- the transaction ledger ------------------------------------------------------------------------


@dataclass
class Ledger:
    """Every transaction machine (``_Machine``) created while tracking, which machine each
    ``RequestTransaction`` handle wraps, and marks per prepared store.

    Every negotiation creates one machine; a handle exists only for a result the
    negotiation built (and is returned only when it has changes)."""

    created: list[_Machine] = field(default_factory=list)
    handles: list[tuple[RequestTransaction, _Machine]] = field(default_factory=list)
    marks: dict[int, int] = field(default_factory=dict)

    def mark(self, prepared: Prepared[Any]) -> None:
        self.marks[id(prepared)] = len(self.created)

    def since(self, prepared: Prepared[Any]) -> list[_Machine]:
        return self.created[self.marks.get(id(prepared), 0) :]

    def machine_of(self, handle: RequestTransaction) -> _Machine:
        """The machine ``handle`` was built on (recorded at construction; the handle itself
        does not expose it)."""
        for known, machine in reversed(self.handles):
            if known is handle:
                return machine
        raise AssertionError(f"{handle!r} was not created while tracking")


def describe(machine: _Machine) -> str:
    """A machine, for assertion messages (``state=NAME``, like the handle's repr)."""
    return (
        f"<_Machine state={machine.state.name} changes={machine.has_changes} "
        f"conflict={machine.conflict}>"
    )


@contextlib.contextmanager
def track_transactions() -> Iterator[Ledger]:
    """Record every ``_Machine`` and every ``RequestTransaction`` constructed in the block."""
    ledger = Ledger()
    machine_init = _Machine.__init__
    handle_init = RequestTransaction.__init__

    def init_machine(self: _Machine, *args: Any, **kwargs: Any) -> None:
        machine_init(self, *args, **kwargs)
        ledger.created.append(self)

    def init_handle(self: RequestTransaction, machine: _Machine) -> None:
        handle_init(self, machine)
        ledger.handles.append((self, machine))

    _Machine.__init__ = init_machine  # type: ignore[method-assign]  # recording; restored below
    RequestTransaction.__init__ = init_handle  # type: ignore[method-assign]  # recording, too
    try:
        yield ledger
    finally:
        _Machine.__init__ = machine_init  # type: ignore[method-assign]  # the original back
        RequestTransaction.__init__ = handle_init  # type: ignore[method-assign]  # the original


# -- the operations the sweeps enumerate ---------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """One store operation in one starting state, and what its no-fault run must do."""

    name: str
    kind: str
    """``ordinary`` | ``hard_fit`` | ``measured`` | ``commit``."""
    history: tuple[dict[str, Any], ...]
    config: tuple[tuple[str, Any], ...] = ()
    budget: int | None = None
    seed_budget: int | None = None
    """Commit an ordinary compaction at this budget first (a sticky starting state)."""
    factory: bool = True
    rule: Rule | None = None
    fit: Callable[..., Awaitable[Any]] | None = None
    retain: tuple[str, ...] = ()
    min_points: int = 1
    outcome: str | None = None
    """The measured path's no-fault outcome."""


async def starting_state(
    op: Operation, plan: FaultPlan
) -> tuple[SimpleContextManager, FaultyHooks]:
    """A fresh store in ``op``'s starting state, its seams routed through ``plan`` (which
    neither counts nor fires while the store is prepared; it is left disarmed)."""
    hooks = FaultyHooks(plan)
    config = dict(op.config)
    if op.kind in ("measured", "commit"):
        config.setdefault("token_meter", "actual")
    manager = SimpleContextManager(**config, hooks=hooks)
    plan.disarm()
    await manager.set_messages(list(op.history))
    if op.seed_budget is not None:
        await manager.get_messages_for_request(token_budget=op.seed_budget)
        assert manager.last_compaction_stats is not None, f"{op.name}: the seed must compact"
    if op.factory:
        await manager.set_system_prompt_factory(faulty_factory(plan, PROMPT))
    return manager, hooks


async def negotiated(manager: SimpleContextManager, op: Operation) -> dict[str, Any]:
    """The no-fault negotiation a ``commit`` operation commits (its count and fit unfaulted)."""
    assert op.kind == "commit" and op.rule is not None
    return await manager.get_measured_request_view(
        provider=None,
        retain_contents=list(op.retain),
        count_view=counting(op.rule),
        fit_output=op.fit,
    )


async def build(op: Operation, plan: FaultPlan, ledger: Ledger | None = None) -> Prepared[Any]:
    """A fresh store in ``op``'s starting state, its seams routed through ``plan``."""
    armed = plan.armed
    manager, hooks = await starting_state(op, plan)
    run: Callable[[], Awaitable[Any]]
    follow: Callable[[], Awaitable[Any]]
    if op.kind == "ordinary":

        async def run() -> Any:
            return await manager.get_messages_for_request(token_budget=op.budget)

        follow = run
    elif op.kind == "hard_fit":

        async def run() -> Any:
            return await manager.get_messages_for_request_retaining(
                retain_contents=list(op.retain), token_budget=op.budget, hard_fit=True
            )

        follow = run
    elif op.kind == "measured":
        assert op.rule is not None
        count_view = faulty_count_view(plan, counting(op.rule))
        fit_output = faulty_fit_output(plan, op.fit) if op.fit is not None else None

        async def run() -> Any:
            return await manager.get_measured_request_view(
                provider=None,
                retain_contents=list(op.retain),
                count_view=count_view,
                fit_output=fit_output,
            )

        follow = run
    else:
        result = await negotiated(manager, op)
        transaction = result["transaction"]
        assert isinstance(transaction, RequestTransaction), f"{op.name}: nothing to commit"
        assert transaction.state is TxnState.READY

        def is_cancelled() -> bool:
            plan.hit_nowait("is_cancelled")
            return False

        async def run() -> Any:
            plan.hit_nowait("entry")
            return await transaction.commit(is_cancelled=is_cancelled)

        async def follow() -> Any:
            return await transaction.commit()

    prepared: Prepared[Any] = Prepared(manager, run, hooks, follow_up=follow)
    if ledger is not None:
        ledger.mark(prepared)
    if armed:
        plan.arm()
    return prepared


def commit_raised_state(trial: Trial[Any]) -> TxnState:
    """The state of a transaction whose ``commit`` run raised with the store as before,
    decided by the fault that ended it (the first that fired; a step sweep's cancellation
    fires no seam).

    ``commit`` has one checkpoint before its commit step and no rollback of its own but
    for ``is_cancelled()`` answering True, which this harness's predicate never does, and
    the run does not roll back. So a fault before the commit step leaves it READY: an
    error at ``entry`` (before ``commit`` is called) or inside ``is_cancelled`` (it
    propagates), a cancellation requested at ``entry`` or a step sweep's (both delivered
    at that checkpoint). A cancellation requested inside ``is_cancelled`` is delivered
    after the commit step, in ``context:compaction`` delivery: it cannot leave the store
    as before.
    """
    if not trial.plan.fired:
        return TxnState.READY  # a step sweep: cancelled at the checkpoint before the commit
    _, label, kind = trial.plan.fired[0]
    if label == "entry" or (label == "is_cancelled" and kind == ERROR):
        return TxnState.READY
    raise AssertionError(f"a {kind} fault at {label!r} must not leave the store as before")


def checker(op: Operation, ledger: Ledger) -> Callable[[Trial[Any]], Awaitable[None]]:
    """Per-trial checks beyond the store oracle: views, transactions, the result envelope."""

    async def check(trial: Trial[Any]) -> None:
        # run between trials: a checkpoint here moves no await point of the operation
        await anyio.lowlevel.checkpoint()
        factory_text = PROMPT if op.factory else None
        created = ledger.since(trial.prepared)
        where = trial.describe()
        if op.kind == "commit":
            machine = ledger.created[ledger.marks[id(trial.prepared)] - 1]
            if trial.returned:
                assert trial.value is True, where
                assert machine.state is TxnState.COMMITTED, (describe(machine), where)
            elif trial.expected == "before":
                assert machine.state is commit_raised_state(trial), (describe(machine), where)
            else:
                assert machine.state is TxnState.COMMITTED, (describe(machine), where)
            assert not created, where
            return
        if op.kind == "measured":  # one request, at most one machine (none if it failed
            # while planning, before the negotiation started)
            assert len(created) <= 1, ([describe(m) for m in created], where)
        if trial.returned and op.kind == "measured":
            result = trial.value
            assert isinstance(result, dict), where
            assert len(created) == 1, where
            check_view_invariants(list(op.history), result["base_view"], factory_text=factory_text)
            returned = result["transaction"]
            ours = None if returned is None else ledger.machine_of(returned)
            assert ours is None or ours in created, where
            for machine in created:
                if machine is ours:
                    assert machine.state is TxnState.READY, (describe(machine), where)
                else:
                    assert machine.state in TERMINAL, (describe(machine), where)
            if op.outcome is not None:
                assert result["outcome"] == op.outcome, where
            return
        for machine in created:  # nothing may leak from a request that raised
            assert machine.state is TxnState.ROLLED_BACK, (describe(machine), where)
        if trial.returned:
            check_view_invariants(
                list(op.history),
                trial.value,
                factory_text=factory_text,
                retained=op.retain,
            )

    return check


# -- hypothesis settings -------------------------------------------------------------------------


def hsettings(**overrides: Any) -> settings:
    """The loaded profile, plus the health checks async/fixture-using properties need."""
    from hypothesis import HealthCheck, settings

    return settings(
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
        **overrides,
    )
