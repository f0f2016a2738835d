"""Reliability test support: fault injection at the seams, snapshots, a model and the oracles.

Shipped with the package for orchestrator authors who want to test their own loop against
this module the way the module tests itself (docs/design.md section 10); it is
also the only test support of this project's own suite. One module per concern:

- ``faults``: ``FaultPlan`` (fail or cancel the k-th seam hit: ``InjectedFault``, an anyio
  cancellation, or a native ``asyncio.Task.cancel()``), the seam wrappers
  ``faulty_count_view``, ``faulty_fit_output``, ``faulty_factory`` and ``FaultyHooks``;
- ``hooks``: ``RecordingHooks``, a hook registry that records registrations and
  deliveries (started, completed, interrupted), and the event names;
- ``state``: ``snapshot(manager)`` - the store's public ``observable_state()``, which
  covers every mark that changes a later request (sticky decisions, stats, meter, floor
  mark, learned provider limit, the budget payload last delivered, history and display
  order, held notes, version) - ``freeze``, and the ``ReferenceStore`` model;
- ``messages``, ``layout`` and ``oracle``: ``check_view_invariants``, the view oracle of
  docs/design.md section 10 (tool pairing by id in the OpenAI, Amplifier and Anthropic
  formats, protected content and loaded-tool state, order, no invention, the budget,
  the canonical history, isolation, serialisability and the providers' own rules), and
  ``check_isolation``;
- ``sweeps`` and ``steps``: ``sweep`` (a fault at every await point, each outcome judged
  against the no-fault reference run, retries compared with it, events included) and
  ``step_sweep`` (a trio cancellation before every scheduler step);
- ``provider_rules`` and ``thinking_oracle``: the two independent oracles (the providers'
  tool-use request rules, ``check_provider_valid``; the preserved-thinking prefix rule,
  ``PrefixLedger``). They import only the standard library, share no code with the runtime
  they check, and are imported by their module path (nothing here re-exports them).

Only anyio and the standard library are imported at import time (never pytest or
hypothesis); asyncio and trio are imported when a mode that needs them is used.
"""

from __future__ import annotations

from .faults import CANCEL as CANCEL
from .faults import ERROR as ERROR
from .faults import FAULT_KINDS as FAULT_KINDS
from .faults import NATIVE as NATIVE
from .faults import FaultPlan as FaultPlan
from .faults import FaultyHooks as FaultyHooks
from .faults import InjectedFault as InjectedFault
from .faults import faulty_count_view as faulty_count_view
from .faults import faulty_factory as faulty_factory
from .faults import faulty_fit_output as faulty_fit_output
from .hooks import BOUNDARY_EVENTS as BOUNDARY_EVENTS
from .hooks import BUDGET_EVENT as BUDGET_EVENT
from .hooks import COMPACTION_EVENT as COMPACTION_EVENT
from .hooks import INGRESS_EVENT as INGRESS_EVENT
from .hooks import RecordingHooks as RecordingHooks
from .hooks import Registration as Registration
from .layout import Slot as Slot
from .layout import display_order as display_order
from .messages import LOADED_TOOL_STATE as LOADED_TOOL_STATE
from .messages import NOTICE_METADATA as NOTICE_METADATA
from .messages import NOTICE_PREFIX as NOTICE_PREFIX
from .messages import call_ids as call_ids
from .messages import is_notice as is_notice
from .messages import reduced_kind as reduced_kind
from .messages import result_ids as result_ids
from .messages import strip_notice as strip_notice
from .messages import tail_is_safe as tail_is_safe
from .oracle import DIALECTS as DIALECTS
from .oracle import MUTATION_MARK as MUTATION_MARK
from .oracle import ViewInvariantError as ViewInvariantError
from .oracle import ViewReport as ViewReport
from .oracle import check_isolation as check_isolation
from .oracle import check_view_invariants as check_view_invariants
from .oracle import mutate_view as mutate_view
from .state import FrozenMap as FrozenMap
from .state import Ref as Ref
from .state import ReferenceStore as ReferenceStore
from .state import Snapshot as Snapshot
from .state import freeze as freeze
from .state import snapshot as snapshot
from .steps import StepCanceller as StepCanceller
from .steps import StepRun as StepRun
from .steps import run_cancelling_after_step as run_cancelling_after_step
from .steps import step_sweep as step_sweep
from .sweeps import DELIVERY_MARKS as DELIVERY_MARKS
from .sweeps import Prepare as Prepare
from .sweeps import Prepared as Prepared
from .sweeps import SweepFailure as SweepFailure
from .sweeps import SweepReport as SweepReport
from .sweeps import Trial as Trial
from .sweeps import after_interruption as after_interruption
from .sweeps import sweep as sweep

__all__ = (
    "BOUNDARY_EVENTS",
    "BUDGET_EVENT",
    "CANCEL",
    "COMPACTION_EVENT",
    "DELIVERY_MARKS",
    "DIALECTS",
    "ERROR",
    "FAULT_KINDS",
    "INGRESS_EVENT",
    "LOADED_TOOL_STATE",
    "MUTATION_MARK",
    "NATIVE",
    "NOTICE_METADATA",
    "NOTICE_PREFIX",
    "FaultPlan",
    "FaultyHooks",
    "FrozenMap",
    "InjectedFault",
    "Prepare",
    "Prepared",
    "RecordingHooks",
    "Ref",
    "ReferenceStore",
    "Registration",
    "Slot",
    "Snapshot",
    "StepCanceller",
    "StepRun",
    "SweepFailure",
    "SweepReport",
    "Trial",
    "ViewInvariantError",
    "ViewReport",
    "after_interruption",
    "call_ids",
    "check_isolation",
    "check_view_invariants",
    "display_order",
    "faulty_count_view",
    "faulty_factory",
    "faulty_fit_output",
    "freeze",
    "is_notice",
    "mutate_view",
    "reduced_kind",
    "result_ids",
    "run_cancelling_after_step",
    "snapshot",
    "step_sweep",
    "strip_notice",
    "sweep",
    "tail_is_safe",
)
