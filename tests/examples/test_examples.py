"""The demo's example modules: the window provider, the negotiating loop, the script.

Provider behaviour is tested directly (budget decisions, overflow errors, usage); the
orchestrator runs on a real ``AmplifierSession`` with context-simple for a handful of
turns in each of its three modes.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import toktok
from amplifier_core import AmplifierSession, ModuleCoordinator
from amplifier_core.llm_errors import ContextLengthError
from amplifier_core.message_models import ChatRequest, Message
from amplifier_module_loop_negotiating import mount as mount_loop
from amplifier_module_loop_negotiating import output_cap_candidates
from amplifier_module_loop_negotiating.messages import to_message
from amplifier_module_loop_negotiating.negotiation import Negotiation
from amplifier_module_provider_window import (
    MEASUREMENT_SOURCE,
    PROVIDER_COUNT_CAPABILITY,
    WindowProvider,
    WindowSettings,
)
from amplifier_module_provider_window import mount as mount_provider
from anyio.lowlevel import checkpoint
from conversation import SCRIPT_CAPABILITY, SYSTEM_PROMPT, Conversation, build_conversation

DECISION_KEYS = {
    "estimated_input_tokens",
    "input_limit_tokens",
    "context_token_budget",
    "max_output_tokens",
    "measurement",
}
MEASURED_OUTCOMES = {
    "not_needed",
    "target_reached",
    "protected_floor",
    "reduced_output",
    "measurement_unavailable",
}


def provider(**config: Any) -> WindowProvider:
    """A provider without hooks or script."""
    return WindowProvider(WindowSettings.from_config(config))


def request(*texts: str, max_output_tokens: int | None = None) -> ChatRequest:
    """A request of user messages with ``texts``."""
    messages = [Message(role="user", content=text) for text in texts]
    return ChatRequest(messages=messages, max_output_tokens=max_output_tokens)


def o200k(text: str) -> int:
    """The real token count of ``text``."""
    return int(toktok.batch_count([text], "o200k_base")[0])


# -- provider: counting and budget decisions ---------------------------------------------


def test_count_is_o200k_plus_framing() -> None:
    text = "Context windows are counted in tokens, 上下文窗口按令牌计算。"
    counted = provider().count_request_tokens(request(text))
    assert counted == o200k(text) + 4 + 3


def test_request_budget_follows_the_provider_count_contract() -> None:
    window = provider(context_window=10_000, max_output_tokens=2_000, safety_margin_tokens=100)
    req = request("hello there")
    decision = window.request_budget(req, context_estimate=None)
    assert set(decision) == DECISION_KEYS
    assert decision["input_limit_tokens"] == 10_000 - 2_000 - 100
    assert decision["max_output_tokens"] == 2_000
    measurement = decision["measurement"]
    assert measurement == {
        "kind": "provider_count",
        "source": MEASUREMENT_SOURCE,
        "input_tokens": window.count_request_tokens(req),
    }
    assert decision["estimated_input_tokens"] >= measurement["input_tokens"]
    assert 0 < decision["context_token_budget"] <= decision["input_limit_tokens"]
    assert window.stats.count_calls == 1


def test_a_smaller_output_cap_raises_the_input_limit() -> None:
    window = provider(context_window=10_000, max_output_tokens=4_000, safety_margin_tokens=0)
    req = request("x")
    default = window.request_budget(req, context_estimate=10)
    capped = window.request_budget(
        req, context_estimate=10, request_options={"max_output_tokens": 1_000}
    )
    assert default["input_limit_tokens"] == 6_000
    assert capped["input_limit_tokens"] == 9_000
    assert capped["max_output_tokens"] == 1_000


def test_context_budget_is_scaled_to_the_callers_estimate_units() -> None:
    window = provider()
    req = request("word " * 400)
    plain = window.request_budget(req, context_estimate=None)["context_token_budget"]
    halved = window.request_budget(req, context_estimate=window.count_request_tokens(req) // 2)[
        "context_token_budget"
    ]
    assert halved < plain


def test_recover_context_overflow_returns_the_same_shape() -> None:
    window = provider()
    req = request("too long")
    error = ContextLengthError("prompt is too long")
    decision = window.recover_context_overflow(req, error, context_estimate=None)
    assert set(decision) == DECISION_KEYS
    assert window.stats.recover_calls == 1
    assert window.stats.count_calls == 1


def test_published_window_and_capability() -> None:
    window = provider(context_window=20_000, advertised_context_window=30_000)
    info = window.get_info()
    assert PROVIDER_COUNT_CAPABILITY in info.capabilities
    assert info.defaults["context_window"] == 30_000
    assert info.defaults["max_output_tokens"] == 4_000
    assert window.context_window == 20_000


@pytest.mark.parametrize(
    "config",
    [
        {"context_window": 0},
        {"context_window": "32000"},
        {"max_output_tokens": True},
        {"context_window": 4_000, "max_output_tokens": 4_000},
    ],
)
def test_bad_config_is_rejected(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="provider-window"):
        WindowSettings.from_config(config)


# -- provider: complete ------------------------------------------------------------------


@pytest.mark.anyio
async def test_complete_rejects_a_request_over_the_allowance() -> None:
    window = provider(context_window=3_000, max_output_tokens=1_000, safety_margin_tokens=0)
    big = request("token " * 2_500)
    with pytest.raises(ContextLengthError) as caught:
        await window.complete(big)
    assert caught.value.status_code == 400
    assert window.stats.overflow_errors == 1
    assert window.stats.completed == 0


@pytest.mark.anyio
async def test_a_smaller_output_cap_lets_the_same_input_through() -> None:
    window = provider(context_window=3_000, max_output_tokens=1_000, safety_margin_tokens=0)
    text = "token " * 2_300  # about 2,300 tokens: over 2,000, under 2,800
    with pytest.raises(ContextLengthError):
        await window.complete(request(text))
    response = await window.complete(request(text, max_output_tokens=200))
    assert response.content


@pytest.mark.anyio
async def test_complete_emits_canonical_usage_with_simulated_caching() -> None:
    coordinator = ModuleCoordinator()
    seen: list[dict[str, Any]] = []

    async def on_response(event: str, data: dict[str, Any]) -> None:
        await checkpoint()
        seen.append(data)

    coordinator.hooks.register("llm:response", on_response, name="test-observer")
    await mount_provider(coordinator, {"name": "w"})
    window = coordinator.get("providers")["w"]
    first = request("A long and stable system-like prefix. " * 20)
    second = request("A long and stable system-like prefix. " * 20, "and a new question")
    await window.complete(first)
    await window.complete(second)
    assert [data["provider"] for data in seen] == ["w", "w"]
    usage = seen[1]["usage"]
    assert set(usage) == {
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    }
    total = window.count_request_tokens(second)
    assert usage["input_tokens"] + usage["cache_write_tokens"] == total
    assert usage["cache_read_tokens"] == window.count_request_tokens(first) - 3
    assert seen[0]["usage"]["cache_read_tokens"] == 0


# -- loop helpers ------------------------------------------------------------------------


def test_output_cap_ladder() -> None:
    assert output_cap_candidates(64_000) == [32_000, 25_600, 19_200, 12_800, 6_400, 1_000]
    assert output_cap_candidates(4_000) == [2_000, 1_600, 1_200, 1_000]
    assert output_cap_candidates(1_000) == []
    assert output_cap_candidates(None) == []


def test_messages_are_normalised_for_the_kernel() -> None:
    assistant = to_message(
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "looking"},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"p": 1}},
            ],
            "_truncated": True,
            "metadata": {"_seq": 3, "source": "x"},
        }
    )
    assert assistant.content[1].type == "tool_call"
    assert "_truncated" not in (assistant.model_extra or {})
    assert assistant.metadata == {"source": "x"}
    result = to_message(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
        }
    )
    assert result.content[0].tool_call_id == "toolu_1"
    assert to_message({"role": "assistant", "content": None}).content == ""


@pytest.mark.anyio
async def test_fit_output_returns_the_first_cap_that_fits() -> None:
    window = provider(context_window=10_000, max_output_tokens=4_000, safety_margin_tokens=0)
    negotiation = Negotiation(
        window, estimate=lambda view: None, max_output_tokens=4_000, is_cancelled=lambda: False
    )
    view = [{"role": "user", "content": "token " * 6_500}]
    attempt = await negotiation.count_view(view)
    assert attempt["budget_decision"]["estimated_input_tokens"] > 6_000
    fitted = await negotiation.fit_output(view, attempt)
    assert fitted is not None
    assert fitted["dispatch"].max_output_tokens == 2_000
    assert fitted["count_calls"] == 1
    assert fitted["dispatch"].messages[0].role == "system"
    decision = fitted["budget_decision"]
    assert decision["estimated_input_tokens"] <= decision["input_limit_tokens"]


# -- the conversation script -------------------------------------------------------------


def test_conversation_is_deterministic_and_mixed() -> None:
    first, second = build_conversation(), build_conversation()
    assert [turn.prompt for turn in first.turns] == [turn.prompt for turn in second.turns]
    assert len(first.turns) >= 150
    stats = first.stats()
    assert 0 < stats.anthropic_calls < stats.tool_calls
    assert {"json", "code", "prose", "cjk"} <= set(stats.output_bytes)
    sizes = [
        len(call.output.encode())
        for turn in first.turns
        for reply in turn.replies
        for call in reply.tool_calls
    ]
    assert max(sizes) >= 16_000
    assert first.locate_turn(first.turns[41].prompt) == 42
    assert first.locate_turn("not a prompt") is None


# -- the loop on a real session ----------------------------------------------------------


async def run_session(
    mode: str, token_meter: str, conversation: Conversation, **provider_config: Any
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """Replay ``conversation``; return (loop, provider, final history)."""
    plan = {
        "session": {"orchestrator": "loop-negotiating", "context": "context-simple"},
        "orchestrator": {"config": {"mode": mode}},
        "context": {"config": {"token_meter": token_meter}},
        "providers": [{"module": "provider-window", "config": provider_config}],
    }
    session = AmplifierSession(plan)
    session.coordinator.register_capability(SCRIPT_CAPABILITY, conversation)
    await session.initialize()
    try:
        context = session.coordinator.get("context")
        await context.add_message({"role": "system", "content": SYSTEM_PROMPT})
        for turn in conversation.turns:
            await session.execute(turn.prompt)
        loop = session.coordinator.get("orchestrator")
        window = session.coordinator.get("providers")["window"]
        return loop, window, await context.get_messages()
    finally:
        with anyio.CancelScope(shield=True):  # the kernel's session is always cleaned up
            await session.cleanup()


SMALL = {"context_window": 24_000, "max_output_tokens": 2_000}


@pytest.fixture(scope="module")
def conversation() -> Conversation:
    """The first 14 turns: enough for several compactions in a 24k window."""
    return build_conversation(14)


@pytest.mark.anyio
async def test_legacy_mode_compacts_and_stores_both_tool_formats(
    conversation: Conversation,
) -> None:
    loop, window, history = await run_session("legacy", "estimate", conversation, **SMALL)
    assert loop.turns == 14
    assert loop.unhandled_overflows == 0
    assert window.stats.overflow_errors == 0
    assert loop.events.total["context:compaction"] >= 1
    assert all(row.view_tokens is not None for row in loop.rows)
    assert max(row.history_tokens for row in loop.rows) > SMALL["context_window"]
    assert any(message.get("tool_calls") for message in history)
    blocks = [
        block.get("type")
        for message in history
        if isinstance(message.get("content"), list)
        for block in message["content"]
    ]
    assert {"tool_use", "tool_result"} <= set(blocks)


@pytest.mark.anyio
async def test_measured_mode_negotiates_every_request(conversation: Conversation) -> None:
    loop, window, _ = await run_session("measured", "actual", conversation, **SMALL)
    assert loop.degraded is None
    assert window.stats.overflow_errors == 0
    assert {row.outcome for row in loop.rows} <= MEASURED_OUTCOMES
    # The scripted conversation and the fake provider's counts are deterministic (every
    # answer carries a signed thinking block): requests 1-10, 12 and 16 are under the
    # trigger, 11, 13-15 and 17-19 end at the protected floor, the 20th reaches the target,
    # and after it every request is under the trigger again.
    assert [row.outcome for row in loop.rows] == (
        ["not_needed"] * 10
        + ["protected_floor"]
        + ["not_needed"]
        + ["protected_floor"] * 3
        + ["not_needed"]
        + ["protected_floor"] * 3
        + ["target_reached"]
        + ["not_needed"] * 10
    )
    assert window.stats.count_calls >= len(loop.rows)
    assert all(row.view_tokens <= row.input_limit for row in loop.rows)


@pytest.mark.anyio
async def test_measured_mode_without_the_capability_says_so(conversation: Conversation) -> None:
    short = Conversation(conversation.turns[:2])
    loop, _, _ = await run_session("measured", "estimate", short, **SMALL)
    assert loop.degraded is not None
    assert "context.measured_request_view" in loop.degraded


@pytest.mark.anyio
async def test_hardfit_mode_recovers_from_provider_overflows(conversation: Conversation) -> None:
    loop, window, _ = await run_session(
        "hardfit", "estimate", conversation, advertised_context_window=36_000, **SMALL
    )
    assert window.stats.overflow_errors >= 1
    assert loop.recovered_overflows == window.stats.overflow_errors
    assert loop.unhandled_overflows == 0
    assert window.stats.recover_calls == window.stats.overflow_errors


# -- the measured path's transaction handling (fake getter, real loop) -------------------


class FakeTransaction:
    """Records commit/rollback calls into a shared journal."""

    def __init__(self, journal: list[str], *, commits: bool = True) -> None:
        self.journal = journal
        self.commits = commits

    async def commit(self, *, is_cancelled: Any = None) -> bool:
        await checkpoint()
        assert callable(is_cancelled)
        self.journal.append("commit")
        return self.commits

    def rollback(self) -> None:
        self.journal.append("rollback")


class ListContext:
    """The smallest context the loop needs."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def add_message(self, message: dict[str, Any]) -> None:
        await checkpoint()
        self.messages.append(message)

    async def get_messages(self) -> list[dict[str, Any]]:
        await checkpoint()
        return list(self.messages)


async def run_fake_measured(
    journal: list[str], *, oversize: bool = False, commits: bool = True
) -> tuple[str, Any]:
    """One turn of the real loop against a fake measured getter; returns (answer, loop)."""
    coordinator = ModuleCoordinator()
    await mount_provider(coordinator, {})
    window = coordinator.get("providers")["window"]
    original = window.complete

    async def complete(request: ChatRequest, **kwargs: Any) -> Any:
        journal.append("dispatch")
        return await original(request, **kwargs)

    window.complete = complete
    context = ListContext()

    async def getter(*, provider: Any, retain_contents: list[str], count_view: Any) -> Any:
        assert retain_contents == []
        attempt = await count_view(await context.get_messages())
        if oversize:
            attempt["budget_decision"]["estimated_input_tokens"] = 10**6
        transaction = FakeTransaction(journal, commits=commits)
        return {"final_attempt": attempt, "outcome": "target_reached", "transaction": transaction}

    coordinator.register_capability("context.measured_request_view", getter)
    await mount_loop(coordinator, {"mode": "measured"})
    loop = coordinator.get("orchestrator")
    providers = coordinator.get("providers")
    answer = await loop.execute(
        "hello", context, providers, {}, coordinator.hooks, coordinator=coordinator
    )
    return answer, loop


@pytest.mark.anyio
async def test_measured_commit_happens_immediately_before_dispatch() -> None:
    journal: list[str] = []
    answer, loop = await run_fake_measured(journal)
    assert journal == ["commit", "dispatch"]
    assert not answer.startswith("[turn")
    assert loop.rows[0].outcome == "target_reached"


@pytest.mark.anyio
async def test_measured_oversize_dispatch_rolls_back_and_fails_the_turn() -> None:
    journal: list[str] = []
    answer, loop = await run_fake_measured(journal, oversize=True)
    assert journal == ["rollback"]
    assert answer.startswith("[turn failed")
    assert loop.context_failures == 1


@pytest.mark.anyio
async def test_measured_refused_commit_rolls_back_without_dispatch() -> None:
    journal: list[str] = []
    answer, _ = await run_fake_measured(journal, commits=False)
    assert journal == ["commit", "rollback"]
    assert answer == "[turn cancelled]"


# -- the demo's bill ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_demo_bill_prices_the_providers_cache_figures() -> None:
    import demo

    coordinator = ModuleCoordinator()
    usages: list[Any] = []

    async def on_response(event: str, data: dict[str, Any]) -> None:
        await checkpoint()
        usages.append(demo.Usage.from_payload(data["usage"]))

    coordinator.hooks.register("llm:response", on_response, name="test-bill")
    await mount_provider(coordinator, {"name": "w"})
    window = coordinator.get("providers")["w"]
    first = request("A long and stable system-like prefix. " * 20)
    second = request("A long and stable system-like prefix. " * 20, "and a new question")
    await window.complete(first)
    await window.complete(second)
    totals = [window.count_request_tokens(first), window.count_request_tokens(second)]
    assert [u.total for u in usages] == totals
    assert usages[0].cache_read == 0
    assert usages[1].cache_read == totals[0] - 3
    bill = demo.bill(usages, demo.Prices())
    assert bill.total == sum(totals)
    assert bill.total == bill.fresh + bill.cache_read + bill.cache_write
    assert bill.billed == pytest.approx(
        bill.fresh + 0.1 * bill.cache_read + 1.25 * bill.cache_write
    )
    assert demo.Usage(100, 60, 30).fresh == 40
    assert demo.Prices(1.0, 0.1, 1.25).billed(demo.Usage(100, 60, 30)) == pytest.approx(83.5)


def test_demo_summary_has_the_cost_columns() -> None:
    import demo

    table = demo.summary_table([demo.RunResult(demo.RUNS[0], usages=[demo.Usage(100, 60, 30)])])
    headers = [str(column.header) for column in table.columns]
    assert headers[-8:-1] == [
        "input tokens",
        "cached",
        "cache writes",
        "billed input",
        "thinking sent",
        "invalid thinking",
        "seconds",
    ]
    assert headers[-1] == "verdict"
    assert "provider counts" in headers
    assert "compaction boundaries" in headers
    cells = {str(c.header): next(iter(c.cells)) for c in table.columns}
    assert cells["input tokens"] == "130"
    assert cells["cached"] == "46.2%"
    assert cells["billed input"] == "84"
    assert (cells["thinking sent"], cells["invalid thinking"]) == ("0", "0")
    assert cells["verdict"] == "ok"


# -- the demo's verdict: a degraded run fails it, naming why ------------------------------

FALLBACK = "fell back to the legacy getter: capability 'context.measured_request_view' is missing"
FAIL_CLOSED = "turn(s) failed closed (the context raised ContextLengthError)"
TINY = {"context_window": 1_100, "max_output_tokens": 1_000, "safety_margin_tokens": 0}
"""A window whose input limit (100 tokens) the protected floor outgrows on the third turn."""


@pytest.mark.anyio
async def test_demo_verdict_passes_a_measured_run_that_negotiated_every_request(
    conversation: Conversation,
) -> None:
    import demo

    spec = demo.RunSpec("measured", "measured", "measured", "actual")
    result = await demo.run_conversation(spec, conversation, dict(SMALL))
    assert result.problems() == []
    assert demo.verdict([result]) == []


@pytest.mark.anyio
async def test_demo_verdict_fails_a_measured_run_that_used_the_legacy_getter(
    conversation: Conversation,
) -> None:
    """The context has no measured capability (token_meter "estimate"): the loop falls back
    to get_messages_for_request, so no request has a measured outcome."""
    import demo

    spec = demo.RunSpec("measured", "measured", "measured", "estimate")
    result = await demo.run_conversation(spec, Conversation(conversation.turns[:2]), dict(SMALL))
    assert result.problems() == [
        FALLBACK,
        f"unexpected outcome(s) for mode 'measured': '-' x{len(result.rows)}",
    ]
    assert demo.verdict([result])[0] == f"measured: {FALLBACK}"


@pytest.mark.anyio
async def test_demo_verdict_fails_a_run_with_a_fail_closed_turn() -> None:
    import demo

    spec = demo.RunSpec("measured", "measured", "measured", "actual")
    result = await demo.run_conversation(spec, build_conversation(3), dict(TINY))
    assert result.problems() == [f"1 {FAIL_CLOSED}"]
    assert demo.verdict([result]) == [f"measured: 1 {FAIL_CLOSED}"]


def test_demo_verdict_fails_an_outcome_the_path_does_not_produce_when_it_works() -> None:
    """measurement_unavailable: the provider's count was unusable and the module fell back
    to its own estimate."""
    import demo
    from amplifier_module_loop_negotiating.records import RequestRow

    rows = [
        RequestRow(1, 1, 1, "measured", outcome="target_reached"),
        RequestRow(2, 1, 2, "measured", outcome="measurement_unavailable"),
    ]
    result = demo.RunResult(demo.RUNS[1], rows=rows, turns=1)
    assert result.problems() == [
        "unexpected outcome(s) for mode 'measured': 'measurement_unavailable' x1"
    ]


def test_demo_verdict_fails_when_no_run_ran() -> None:
    import demo

    assert demo.verdict([]) == ["no run was selected"]


@pytest.mark.anyio
async def test_demo_exits_1_and_names_the_degraded_run(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import demo

    argv = ["--runs", "measured", "--turns", "3", "--window", "1600", "--max-output", "1000"]
    assert await demo.main([*argv, "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-2:] == ["verdict: FAILED", f"  measured: 2 {FAIL_CLOSED}"]


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "meter"), [("legacy", "estimate"), ("measured", "actual")])
async def test_every_answered_request_sends_its_thinking_validly(
    conversation: Conversation, mode: str, meter: str
) -> None:
    """The example provider answers with a signed thinking block and the loop stores it:
    across the session's compactions, no request sends one with another prefix than the
    request that produced it (the demo's check, ``demo.check_thinking``)."""
    import demo

    loop, window, history = await run_session(mode, meter, conversation, **SMALL)
    assert loop.events.total["context:compaction"] >= 1
    assert any(
        isinstance(m.get("content"), list) and m["content"][0].get("type") == "thinking"
        for m in history
        if m["role"] == "assistant"
    )
    result = demo.RunResult(demo.RUNS[0])
    demo.check_thinking(result, window.stats.exchanges)
    assert result.thinking_sent > 0
    assert result.thinking_invalid == 0


# -- the demo's report: one line per compaction, warnings whole ---------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("key", ["legacy", "measured", "hardfit"])
async def test_demo_prints_one_line_per_compaction(
    conversation: Conversation, tmp_path: Any, key: str
) -> None:
    """Every ``context:compaction`` event of a run is one line of its report, numbered in
    order and naming the request whose row lists it."""
    import io

    import demo
    from rich.console import Console

    spec = next(spec for spec in demo.RUNS if spec.key == key)
    options = demo.parse_args(["--out", str(tmp_path), "--window", "24000"])
    with demo.captured_warnings() as tally:
        result = await demo.run_conversation(spec, conversation, dict(SMALL))
    assert result.compactions >= 1
    assert len(result.compaction_events) == result.compactions
    buffer = io.StringIO()
    demo.report_run(Console(file=buffer, width=120), result, options, tally)
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("compaction ")]
    assert len(lines) == result.compactions
    requests = [row.number for row in result.rows for _ in range(row.compactions)]
    assert [line.split(":")[0] for line in lines] == [
        f"compaction {n} at request {r} (turn {result.rows[r - 1].turn})"
        for n, r in enumerate(requests, 1)
    ]
    assert all(" -> " in line and " tokens (" in line for line in lines)


def test_a_compaction_line_names_what_that_compaction_added() -> None:
    """The payload's counts are cumulative: a line names the difference from the previous
    compaction's, the view's omitted thinking blocks, and tokens before -> after."""
    import demo

    first = demo.Compaction(
        15,
        7,
        {
            "strategy_level": 3,
            "before_tokens": 23_260,
            "after_tokens": 11_000,
            "target_tokens": 12_552,
            "messages_removed": 13,
            "messages_truncated": 2,
            "user_messages_stubbed": 0,
            "thinking_blocks_omitted": 5,
        },
    )
    second = demo.Compaction(
        30,
        14,
        {
            **first.payload,
            "strategy_level": 8,
            "messages_removed": 20,
            "user_messages_stubbed": 1,
            "thinking_blocks_omitted": 0,
            "outcome": "target_reached",
            "measured_before": 25_000,
            "measured_after": 12_000,
        },
    )
    assert demo.compaction_line(1, first, None) == (
        "compaction 1 at request 15 (turn 7): L3, 23,260 -> 11,000 tokens (estimate; "
        "target 12,552); removed 13 message(s), truncated 2 tool result(s), view omits 5 "
        "thinking block(s)"
    )
    assert demo.compaction_line(2, second, first) == (
        "compaction 2 at request 30 (turn 14): L8 target_reached, 25,000 -> 12,000 tokens "
        "(provider count; target 12,552); removed 7 message(s), stubbed 1 user envelope(s)"
    )
    assert demo.compaction_line(3, second, second).endswith("; no new reduction")
    result = demo.RunResult(demo.RUNS[1], compaction_events=[first, second])
    assert demo.compaction_lines(result) == [
        demo.compaction_line(1, first, None),
        demo.compaction_line(2, second, first),
    ]


def test_the_demo_prints_a_warning_whole() -> None:
    """The tally's line carries the first warning's whole message (it was cut at 160
    characters, mid-sentence)."""
    import logging

    import demo

    message = "context-simple: " + " ".join(f"word{n}" for n in range(80)) + "; the end."
    with demo.captured_warnings() as tally:
        logging.getLogger("demo-test").warning(message)
        logging.getLogger("demo-test").warning("a second one")
    assert tally.lines() == [f"demo-test: 2 warning(s); first: {message}"]
