"""``ContextStore``: the in-memory context store, its state and every write of it.

This module holds the writes and what must sit with them: admission, the request loop
and its commit boundary, the commit primitive, the negotiated request's opening (it lends
the store's own bound methods) and return boundary, and the event deliveries the fault
sweeps patch. What is not a write lives elsewhere: the request rules (``policy.py``), the
snapshot and its budget arithmetic (``plan.py``: ``RequestPlan``, ``Limits``), the seam
(``negotiable.py``), the observable state's assembly (``state.py``), the configuration
keys (``config.py``).

The store keeps the canonical history (append-only between ``set_messages``/``clear``)
and the committed sticky decisions. Every request builds a *view*: new message dicts,
system messages first, sticky decisions reapplied, sequence ids stripped, and the tail
compaction notice when one applies. The stored history is never rewritten.

Atomicity: every state change of a request happens in one synchronous block after the
request's last await before delivery (the *commit boundary*); events are delivered after
it. So a request that raises before delivery starts leaves no trace (same decisions, same
stats object, same meter stats, no event), and one whose ``context:compaction`` delivery
has started keeps its commit even if the caller is cancelled during delivery.

Many sessions on one event loop: the work of a request that grows with the history
(rendering, the ladder, the stats) is planned in slices (``slices.py``) that yield to the
loop once a few milliseconds of work have passed; only the commit is one synchronous
step. A plan reads its own snapshot (``RequestPlan``), never the store's current state, and
is checked against the store before it is committed (see ``_request`` and
``_open_negotiation`` for what happens when the store moved meanwhile).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Self, TypeVar

import anyio.lowlevel

from .._values import is_number
from ..errors import (
    RequiredContentTooLargeError,
    TransactionConflictError,
)
from .config import CONFIG_KEYS, TOKEN_METER_ACTUAL, ContextConfig
from .counting.budget import LearnedLimit
from .counting.cache import CacheLife, Clock
from .counting.correction import Reconciler
from .counting.meter import TokenMeter
from .history.history import (
    History,
    build_history,
    validate_message,
)
from .history.ingress import INGRESS_EVENT, RETRIEVAL_GUIDANCE, IngressClip, cap_tool_result
from .ladder.decisions import Decisions
from .policy.compaction import Compactor
from .policy.negotiable import Negotiable, StoreLink
from .policy.plan import RequestArgs, RequestPlan, derived_budget
from .policy.policy import RequestPolicy, check_retain
from .rendering.render import Renderer
from .rendering.thinking import PriorThinking, Ranges, with_range
from .slices import Pacer, run_through
from .state import ObservableState

__all__ = (
    "BUDGET_EVENT",
    "COMPACTION_EVENT",
    "ContextStore",
    "SystemPromptFactory",
)


logger = logging.getLogger(__name__)

COMPACTION_EVENT: Final = "context:compaction"
BUDGET_EVENT: Final = "context:budget"

SystemPromptFactory = Callable[[], Awaitable[str]]

PACED_PLANS: Final = 3
"""Paced plans an ordinary request makes before it plans without pausing (see
``_request``)."""


_Store = TypeVar("_Store", bound="ContextStore")


def _setting(name: str) -> property:
    """A configuration attribute of ``ContextStore``: reads the validated config; a write
    re-validates the whole config exactly as the constructor does (lenient keys included)."""

    def get(self: ContextStore) -> Any:
        return getattr(self._config, name)

    def put(self: ContextStore, value: Any) -> None:
        self._config = ContextConfig.from_mapping({**dataclasses.asdict(self._config), name: value})

    return property(get, put, doc=f"The ``{name}`` configuration key (validated on write).")


def _with_settings(cls: type[_Store]) -> type[_Store]:
    """``cls`` with one configuration attribute (``_setting``) per key of ``CONFIG_KEYS``."""
    for name in CONFIG_KEYS:
        setattr(cls, name, _setting(name))
    return cls


@_with_settings
class ContextStore:
    """In-memory conversation context with view-only, transactional compaction.

    Constructor keywords are the configuration keys (see ``ContextConfig``) plus
    ``hooks`` and ``clock`` (seconds, never decreasing; ``time.monotonic`` by default: a
    replay passes the transcript's times). Invalid values raise ``ValueError`` naming the key and value, except an
    unknown ``token_meter`` (warns, uses ``"estimate"``) and an invalid ``max_tokens``
    (warns, no cap).
    """

    # Every configuration key is an attribute (``config`` holds them all): read from the
    # validated config, re-validated as a whole on write. The attributes are made from
    # ``CONFIG_KEYS`` (``_with_settings``), so none is missing; their types are stated here
    # for the type checker, as ``ContextConfig`` declares them (tests/context/test_config.py
    # checks the two agree).
    max_tokens: int | None
    max_tokens_fallback: int
    compact_threshold: float
    target_usage: float
    protected_recent: float
    protected_tool_results: int
    truncate_chars: int
    compaction_notice_enabled: bool
    compaction_notice_token_reserve: int
    compaction_notice_verbosity: str
    compaction_notice_min_level: int
    output_reserve_fraction: float
    token_meter: str
    max_tool_result_bytes: int
    count_every_rung: bool
    learn_provider_limits: bool
    preserved_thinking: bool | str
    estimate_margin: float
    cache_lifetime: float
    idle_compact_at: float

    def __init__(self, *, hooks: Any = None, clock: Clock = time.monotonic, **config: Any) -> None:
        # The defaults live in ``ContextConfig`` alone; unknown keywords are a caller's
        # typo (the mount config, by contrast, warns and ignores them).
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise TypeError(f"unknown configuration keyword(s): {', '.join(unknown)}")
        self._config = ContextConfig.from_mapping(config)
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        self.hooks = hooks
        self._clock = clock
        self._cache = CacheLife()
        """When the latest view was returned, for the idle-aware trigger."""
        self._counts = Reconciler(self._config.estimate_margin)
        """The count correction: our estimate against the provider's usage reports."""
        self._history = History()
        self._epoch = 0
        self._decisions = Decisions()
        self._commit_version = 0
        self._meter = TokenMeter(listener=self._counts.reported)
        self._factory: SystemPromptFactory | None = None
        self._compactor = Compactor(lambda: self._config)
        self._prior_thinking = PriorThinking()
        self._unthought: Ranges = ()
        """Seq ranges shown without thinking (``RequestPlan.unthought``)."""
        self._sent_systems: tuple[object, object] | None = None
        """The system part of the last view a request returned (this history)."""
        self._returned = 0
        """Views requests have returned (``RequestPlan.returned``)."""
        self._late_from: int | None = None
        """A late commit's planned length, for the next request (``RequestPlan.late_from``)."""
        self._policy = RequestPolicy(
            lambda: self._config,
            renderer=Renderer(),
            compactor=self._compactor,
            meter=self._meter,
        )
        self._pacer = Pacer()
        """Paces planning work (``slices.py``); tests replace it (a zero budget yields at
        every pause point)."""
        self._last_token_meter_stats: dict[str, Any] | None = None
        self._last_emitted_budget: dict[str, Any] | None = None
        self._learned: LearnedLimit | None = None
        """The provider limit learned from a provider-directed hard-fit rebuild."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None, *, hooks: Any = None) -> Self:
        """Build a manager from a mount ``config`` dict (unknown keys warn and are ignored)."""
        validated = ContextConfig.from_mapping(config)
        return cls(**dataclasses.asdict(validated), hooks=hooks)

    @property
    def config(self) -> ContextConfig:
        """The validated configuration (immutable: assigning a key's attribute replaces it)."""
        return self._config

    # -- observability -----------------------------------------------------------

    @property
    def last_compaction_stats(self) -> dict[str, Any] | None:
        """Stats of the committed compaction (the dict ``context:compaction`` carried)."""
        stats = self._decisions.stats
        return None if stats is None else stats.to_event()

    @property
    def last_token_meter_stats(self) -> dict[str, Any] | None:
        """Meter readings of the latest request that returned."""
        return self._last_token_meter_stats

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The canonical history (copies), for callers that read the attribute."""
        entries = self._history.entries
        return list(map(entries.stored, range(len(entries))))

    @property
    def version(self) -> tuple[int, int]:
        """(history epoch, commit version): what a staged transaction must still match."""
        return self._epoch, self._commit_version

    def observable_state(self) -> ObservableState:
        """Everything observable an operation may change, as one immutable value.

        Two calls compare equal (``==``) when the store holds the same values: the
        canonical history and its display order, the version, the committed sticky
        decisions and their stats, the meter (its reading and the last meter stats), the
        floor mark, the learned provider limit, the ``context:budget`` payload last
        delivered, the configuration and whether a system prompt factory is set.
        ``same_objects`` also compares the identity of the decisions, stats and meter-stats
        objects. See ``context/state.py``.
        """
        return ObservableState.of(
            history=self._history,
            version=self.version,
            decisions=self._decisions,
            stats=self.last_compaction_stats,
            meter=self._meter,
            meter_stats=self._last_token_meter_stats,
            floor=self._compactor.floor,
            learned_limit=self._learned,
            budget_mark=self._last_emitted_budget,
            config=self._config,
            has_factory=self._factory is not None,
        )

    # -- admission ------------------------------------------------------------------

    async def add_message(self, message: dict[str, Any]) -> None:
        """Admit one message (a copy; the caller's dict is never mutated).

        Raises:
            InvalidMessageError: not a dict, no string role, or malformed fields; nothing
                is admitted.
        """
        await anyio.lowlevel.checkpoint()
        validate_message(message)
        cap = self._config.max_tool_result_bytes
        capped, clip = cap_tool_result(message, cap)
        if clip is not None:
            # Reported before admission: a cancelled delivery admits nothing.
            await self._report_clip(clip)
        self._history.admit_capped(capped, max_tool_result_bytes=cap, stamp_time=True)

    async def set_messages(self, messages: list[dict[str, Any]]) -> None:
        """Replace the history (session resume), or extend it.

        When ``messages`` starts with the current history (the same messages in the same
        order, as a provider would see them: the store's ``_seq`` and timestamps are
        ignored), only the rest is admitted and the sticky decisions, cached estimates and
        the floor mark stay: an orchestrator that re-sets the whole list after every turn
        gets the same views as one that appends. Any other list replaces the history and
        resets the sticky decisions. Messages are compared by their current content, never
        by identity (see ``History.starts``): a message or metadata dict that the caller
        changed in place since it gave it is a different message. Nested values are shared
        with the stored history and read-only by contract; a change inside one is not seen.
        So an extension reads every earlier message once (dict equality, in C) and admits
        only the new ones: identity would be cheaper but would miss an edit in place.

        Sequence ids are reassigned in order on a replacement; no timestamps are added.
        The whole batch is validated first: a bad message raises ``InvalidMessageError``
        naming its index and the previous history stays.
        """
        await anyio.lowlevel.checkpoint()
        cap = self._config.max_tool_result_bytes
        extension = self._extension_of(messages, cap)
        if extension is None:
            history, clips = build_history(messages, max_tool_result_bytes=cap)
            for clip in clips:  # reported before the swap: a cancelled delivery replaces nothing
                await self._report_clip(clip)
            self._reset(history)
            return
        start, epoch = len(self._history), self._epoch
        capped = [cap_tool_result(message, cap) for message in extension]
        for _, new_clip in capped:  # reported before admission: a cancelled delivery admits nothing
            if new_clip is not None:
                await self._report_clip(new_clip)
        if (len(self._history), self._epoch) != (start, epoch):
            # the history moved while the clips were delivered: replace it as given
            self._reset(build_history(messages, max_tool_result_bytes=cap)[0])
            return
        for message, _ in capped:
            self._history.admit_capped(message, max_tool_result_bytes=cap, stamp_time=False)

    def _extension_of(self, messages: object, cap: int) -> list[Mapping[str, Any]] | None:
        """The messages ``messages`` adds to the current history, or None when it does not
        start with it.

        Raises:
            InvalidMessageError: a message of ``messages`` is malformed (naming its index).
        """
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, list):
            return None  # build_history reports the problem
        history = self._history
        # Validated as compared: an unrelated list stops at its first message and
        # build_history validates it once, whole.
        if not len(history) or not history.starts(messages, cap):
            return None
        extension = messages[len(history) :]
        for index, message in enumerate(extension, start=len(history)):
            validate_message(message, index)
        return extension

    async def get_messages(self) -> list[dict[str, Any]]:
        """The full canonical history: a new list of copies of the admitted messages."""
        await anyio.lowlevel.checkpoint()
        return self.messages

    async def clear(self) -> None:
        """Empty the history and the sticky decisions, and forget the meter reading."""
        await anyio.lowlevel.checkpoint()
        self._reset(History())
        self._last_token_meter_stats = None
        self._meter.reset()

    def _reset(self, history: History) -> None:
        self._history = history
        self._learned = None
        self._epoch += 1
        self._decisions = Decisions()
        self._commit_version += 1
        self._compactor.reset()
        self._prior_thinking.reset()
        self._unthought = ()
        self._sent_systems = None
        self._late_from = None
        self._counts.reset()
        self._cache.reset()

    async def _report_clip(self, clip: IngressClip) -> None:
        delivered = await self._emit(INGRESS_EVENT, clip.payload())
        if not delivered:
            logger.warning(
                "context-simple: clipped tool result %s from %d to %d UTF-8 bytes at ingress; %s",
                clip.tool_call_id,
                clip.original_text_utf8_bytes,
                clip.stored_text_utf8_bytes,
                RETRIEVAL_GUIDANCE,
            )

    # -- protocol stubs ---------------------------------------------------------------

    async def should_compact(self) -> bool:
        """Always False: compaction is view-only and happens per request."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        return False

    async def compact(self) -> None:
        """No-op: the stored history is never compacted."""
        await anyio.lowlevel.checkpoint_if_cancelled()

    async def set_system_prompt_factory(self, factory: SystemPromptFactory) -> None:
        """Use ``await factory()`` as the system prompt of every request.

        Stored system messages are then left out of views, except hook-sourced ones.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not callable(factory):
            raise TypeError("set_system_prompt_factory needs an async callable")
        self._factory = factory
        logger.info("context-simple: system prompt factory set")

    # -- the meter --------------------------------------------------------------------

    async def on_llm_response(self, event: str, data: Any) -> None:
        """The ``llm:response`` listener ``mount`` registers: record the provider's reading
        (a host that builds the manager itself registers it the same way). Returns None,
        as hook handlers must."""
        self._meter.on_llm_response(data)
        await anyio.lowlevel.checkpoint_if_cancelled()

    def claim_foreground_usage(self) -> Callable[..., bool]:
        """Capability ``context.foreground_usage``: the orchestrator owns the meter."""
        return self._meter.claim()

    # -- requests ----------------------------------------------------------------------

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        """The view for the next provider request (the ordinary / legacy path)."""
        return await self._request(
            token_budget=token_budget, provider=provider, retain=(), hard_fit=False
        )

    async def get_messages_for_request_retaining(
        self,
        *,
        retain_contents: Sequence[str],
        provider: Any | None = None,
        token_budget: int | None = None,
        hard_fit: bool = False,
    ) -> list[dict[str, Any]]:
        """Capability ``context.request_retention``: a view that keeps named reminders.

        Each body in ``retain_contents`` must equal the content of an admitted persisted
        reminder envelope; the newest such envelope is kept complete, along with the first
        and latest human prompts. ``hard_fit=True`` targets the whole supplied budget.

        Raises:
            RetainedContentMissingError: a body is not in the admitted history.
            RequiredContentTooLargeError: the required content cannot fit; nothing changed.
        """
        retain = check_retain(retain_contents)
        if not isinstance(hard_fit, bool):
            raise TypeError("hard_fit must be a bool")
        return await self._request(
            token_budget=token_budget, provider=provider, retain=retain, hard_fit=hard_fit
        )

    async def _request(
        self,
        *,
        token_budget: int | None,
        provider: Any,
        retain: tuple[str, ...],
        hard_fit: bool,
    ) -> list[dict[str, Any]]:
        """An ordinary, retaining or hard-fit request: plan in slices, commit at once.

        After the budget is derived and the system prompt factory awaited, the request is
        planned from a snapshot of the store, paced (``slices.py``: it yields to the event
        loop between slices of a few milliseconds). A plan is *stale* when the store moved
        while it was paused: ``set_messages``, ``clear``, an admission, another request's
        commit (or its floor mark or learned limit), a configuration change or, with
        ``token_meter: "actual"``, a new meter reading. A stale plan is never committed nor
        returned: the request is planned again from a new snapshot, with the same factory
        text and budget (an error a stale plan raised is dropped too). After
        ``PACED_PLANS`` stale plans, the next one runs without pausing, so it cannot go
        stale and the request always ends. The last check and the commit are one
        synchronous step: the view returned and the decisions committed are exactly those
        of the store as it is when the request commits.
        """
        args = await self._request_inputs(
            token_budget=token_budget, provider=provider, retain=retain, hard_fit=hard_fit
        )
        attempt = 0
        while True:
            if args.derived_under is not self._config:  # reconfigured: derive the budget again
                provenance = derived_budget(self._config, token_budget, provider)
                args = dataclasses.replace(args, provenance=provenance)
            plan = self._snapshot(args)
            stamp = self._stamp()
            steps = self._policy.planning(plan, self._compactor.floor)
            if attempt >= PACED_PLANS:
                planned = run_through(steps)  # unpaced: nothing can move the store meanwhile
                break
            attempt += 1
            try:
                planned = await self._pacer.run(steps)
            except RequiredContentTooLargeError:
                if self._stamp() == stamp:
                    raise
                continue  # the error was about a history that is no longer there
            if self._stamp() == stamp:
                break
        # -- commit boundary: the request stands once its first event delivery starts ------
        staged = planned.staged
        if staged is not None:
            self._commit(staged, plan.version)
        self._sent(planned.plan)
        self._compactor.floor = planned.floor
        self._learned = plan.limit
        if self._config.token_meter != TOKEN_METER_ACTUAL:
            self._counts.returned(planned.view_tokens, plan.count_key)
        self._publish_meter(
            planned.estimated,
            plan,
            synthesized=planned.synthesized,
            floor_held=planned.floor_held,
        )
        if planned.new_stats and staged is not None and staged.stats is not None:
            await self._emit(COMPACTION_EVENT, dict(staged.stats.to_event()))
        await self._emit_budget(plan.provenance)
        return planned.messages

    def _sent(self, plan: RequestPlan) -> None:
        """A request of ``plan`` returned its view: remember its system part and what it
        shows without thinking (the next request's view is compared with them:
        ``RequestPolicy.based``)."""
        if plan.epoch != self._epoch:
            return
        self._cache.returned(plan.now)
        for lo, hi in plan.unthought:
            self._unthought = with_range(self._unthought, lo, hi)
        self._sent_systems = plan.shown_systems
        self._returned += 1
        if plan.late_from is not None and plan.late_from == self._late_from:
            self._late_from = None

    def _stamp(self) -> tuple[object, ...]:
        """What an ordinary plan depends on besides its snapshot: when this changed while a
        plan was paused, the plan is stale."""
        measured = self._meter.measured if self._config.token_meter == TOKEN_METER_ACTUAL else 0
        return (
            self._epoch,
            self._commit_version,
            len(self._history),
            self._compactor.floor,
            self._learned,
            self._config,
            measured,
            self._unthought,
            self._sent_systems,
            self._late_from,
        )

    # -- planning ---------------------------------------------------------------------------

    async def _plan_request(
        self,
        *,
        token_budget: int | None,
        provider: Any,
        retain: Sequence[str],
        hard_fit: bool,
    ) -> RequestPlan:
        """Derive the budget, await the system prompt factory, then snapshot the store.

        The snapshot is taken after the factory's await, so it is current for the
        work that follows.
        """
        args = await self._request_inputs(
            token_budget=token_budget, provider=provider, retain=retain, hard_fit=hard_fit
        )
        return self._snapshot(args)

    async def _request_inputs(
        self,
        *,
        token_budget: int | None,
        provider: Any,
        retain: Sequence[str],
        hard_fit: bool,
    ) -> RequestArgs:
        """The request as asked, with what it takes from outside the store: the budget's
        provenance (before a learned limit, under the configuration now) and the system
        prompt factory's text."""
        await anyio.lowlevel.checkpoint()
        config = self._config
        provenance = derived_budget(config, token_budget, provider)
        factory_text: str | None = None
        if self._factory is not None:
            text = await self._factory()
            if not isinstance(text, str):
                raise TypeError(
                    f"system prompt factory returned {type(text).__name__}, expected str"
                )
            factory_text = text
        return RequestArgs(
            provenance, factory_text, token_budget, provider, retain, hard_fit, config
        )

    def _snapshot(self, args: RequestArgs) -> RequestPlan:
        """The plan of the request ``args`` in the store's current state (synchronous).

        Raises:
            RetainedContentMissingError: a retained body is not in the admitted history.
        """
        config = self._config
        now = self._now()
        return RequestPlan.taken(
            args,
            config=config,
            learned=self._learned,
            history=self._history,
            epoch=self._epoch,
            version=self.version,
            decisions=self._decisions,
            unthought=self._unthought,
            late_from=self._late_from,
            sent_systems=self._sent_systems,
            returned=self._returned,
            prior=self._prior_thinking,
            counts=self._counts,
            idle=self._cache.expired(now, config.cache_lifetime),
            now=now,
        )

    def _now(self) -> float:
        """The clock's time (seconds).

        Raises:
            TypeError: the clock returned something other than a finite number.
        """
        now = self._clock()
        if not is_number(now):
            raise TypeError(f"the store's clock returned {now!r}, expected finite seconds")
        return float(now)

    def _publish_meter(
        self,
        estimated: int,
        plan: RequestPlan,
        *,
        synthesized: int = 0,
        floor_held: bool = False,
    ) -> None:
        """Refresh the meter stats of a request of ``plan`` that returned. ``floor_held``:
        the request reached the trigger but did not compact, because a reported protected
        floor still holds (it fits the budget; see ``Compactor.floor_holds``). With the
        request's thinking rule (and the thinking the committed decisions leave out of the
        view), its count correction (``count_scale``, ``count_margin``, ``count_samples``)
        and whether it followed an idle gap that outlived the cache (``cache_expired``)."""
        stats = self._meter.stats(
            mode=self._config.token_meter,
            estimated=estimated,
            budget=plan.limits.policy_budget,
            images_estimated=False,
        )
        stats["results_synthesized"] = synthesized
        stats["floor_held"] = floor_held
        stats["provider_limit"] = self._learned.limit if self._learned is not None else None
        thinking = plan.thinking
        stats["preserved_thinking"] = thinking.preserved
        stats["thinking_rule_source"] = thinking.source
        stats["thinking_blocks_omitted"] = sum(self._decisions.thoughtless.values())
        stats.update(plan.limits.correction.stats())
        stats["cache_expired"] = plan.idle
        self._last_token_meter_stats = stats

    def _check_version(self, version: tuple[int, int]) -> None:
        """Raise ``TransactionConflictError`` unless the store is still at ``version``."""
        if self.version != version:
            raise TransactionConflictError(
                "the context changed since this request was planned (set_messages, clear "
                "or another commit); nothing was applied"
            )

    def _commit(
        self,
        decisions: Decisions,
        version: tuple[int, int],
        planned: tuple[int, int] | None = None,
    ) -> None:
        """The one place decisions become the store's: check ``version``, then swap.

        Synchronous. Every path commits through here (the ordinary path at its commit
        boundary, a negotiated request through its transaction). ``planned``: the history
        length the decisions were planned at and the views returned by then, for a model
        that checks the prefix of thinking. When messages were admitted since, or another
        request returned a view (besides the transaction's own), what was answered to
        views without these decisions is shown without its thinking by the next request
        (``RequestPlan.late_from``).

        Raises:
            TransactionConflictError: the store moved since ``version`` was read
                (another commit, ``set_messages``, ``clear``); nothing is applied.
        """
        self._check_version(version)
        self._decisions = decisions
        self._commit_version += 1
        if planned is not None:
            length, returned = planned
            if length < len(self._history) or self._returned > returned + 1:
                late = self._late_from
                self._late_from = length if late is None else min(late, length)

    # -- the negotiated path ----------------------------------------------------------------

    async def _open_negotiation(self, provider: Any, retain_contents: Sequence[str]) -> Negotiable:
        """Plan one negotiated request and hand out its seam (see ``negotiable.py``); the
        caller (``SimpleContextManager``) has checked that the store is in
        ``token_meter: "actual"`` mode.

        The base candidate is rendered in slices (``slices.py``). When ``set_messages`` or
        ``clear`` replaced the history meanwhile, the plan is stale and the request fails
        (as it does when that happens while a candidate is counted); an admission does not
        matter (the request is for the planned prefix), and another commit makes this
        request's commit a conflict.

        Raises:
            TypeError: ``retain_contents`` is not a list of strings.
            RetainedContentMissingError: a retained body is not in the admitted history.
            TransactionConflictError: the history was replaced while the base candidate was
                rendered; nothing was planned.
        """
        retain = check_retain(retain_contents)
        plan = await self._plan_request(
            token_budget=None, provider=provider, retain=retain, hard_fit=False
        )
        link = StoreLink(
            pacer=self._pacer,
            epoch=self._current_epoch,
            check_version=self._check_version,
            commit=self._commit,
            deliver_compaction=self._deliver_compaction,
            close=self._close_negotiated,
        )
        seam = Negotiable(self._policy, link, plan)
        await self._pacer.run(seam.preparing())
        if seam.history_replaced():
            raise TransactionConflictError(
                "the context history was replaced (set_messages or clear) while this request "
                "was being planned; nothing was applied"
            )
        return seam

    def _current_epoch(self) -> int:
        return self._epoch

    async def _close_negotiated(
        self,
        plan: RequestPlan,
        estimated: int,
        synthesized: int,
        floor_held: bool,
        provider_count: int | None,
    ) -> None:
        """A negotiated request's return boundary: emit ``context:budget`` (on change),
        then publish the meter stats. A delivery that raises publishes nothing."""
        await self._emit_budget(plan.provenance)
        self._learned = plan.limit
        self._sent(plan)
        self._publish_meter(estimated, plan, synthesized=synthesized, floor_held=floor_held)
        assert self._last_token_meter_stats is not None
        self._last_token_meter_stats["provider_count"] = provider_count

    # -- events -----------------------------------------------------------------------------

    async def _deliver_compaction(self, stats: dict[str, Any]) -> None:
        """Deliver ``context:compaction`` for a committed decision (a copy of its stats)."""
        await self._emit(COMPACTION_EVENT, dict(stats))

    async def _emit_budget(self, provenance: dict[str, Any]) -> None:
        """Emit ``context:budget`` when the provenance differs from the last one emitted.

        Delivery helpers add no checkpoint of their own: they run after a commit, where a
        cancellation point would only make a completed request look cancelled.
        """
        if provenance == self._last_emitted_budget:
            return  # noqa: ASYNC910 - delivery adds no checkpoint (see above)
        if provenance.get("window_too_small"):
            logger.warning(
                "context-simple: the provider's window (%s tokens) leaves no room for its "
                "output reserve and safety margin; budgeting %s tokens",
                provenance.get("context_window"),
                provenance.get("effective_budget"),
            )
        await self._emit(BUDGET_EVENT, dict(provenance))
        # Marked only once delivered: a request cancelled during delivery leaves no mark,
        # so the next request emits the budget again.
        self._last_emitted_budget = provenance

    async def _emit(self, event: str, data: dict[str, Any]) -> bool:
        """Deliver an event; a failing hook is logged, never raised. Cancellation propagates.

        Returns whether a hook registry took the event.
        """
        hooks = self.hooks
        emit = getattr(hooks, "emit", None)
        if not callable(emit):
            return False  # noqa: ASYNC910 - see _emit_budget: no checkpoint of its own
        try:
            await emit(event, data)
        except Exception:
            logger.warning("context-simple: delivering %s failed", event, exc_info=True)
            return False  # noqa: ASYNC910 - see _emit_budget: no checkpoint of its own
        return True
