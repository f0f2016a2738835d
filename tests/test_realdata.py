"""Real public agent conversations through every request path, judged by outside rules.

Each conversation in ``tests/data/real`` (OpenAI, Anthropic-block and Amplifier format;
sources in ``SOURCES.json``), and the same conversation with one tool result removed
mid-history, goes through:

- the ordinary path (``get_messages_for_request``) on a fresh store, and replayed turn by
  turn (a request before every assistant message, sticky decisions carried along);
- the hard-fit path (``get_messages_for_request_retaining(hard_fit=True)``);
- the negotiated path (``get_measured_request_view``), counted by the o200k example
  provider (``amplifier_module_provider_window.counting`` over the request that
  ``amplifier_module_loop_negotiating.messages.build_request`` builds from the view: a
  counter that shares nothing with the module's estimator), every candidate checked.

at budgets from 1% to 120% of the conversation's size. Every view must be valid under the
OpenAI and the Anthropic tool-use rules (``provider_rules``, which imports nothing from
the module), meet the view invariants (``testing.check_view_invariants``), and keep the
budget rules:

- a view is never over its budget when the irreducible content (system messages, the
  first and latest human prompt) fits it; a request fails closed only when it does not;
- a compacted view is never larger than the uncompacted one.

The budget of the ordinary and hard-fit paths is in the module's own estimate (that is
what those paths promise); the negotiated path's is the provider's o200k count.

The ordinary path is also judged by an INDEPENDENT count (``benchmarks.provider.Counter``:
o200k_base with OpenAI's message accounting, which shares nothing with the module's
estimator), on every conversation (fresh at every budget, replayed at three) and on the
long sessions (``long_sessions()``, replayed at 32k, 128k and 163,904): no view is over its
budget by that count, except where the irreducible content of the history so far
(``irreducible``: system messages, the first and latest human prompt, a pending tail),
counted alone, is over it. That is the estimate mode's promise with no usage report from
the provider (``test_reconciliation.py`` covers a provider that counts differently).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from amplifier_module_loop_negotiating.messages import build_request
from amplifier_module_provider_window.counting import count_request
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import ContextLengthError, SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.testing import check_view_invariants
from amplifier_module_context_simple.testing.provider_rules import provider_violations
from benchmarks.provider import Counter as IndependentCounter
from tests.realdata import conversations, long_sessions, with_result_removed
from tests.support import provider_count_envelope

FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2)
REPLAY_FRACTIONS = (0.1, 0.3, 0.6)
UNLIMITED = 10**9
SOURCE = "o200k-example-provider"


@dataclass(frozen=True)
class Case:
    name: str
    messages: list[dict[str, Any]]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for conversation in conversations():
        cases.append(Case(conversation.name, conversation.messages))
        removed = with_result_removed(conversation.messages)
        if removed != conversation.messages:
            cases.append(Case(f"{conversation.name}-result-removed", removed))
    return cases


CASES = _cases()
IDS = [case.name for case in CASES]


# -- independent judgements ------------------------------------------------------------------


def _metadata(message: Mapping[str, Any]) -> Mapping[str, Any]:
    value = message.get("metadata")
    return value if isinstance(value, Mapping) else {}


def _only_results(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
    )


def _is_human(message: Mapping[str, Any]) -> bool:
    """A person's own turn: a user message that is not machine-written or only results."""
    metadata = _metadata(message)
    return (
        message.get("role") == "user"
        and not metadata.get("ephemeral")
        and metadata.get("source") not in ("hook", "context-compaction")
        and not _only_results(message)
    )


def _call_ids(message: Mapping[str, Any]) -> set[str]:
    ids = {c.get("id") for c in message.get("tool_calls") or () if isinstance(c, Mapping)}
    content = message.get("content")
    if isinstance(content, list):
        ids |= {
            b.get("id") for b in content if isinstance(b, Mapping) and b.get("type") == "tool_use"
        }
    return {i for i in ids if isinstance(i, str)}


def _result_ids(message: Mapping[str, Any]) -> set[str]:
    if message.get("role") == "tool":
        ids = {message.get("tool_call_id")}
    else:
        content = message.get("content")
        blocks = content if isinstance(content, list) else ()
        ids = {
            b.get("tool_use_id")
            for b in blocks
            if isinstance(b, Mapping) and b.get("type") == "tool_result"
        }
    return {i for i in ids if isinstance(i, str)}


def pending_tail(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A last assistant turn with calls, and what follows it, when no assistant message
    and no person's turn comes after it: the calls may still be running, so no view may
    drop them (their results would arrive without their call)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant":
            answered = set().union(*(_result_ids(m) for m in messages[index + 1 :]))
            return list(messages[index:]) if _call_ids(message) - answered else []
        if _is_human(message):
            return []
    return []


def irreducible(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """What no reduction may touch: system messages, the first and latest human prompts
    (no retained reminders here) and a pending tail."""
    systems = [m for m in messages if m.get("role") == "system"]
    humans = [m for m in messages if _is_human(m)]
    kept = systems + ([humans[0], humans[-1]] if len(humans) > 1 else humans)
    return kept + [m for m in pending_tail(messages) if not any(m is k for k in kept)]


def estimated(view: Sequence[Mapping[str, Any]]) -> int:
    return sum(estimate_message(message) for message in view)


def counted(view: Sequence[Mapping[str, Any]]) -> int:
    """The o200k example provider's count of the complete request built from ``view``."""
    return count_request(build_request(view)).total


def assert_valid(case: Case, view: list[dict[str, Any]], where: str) -> None:
    problems = [
        str(error)
        for dialect in ("openai", "anthropic")
        for error in provider_violations(view, dialect)
    ]
    assert not problems, f"{case.name} {where}: {problems[:3]}"
    check_view_invariants(case.messages, view)


# -- the paths ---------------------------------------------------------------------------


async def fresh(messages: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return manager


async def uncompacted(case: Case) -> list[dict[str, Any]]:
    manager = await fresh(case.messages)
    return await manager.get_messages_for_request(token_budget=UNLIMITED)


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_ordinary_and_hard_fit_views_at_every_budget(case: Case, anyio_backend: str) -> None:
    whole = await uncompacted(case)
    assert_valid(case, whole, "uncompacted")
    size = estimated(whole)
    floor = estimated(irreducible(case.messages))
    for fraction in FRACTIONS:
        budget = max(1, int(size * fraction))
        where = f"budget {budget} ({fraction:.0%})"
        manager = await fresh(case.messages)
        view = await manager.get_messages_for_request(token_budget=budget)
        assert_valid(case, view, f"ordinary {where}")
        tokens = estimated(view)
        assert tokens <= size, f"{case.name} ordinary {where}: {tokens} > uncompacted {size}"
        if floor <= budget:
            assert tokens <= budget, f"{case.name} ordinary {where}: {tokens} > budget"
        manager = await fresh(case.messages)
        if floor > budget:
            with pytest.raises(ContextLengthError):
                await manager.get_messages_for_request_retaining(
                    retain_contents=[], token_budget=budget, hard_fit=True
                )
            continue
        view = await manager.get_messages_for_request_retaining(
            retain_contents=[], token_budget=budget, hard_fit=True
        )
        assert_valid(case, view, f"hard-fit {where}")
        tokens = estimated(view)
        assert tokens <= budget, f"{case.name} hard-fit {where}: {tokens} > budget"
        assert tokens <= size, f"{case.name} hard-fit {where}: {tokens} > uncompacted {size}"


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_replayed_session_views(case: Case, anyio_backend: str) -> None:
    """The conversation admitted message by message, with a request before each assistant
    turn, at a fixed budget: sticky decisions carried from request to request."""
    size = estimated(await uncompacted(case))
    for fraction in REPLAY_FRACTIONS:
        budget = max(1, int(size * fraction))
        manager = SimpleContextManager()
        mirror = SimpleContextManager()  # the same history, never compacted
        for index, message in enumerate(case.messages):
            if message.get("role") == "assistant" and index > 0:
                prefix = case.messages[:index]
                where = f"replay budget {budget} ({fraction:.0%}) before message {index}"
                view = await manager.get_messages_for_request(token_budget=budget)
                assert_valid(Case(case.name, prefix), view, where)
                whole = estimated(await mirror.get_messages_for_request(token_budget=UNLIMITED))
                tokens = estimated(view)
                assert tokens <= whole, f"{case.name} {where}: {tokens} > uncompacted {whole}"
                if estimated(irreducible(prefix)) <= budget:
                    assert tokens <= budget, f"{case.name} {where}: {tokens} > budget"
            await manager.add_message(copy.deepcopy(message))
            await mirror.add_message(copy.deepcopy(message))


class Counter:
    """``count_view`` over the o200k example provider; every candidate is checked."""

    def __init__(self, case: Case, limit: int) -> None:
        self.case = case
        self.limit = limit
        self.counts: list[int] = []

    async def __call__(self, view: list[dict[str, Any]]) -> dict[str, Any]:
        await checkpoint()  # a provider's count is an await
        assert_valid(self.case, view, f"negotiated candidate {len(self.counts)}")
        tokens = counted(view)
        self.counts.append(tokens)
        return provider_count_envelope(view, tokens, self.limit, SOURCE)


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_negotiated_views_at_every_budget(case: Case, anyio_backend: str) -> None:
    size = counted(await uncompacted(case))
    floor = counted(irreducible(case.messages))
    for fraction in FRACTIONS:
        limit = max(1, int(size * fraction))
        where = f"limit {limit} ({fraction:.0%})"
        manager = await fresh(case.messages, token_meter="actual", max_tokens=limit)
        counter = Counter(case, limit)
        if floor > limit:
            with pytest.raises(ContextLengthError):
                await manager.get_measured_request_view(
                    provider=None, retain_contents=[], count_view=counter
                )
            continue
        result = await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=counter
        )
        view = result["base_view"]
        assert_valid(case, view, f"negotiated final {where}")
        tokens = counted(view)
        assert tokens <= limit, f"{case.name} negotiated {where}: {tokens} > limit"
        assert tokens <= size, f"{case.name} negotiated {where}: {tokens} > uncompacted {size}"
        transaction = result["transaction"]
        if transaction is not None:
            assert await transaction.commit()


# -- the ordinary path by an independent count ----------------------------------------------

INDEPENDENT = IndependentCounter()
LONG_BUDGETS = (32_000, 128_000, 163_904)
"""The long benchmark's budgets (``benchmarks/long.py``): 163,904 is what the module derives
for a 200k-window model."""


def independently(view: Sequence[Mapping[str, Any]]) -> int:
    """The independent count of a request carrying ``view`` (reply priming included)."""
    return INDEPENDENT.count_request(view)


def assert_within(
    name: str, where: str, view: Sequence[Mapping[str, Any]], budget: int, history: Any
) -> None:
    """``view`` is within ``budget`` by the independent count, unless the irreducible
    content of ``history`` alone is over it."""
    tokens = independently(view)
    if tokens > budget and independently(irreducible(history)) <= budget:
        pytest.fail(f"{name} {where}: {tokens} > budget {budget} ({tokens / budget:.3f} x B)")


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_ordinary_views_fit_the_budget_by_an_independent_count(
    case: Case, anyio_backend: str
) -> None:
    """Fresh at every budget, and replayed turn by turn at ``REPLAY_FRACTIONS`` of the
    conversation's independent size."""
    size = independently(await uncompacted(case))
    for fraction in FRACTIONS:
        budget = max(1, int(size * fraction))
        manager = await fresh(case.messages)
        view = await manager.get_messages_for_request(token_budget=budget)
        assert_within(case.name, f"fresh {fraction:.0%}", view, budget, case.messages)
    for fraction in REPLAY_FRACTIONS:
        budget = max(1, int(size * fraction))
        manager = SimpleContextManager()
        for index, message in enumerate(case.messages):
            if message.get("role") == "assistant" and index > 0:
                view = await manager.get_messages_for_request(token_budget=budget)
                where = f"replay {fraction:.0%} before message {index}"
                assert_within(case.name, where, view, budget, case.messages[:index])
            await manager.add_message(copy.deepcopy(message))


LONG_CASES = [(s.name, budget) for s in long_sessions() for budget in LONG_BUDGETS]


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "budget"), LONG_CASES, ids=[f"{n}@{b}" for n, b in LONG_CASES])
async def test_long_session_views_fit_the_budget_by_an_independent_count(
    name: str, budget: int, anyio_backend: str
) -> None:
    """A long session replayed turn by turn: a request before each assistant message, and
    one at the end (the replay CLI's cadence)."""
    (session,) = [s for s in long_sessions() if s.name == name]
    messages = session.conversation.messages
    manager = SimpleContextManager()
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index > 0:
            view = await manager.get_messages_for_request(token_budget=budget)
            where = f"replay before message {index}"
            assert_within(name, where, view, budget, messages[:index])
        await manager.add_message(copy.deepcopy(message))
    view = await manager.get_messages_for_request(token_budget=budget)
    assert_within(name, "replay at the end", view, budget, messages)


def test_the_real_data_covers_every_format() -> None:
    """The suite's real data has conversations in all three formats (not only OpenAI)."""
    formats = {conversation.format for conversation in conversations()}
    assert formats == {"openai", "anthropic", "amplifier"}
