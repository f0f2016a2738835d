"""Which thinking rule a session's model follows (``context/rendering/thinking.py``), read from what
the provider reports or forced by ``preserved_thinking``; what each rule does to the view
and to its estimate."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.config import ContextConfig
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.rendering.thinking import model_rule, thinking_rule
from tests.realdata import conversations
from tests.thinking.sessions import has_thinking, ordinary, replay_checked

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("model", "preserved", "keeps_prior"),
    [
        ("claude-fable-5-1", True, True),
        ("claude-fable-5-2-20261001", True, True),
        ("claude-mythos-5-1", True, True),
        ("claude-opus-5-5", True, True),
        ("claude-sonnet-5-5@20261101", True, True),
        ("anthropic.claude-haiku-5-5-v1:0", True, True),
        ("claude-opus-6", True, True),
        ("claude-opus-4-5-20251101", False, True),
        ("claude-opus-4-1", False, False),
        ("claude-sonnet-4-6", False, True),
        ("claude-sonnet-4-5-20250929", False, False),
        ("claude-sonnet-4-20250514", False, False),
        ("claude-3-7-sonnet-20250219", False, False),
        ("claude-haiku-4-5", False, False),
        ("gpt-5.1", False, True),
    ],
)
def test_model_ids(model: str, preserved: bool, keeps_prior: bool) -> None:
    rule = model_rule(model)
    assert rule is not None
    assert (rule.preserved, rule.keeps_prior, rule.source) == (preserved, keeps_prior, "model_id")


def test_an_unknown_model_is_treated_as_preserved() -> None:
    assert model_rule("some-house-model") is None
    rule = thinking_rule("auto", Provider(model_id="some-house-model"))
    assert (rule.preserved, rule.keeps_prior, rule.source) == (True, True, "default")


@dataclass
class Info:
    id: str
    capabilities: list[str] = field(default_factory=list)
    context_window: int = 200_000
    max_output_tokens: int = 64_000


@dataclass
class Provider:
    model_id: str | None = None
    capabilities: list[str] = field(default_factory=list)
    default_model: str | None = None
    broken: bool = False

    def get_model_info(self) -> Info | None:
        if self.broken:
            raise RuntimeError("provider bug")
        return None if self.model_id is None else Info(self.model_id, self.capabilities)

    def get_info(self) -> Any:
        defaults = {"context_window": 200_000, "max_output_tokens": 64_000}
        if self.default_model is not None:
            defaults["model"] = self.default_model  # type: ignore[assignment]
        return type("ProviderInfo", (), {"defaults": defaults})()


def test_what_the_provider_reports() -> None:
    capable = Provider(model_id="house-model", capabilities=["tools", "preserved_thinking"])
    assert thinking_rule("auto", capable).source == "provider_capabilities"
    assert thinking_rule("auto", capable).preserved is True
    by_id = thinking_rule("auto", Provider(model_id="claude-sonnet-4-5"))
    assert (by_id.preserved, by_id.model) == (False, "claude-sonnet-4-5")
    by_default = thinking_rule("auto", Provider(default_model="claude-mythos-5-2"))
    assert (by_default.preserved, by_default.source) == (True, "model_id")
    assert thinking_rule("auto", Provider(broken=True, default_model="gpt-5")).preserved is False
    assert thinking_rule("auto", None).source == "default"


def test_the_config_key_forces_it_either_way() -> None:
    old = Provider(model_id="claude-sonnet-4-5")
    assert thinking_rule(True, old).preserved is True
    assert thinking_rule(False, Provider(model_id="claude-opus-5-5")).preserved is False
    assert ContextConfig().preserved_thinking == "auto"
    for bad in ("yes", 1, None, ["auto"]):
        with pytest.raises(ValueError, match="preserved_thinking"):
            ContextConfig(preserved_thinking=bad)  # type: ignore[arg-type]


REAL = next(conv for conv in conversations() if conv.name == "anthropic_entire_1")


async def test_without_a_prefix_check_a_compaction_keeps_the_thinking(anyio_backend: str) -> None:
    """A model with no prefix check gets every thinking block of the messages it is shown
    (its rules may require the latest one); the view leaves none out."""
    forced = await replay_checked(REAL.messages, ordinary(8_000), preserved_thinking=False)
    auto = await replay_checked(REAL.messages, ordinary(8_000))
    assert forced.compactions > 0
    assert forced.shown > auto.shown
    manager = SimpleContextManager(preserved_thinking=False)
    await manager.set_messages(copy.deepcopy(REAL.messages))
    await manager.get_messages_for_request(token_budget=8_000)
    stats = manager.last_compaction_stats
    assert stats is not None
    assert (stats["thinking_blocks_omitted"], stats["preserved_thinking"]) == (0, False)
    assert stats["thinking_rule_source"] == "config"


async def test_the_stats_say_what_thinking_the_view_left_out(anyio_backend: str) -> None:
    """Each compaction's stats (and the meter's, for the request that made it) count the
    thinking blocks the view leaves out, and say why."""
    await checkpoint()
    conv = next(conv for conv in conversations() if conv.name == "anthropic_entire_3")
    # no margin under a held floor: the recorded sequence of compactions (a margin makes
    # the floor give way sooner, at other points: tests/context/test_floor_economics.py)
    manager = SimpleContextManager(estimate_margin=0.0)
    reported: list[int] = []
    for message in conv.messages:
        if message["role"] == "assistant":
            before = manager.last_compaction_stats
            await manager.get_messages_for_request(token_budget=24_000)
            stats = manager.last_compaction_stats
            if stats is not None and stats is not before:
                meter = manager.last_token_meter_stats
                assert meter is not None
                assert meter["thinking_blocks_omitted"] == stats["thinking_blocks_omitted"]
                assert (meter["preserved_thinking"], meter["thinking_rule_source"]) == (
                    True,
                    "default",
                )
                assert stats["thinking_messages_omitted"] <= stats["thinking_blocks_omitted"]
                reason = "prefix_changed" if stats["thinking_blocks_omitted"] else None
                assert stats["thinking_omitted_reason"] == reason
                reported.append(stats["thinking_blocks_omitted"])
        await manager.add_message(copy.deepcopy(message))
    assert reported == [5, 6, 8, 2]


def thinking_tokens(message: dict[str, Any]) -> int:
    kept = [b for b in message["content"] if b.get("type") not in ("thinking", "redacted_thinking")]
    return estimate_message(message) - estimate_message({**message, "content": kept})


async def test_a_model_that_drops_earlier_thinking_is_estimated_without_it(
    anyio_backend: str,
) -> None:
    """Sonnet 4.5 drops the thinking of turns before the latest human prompt: the estimate
    leaves exactly that out; Opus 4.5 keeps it, and the estimate counts it."""
    messages = REAL.messages
    last_human = max(
        i for i, m in enumerate(messages) if m["role"] == "user" and isinstance(m["content"], str)
    )
    dropped = sum(thinking_tokens(m) for m in messages[:last_human] if has_thinking(m))
    assert dropped > 0
    estimates = {}
    for model in ("claude-sonnet-4-5", "claude-opus-4-5"):
        manager = SimpleContextManager()
        await manager.set_messages(copy.deepcopy(messages))
        await manager.get_messages_for_request(provider=Provider(model_id=model))
        meter = manager.last_token_meter_stats
        assert meter is not None and manager.last_compaction_stats is None
        estimates[model] = meter["estimated_tokens"]
    assert estimates["claude-opus-4-5"] - estimates["claude-sonnet-4-5"] == dropped
