"""Reliability test support: fault injection at the seams, snapshots, models and oracles.

Shipped with the package for orchestrator authors who want to test their own loop against
this module the way the module tests itself (RELIABILITY.md sections 4, 5 and 7).

The module awaits only through its *seams*: the system prompt factory, the orchestrator's
``count_view`` and ``fit_output``, and ``hooks.emit`` (``context:compaction``,
``context:budget``, ``context:tool_result_ingress_truncated``). Everything else is
synchronous. So a test can enumerate every await point of an operation:

- ``FaultPlan`` counts seam hits and, at hit ``k`` (and every later hit when
  ``persistent``), raises ``InjectedFault``, cancels the enclosing anyio ``CancelScope``,
  or cancels the current asyncio task natively (``asyncio.Task.cancel()``, which pierces
  anyio shields - what an asyncio host really does);
- ``faulty_count_view``, ``faulty_fit_output``, ``faulty_factory`` and ``FaultyHooks`` route
  a seam through a plan (every seam is a real checkpoint);
- ``sweep`` runs an operation once without faults (the reference: the expected ``after``
  snapshot and the number of await points), then once per await point with a fault
  there, and checks the outcome against the store: an operation that raised left the
  store exactly as before (same values, same objects), except when the fault interrupted a
  *boundary delivery* (an event delivered after the operation's commit, see
  ``BOUNDARY_EVENTS``) - then the store equals the no-fault ``after``; an operation that
  returned equals ``after``;
- ``step_sweep`` does the same with a trio ``Instrument`` that cancels after the task's
  k-th scheduler step, which also covers awaits that are *not* seams (anyio on trio only);
- ``snapshot`` is a comparable, immutable picture of everything a request may change;
- ``ReferenceStore`` models the canonical history;
- ``check_view_invariants`` is the view oracle of RELIABILITY.md section 7 (items 1-4, 6,
  7 and 9), by tool id, in the OpenAI, Amplifier and Anthropic formats.

Only anyio and the standard library are imported at module level; asyncio and trio are
imported when a mode that needs them is used.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    import trio

    from .manager import SimpleContextManager

__all__ = (
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
)

T = TypeVar("T")

ERROR: Final = "error"
"""Raise ``InjectedFault`` at the hit."""
CANCEL: Final = "cancel"
"""Cancel the plan's anyio ``CancelScope`` at the hit (delivered at the seam's checkpoint)."""
NATIVE: Final = "native"
"""``asyncio.current_task().cancel()`` at the hit (asyncio only; pierces anyio shields)."""
FAULT_KINDS: Final = (ERROR, CANCEL, NATIVE)

COMPACTION_EVENT: Final = "context:compaction"
BUDGET_EVENT: Final = "context:budget"
INGRESS_EVENT: Final = "context:tool_result_ingress_truncated"
BOUNDARY_EVENTS: Final = frozenset({COMPACTION_EVENT, BUDGET_EVENT})
"""Events an ordinary or hard-fit request delivers after its commit: a fault interrupting
them keeps the commit. For ``RequestTransaction.commit`` use ``{COMPACTION_EVENT}``; the
negotiated view commits nothing and delivers ``context:budget`` before its return boundary,
so use an empty set (a fault anywhere leaves the store as before)."""

CountView = Callable[[list[dict[str, Any]]], Awaitable[Any]]
FitOutput = Callable[[list[dict[str, Any]], Any], Awaitable[Any]]
Factory = Callable[[], Awaitable[str]]


# -- fault plans ---------------------------------------------------------------------------


class InjectedFault(Exception):
    """The error a ``FaultPlan`` raises at its chosen hit."""

    def __init__(self, label: str, hit: int) -> None:
        super().__init__(f"injected fault at {label}#{hit}")
        self.label = label
        self.hit = hit


@dataclass
class FaultPlan:
    """Counts seam hits; at hit ``fail_at`` raises or cancels (persistent: every later hit too).

    ``fail_at=0`` never fires: that is the reference run. ``always`` maps seam labels to a
    kind that fires at *every* hit with that label (compound faults: e.g. every hook
    delivery fails while a count is cancelled). A disarmed plan neither counts nor fires
    (use it while preparing a store), but its seams still checkpoint.
    """

    fail_at: int = 0
    kind: str = ERROR
    persistent: bool = False
    scope: anyio.CancelScope | None = None
    always: Mapping[str, str] = field(default_factory=dict)
    armed: bool = True
    hits: int = 0
    labels: list[str] = field(default_factory=list)
    fired: list[tuple[int, str, str]] = field(default_factory=list)
    """``(hit, label, kind)`` of every hit that fired."""

    def __post_init__(self) -> None:
        unknown = {self.kind, *self.always.values()} - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; use {FAULT_KINDS}")
        if self.fail_at < 0:
            raise ValueError(f"fail_at must be >= 0, got {self.fail_at}")

    @property
    def fired_label(self) -> str | None:
        """The label of the first hit that fired."""
        return self.fired[0][1] if self.fired else None

    @property
    def last_fired_label(self) -> str | None:
        return self.fired[-1][1] if self.fired else None

    def arm(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def _due(self, label: str) -> str | None:
        if not self.armed:
            return None
        self.hits += 1
        self.labels.append(label)
        k = self.fail_at
        if k and (self.hits == k or (self.persistent and self.hits > k)):
            return self.kind
        return self.always.get(label)

    def hit_nowait(self, label: str) -> None:
        """A synchronous seam (e.g. an ``is_cancelled`` predicate): fire without a checkpoint.

        A cancellation requested here is delivered at the caller's next checkpoint.
        """
        kind = self._due(label)
        if kind is None:
            return
        self.fired.append((self.hits, label, kind))
        if kind == ERROR:
            raise InjectedFault(label, self.hits)
        if kind == CANCEL:
            if self.scope is None:
                raise RuntimeError("a cancelling FaultPlan needs its CancelScope (plan.scope)")
            self.scope.cancel()
            return
        import asyncio

        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is None:
            raise RuntimeError("native cancellation needs a running asyncio task")
        task.cancel()

    async def hit(self, label: str) -> None:
        """An async seam: count the hit, fire if due, then checkpoint."""
        self.hit_nowait(label)
        await anyio.lowlevel.checkpoint()


def faulty_count_view(plan: FaultPlan, inner: CountView, *, label: str = "count_view") -> CountView:
    """``inner`` (an orchestrator's ``count_view``) with a seam hit before each call."""

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await plan.hit(label)
        return await inner(view)

    return count_view


def faulty_fit_output(plan: FaultPlan, inner: FitOutput, *, label: str = "fit_output") -> FitOutput:
    """``inner`` (an orchestrator's ``fit_output``) with a seam hit before each call."""

    async def fit_output(view: list[dict[str, Any]], attempt: Any) -> Any:
        await plan.hit(label)
        return await inner(view, attempt)

    return fit_output


def faulty_factory(plan: FaultPlan, prompt: str | Factory, *, label: str = "factory") -> Factory:
    """A system prompt factory (returning ``prompt``, or awaiting it) with a seam hit."""

    async def factory() -> str:
        await plan.hit(label)
        if isinstance(prompt, str):
            return prompt
        return await prompt()

    return factory


class FaultyHooks:
    """A hook registry whose ``emit`` is a seam labelled ``emit:<event>``.

    Records, synchronously and before the seam's checkpoint, every event whose delivery
    *started*, and every delivery that *completed*; ``interrupted`` is the difference (a
    fault or cancellation landed inside that delivery). ``inner`` (optional) is a real
    registry to forward to (``register``/``unregister``/``emit``).
    """

    def __init__(self, plan: FaultPlan | None = None, inner: Any = None) -> None:
        self.plan = plan
        self.inner = inner
        self.started: list[str] = []
        self.completed: list[tuple[str, dict[str, Any]]] = []

    def register(self, *args: Any, **kwargs: Any) -> Any:
        register = getattr(self.inner, "register", None)
        if callable(register):
            return register(*args, **kwargs)
        return lambda: None

    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        self.started.append(event)
        if self.plan is not None:
            await self.plan.hit(f"emit:{event}")
        else:
            await anyio.lowlevel.checkpoint()
        result: Any = None
        emit = getattr(self.inner, "emit", None)
        if callable(emit):
            result = await emit(event, data)
        self.completed.append((event, data))
        return result

    @property
    def interrupted(self) -> list[str]:
        """Events whose delivery started but did not complete (in start order)."""
        done = Counter(event for event, _ in self.completed)
        left: list[str] = []
        for event in self.started:
            if done[event]:
                done[event] -= 1
            else:
                left.append(event)
        return left

    def named(self, event: str) -> list[dict[str, Any]]:
        """Payloads of the completed deliveries of ``event``."""
        return [data for name, data in self.completed if name == event]


# -- snapshots -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrozenMap:
    """An immutable, comparable mapping (what ``freeze`` turns a dict into)."""

    items: tuple[tuple[Any, Any], ...]


@dataclass(frozen=True, slots=True)
class _Typed:
    """A scalar whose type matters for equality (``True`` != ``1``, ``1.0`` != ``1``)."""

    kind: str
    value: str


def freeze(value: object) -> object:
    """A deep, immutable, exactly comparable copy of a JSON-like value.

    Mappings become ``FrozenMap`` (order-insensitive), lists and tuples tuples, sets
    frozensets; bools and floats keep their type (``nan`` equals ``nan``). Other objects
    are kept as they are (compared with their own ``==``).
    """
    if isinstance(value, Mapping):
        pairs = [(freeze(k), freeze(v)) for k, v in value.items()]
        pairs.sort(key=lambda kv: repr(kv[0]))
        return FrozenMap(tuple(pairs))
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(v) for v in value)
    if isinstance(value, bool):
        return _Typed("bool", repr(value))
    if isinstance(value, float):
        return _Typed("float", repr(value))
    return value


class Ref:
    """Compares by identity: ``Ref(a) == Ref(b)`` iff ``a is b`` (keeps ``a`` alive)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"Ref({type(self.obj).__name__}@{id(self.obj):#x})"


@dataclass(frozen=True)
class Snapshot:
    """Everything observable a store operation may change, as immutable values.

    ``==`` compares values; ``same_objects`` also compares the identity of the committed
    decisions, stats and meter-stats objects (a request that raised must leave the very
    same objects in place).
    """

    history: tuple[object, ...]
    """``get_messages()`` contents (sequence ids and stamped timestamps included)."""
    removed: frozenset[int]
    truncated: frozenset[int]
    stubbed: frozenset[int]
    level: int
    overrides: object
    stats: object
    meter: object
    measured: int | None
    version: tuple[int, int]
    floor: object
    decisions_ref: Ref = field(compare=False)
    stats_ref: Ref = field(compare=False)
    meter_ref: Ref = field(compare=False)

    def same_objects(self, other: Snapshot) -> bool:
        return (
            self.decisions_ref == other.decisions_ref
            and self.stats_ref == other.stats_ref
            and self.meter_ref == other.meter_ref
        )

    def differences(self, other: Snapshot) -> list[str]:
        """Names of the fields that differ (identity fields included)."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


def snapshot(manager: SimpleContextManager) -> Snapshot:
    """A comparable, immutable snapshot of ``manager``'s observable state."""
    decisions = manager._decisions
    stats = manager.last_compaction_stats
    meter = manager.last_token_meter_stats
    return Snapshot(
        history=tuple(freeze(message) for message in manager.messages),
        removed=frozenset(manager._removed_seqs),
        truncated=frozenset(manager._truncated_seqs),
        stubbed=frozenset(manager._stubbed_seqs),
        level=manager._sticky_level,
        overrides=freeze(dict(decisions.overrides)),
        stats=freeze(stats),
        meter=freeze(meter),
        measured=manager._last_measured_prompt_tokens,
        version=manager.version,
        floor=freeze(manager._floor),
        decisions_ref=Ref(decisions),
        stats_ref=Ref(stats),
        meter_ref=Ref(meter),
    )


# -- the reference model ---------------------------------------------------------------------


_SEQ: Final = "_seq"


def _seen(frozen: object) -> object:
    """A frozen message without bookkeeping metadata (``_seq``, ``timestamp``)."""
    if not isinstance(frozen, FrozenMap):
        return frozen
    pairs = []
    for key, value in frozen.items:
        if key == "metadata" and isinstance(value, FrozenMap):
            kept = tuple((k, v) for k, v in value.items if k not in ("_seq", "timestamp"))
            if kept:
                pairs.append((key, FrozenMap(kept)))
            continue
        pairs.append((key, value))
    return FrozenMap(tuple(pairs))


class ReferenceStore:
    """A model of the canonical history: what admission must have stored, in order.

    It assumes no ingress clipping (keep tool results under ``max_tool_result_bytes``).
    ``version`` models ``SimpleContextManager.version``: ``set_messages``/``clear`` move
    both parts, a commit moves the second (call ``note_commit``).
    """

    def __init__(self) -> None:
        self.messages: list[object] = []
        self.stamped: list[bool] = []
        self.epoch = 0
        self.commits = 0

    @property
    def version(self) -> tuple[int, int]:
        return self.epoch, self.commits

    def add(self, message: Mapping[str, Any]) -> None:
        """Model ``add_message`` (stamps a timestamp unless the metadata has one)."""
        metadata = message.get("metadata")
        has_time = isinstance(metadata, Mapping) and "timestamp" in metadata
        self.messages.append(freeze(message))
        self.stamped.append(not has_time)

    def set(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Model ``set_messages`` (no timestamps stamped).

        A list that starts with the current history (compared without the store's
        ``_seq`` and timestamps) extends it: the version stays. Any other list replaces
        the history: both parts of the version move.
        """
        given = list(messages)
        current = self.messages
        if (
            current
            and len(given) >= len(current)
            and all(_seen(freeze(m)) == _seen(c) for m, c in zip(given, current, strict=False))
        ):
            self.messages = [*current, *(freeze(m) for m in given[len(current) :])]
            self.stamped = [*self.stamped, *([False] * (len(given) - len(current)))]
            return
        self.messages = [freeze(m) for m in given]
        self.stamped = [False] * len(self.messages)
        self.epoch += 1
        self.commits += 1

    def clear(self) -> None:
        self.set(())

    def note_commit(self) -> None:
        self.commits += 1

    def mismatches(self, stored: Sequence[Mapping[str, Any]]) -> list[str]:
        """How ``stored`` (``manager.messages``) differs from the model; empty if it agrees."""
        problems: list[str] = []
        if len(stored) != len(self.messages):
            problems.append(f"history has {len(stored)} messages, the model {len(self.messages)}")
        for index, (message, expected, stamped) in enumerate(
            zip(stored, self.messages, self.stamped, strict=False)
        ):
            metadata = message.get("metadata")
            if not isinstance(metadata, Mapping) or metadata.get(_SEQ) != index:
                problems.append(f"message {index}: metadata._seq is not {index}")
                continue
            rest = {k: v for k, v in metadata.items() if k != _SEQ}
            if stamped and not isinstance(rest.pop("timestamp", None), str):
                problems.append(f"message {index}: no admission timestamp")
            shell = {k: v for k, v in message.items() if k != "metadata"}
            model = cast(FrozenMap, expected)
            given = dict(model.items)
            given_metadata = given.pop("metadata", None)
            if freeze(shell) != FrozenMap(tuple(sorted(given.items(), key=lambda kv: repr(kv[0])))):
                problems.append(f"message {index}: stored message differs from the admitted one")
            wanted = dict(given_metadata.items) if isinstance(given_metadata, FrozenMap) else {}
            if freeze(rest) != FrozenMap(tuple(sorted(wanted.items(), key=lambda kv: repr(kv[0])))):
                problems.append(f"message {index}: stored metadata differs from the admitted one")
        return problems

    def check(self, manager: SimpleContextManager) -> None:
        """Raise ``AssertionError`` unless the manager's history and version agree."""
        problems = self.mismatches(manager.messages)
        if manager.version != self.version:
            problems.append(f"version {manager.version} != model {self.version}")
        if problems:
            raise AssertionError("store disagrees with the model: " + "; ".join(problems))


# -- the view oracle (RELIABILITY.md section 7) ---------------------------------------------


_HIDDEN: Final = frozenset(
    {
        _SEQ,
        "amplifier_public_message",
        "amplifier_public_copy_source",
        "amplifier_public_reference_only",
    }
)
_NOTICE_SOURCE: Final = "context-compaction"
_TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})


class ViewInvariantError(AssertionError):
    """A view broke an invariant of RELIABILITY.md section 7 (``item`` says which)."""

    def __init__(self, item: int, code: str, detail: str, position: int | None = None) -> None:
        super().__init__(f"view invariant {item} ({code}): {detail}")
        self.item = item
        self.code = code
        self.detail = detail
        self.position = position
        """Index of the offending view message, when one message is at fault."""


@dataclass(frozen=True)
class ViewReport:
    """What the oracle found in a valid view."""

    systems: int
    mapping: tuple[int, ...]
    """History index of every non-system, non-notice view message that is not a synthesized
    result, in view order."""
    reduced: tuple[int, ...]
    """History indexes shown in a reduced (truncated/stubbed) form."""
    notice: bool
    pending: frozenset[str]
    """Call ids shown without results because the history has none yet (the pending tail)."""
    synthesized: frozenset[str] = frozenset()
    """Call ids the view answers with synthesized results."""
    held: frozenset[int] = frozenset()
    """History indexes of the notes held back because the history ends while the calls of
    their run are still running (never shown by this view)."""


def _get(obj: object, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _meta(message: Mapping[str, Any]) -> Mapping[str, Any]:
    value = message.get("metadata")
    return value if isinstance(value, Mapping) else {}


def _call_formats(message: Mapping[str, Any]) -> dict[str, bool]:
    """Call id -> whether it is an Anthropic ``tool_use`` block, in declaration order.

    An assistant message declares calls in ``tool_calls`` (OpenAI and Amplifier) and in
    ``tool_use``/``tool_call`` content blocks; an id stated twice is one call, in the form
    met first (``tool_calls`` before the content).
    """
    if message.get("role") != "assistant":
        return {}
    formats: dict[str, bool] = {}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            value = _get(call, "id")
            if not _valid_id(value):
                value = _get(call, "tool_call_id")
            if _valid_id(value):
                formats.setdefault(value, False)
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            kind = _get(block, "type")
            if kind in ("tool_use", "tool_call") and _valid_id(_get(block, "id")):
                formats.setdefault(_get(block, "id"), kind == "tool_use")
    return formats


def _call_ids(message: Mapping[str, Any]) -> list[str]:
    """Call ids an assistant message declares (all three formats), in order, unique."""
    return list(_call_formats(message))


def _result_blocks(message: Mapping[str, Any]) -> list[object]:
    content = message.get("content")
    if message.get("role") in ("assistant", "tool") or not isinstance(content, list):
        return []
    return [block for block in content if _get(block, "type") == "tool_result"]


def _block_result_id(block: object) -> object:
    value = _get(block, "tool_use_id")
    return value if _valid_id(value) else _get(block, "tool_call_id")


def _result_refs(message: Mapping[str, Any]) -> list[object]:
    """The raw id of every result a message carries (possibly missing or not a string)."""
    if message.get("role") == "tool":
        return [message.get("tool_call_id")]
    return [_block_result_id(block) for block in _result_blocks(message)]


def _result_ids(message: Mapping[str, Any]) -> list[str]:
    return [ref for ref in _result_refs(message) if isinstance(ref, str) and ref]


def _carries_only_results(message: Mapping[str, Any]) -> bool:
    """A *pure* result carrier: a ``tool`` message, or non-empty block content that is
    nothing but ``tool_result`` blocks (whatever their ids)."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return (
        message.get("role") != "assistant"
        and isinstance(content, list)
        and bool(content)
        and len(_result_blocks(message)) == len(content)
    )


def _only_results(message: Mapping[str, Any]) -> bool:
    """A pure result carrier that answers at least one id."""
    return _carries_only_results(message) and bool(_result_ids(message))


def _is_human(message: Mapping[str, Any]) -> bool:
    metadata = _meta(message)
    return (
        message.get("role") == "user"
        and not metadata.get("ephemeral")
        and metadata.get("source") not in ("hook", _NOTICE_SOURCE)
        and not _only_results(message)
    )


def _is_envelope(message: Mapping[str, Any]) -> bool:
    metadata = _meta(message)
    return (
        message.get("role") == "user"
        and metadata.get("ephemeral") is True
        and metadata.get("persisted") is True
        and isinstance(message.get("content"), str)
    )


def _is_notice(message: Mapping[str, Any]) -> bool:
    return (
        message.get("role") == "user"
        and _meta(message).get("source") == _NOTICE_SOURCE
        and isinstance(message.get("content"), str)
    )


def _normal(message: Mapping[str, Any], *, drop_time: bool) -> dict[str, Any]:
    """``message`` without store bookkeeping; empty or missing metadata read as absent."""
    out = dict(message)
    metadata = out.pop("metadata", None)
    if isinstance(metadata, Mapping):
        kept = {
            k: v
            for k, v in metadata.items()
            if k not in _HIDDEN and not (drop_time and k == "timestamp")
        }
        if kept:
            out["metadata"] = kept
    elif metadata is not None:
        out["metadata"] = metadata
    return out


def _same_message(shown: Mapping[str, Any], public: Mapping[str, Any]) -> bool:
    """``shown`` is ``public`` as a view shows it (the store's timestamp may be absent)."""
    drop_time = "timestamp" not in _meta(shown)
    return _normal(shown, drop_time=False) == _normal(public, drop_time=drop_time)


def _text_hint(content: object) -> str:
    """The first words of a message's text (how a reduced form is traced to its source)."""
    if isinstance(content, str):
        return " ".join(content[:20].split())
    return ""


def _kept_pieces(blocks: list[Any], keep: int) -> list[str]:
    """The text each direct text block keeps when ``keep`` characters are kept in total,
    earlier text first."""
    pieces: list[str] = []
    remaining = keep
    for block in blocks:
        text = _get(block, "text")
        if _get(block, "type") in _TEXT_TYPES and isinstance(text, str):
            piece = text[:remaining]
            remaining -= len(piece)
            pieces.append(piece)
    return pieces


def _reduced_content(before: object, after: object, keep: int | None) -> bool:
    """``after`` is one tool result's content (a string or a block list) reduced.

    A string keeps its first ``keep`` characters; a block list becomes a list of at most one
    more block (a lead-in) in which every block is an original block or a text block, and
    which keeps the first ``keep`` characters of the original's text (non-text blocks give
    way to short text placeholders). ``keep`` None: the amount kept is not checked.
    """
    if isinstance(before, str):
        return isinstance(after, str) and (keep is None or before[:keep] in after)
    if not (isinstance(before, list) and isinstance(after, list)):
        return False
    if len(after) > len(before) + 1:
        return False
    texts: list[str] = []
    for block in after:
        text = _get(block, "text")
        if _get(block, "type") in _TEXT_TYPES and isinstance(text, str):
            texts.append(text)
        elif not any(block == old for old in before):
            return False
    joined = "\n".join(texts)
    return keep is None or all(piece in joined for piece in _kept_pieces(before, keep))


def _is_reduced_form(
    shown: Mapping[str, Any], public: Mapping[str, Any], truncate_chars: int | None
) -> bool:
    note = _meta(shown).get("compaction")
    form = _get(note, "form")
    if form not in ("truncated", "stubbed"):
        return False
    shell = {k: v for k, v in shown.items() if k not in ("content", "metadata")}
    if shell != {k: v for k, v in public.items() if k not in ("content", "metadata")}:
        return False
    shown_meta = {k: v for k, v in _meta(shown).items() if k != "compaction"}
    drop_time = "timestamp" not in shown_meta
    original = _normal(public, drop_time=drop_time).get("metadata", {})
    if _normal({"metadata": shown_meta}, drop_time=False).get("metadata", {}) != original:
        return False
    before, after = public.get("content"), shown.get("content")
    if form == "stubbed":
        return (
            public.get("role") == "user"
            and isinstance(before, str)
            and isinstance(after, str)
            and _text_hint(before) in after
        )
    if not _only_results(public):
        return False
    protected = _get(note, "protected")
    if protected not in (None, True):
        return False
    # the last-resort form of a protected result may keep less than ``truncate_chars``
    keep = None if protected else truncate_chars
    if public.get("role") == "tool" or not isinstance(before, list):
        return _reduced_content(before, after, keep)
    if not (isinstance(after, list) and len(before) == len(after)):
        return False
    for old, new in zip(before, after, strict=True):
        if old == new:
            continue
        if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
            return False
        if _get(old, "type") != "tool_result":
            return False
        if {k: v for k, v in old.items() if k != "content"} != {
            k: v for k, v in new.items() if k != "content"
        }:
            return False
        if not _reduced_content(old.get("content"), new.get("content"), keep):
            return False
    return True


def _says_no_result(text: object) -> bool:
    return isinstance(text, str) and "no result" in text.lower()


def _is_synthesized(shown: Mapping[str, Any], ids: tuple[str, ...], anthropic: bool) -> bool:
    """``shown`` is exactly the synthesized result the view owes for ``ids``."""
    note = {"compaction": {"form": "synthesized", "tool_call_ids": list(ids)}}
    if shown.get("metadata") != note:
        return False
    content = shown.get("content")
    if not anthropic:
        return (
            set(shown) == {"role", "tool_call_id", "content", "metadata"}
            and shown["role"] == "tool"
            and shown["tool_call_id"] == ids[0]
            and _says_no_result(content)
        )
    return (
        set(shown) == {"role", "content", "metadata"}
        and shown["role"] == "user"
        and isinstance(content, list)
        and len(content) == len(ids)
        and all(
            isinstance(block, Mapping)
            and set(block) == {"type", "tool_use_id", "is_error", "content"}
            and block["type"] == "tool_result"
            and block["tool_use_id"] == call_id
            and block["is_error"] is True
            and _says_no_result(block["content"])
            for block, call_id in zip(content, ids, strict=True)
        )
    )


@dataclass
class _Row:
    index: int
    public: dict[str, Any] | None
    """What a view shows for the message (None: never shown)."""
    owners: dict[str, int]
    """Result id -> index of the history message whose call it answers."""


@dataclass(frozen=True)
class _Slot:
    """One place in the expected display order of the conversation."""

    index: int
    """The history index of the message (of the call message, for a synthesized result)."""
    synthesized: tuple[str, ...] = ()
    """For a synthesized result: the call ids it answers."""
    anthropic: bool = False
    """For a synthesized result: a user message of ``tool_result`` blocks."""


_RENAMED: Final = "renamed_tool_call_ids"


@dataclass
class _Run:
    """An assistant message with calls and what was admitted before the run closed."""

    owner: int
    pending: list[str]
    """Its call ids (as stored) not answered yet, in call order."""
    formats: dict[str, bool]
    renames: dict[str, str]
    """Stored id -> the fresh id views show for it (reused ids only)."""
    pure: list[int] = field(default_factory=list)
    mixed: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    """Notes admitted while ids were pending: shown once the run is answered or closed."""
    others: list[int] = field(default_factory=list)

    def shown(self, call_id: str) -> str:
        return self.renames.get(call_id, call_id)

    def slots(self, closed: bool) -> list[_Slot]:
        """The run in display order; ``closed``: a later turn closed it (else the history
        ends with it). Held notes are left out of a run that ends the history pending."""
        out = [_Slot(self.owner)]
        if closed and self.pending:
            tool = [self.shown(c) for c in self.pending if not self.formats[c]]
            blocks = tuple(self.shown(c) for c in self.pending if self.formats[c])
            out += [_Slot(self.owner, (call_id,)) for call_id in tool]
            if blocks:
                out.append(_Slot(self.owner, blocks, anthropic=True))
        held = self.held if closed or not self.pending else []
        out += [_Slot(index) for index in (*self.pure, *self.mixed, *held, *self.others)]
        return out


@dataclass
class _Layout:
    """The history as views must show it (see ``check_view_invariants``)."""

    rows: list[_Row]
    slots: list[_Slot]
    """The conversation (system messages aside) in display order."""
    results_of: dict[tuple[int, str], list[int]]
    """(call message index, call id as shown) -> indexes of the messages carrying its result."""
    synthesized: dict[int, list[int]]
    """Call message index -> positions in ``slots`` of its synthesized results."""
    tail: int | None
    """Index of the call message of a run still open at the end (the pending tail)."""
    tail_pending: frozenset[str]
    """Its call ids (as shown) without a result."""
    held: frozenset[int] = frozenset()
    """Indexes of the notes of the pending tail's run: never shown (no slot)."""


def _renamed(value: object, renames: Mapping[str, str]) -> object:
    return renames[value] if isinstance(value, str) and value in renames else value


def _with_renames(
    message: dict[str, Any], renames: Mapping[str, str], id_keys: tuple[str, ...]
) -> dict[str, Any]:
    """``message`` showing ``renames`` (stored id -> shown id) wherever ``id_keys`` of its
    calls (``tool_calls`` entries, ``tool_use``/``tool_call`` blocks) or results (the
    message's ``tool_call_id``, ``tool_result`` blocks) hold a renamed id, with the
    ``renamed_tool_call_ids`` note (shown id -> stored id) in its metadata."""
    out = dict(message)
    metadata = out.get("metadata")
    note = {new: old for old, new in renames.items()}
    out["metadata"] = {**(metadata if isinstance(metadata, Mapping) else {}), _RENAMED: note}

    def block(value: object, kinds: tuple[str, ...] | None) -> object:
        if not isinstance(value, Mapping) or (
            kinds is not None and _get(value, "type") not in kinds
        ):
            return value
        changed = {k: _renamed(value.get(k), renames) for k in id_keys if value.get(k) in renames}
        return {**value, **changed} if changed else value

    if message.get("role") == "assistant":
        if isinstance(message.get("tool_calls"), list):
            out["tool_calls"] = [block(call, None) for call in message["tool_calls"]]
        kinds: tuple[str, ...] = ("tool_use", "tool_call")
    else:
        out["tool_call_id"] = _renamed(message.get("tool_call_id"), renames)
        if "tool_call_id" not in message:
            del out["tool_call_id"]
        kinds = ("tool_result",)
    if isinstance(message.get("content"), list):
        out["content"] = [block(b, kinds) for b in message["content"]]
    return out


def _public_form(
    message: Mapping[str, Any], run: _Run | None
) -> tuple[dict[str, Any] | None, list[str]]:
    """What a view shows for a non-assistant ``message`` admitted while ``run`` is open, and
    the ids (as stored) it answers.

    A result answers a still unanswered id of the open run; any other result is an orphan
    (a block with no valid id, or a second block for an id answered earlier in the same
    message, included): a ``tool`` message or a pure carrier left with no result is never
    shown, a block list loses its orphan ``tool_result`` blocks (and is never shown if
    nothing is left), and its remaining ``tool_result`` blocks come first, in their order,
    before every other block (Anthropic requires a turn answering calls to begin with its
    results). A result of a call whose id views rename shows the new id.
    """
    role = message["role"]
    open_ids = run.pending if run is not None else []
    linked: list[str] = []
    if role == "tool":
        ref = message.get("tool_call_id")
        if not (_valid_id(ref) and ref in open_ids):
            return None, []
        public = dict(message)
        linked = [ref]
    elif role == "system" or not _result_blocks(message):
        return dict(message), []
    else:
        answers: list[object] = []
        others: list[object] = []
        for block in message["content"]:
            if _get(block, "type") != "tool_result":
                others.append(block)
                continue
            ref = _block_result_id(block)
            if _valid_id(ref) and ref in open_ids and ref not in linked:
                linked.append(ref)
                answers.append(block)
        if not answers and not others:
            return None, []
        # a turn that answers calls begins with its results (Anthropic Messages)
        public = {**message, "content": [*answers, *others]}
    if run is None:
        return public, linked
    renames = {c: run.renames[c] for c in linked if c in run.renames}
    if renames:
        public = _with_renames(public, renames, ("tool_use_id", "tool_call_id"))
    return public, linked


def _layout(history: Sequence[object]) -> _Layout:
    """Compute, from the history alone, the rows, the runs and the expected display order.

    Runs: an assistant message with calls opens a run; the next assistant message closes
    it, and so does a person's own turn (a user message that is not machine-written - no
    ``source: hook``, not ephemeral - nor a pure result carrier), after its own results are
    linked. Within a run the call message comes first, then (once the run is closed with
    calls unanswered) their synthesized results, then the pure result carriers, then
    messages mixing results with other content, then everything else, each group in
    admission order. A message answering none of the run's ids that is not a person's turn
    (a note: hook, ephemeral, developer, ...) admitted while an id is pending is *held*: it
    takes its place among "everything else" once the run is answered or closed, and has no
    place at all (``_Layout.held``) when the history ends with the run pending. A message
    no view shows (reference-only row, orphan) changes nothing.
    A call id declared again after an earlier call message showed it is renamed
    ``<id>~<n>`` (the smallest n >= 2 not taken) in the call and in its run's results.
    """
    rows: list[_Row] = []
    slots: list[_Slot] = []
    results_of: dict[tuple[int, str], list[int]] = {}
    taken: set[str] = set()
    run: _Run | None = None

    def close(closed: bool) -> None:
        if run is not None:
            slots.extend(run.slots(closed))

    for index, message in enumerate(history):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or _meta(message).get("amplifier_public_reference_only") is True
        ):
            rows.append(_Row(index, None, {}))
            continue
        owners: dict[str, int] = {}
        if message["role"] == "assistant":
            close(closed=True)
            formats = _call_formats(message)
            renames: dict[str, str] = {}
            for call_id in formats:
                if call_id in taken:
                    n = 2
                    while f"{call_id}~{n}" in taken or f"{call_id}~{n}" in renames.values():
                        n += 1
                    renames[call_id] = f"{call_id}~{n}"
            taken.update(formats)
            taken.update(renames.values())
            public: dict[str, Any] | None = dict(message)
            if renames:
                public = _with_renames(dict(message), renames, ("id", "tool_call_id"))
            rows.append(_Row(index, public, owners))
            run = _Run(index, list(formats), formats, renames) if formats else None
            if run is None:
                slots.append(_Slot(index))
            continue
        public, linked = _public_form(message, run)
        rows.append(_Row(index, public, owners))
        if public is None or message["role"] == "system":
            continue
        human = _is_human(message) and not _carries_only_results(message)
        if run is None:
            slots.append(_Slot(index))
            continue
        for call_id in linked:
            run.pending.remove(call_id)
            owners[run.shown(call_id)] = run.owner
            results_of.setdefault((run.owner, run.shown(call_id)), []).append(index)
        if linked and _carries_only_results(message):
            run.pure.append(index)
        elif linked:
            run.mixed.append(index)
        elif run.pending and not human:
            run.held.append(index)  # a note while calls are running: shown after them
        else:
            run.others.append(index)
        if human:
            close(closed=True)
            run = None
    close(closed=False)
    synthesized: dict[int, list[int]] = {}
    for position, slot in enumerate(slots):
        if slot.synthesized:
            synthesized.setdefault(slot.index, []).append(position)
    tail = run.owner if run is not None else None
    pending = frozenset(run.shown(c) for c in run.pending) if run is not None else frozenset()
    held = frozenset(run.held) if run is not None and run.pending else frozenset()
    return _Layout(rows, slots, results_of, synthesized, tail, pending, held)


def _json_ok(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _runs_in_view(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[int | None, frozenset[str]] | ViewInvariantError:
    """Pairing on the view alone: every result answers a call of the same run (the latest
    assistant message before it, nothing else assistant in between), at most once; a run
    closed by a later assistant message has all of its results.

    Returns the view position of the last call message and its ids left unanswered at the
    end of the view (allowed only for the history's pending tail), or the error.
    """
    owner: int | None = None
    wanted: list[str] = []
    answered: set[str] = set()
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            missing = [call_id for call_id in wanted if call_id not in answered]
            if missing:
                return ViewInvariantError(
                    1,
                    "call-without-results",
                    f"view[{owner}] calls {missing} without results before the next assistant "
                    f"message (view[{position}])",
                    owner,
                )
            wanted = _call_ids(message)
            owner = position if wanted else None
            answered = set()
        for ref in _result_refs(message):
            if not _valid_id(ref):
                detail = f"view[{position}] carries a result id {ref!r}"
                return ViewInvariantError(1, "result-without-id", detail, position)
            assert isinstance(ref, str)
            if ref not in wanted:
                detail = f"view[{position}] answers {ref!r}, which no call of its run declares"
                return ViewInvariantError(1, "result-without-call", detail, position)
            if ref in answered:
                detail = f"view[{position}] answers {ref!r} a second time"
                return ViewInvariantError(1, "duplicate-result", detail, position)
            answered.add(ref)
    return owner, frozenset(call_id for call_id in wanted if call_id not in answered)


def _embed(
    body: Sequence[Mapping[str, Any]],
    layout: _Layout,
    truncate_chars: int | None,
    offset: int,
    *,
    reverse: bool,
) -> tuple[list[int], list[int]] | ViewInvariantError:
    """Map each view message to a slot of the display order, in order (greedy from the left
    or right): verbatim, a traceable reduced form, or exactly the synthesized result.

    Returns ``(chosen, reduced)`` (slot positions in view order; history indexes shown
    reduced), or the error for the first view message that does not fit (``held-note``
    when it is a note the history's pending tail holds back).
    """
    order = range(len(body) - 1, -1, -1) if reverse else range(len(body))
    positions = list(range(len(layout.slots)))
    if reverse:
        positions.reverse()
    chosen: list[int] = []
    reduced: list[int] = []
    cursor = 0

    def match(message: Mapping[str, Any], slot: _Slot) -> str | None:
        if slot.synthesized:
            if _is_synthesized(message, slot.synthesized, slot.anthropic):
                return "same"
            return None
        public = layout.rows[slot.index].public
        assert public is not None
        if _same_message(message, public):
            return "same"
        if _is_reduced_form(message, public, truncate_chars):
            return "reduced"
        return None

    for position in order:
        message = body[position]
        while cursor < len(positions):
            slot_position = positions[cursor]
            cursor += 1
            how = match(message, layout.slots[slot_position])
            if how is not None:
                chosen.append(slot_position)
                if how == "reduced":
                    reduced.append(layout.slots[slot_position].index)
                break
        else:
            where = offset + position
            held = [i for i in sorted(layout.held) if match(message, _Slot(i)) is not None]
            if held:
                return ViewInvariantError(
                    3,
                    "held-note",
                    f"view[{where}] shows history[{held[0]}], a note admitted while calls of "
                    f"history[{layout.tail}] were running: it is held until they are answered "
                    f"or the run is closed, and the history ends first: {message!r:.300}",
                    where,
                )
            if any(match(message, slot) is not None for slot in layout.slots):
                return ViewInvariantError(
                    3,
                    "out-of-order",
                    f"view[{where}] is a history message out of the display order (results "
                    f"right after their call, other messages of the run after them): "
                    f"{message!r:.300}",
                    where,
                )
            return ViewInvariantError(
                4,
                "invented",
                f"view[{where}] is neither a history message nor a traceable reduced form of "
                f"one nor a synthesized result owed by the view: {message!r:.300}",
                where,
            )
    if reverse:
        chosen.reverse()
        reduced.reverse()
    return chosen, reduced


def _pairing(
    layout: _Layout,
    chosen: Sequence[int],
    tail: tuple[int | None, frozenset[str]],
    offset: int,
) -> tuple[frozenset[str], frozenset[str]] | ViewInvariantError:
    """Pairing through the embedding. Returns (pending ids, synthesized ids) or the error.

    Synthesized results are shown exactly when their call message is; a call shown has all
    of its history results shown; a result shown has its call shown; ids left unanswered at
    the end of the view belong to the history's pending tail.
    """
    shown_slots = set(chosen)
    shown = {layout.slots[k].index for k in chosen if not layout.slots[k].synthesized}
    synthesized: set[str] = set()
    for owner, positions in layout.synthesized.items():
        present = [k in shown_slots for k in positions]
        if owner in shown and not all(present):
            return ViewInvariantError(
                1,
                "synthesized-missing",
                f"the call message history[{owner}] is shown without the synthesized results "
                "its unanswered calls are owed",
            )
        if owner not in shown and any(present):
            return ViewInvariantError(
                1,
                "synthesized-without-call",
                f"synthesized results for history[{owner}] are shown without their call",
            )
        if owner in shown:
            for k in positions:
                synthesized.update(layout.slots[k].synthesized)
    for index in sorted(shown):
        row = layout.rows[index]
        assert row.public is not None
        for call_id in _call_ids(row.public):
            answers = layout.results_of.get((index, call_id), [])
            missing = [a for a in answers if a not in shown]
            if missing:
                return ViewInvariantError(
                    1,
                    "call-without-results",
                    f"call {call_id!r} of history[{index}] shown without its results {missing}",
                )
        for rid, owner in row.owners.items():
            if owner not in shown:
                return ViewInvariantError(
                    1,
                    "result-without-call",
                    f"result {rid!r} of history[{index}] shown without its call (history[{owner}])",
                )
    position, unanswered = tail
    if unanswered:
        assert position is not None
        slot = layout.slots[chosen[position - offset]]
        if slot.synthesized or slot.index != layout.tail or not unanswered <= layout.tail_pending:
            return ViewInvariantError(
                1,
                "call-without-results",
                f"view[{position}] (history[{slot.index}]) leaves {sorted(unanswered)} "
                "unanswered but is not the history's pending tail",
                position,
            )
    return frozenset(unanswered), frozenset(synthesized)


def check_view_invariants(
    history: Sequence[object],
    view: object,
    *,
    factory_text: str | None = None,
    retained: Iterable[str] = (),
    protected: Iterable[Mapping[str, Any]] = (),
    truncate_chars: int | None = None,
    canonical: Sequence[object] | None = None,
) -> ViewReport:
    """Raise ``ViewInvariantError`` unless ``view`` is a valid view of ``history``.

    ``history`` is the canonical history: the messages as admitted (what the caller gave
    ``add_message``/``set_messages``) or as stored (``get_messages()``; the store's ``_seq``
    and admission timestamp are then allowed to be absent from the view). A view of a
    history *prefix* (a request that raced an admission) must be checked against that
    prefix. The expected view is computed from the history alone, by these rules (the
    providers' own: OpenAI Chat Completions and Anthropic Messages):

    - **runs**: an assistant message's calls (``tool_calls``, ``tool_use``/``tool_call``
      blocks) are answered by the results (``tool`` messages, ``tool_result`` blocks)
      admitted before the next assistant message or a person's own turn (a user message
      neither machine-written - ``source: hook``, ephemeral - nor made of results only; a
      turn mixing results with typed text closes the run after answering). A result that
      answers a still unanswered id of the open run is linked to it; any other (call never
      made, made in an earlier run or only in a reference-only row, admitted before its
      call, or a second result for an answered id) is an orphan: a ``tool`` message or a
      message of nothing but results is then never shown, a block list loses its orphan
      blocks (and is never shown if nothing is left). Reference-only rows and orphans
      change no run;
    - **tidied result carriers**: in a list of blocks the orphan ``tool_result`` blocks
      (no valid id, an id the open run does not wait for, or an id answered by an earlier
      block of the same message) are left out, and the remaining ``tool_result`` blocks
      come first, in their order, before every other block (a turn answering calls begins
      with its results: Anthropic Messages);
    - **reused ids**: a call id that an earlier shown call message declared is shown as
      ``<id>~<n>`` (the smallest n >= 2 not taken) in its call and in its run's results,
      whose metadata gets ``renamed_tool_call_ids`` (shown id -> stored id);
    - **display order**: system messages first; then, within a run, the call message, then
      the *pure* result carriers (a ``tool`` message, a message of nothing but
      ``tool_result`` blocks) in admission order, then messages mixing results with other
      content, then every other message of the run, in admission order;
    - **held notes**: a message admitted while the open run has ids still unanswered that
      answers none of them and is neither a person's turn, an assistant message nor a
      system message (a machine-written note: ``source: hook``, an ephemeral or persisted
      envelope, a developer message, ...) is *held*: shown in its place among the run's
      other messages once the run is answered completely or closed (after the synthesized
      results, before the closing message), never while the run is pending - a history
      ending with the run pending never shows it (``ViewReport.held``). A note admitted
      when no id is pending is placed as usual;
    - **synthesized results**: when a run closes with ids unanswered, the view answers
      them right after the call message, in the call's format: one ``{"role": "tool",
      "tool_call_id", "content"}`` per id declared in ``tool_calls`` or as a ``tool_call``
      block, then one user message of ``tool_result`` blocks (``is_error: True``) for the
      ``tool_use`` ids, each with a text saying no result was recorded and ``metadata ==
      {"compaction": {"form": "synthesized", "tool_call_ids": [...]}}``. They are shown
      exactly when their call message is;
    - **pending tail**: a run still open at the end of the history shows no results for
      the ids it has not received.

    Items checked:

    1. tool pairing by id, both ways, in all three formats, on the view itself: every
       result has a valid id, declared by the latest assistant message before it (no other
       assistant message in between), answered once; every call shown has results for all
       of its ids before the next assistant message, except the history's pending tail;
       and through the history: a call shown has all of its results shown (synthesized
       ones included), a result shown has its call shown;
    2. protected content, verbatim: system messages (or ``factory_text`` plus hook-sourced
       system messages), the first and the latest human prompt, the newest envelope of
       every ``retained`` body (unless it is a held note, which is not shown), and every
       message in ``protected``;
    3. order: system messages first; the rest is a subsequence of the display order above
       (a held note is shown nowhere: ``held-note``), plus at most one compaction notice at
       the end, only when no call of the view is left unanswered;
    4. no invention: each message equals a history message (minus store bookkeeping), is
       a reduced form traceable to one (``metadata["compaction"]``: a stubbed user message;
       a truncated result - string content or a block list, in a ``tool`` message or in
       ``tool_result`` blocks, with ``"protected": True`` for the last-resort form of a
       protected result), or is a synthesized result the rules above owe; no ``_seq`` or
       ``amplifier_public_*`` key leaks;
    6. when ``canonical`` (the history read again after the call) is given, it equals
       ``history``;
    7. isolation: the view is a new list of new message and metadata dicts (no object of
       ``history`` is shared, no message dict appears twice);
    9. ``json.dumps(view)`` succeeds whenever ``json.dumps(history)`` does.
    """

    def fail(item: int, code: str, detail: str, position: int | None = None) -> ViewInvariantError:
        return ViewInvariantError(item, code, detail, position)

    if not isinstance(view, list):
        raise fail(4, "not-a-list", f"a view must be a list, got {type(view).__name__}")
    messages: list[Mapping[str, Any]] = []
    for position, message in enumerate(view):
        if not isinstance(message, dict):
            raise fail(4, "not-a-dict", f"view[{position}] is {type(message).__name__}")
        messages.append(message)

    # 9: serialisable (for a serialisable history)
    if _json_ok(list(history)) and not _json_ok(view):
        raise fail(9, "json", "json.dumps(view) fails for a JSON-serialisable history")

    # 4: no bookkeeping leaks
    for position, message in enumerate(messages):
        leaked = sorted(key for key in _meta(message) if key in _HIDDEN)
        if leaked:
            raise fail(4, "bookkeeping-leak", f"view[{position}] carries {leaked}")

    # 7: isolation by identity
    history_objects = {id(m) for m in history} | {
        id(m.get("metadata")) for m in history if isinstance(m, Mapping) and m.get("metadata")
    }
    seen: set[int] = set()
    if view is history:
        raise fail(7, "shared-list", "the view is the history list itself")
    for position, message in enumerate(messages):
        metadata = message.get("metadata")
        if id(message) in history_objects or (
            isinstance(metadata, dict) and metadata and id(metadata) in history_objects
        ):
            raise fail(7, "shared-dict", f"view[{position}] shares a dict with the history")
        if id(message) in seen:
            raise fail(7, "repeated-dict", f"view[{position}] is the same dict as another")
        seen.add(id(message))

    # 3: system messages first
    systems = 0
    while systems < len(messages) and messages[systems].get("role") == "system":
        systems += 1
    late = [i for i in range(systems, len(messages)) if messages[i].get("role") == "system"]
    if late:
        raise fail(3, "system-late", f"system message at view[{late[0]}] after the conversation")

    # 1: pairing by id, on the view alone (runs)
    tail = _runs_in_view(messages)
    if isinstance(tail, ViewInvariantError):
        raise tail

    layout = _layout(history)
    rows = layout.rows

    # 2 + 3: the system block
    stored_systems: list[Mapping[str, Any]] = [
        r.public for r in rows if r.public is not None and r.public["role"] == "system"
    ]
    if factory_text is not None:
        expected: list[Mapping[str, Any]] = [{"role": "system", "content": factory_text}]
        expected += [s for s in stored_systems if _meta(s).get("source") == "hook"]
    else:
        expected = stored_systems
    shown_systems = messages[:systems]
    if len(shown_systems) != len(expected) or not all(
        _same_message(a, b) for a, b in zip(shown_systems, expected, strict=False)
    ):
        raise fail(2, "systems", f"system block {shown_systems!r:.300} != {expected!r:.300}")

    # 3 + 4: the notice, only at the end of a view that leaves no call unanswered
    body = messages[systems:]
    notice = (
        bool(body)
        and _is_notice(body[-1])
        and not any(
            r.public is not None and _is_notice(r.public) and _same_message(body[-1], r.public)
            for r in rows
        )
    )
    if notice:
        body = body[:-1]
        if tail[1]:
            raise fail(
                3,
                "notice-unsafe",
                f"compaction notice in a view that leaves {sorted(tail[1])} unanswered",
            )

    # 3 + 4: a subsequence of the display order, each message verbatim, a traceable reduced
    # form or an owed synthesized result. Equal messages (a duplicated row) make the
    # embedding ambiguous, so pairing is judged on the leftmost and on the rightmost
    # embedding; the view passes if either is consistent.
    leftmost = _embed(body, layout, truncate_chars, systems, reverse=False)
    if isinstance(leftmost, ViewInvariantError):
        raise leftmost
    rightmost = _embed(body, layout, truncate_chars, systems, reverse=True)
    assert not isinstance(rightmost, ViewInvariantError)

    # 1: pairing by id, through the embedding
    chosen, reduced = leftmost
    pairing = _pairing(layout, chosen, tail, systems)
    if isinstance(pairing, ViewInvariantError):
        second = _pairing(layout, rightmost[0], tail, systems)
        if isinstance(second, ViewInvariantError):
            raise pairing
        pairing = second
        chosen, reduced = rightmost
    pending, synthesized = pairing
    mapping = [layout.slots[k].index for k in chosen if not layout.slots[k].synthesized]

    # 2: protected content, verbatim
    must: list[Mapping[str, Any]] = []
    humans = [r.public for r in rows if r.public is not None and _is_human(r.public)]
    if humans:
        must += [humans[0], humans[-1]]
    for text in retained:
        envelopes = [
            r
            for r in rows
            if r.public is not None and _is_envelope(r.public) and r.public["content"] == text
        ]
        if not envelopes:
            raise fail(2, "retained-missing", f"no envelope in the history carries {text[:60]!r}")
        newest = envelopes[-1]
        if newest.index not in layout.held:  # a held envelope is not shown yet
            assert newest.public is not None
            must.append(newest.public)
    must += list(protected)
    for message in must:
        if not any(_same_message(shown_message, message) for shown_message in body):
            raise fail(2, "protected", f"missing or altered: {message!r:.300}")

    # 6: canonical unchanged
    if canonical is not None and [freeze(m) for m in canonical] != [freeze(m) for m in history]:
        raise fail(6, "canonical-changed", "the canonical history changed")

    return ViewReport(
        systems=systems,
        mapping=tuple(mapping),
        reduced=tuple(reduced),
        notice=notice,
        pending=pending,
        synthesized=synthesized,
        held=layout.held,
    )


def mutate_view(view: list[dict[str, Any]]) -> None:
    """Set, replace and delete keys of every view message and of its metadata; append one."""
    for message in view:
        message["content"] = "mutated"
        message["injected"] = True
        message.pop("tool_call_id", None)
        metadata = message.get("metadata")
        if isinstance(metadata, dict):
            metadata["injected"] = True
            metadata.pop("timestamp", None)
            metadata.pop("source", None)
        else:
            message["metadata"] = {"injected": True}
    view.append({"role": "user", "content": "appended"})


async def check_isolation(
    manager: SimpleContextManager,
    view: list[dict[str, Any]],
    next_view: Callable[[], Awaitable[list[dict[str, Any]]]],
) -> None:
    """Item 7: mutating ``view`` changes neither the history nor the next view.

    ``next_view`` must rebuild the same view (e.g. the same request again).
    """
    before = snapshot(manager)
    expected = freeze(view)
    mutate_view(view)
    if snapshot(manager) != before:
        raise ViewInvariantError(7, "isolation", "mutating a view changed the store")
    again = await next_view()
    if freeze(again) != expected:
        raise ViewInvariantError(7, "isolation", "mutating a view changed the next view")


# -- sweeps ------------------------------------------------------------------------------------


@dataclass
class Prepared(Generic[T]):
    """A fresh store with its seams routed through a plan, and the operation to run."""

    manager: SimpleContextManager
    run: Callable[[], Awaitable[T]]
    hooks: FaultyHooks | None = None
    follow_up: Callable[[], Awaitable[object]] | None = None
    """A clean retry after a run that raised and left the store unchanged."""


Prepare = Callable[[FaultPlan], Awaitable[Prepared[T]]]


@dataclass
class Trial(Generic[T]):
    """One run of an operation with a fault at hit (or step) ``k``."""

    k: int
    plan: FaultPlan
    prepared: Prepared[T]
    before: Snapshot
    state: Snapshot | None = None
    returned: bool = False
    value: T | None = None
    error: BaseException | None = None
    cancelled: bool = False
    expected: str = ""
    """Which reference the oracle compared against: ``before`` or ``after``."""

    @property
    def interrupted(self) -> list[str]:
        hooks = self.prepared.hooks
        return hooks.interrupted if hooks is not None else []

    def describe(self) -> str:
        outcome = "returned" if self.returned else ("cancelled" if self.cancelled else "raised")
        return (
            f"k={self.k} kind={self.plan.kind} persistent={self.plan.persistent} "
            f"fired={self.plan.fired} labels={self.plan.labels} outcome={outcome} "
            f"error={self.error!r} interrupted={self.interrupted}"
        )


class SweepFailure(AssertionError):
    """A sweep found a run whose outcome and store state disagree."""

    def __init__(self, name: str, trial: Trial[Any], problem: str) -> None:
        super().__init__(f"{name}: {problem}\n  {trial.describe()}")
        self.trial = trial
        self.problem = problem


@dataclass
class SweepReport:
    """How many await points (or scheduler steps) a sweep enumerated, and what happened."""

    name: str
    mode: str
    points: int
    labels: list[str]
    trials: int = 0
    raised_before: int = 0
    boundary: int = 0
    returned: int = 0

    def record(self, trial: Any, verdict: str) -> None:
        """Tally one faulted run and note on ``trial`` which state it was judged against."""
        self.trials += 1
        trial.expected = "before" if verdict == "before" else "after"
        if verdict == "before":
            self.raised_before += 1
        elif verdict == "boundary":
            self.boundary += 1
        else:
            self.returned += 1

    def summary(self) -> str:
        unit = "scheduler steps" if self.mode == "trio steps" else "await points"
        return (
            f"{self.name} [{self.mode}]: {self.points} {unit}, {self.trials} faulted runs "
            f"(raised->before {self.raised_before}, boundary->after {self.boundary}, "
            f"returned->after {self.returned}) {self.labels}"
        )


def _judge(
    name: str,
    trial: Trial[Any],
    after: Snapshot,
    boundary: Collection[str],
    expected_errors: tuple[type[BaseException], ...],
) -> str:
    """Check one finished trial against the oracle; return ``before``/``boundary``/``after``."""
    state = trial.state
    assert state is not None
    if trial.returned:
        if state != after:
            raise SweepFailure(
                name, trial, f"returned but store != no-fault after: {state.differences(after)}"
            )
        return "after"
    if trial.error is not None and not isinstance(trial.error, expected_errors):
        raise SweepFailure(name, trial, f"undocumented error type {type(trial.error).__name__}")
    if any(event in boundary for event in trial.interrupted):
        if state != after:
            raise SweepFailure(
                name,
                trial,
                "a fault interrupting a boundary delivery must keep the commit: store != "
                f"no-fault after: {state.differences(after)}",
            )
        return "boundary"
    if state != trial.before or not state.same_objects(trial.before):
        raise SweepFailure(
            name, trial, f"raised but store != before: {state.differences(trial.before)}"
        )
    return "before"


async def _run_trial(trial: Trial[T]) -> None:  # noqa: ASYNC910 - the scope may absorb it
    plan = trial.plan
    run = trial.prepared.run
    if plan.kind == NATIVE or NATIVE in plan.always.values():
        import asyncio

        async def body() -> T:
            return await run()

        task = asyncio.ensure_future(body())
        await asyncio.wait([task])
        if task.cancelled():
            trial.cancelled = True
        elif task.exception() is not None:
            trial.error = task.exception()
        else:
            trial.value = task.result()
            trial.returned = True
        return
    with anyio.CancelScope() as scope:
        plan.scope = scope
        try:
            trial.value = await run()
            trial.returned = True
        except Exception as error:
            trial.error = error
    if not trial.returned and trial.error is None:
        trial.cancelled = True


async def sweep(
    name: str,
    prepare: Prepare[T],
    *,
    kind: str,
    persistent: bool = False,
    boundary: Collection[str] = BOUNDARY_EVENTS,
    expected_errors: tuple[type[BaseException], ...] = (InjectedFault,),
    always: Mapping[str, str] | None = None,
    check: Callable[[Trial[T]], Awaitable[None]] | None = None,
    max_points: int = 10_000,
) -> SweepReport:
    """Inject a fault at every await point of an operation; check each outcome.

    ``prepare(plan)`` builds a fresh store whose seams go through ``plan`` and returns the
    operation. The reference run (a plan that never fires) gives the expected ``after``
    and the number N of seam hits; then for k = 1, 2, ... the operation runs with a fault
    of ``kind`` at hit k (and every later hit when ``persistent``) until a run finishes
    without reaching k, which must be k = N + 1. Oracle per run:

    - returned -> the store equals the no-fault ``after`` (values);
    - raised (an ``expected_errors`` error or a cancellation) with a ``boundary`` event's
      delivery interrupted -> the store equals ``after`` (the commit stands);
    - any other raise -> the store equals ``before`` (values and the same objects); then
      ``follow_up`` (if any), run without faults, must reach ``after``.

    ``check(trial)`` runs after every trial for caller-specific assertions (views, leaked
    transactions). Raises ``SweepFailure`` at the first disagreement.
    """
    reference = await _reference(name, prepare, always)
    after = reference.state
    assert after is not None
    labels = list(reference.plan.labels)
    report = SweepReport(
        name, f"{kind} {'persistent' if persistent else 'transient'}", len(labels), labels
    )
    for k in itertools.count(1):
        if k > max_points + 1:
            raise AssertionError(f"{name}: more than {max_points} await points")
        plan = FaultPlan(k, kind, persistent, always=dict(always or {}))
        prepared = await prepare(plan)
        trial = Trial(k, plan, prepared, snapshot(prepared.manager))
        await _run_trial(trial)
        trial.state = snapshot(prepared.manager)
        if plan.labels[: k - 1] != labels[: k - 1]:
            raise SweepFailure(name, trial, f"seam order differs from the reference {labels}")
        if not any(hit == k for hit, _, _ in plan.fired):
            if k != len(labels) + 1:
                raise SweepFailure(
                    name, trial, f"reached no hit {k} but the reference had {labels}"
                )
            if trial.returned != reference.returned or trial.state != after:
                raise SweepFailure(name, trial, "the unfaulted run differs from the reference")
            if check is not None:
                await check(trial)
            break
        verdict = _judge(name, trial, after, boundary, expected_errors)
        report.record(trial, verdict)
        if check is not None:
            await check(trial)
        if verdict == "before" and prepared.follow_up is not None:
            plan.disarm()
            try:
                await prepared.follow_up()
                retried = True
            except expected_errors:
                retried = False
            if retried != reference.returned:
                raise SweepFailure(name, trial, "a clean retry ended unlike the reference run")
            state = snapshot(prepared.manager)
            if state != after:
                raise SweepFailure(
                    name, trial, f"a clean retry did not reach after: {state.differences(after)}"
                )
    return report


async def _reference(name: str, prepare: Prepare[T], always: Mapping[str, str] | None) -> Trial[T]:
    plan = FaultPlan(always=dict(always or {}))
    prepared = await prepare(plan)
    trial = Trial(0, plan, prepared, snapshot(prepared.manager))
    await _run_trial(trial)
    trial.state = snapshot(prepared.manager)
    if not trial.returned and trial.state != trial.before:
        raise SweepFailure(name, trial, "the no-fault run raised and changed the store")
    return trial


# -- the trio step sweep (RELIABILITY.md T5) ------------------------------------------------------


class StepCanceller:
    """A trio ``Instrument``: cancels ``scope`` before the ``k``-th step of the watched task.

    The watched task is any task whose parent nursery is ``nursery`` (set by
    ``run_cancelling_after_step``). The cancellation is delivered at the task's next
    checkpoint in that step, so k = 1, 2, ... reaches every checkpoint of the task -
    seams, anyio-internal checkpoints and any await someone added outside the seams.
    """

    def __init__(self, k: int, scope: anyio.CancelScope) -> None:
        self.k = k
        self.scope = scope
        self.steps = 0
        self.nursery: object = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.nursery is not None and task.parent_nursery is self.nursery:
            self.steps += 1
            if self.steps == self.k:
                self.scope.cancel()


@dataclass
class StepRun(Generic[T]):
    """The outcome of ``run_cancelling_after_step``."""

    steps: int = 0
    returned: bool = False
    value: T | None = None
    error: Exception | None = None
    cancelled: bool = False


async def run_cancelling_after_step(k: int, run: Callable[[], Awaitable[T]]) -> StepRun[T]:
    """Run ``run()`` in its own trio task, cancelling it before its ``k``-th scheduler step.

    anyio on the trio backend only. ``steps`` is how many steps the task took; when
    ``steps < k`` the run finished before the cancellation was requested.
    """
    import trio

    scope = anyio.CancelScope()
    canceller = StepCanceller(k, scope)
    outcome: StepRun[T] = StepRun()

    async def worker() -> None:  # noqa: ASYNC910 - no extra step after the operation
        with scope:
            try:
                outcome.value = await run()
                outcome.returned = True
            except Exception as error:
                outcome.error = error
        outcome.cancelled = scope.cancelled_caught

    trio.lowlevel.add_instrument(cast("trio.abc.Instrument", canceller))
    try:
        async with trio.open_nursery() as nursery:
            canceller.nursery = nursery
            nursery.start_soon(worker)
    finally:
        trio.lowlevel.remove_instrument(cast("trio.abc.Instrument", canceller))
    outcome.steps = canceller.steps
    return outcome


async def step_sweep(
    name: str,
    prepare: Prepare[T],
    *,
    boundary: Collection[str] = BOUNDARY_EVENTS,
    expected_errors: tuple[type[BaseException], ...] = (),
    check: Callable[[Trial[T]], Awaitable[None]] | None = None,
    max_steps: int = 10_000,
) -> SweepReport:
    """``sweep``'s oracle over every scheduler step of the operation (trio backend).

    The plan handed to ``prepare`` never fires (its seams only checkpoint); a trio
    ``Instrument`` cancels the operation's task before its k-th step instead, for
    k = 1, 2, ... until a run takes fewer than k steps.
    """
    reference = await _reference(name, prepare, None)
    after = reference.state
    assert after is not None
    report = SweepReport(name, "trio steps", 0, list(reference.plan.labels))
    for k in itertools.count(1):
        if k > max_steps + 1:
            raise AssertionError(f"{name}: more than {max_steps} steps")
        plan = FaultPlan()
        prepared = await prepare(plan)
        trial = Trial(k, plan, prepared, snapshot(prepared.manager))
        outcome = await run_cancelling_after_step(k, prepared.run)
        trial.returned, trial.value = outcome.returned, outcome.value
        trial.error, trial.cancelled = outcome.error, outcome.cancelled
        trial.state = snapshot(prepared.manager)
        if outcome.steps < k:
            if trial.returned != reference.returned or trial.state != after:
                raise SweepFailure(name, trial, "the uncancelled run differs from the reference")
            report.points = k - 1
            break
        verdict = _judge(name, trial, after, boundary, expected_errors)
        report.record(trial, verdict)
        if check is not None:
            await check(trial)
    return report
