"""Deep tier: full sweeps over Hypothesis-generated histories (the deep tier, ``make test-deep``; docs/design.md section 10).

Each example draws a history (all three tool formats, mixed), a configuration, a pressure
and an operation (ordinary, hard fit with retained reminders, negotiated, commit), then
runs a complete sweep over every await point of that operation: error and cancellation,
transient and persistent, on asyncio and trio; native cancellation on asyncio; and the
trio step sweep. Run with ``make test-deep``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from amplifier_module_context_simple import ContextLengthError, ProviderLimitError
from amplifier_module_context_simple.negotiator.transaction import TxnState
from amplifier_module_context_simple.testing import (
    CANCEL,
    ERROR,
    NATIVE,
    FaultPlan,
    InjectedFault,
    Prepared,
    step_sweep,
)
from tests.negotiator.orchestrator import proportional
from tests.reliability.harness import (
    EXAMPLES,
    Operation,
    build,
    checker,
    hsettings,
    negotiated,
    starting_state,
    track_transactions,
)
from tests.reliability.operations import boundary, run_sweep
from tests.reliability.scenarios import RESERVE, configs, total_tokens
from tests.reliability.strategies import History, histories

pytestmark = [pytest.mark.deep, pytest.mark.anyio]

EXPECTED = (InjectedFault, ContextLengthError)


@st.composite
def operations(draw: Any) -> Operation:
    history: History = draw(histories(max_turns=5))
    kind = draw(st.sampled_from(["ordinary", "hard_fit", "measured", "commit"]))
    config = dict(draw(configs))
    size = total_tokens(history.messages) + RESERVE
    budget = max(1, int(size * draw(st.floats(0.05, 1.3)))) + RESERVE
    retain = tuple(sorted(set(history.bodies))) if draw(st.booleans()) else ()
    if kind in ("measured", "commit"):
        config["max_tokens"] = budget
    return Operation(
        name=f"generated/{kind}",
        kind=kind,
        history=tuple(history.messages),
        config=tuple(config.items()),
        budget=budget if kind in ("ordinary", "hard_fit") else None,
        factory=draw(st.booleans()),
        rule=proportional(draw(st.sampled_from([0.1, 0.3, 1.0]))),
        retain=retain if kind in ("hard_fit", "measured") else (),
    )


async def runnable(op: Operation) -> bool:
    """Whether ``op`` can be swept: every operation but a ``commit`` whose no-fault
    negotiation leaves nothing to commit, decided from that negotiation's outcome.

    A generated commit has no ``fit_output`` and a provider limit of 1000: its negotiation
    fails closed (``irreducible_over_limit``) when the floor stays over the limit, returns
    no transaction when it changes nothing (``not_needed`` under the trigger, else
    ``protected_floor``; never over the limit: that reduces the floor), and otherwise a
    READY transaction with changes, which ``build`` then finds the same way (its
    assertions are failures of the sweep, not a reason to skip it).
    """
    if op.kind != "commit":
        return True  # noqa: ASYNC910 - a predicate: only a commit needs a negotiation to await
    manager, _ = await starting_state(op, FaultPlan())
    try:
        result = await negotiated(manager, op)
    except ProviderLimitError as error:
        assert error.reason == "irreducible_over_limit", error
        return False
    transaction = result["transaction"]
    if transaction is None:
        first = result["final_attempt"]["budget_decision"]
        assert first["estimated_input_tokens"] <= first["input_limit_tokens"], result
        quiet = result["measured_before"] < result["trigger"]
        assert result["outcome"] == ("not_needed" if quiet else "protected_floor"), result
        return False
    assert transaction.state is TxnState.READY and transaction.has_changes, transaction
    return True


MODES = [(ERROR, False), (ERROR, True), (CANCEL, False), (CANCEL, True)]


@hsettings()
@given(op=operations(), mode=st.sampled_from(MODES))
async def test_sweeps_over_generated_histories(
    op: Operation, mode: tuple[str, bool], anyio_backend: str
) -> None:
    assume(await runnable(op))
    EXAMPLES[f"deep sweeps over generated histories ({anyio_backend})"] += 1
    report = await run_sweep(op, None, *mode, expected_errors=EXPECTED)
    EXAMPLES[f"deep sweep await points ({anyio_backend})"] += report.points


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@hsettings()
@given(op=operations(), persistent=st.booleans())
async def test_native_sweeps_over_generated_histories(
    op: Operation, persistent: bool, anyio_backend: str
) -> None:
    assume(await runnable(op))
    EXAMPLES["deep native sweeps over generated histories"] += 1
    await run_sweep(op, None, NATIVE, persistent, expected_errors=EXPECTED)


@pytest.mark.parametrize("anyio_backend", ["trio"])
@hsettings()
@given(op=operations())
async def test_step_sweeps_over_generated_histories(op: Operation, anyio_backend: str) -> None:
    assume(await runnable(op))
    EXAMPLES["deep step sweeps over generated histories"] += 1
    with track_transactions() as ledger:

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            return await build(op, plan, ledger)

        await step_sweep(
            op.name,
            prepare,
            boundary=boundary(op),
            expected_errors=(ContextLengthError,),
            check=checker(op, ledger),
        )
