"""The public surface, pinned; the two parts' import graph; one test per typed error.

A change here is a change of the module's contract with orchestrators: make it on
purpose, and say so in the README.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

import amplifier_module_context_simple as package
from amplifier_module_context_simple import (
    ContextLengthError,
    CountContractError,
    InvalidMessageError,
    ProviderLimitError,
    RequestTransaction,
    RequiredContentTooLargeError,
    RetainedContentMissingError,
    SimpleContextManager,
    TokenMeterError,
    TransactionConflictError,
    TransactionStateError,
    TxnState,
)

PACKAGE_DIR = Path(package.__file__).parent

PUBLIC = {
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
}

# The manager's documented surface (docs/design.md section 1, README "Using it"), plus the configuration attributes and the read-only observability ones.
MANAGER_SURFACE = {
    "add_message",
    "get_messages",
    "set_messages",
    "clear",
    "get_messages_for_request",
    "get_messages_for_request_retaining",
    "get_measured_request_view",
    "claim_foreground_usage",
    "set_system_prompt_factory",
    "should_compact",
    "compact",
    "from_config",
    "config",
    "messages",
    "version",
    "observable_state",
    "last_compaction_stats",
    "last_token_meter_stats",
    "on_llm_response",
    # configuration attributes, one per key (each validates as the constructor does)
    "max_tokens",
    "max_tokens_fallback",
    "compact_threshold",
    "target_usage",
    "protected_recent",
    "protected_tool_results",
    "truncate_chars",
    "compaction_notice_enabled",
    "compaction_notice_token_reserve",
    "compaction_notice_verbosity",
    "compaction_notice_min_level",
    "output_reserve_fraction",
    "token_meter",
    "max_tool_result_bytes",
    "count_every_rung",
    "learn_provider_limits",
    "preserved_thinking",
    "estimate_margin",
    "cache_lifetime",
    "idle_compact_at",
}

HANDLE_SURFACE = {"commit", "rollback", "state", "conflict", "has_changes", "stats"}

# The test support shipped to orchestrator authors (and the only one this suite uses).
TESTING_BEFORE_THE_SPLIT = {
    "BOUNDARY_EVENTS",
    "BUDGET_EVENT",
    "CANCEL",
    "COMPACTION_EVENT",
    "ERROR",
    "FAULT_KINDS",
    "INGRESS_EVENT",
    "NATIVE",
    "FaultPlan",
    "FaultyHooks",
    "FrozenMap",
    "InjectedFault",
    "Prepared",
    "Ref",
    "ReferenceStore",
    "Snapshot",
    "StepCanceller",
    "StepRun",
    "SweepFailure",
    "SweepReport",
    "Trial",
    "ViewInvariantError",
    "ViewReport",
    "check_isolation",
    "check_view_invariants",
    "faulty_count_view",
    "faulty_factory",
    "faulty_fit_output",
    "freeze",
    "mutate_view",
    "run_cancelling_after_step",
    "snapshot",
    "step_sweep",
    "sweep",
}
TESTING = TESTING_BEFORE_THE_SPLIT | {
    "DELIVERY_MARKS",
    "DIALECTS",
    "LOADED_TOOL_STATE",
    "MUTATION_MARK",
    "NOTICE_METADATA",
    "NOTICE_PREFIX",
    "Prepare",
    "RecordingHooks",
    "Registration",
    "Slot",
    "after_interruption",
    "call_ids",
    "display_order",
    "is_notice",
    "reduced_kind",
    "result_ids",
    "strip_notice",
    "tail_is_safe",
}


def public_names(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_package_exports_exactly_its_public_surface() -> None:
    assert set(package.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(package, name), name


def test_every_module_declares_its_public_names() -> None:
    """Every module has an explicit ``__all__`` (or is private), and each name it lists
    exists."""
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix=f"{package.__name__}."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), f"{info.name} has no __all__"
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.__all__ lists missing {name!r}"


def test_the_testing_package_exports_exactly_its_surface() -> None:
    """Every name ``testing.py`` exported before it became a package still imports from
    ``amplifier_module_context_simple.testing``; the new names are listed here on purpose."""
    testing = importlib.import_module(f"{package.__name__}.testing")
    assert set(testing.__all__) == TESTING
    for name in TESTING:
        assert hasattr(testing, name), name


def test_the_testing_package_imports_neither_pytest_nor_hypothesis() -> None:
    """The runtime dependency is anyio only: test frameworks are the caller's choice."""
    code = (
        "import sys, amplifier_module_context_simple.testing; "
        "print(sorted(m for m in ('pytest', 'hypothesis', 'trio') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_the_manager_surface_is_the_contract() -> None:
    """What an orchestrator can call on the manager: its documented surface (docs/design.md section 1) and the configuration,
    nothing that exists only for the negotiator (it uses the seam instead)."""
    assert public_names(SimpleContextManager) == MANAGER_SURFACE


def test_the_manager_has_no_private_views_of_its_state() -> None:
    """What a test reads of the store it reads through the public surface
    (``observable_state()``, ``last_compaction_stats``, events): no private property
    re-exposes a piece of it."""
    private = [
        f"{cls.__name__}.{name}"
        for cls in SimpleContextManager.__mro__
        for name, value in vars(cls).items()
        if name.startswith("_") and isinstance(value, property)
    ]
    assert private == []


def test_the_transaction_handle_cannot_move_the_machine() -> None:
    assert public_names(RequestTransaction) == HANDLE_SURFACE
    assert RequestTransaction.__slots__ == ("__machine",)


# -- the import graph ---------------------------------------------------------------------


def imports_of(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved)."""
    relative_to = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    package_parts = list(relative_to.parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package_parts[: len(package_parts) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_the_runtime_never_imports_the_test_support() -> None:
    """The oracles in ``testing/`` share no code with what they check, either way: no module
    outside ``testing/`` and the replay (``cli/``) imports them."""
    for path in PACKAGE_DIR.rglob("*.py"):
        part = path.relative_to(PACKAGE_DIR).parts[0]
        if part in ("testing", "cli"):
            continue
        bad = {name for name in imports_of(path) if ".testing" in name}
        assert not bad, f"{path.name} imports {bad}"


def test_context_never_imports_the_negotiator() -> None:
    for path in (PACKAGE_DIR / "context").rglob("*.py"):
        bad = {name for name in imports_of(path) if ".negotiator" in name}
        assert not bad, f"{path.name} imports {bad}"


# The layers of ``context`` (its ``__init__`` docstring): each sub-package imports only the
# ones before it; the leaves (config, stats, slices) are open to all, the roots (store,
# state) to none of them.
LAYERS = ("formats", "counting", "history", "ladder", "rendering", "policy")
LEAVES = frozenset({"config", "stats", "slices"})


def test_each_layer_of_context_imports_only_the_layers_below_it() -> None:
    context = PACKAGE_DIR / "context"
    for rank, layer in enumerate(LAYERS):
        allowed = set(LAYERS[: rank + 1]) | LEAVES
        for path in (context / layer).rglob("*.py"):
            used = {
                name.split(".context.", 1)[1].split(".")[0]
                for name in imports_of(path)
                if ".context." in name
            }
            assert used <= allowed, f"{layer}/{path.name} imports {used - allowed}"


def test_the_driver_reaches_context_only_through_the_seam() -> None:
    for path in sorted((PACKAGE_DIR / "negotiator").glob("*.py")):
        name = path.name
        imported = imports_of(path)
        from_context = {i for i in imported if ".context." in i or i.endswith(".context")}
        modules = {".".join(i.split(".context.", 1)[1].split(".")[:2]) for i in from_context}
        assert modules <= {"policy.negotiable"}, f"{name} imports context modules {modules}"


# -- one test per typed error ----------------------------------------------------------


def run(coroutine: Any) -> Any:
    async def main() -> Any:
        return await coroutine

    return anyio.run(main)


def test_invalid_message_error() -> None:
    with pytest.raises(InvalidMessageError) as raised:
        run(SimpleContextManager().add_message({"role": 3}))
    assert isinstance(raised.value, ValueError) and "role" in str(raised.value)


def test_retained_content_missing_error() -> None:
    async def scenario() -> None:
        manager = SimpleContextManager()
        await manager.add_message({"role": "user", "content": "hi"})
        await manager.get_messages_for_request_retaining(retain_contents=["absent"])

    with pytest.raises(RetainedContentMissingError) as raised:
        run(scenario())
    assert isinstance(raised.value, ContextLengthError) and isinstance(raised.value, ValueError)


def test_required_content_too_large_error() -> None:
    async def scenario() -> None:
        manager = SimpleContextManager()
        await manager.add_message({"role": "user", "content": "word " * 4000})
        await manager.get_messages_for_request_retaining(
            retain_contents=[], token_budget=100, hard_fit=True
        )

    with pytest.raises(RequiredContentTooLargeError) as raised:
        run(scenario())
    error = raised.value
    assert error.budget == 100 and error.required is not None and error.required > 100
    # the same figures as ProviderLimitError: what had to fit, the limit, rung and reason
    assert (error.limit, error.rung, error.reason) == (100, 0, "required_over_budget")
    assert error.estimated == error.required


def test_token_meter_error() -> None:
    async def count(view: list[dict[str, Any]]) -> Any:
        await checkpoint()
        return {"dispatch": view, "budget_decision": None}

    with pytest.raises(TokenMeterError) as raised:
        run(
            SimpleContextManager().get_measured_request_view(
                provider=None, retain_contents=[], count_view=count
            )
        )
    assert isinstance(raised.value, RuntimeError)


def test_count_contract_error() -> None:
    async def count(view: list[dict[str, Any]]) -> Any:
        await checkpoint()
        return {"no": "dispatch"}

    manager = SimpleContextManager(token_meter="actual")
    with pytest.raises(CountContractError) as raised:
        run(manager.get_measured_request_view(provider=None, retain_contents=[], count_view=count))
    assert isinstance(raised.value, TypeError)


def test_provider_limit_error_carries_its_figures() -> None:
    async def count(view: list[dict[str, Any]]) -> Any:
        await checkpoint()
        decision = {"estimated_input_tokens": 5000, "input_limit_tokens": 100}
        return {"dispatch": view, "budget_decision": decision}  # unmeasured, oversize

    async def scenario() -> None:
        manager = SimpleContextManager(token_meter="actual")
        await manager.add_message({"role": "user", "content": "hi"})
        await manager.get_measured_request_view(provider=None, retain_contents=[], count_view=count)

    with pytest.raises(ProviderLimitError) as raised:
        run(scenario())
    error = raised.value
    assert isinstance(error, ContextLengthError)
    assert (error.reason, error.estimated, error.limit, error.rung) == (
        "oversize_unmeasured",
        5000,
        100,
        0,
    )


def test_transaction_conflict_error_when_the_history_is_replaced_during_a_count() -> None:
    async def scenario() -> None:
        manager = SimpleContextManager(token_meter="actual")
        await manager.add_message({"role": "user", "content": "hi"})

        async def count(view: list[dict[str, Any]]) -> Any:
            await manager.clear()
            return {"dispatch": view, "budget_decision": None}

        await manager.get_measured_request_view(provider=None, retain_contents=[], count_view=count)

    with pytest.raises(TransactionConflictError):
        run(scenario())


def test_transaction_state_error_names_the_event_and_the_state() -> None:
    error = TransactionStateError("commit", TxnState.STAGED.name)
    assert (error.event, error.state) == ("commit", "STAGED")
    assert "commit" in str(error) and "STAGED" in str(error)


def test_every_error_is_documented() -> None:
    for error in (
        ContextLengthError,
        CountContractError,
        InvalidMessageError,
        ProviderLimitError,
        RequiredContentTooLargeError,
        RetainedContentMissingError,
        TokenMeterError,
        TransactionConflictError,
        TransactionStateError,
    ):
        assert inspect.getdoc(error), error
