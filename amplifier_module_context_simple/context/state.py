"""The store's observable state as one immutable, comparable value.

``ContextStore.observable_state()`` returns an ``ObservableState``: everything a store
operation may change that a caller can read or that changes what a later operation does.
Two states compare equal (``==``) when they hold the same *values*; ``same_objects``
also compares the identity of the committed decisions, the stats and the meter stats (a
request that raised must leave the very objects in place: ``last_compaction_stats`` is
the same dict). ``differences`` names the fields that differ.

Left out on purpose: caches that only make a later request cheaper and never change its
result (the renderer's previous view, the reduced-form cache, cached estimates), and
what the caller owns (``hooks``). Nested message values are frozen copies, so a state
never changes after it was taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .config import ContextConfig
from .counting.budget import LearnedLimit
from .counting.meter import TokenMeter
from .history.history import History
from .ladder.decisions import Decisions
from .policy.compaction import FloorMark

__all__ = (
    "FrozenMap",
    "ObservableState",
    "Ref",
    "freeze",
)


@dataclass(frozen=True, slots=True)
class FrozenMap:
    """An immutable, comparable mapping (what ``freeze`` turns a dict into)."""

    items: tuple[tuple[object, object], ...]


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
class ObservableState:
    """Everything observable a store operation may change, as immutable values."""

    # -- the canonical history -----------------------------------------------------------
    history: tuple[object, ...]
    """``get_messages()`` contents (sequence ids and stamped timestamps included)."""
    order: tuple[int, ...]
    """The display order views follow (negative items: synthesized results)."""
    held: tuple[int, ...]
    """Notes the open run holds back while its calls are running."""
    released: object
    """Held notes released so far -> the seq from which views show them."""
    version: tuple[int, int]
    """(history epoch, commit version)."""
    # -- the committed sticky decisions ----------------------------------------------------
    removed: frozenset[int]
    truncated: frozenset[int]
    stubbed: frozenset[int]
    level: int
    overrides: object
    """seq -> the reduced form views show (None: removed)."""
    floor_reported: bool
    """The committed decisions reported a protected floor (the storm guard reads it)."""
    stats: object
    """``last_compaction_stats``."""
    # -- the meter ----------------------------------------------------------------------
    meter: object
    """``last_token_meter_stats``: the readings of the last request that returned."""
    measured: int | None
    """The provider's latest reading (``llm:response`` or the foreground recorder)."""
    meter_claimed: bool
    meter_stale: bool
    # -- marks that change later requests -------------------------------------------------
    floor: FloorMark | None
    """The last reported protected floor (no storm: the next request reuses it)."""
    learned_limit: LearnedLimit | None
    """The provider limit learned from a provider-directed hard-fit rebuild."""
    budget_mark: object
    """The ``context:budget`` payload last delivered (emitted again only on change)."""
    # -- configuration ---------------------------------------------------------------
    config: ContextConfig
    has_factory: bool
    """A system prompt factory is set."""
    # -- identities (not compared by ``==``; see ``same_objects``) ------------------------
    decisions_ref: Ref = field(compare=False)
    stats_ref: Ref = field(compare=False)
    meter_ref: Ref = field(compare=False)

    @classmethod
    def of(
        cls,
        *,
        history: History,
        version: tuple[int, int],
        decisions: Decisions,
        stats: dict[str, Any] | None,
        meter: TokenMeter,
        meter_stats: dict[str, Any] | None,
        floor: FloorMark | None,
        learned_limit: LearnedLimit | None,
        budget_mark: dict[str, Any] | None,
        config: ContextConfig,
        has_factory: bool,
    ) -> ObservableState:
        """The state of a store holding these values (``ContextStore.observable_state``):
        frozen copies of the history, the decisions' shown forms and the payloads, and
        references to the decisions, stats and meter-stats objects."""
        return cls(
            history=tuple(map(freeze, map(history.entries.stored, range(len(history))))),
            order=tuple(history.order),
            held=history.held,
            released=freeze(history.released_at),
            version=version,
            removed=decisions.removed,
            truncated=decisions.truncated,
            stubbed=decisions.stubbed,
            level=decisions.level,
            overrides=freeze(decisions.shown()),
            floor_reported=decisions.floor_reported,
            stats=freeze(stats),
            meter=freeze(meter_stats),
            measured=meter.measured,
            meter_claimed=meter.claimed,
            meter_stale=meter.stale,
            floor=floor,
            learned_limit=learned_limit,
            budget_mark=freeze(budget_mark),
            config=config,
            has_factory=has_factory,
            decisions_ref=Ref(decisions),
            stats_ref=Ref(stats),
            meter_ref=Ref(meter_stats),
        )

    def same_objects(self, other: ObservableState) -> bool:
        """The committed decisions, stats and meter stats are the very same objects."""
        return (
            self.decisions_ref == other.decisions_ref
            and self.stats_ref == other.stats_ref
            and self.meter_ref == other.meter_ref
        )

    def identical(self, other: ObservableState) -> bool:
        """Equal values and the very same objects: what an operation that raised (or was
        refused) must leave behind."""
        return self == other and self.same_objects(other)

    def differences(self, other: ObservableState, *, objects: bool = True) -> list[str]:
        """Names of the fields that differ; ``objects``: the identity fields too (compare
        two states of one store; across two stores only values can agree)."""
        return [
            f.name
            for f in fields(self)
            if (objects or f.compare) and getattr(self, f.name) != getattr(other, f.name)
        ]
