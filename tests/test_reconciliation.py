"""The count correction end to end: a simulated provider that counts differently from our
estimate, on real conversations, through the real ``mount`` on a real amplifier-core
``ModuleCoordinator`` (its real hook registry).

The provider counts a view with an INDEPENDENT counter (``benchmarks.provider.Counter``:
o200k_base with OpenAI's message accounting; it shares nothing with the module's
estimator), times a factor, plus a constant for tool schemas it adds to every request::

    count(view) = ceil(factor x o200k(view)) + tools

The loop (``replay``): before each assistant message of a real conversation (but the
first message) the orchestrator asks for a view (``get_messages_for_request(token_budget
=B)``), the provider counts it and the orchestrator emits ``llm:response`` with ``{"usage":
{"input_tokens": count}}`` through the coordinator's hooks (or not: ``report=False``); then
the message is added to the context.

The exemption, exactly: a view over B is exempt when it holds one message that the
provider, sent that message alone (``count([message])``), counts above B: no policy that
shows that message fits it. The runs below have none (``exempt == 0`` is reported, and
every view over B must be exempt).
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.lowlevel
import pytest

from amplifier_module_context_simple.context.counting.estimate import estimate_message
from benchmarks.provider import Counter
from tests.realdata import conversations, long_sessions
from tests.support import mounted

COUNTER = Counter()
DEFAULT_MARGIN = 0.06
"""The ``estimate_margin`` key's default (the margin before three reports are in)."""
# The correction's rules as documented (counting/correction.py's docstring), restated here
# to compute what the stats should be from the ratios the provider was fed:
WINDOW, MIN_SCALE, MAX_SCALE, STEP = 8, 0.8, 1.5, 0.02
MAX_RATIO, MARGIN_SAMPLES, MIN_MARGIN, MAX_MARGIN = 3.0, 3, 0.02, 0.25
ROUNDING = 5e-5
"""The meter stats round the scale and the margin to 4 decimals."""


@pytest.fixture
def anyio_backend() -> str:
    """The kernel's coordinator and hook registry are asyncio-only."""
    return "asyncio"


@dataclass(frozen=True)
class Provider:
    """Counts a view as ``ceil(factor x o200k(view)) + tools``."""

    factor: float
    tools: int

    def count(self, view: Sequence[Mapping[str, Any]]) -> int:
        return math.ceil(self.factor * COUNTER.count_request(view)) + self.tools


@dataclass
class Run:
    """One replay: per request, the provider's count, our estimate of the view, whether
    the view is exempt, and the meter stats the request published."""

    budget: int
    counts: list[int] = field(default_factory=list)
    estimates: list[int] = field(default_factory=list)
    exempt: list[bool] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)

    @property
    def over(self) -> list[int]:
        """The views over B that are not exempt (indexes)."""
        return [
            i for i, count in enumerate(self.counts) if count > self.budget and not self.exempt[i]
        ]

    @property
    def exempt_over(self) -> int:
        return sum(c > self.budget and e for c, e in zip(self.counts, self.exempt, strict=True))

    @property
    def max_ratio(self) -> float:
        return max(self.counts) / self.budget

    @property
    def mean(self) -> float:
        return statistics.fmean(self.counts)


@dataclass(frozen=True)
class Case:
    name: str
    budget: int
    tools: int
    """The provider's constant for tool schemas: 1,500 at 16k and more; 300 at 4k. (1,500
    on a 4,000 budget makes the provider count a view at more than ``MAX_SCALE`` times our
    estimate: the scale stops at its bound and views go over B; not a case the bounded
    correction is for.)"""


LONG = "anthropic_engram_diffusion_a"
CASES = (
    Case(LONG, 32_000, 1_500),
    Case(LONG, 128_000, 1_500),
    Case("anthropic_engram_diffusion_b", 32_000, 1_500),
    Case("amplifier_geminicli_1", 16_000, 1_500),  # 62 tool results
    Case("anthropic_entire_1", 32_000, 1_500),  # tool_use / tool_result blocks
    Case("openai_tau_airline_052", 4_000, 300),  # 27 tool results
    Case("openai_tau_airline_109", 4_000, 300),
)
IDS = [f"{case.name}@{case.budget}" for case in CASES]


@functools.cache
def _messages() -> dict[str, list[dict[str, Any]]]:
    found = {conv.name: conv.messages for conv in conversations()}
    found.update((s.name, s.conversation.messages) for s in long_sessions())
    return found


def messages_of(name: str) -> list[dict[str, Any]]:
    return copy.deepcopy(_messages()[name])


async def replay(
    messages: Sequence[dict[str, Any]],
    budget: int,
    provider: Provider,
    *,
    report: bool,
    config: dict[str, Any] | None = None,
) -> Run:
    """The loop of the module docstring; see ``Run``."""
    coordinator, context, _ = await mounted(config or {})
    run = Run(budget)
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index > 0:
            view = await context.get_messages_for_request(token_budget=budget)
            run.stats.append(dict(context.last_token_meter_stats))
            count = provider.count(view)
            run.counts.append(count)
            run.estimates.append(sum(estimate_message(m) for m in view))
            run.exempt.append(any(provider.count([m]) > budget for m in view))
            if report:
                usage = {"usage": {"input_tokens": count}}
                result = await coordinator.hooks.emit("llm:response", usage)
                assert result.action == "continue"
        await context.add_message(copy.deepcopy(message))
    await coordinator.cleanup()
    return run


_RUNS: dict[tuple[Any, ...], Run] = {}


async def run_of(
    case: Case, factor: float, *, report: bool, margin: float | None = None, tools: int | None
) -> Run:
    """``replay`` of ``case`` (memoised: several tests judge the same run)."""
    tools = case.tools if tools is None else tools
    key = (case, factor, report, margin, tools)
    if key in _RUNS:
        await anyio.lowlevel.checkpoint()
    else:
        config = {} if margin is None else {"estimate_margin": margin}
        _RUNS[key] = await replay(
            messages_of(case.name),
            case.budget,
            Provider(factor, tools),
            report=report,
            config=config,
        )
    return _RUNS[key]


# -- a provider that counts more: 1.15 x o200k + tools ---------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_with_reports_no_view_is_over_the_providers_count(case: Case) -> None:
    run = await run_of(case, 1.15, report=True, tools=None)
    assert run.stats[-1]["count_samples"] > 0  # the reports were taken
    assert run.over == [], (
        f"{len(run.over)} of {len(run.counts)} views over {case.budget:,}; "
        f"max {run.max_ratio:.3f} x B"
    )
    assert run.exempt_over == 0


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_without_reports_and_margin_a_view_is_over_the_providers_count(
    case: Case,
) -> None:
    """The teeth of the test above: the same loop, no usage reported and
    ``estimate_margin=0``, sends at least one view the provider counts above B."""
    run = await run_of(case, 1.15, report=False, margin=0.0, tools=None)
    assert run.stats[-1]["count_samples"] == 0
    assert run.over != []


# -- a provider that counts less: 0.85 x o200k -----------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_a_provider_counting_less_gets_views_within_its_count(case: Case) -> None:
    run = await run_of(case, 0.85, report=True, tools=0)
    assert run.over == [], f"max {run.max_ratio:.3f} x B"


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_a_provider_counting_less_gets_more_context_with_reports(case: Case) -> None:
    """The mean view, by the provider's count, is larger when its reports scale the
    estimate down than in the same session that never reports usage."""
    reported = await run_of(case, 0.85, report=True, tools=0)
    unreported = await run_of(case, 0.85, report=False, tools=0)
    assert reported.mean > unreported.mean


# -- the stats ---------------------------------------------------------------------------


def expected_stats(run: Run, index: int) -> tuple[int, float | None, float]:
    """What request ``index``'s stats should say, from the ratios fed before it (each
    request's count over our estimate of its view): the samples, the median of the
    latest ``WINDOW`` taken ratios (None: none yet) and the margin."""
    taken = [
        count / estimate
        for count, estimate in zip(run.counts[:index], run.estimates[:index], strict=True)
        if estimate > 0 and 1 / MAX_RATIO <= count / estimate <= MAX_RATIO
    ][-WINDOW:]
    if not taken:
        return 0, None, DEFAULT_MARGIN
    median = statistics.median(taken)
    margin = DEFAULT_MARGIN
    if len(taken) >= MARGIN_SAMPLES:
        margin = min(MAX_MARGIN, max(MIN_MARGIN, max(taken) / median - 1))
    return len(taken), median, margin


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_every_requests_stats_follow_the_ratios_fed(case: Case) -> None:
    """At every request: ``count_samples`` is the reports taken (at most ``WINDOW``),
    ``count_scale`` is within the sticky step of the bounded median of the latest ratios
    (1.0 before any), and ``count_margin`` is the default until three reports are in,
    then their spread."""
    run = await run_of(case, 1.15, report=True, tools=None)
    for index, stats in enumerate(run.stats):
        samples, median, margin = expected_stats(run, index)
        where = f"request {index}"
        assert stats["count_samples"] == samples, where
        if median is None:
            assert stats["count_scale"] == 1.0, where
        else:
            bounded = min(MAX_SCALE, max(MIN_SCALE, median))
            assert abs(stats["count_scale"] - bounded) <= STEP + ROUNDING, where
        assert stats["count_margin"] == pytest.approx(margin, abs=ROUNDING), where


@pytest.mark.anyio
async def test_the_learned_scale_is_near_the_providers_factor() -> None:
    """A provider counting 1.15 x o200k (no tool constant): the scale learned over the
    long session is 1.15 times what o200k counts per estimated token, within the sticky
    step, and so within 0.1 of 1.15 (our estimate is within a few percent of o200k)."""
    case = Case(LONG, 32_000, 0)
    run = await run_of(case, 1.15, report=True, tools=0)
    scale = run.stats[-1]["count_scale"]
    latest = range(len(run.counts) - WINDOW - 1, len(run.counts) - 1)
    per_token = statistics.median(run.counts[i] / run.estimates[i] for i in latest)
    assert abs(scale - per_token) <= STEP + ROUNDING
    assert abs(scale - 1.15) < 0.1


@pytest.mark.anyio
async def test_the_samples_stop_at_the_window() -> None:
    run = await run_of(Case(LONG, 32_000, 0), 1.15, report=True, tools=0)
    assert [s["count_samples"] for s in run.stats[: WINDOW + 3]] == [
        *range(WINDOW + 1),
        WINDOW,
        WINDOW,
    ]


@pytest.mark.anyio
async def test_the_margin_is_the_default_until_three_reports() -> None:
    run = await run_of(Case(LONG, 32_000, 0), 1.15, report=True, tools=0)
    assert [s["count_margin"] for s in run.stats[:MARGIN_SAMPLES]] == [DEFAULT_MARGIN] * 3


@pytest.mark.anyio
async def test_the_margin_moves_to_the_sessions_spread() -> None:
    run = await run_of(Case(LONG, 32_000, 0), 1.15, report=True, tools=0)
    _, _, spread = expected_stats(run, MARGIN_SAMPLES)
    assert spread != DEFAULT_MARGIN
    assert run.stats[MARGIN_SAMPLES]["count_margin"] == pytest.approx(spread, abs=ROUNDING)
