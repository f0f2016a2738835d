"""Thinking blocks under preserved thinking: the real conversations that carry them.

    uv run --frozen python -m benchmarks.thinking      # this section alone

Every real conversation with thinking blocks (``benchmarks.real.conversations()``) is
replayed at every budget ``B`` of ``BUDGETS`` that makes it compact, a request right
before each assistant message, through ``get_messages_for_request`` of a manager with
``max_tokens = max_tokens_fallback = B`` and otherwise the default configuration. Each view
is checked by the preserved-thinking oracle (``testing/thinking_oracle.py``, which shares
no code with the module), with the assistant message that follows it recorded as its
answer; it is counted by ``benchmarks.provider.Counter`` (o200k_base, independent of the
module's estimator) and billed like ``benchmarks.economics`` (an exact-prefix cache: the
leading messages shared with the previous view read at 0.1, every other token written at
1.25).

Two runs of the module per case:

- ``module``: the default, ``preserved_thinking: "auto"`` (no provider: an unknown model,
  read as checking the prefix): the notice stays where it was first shown, and a
  compaction leaves out the thinking after its first change;
- ``kept``: ``preserved_thinking: false``, every thinking block of a shown message sent
  (what a model without the prefix check gets; on a model with it, those requests fail).

And ``before``: the same replay of the module as it was before views were append-only
(commit 1076376: the notice re-placed at the tail of every view, every thinking block
kept), measured once on this machine and recorded in ``benchmarks/results/thinking-before.txt``
(``--record`` writes that file from the code it runs).

Reported per case, for each run: requests with an invalid thinking block, valid blocks
left out, thinking blocks sent, the bill and the mean context (o200k tokens per request).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.lowlevel

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.cli import Prices, tallied_warnings
from amplifier_module_context_simple.cli.bill import cache_use, keyed_view
from amplifier_module_context_simple.testing.thinking_oracle import PrefixLedger, is_thinking
from benchmarks import real
from benchmarks.provider import Counter

BUDGETS: Final = (8_000, 12_000, 16_000, 24_000, 32_000, 48_000, 64_000)
PRICES: Final = Prices(fresh=1.25, cache_read=0.1, cache_write=1.25)
BEFORE: Final = Path(__file__).resolve().parent / "results" / "thinking-before.txt"
RUNS: Final[tuple[tuple[str, dict[str, Any]], ...]] = (
    ("module", {}),
    ("kept", {"preserved_thinking": False}),
)


@dataclass(frozen=True, slots=True)
class Replay:
    """One run of one case."""

    conversation: str
    budget: int
    run: str
    requests: int
    compactions: int
    invalid_requests: int
    left_out: int
    thinking_sent: int
    bill: float
    mean_context: float


def has_thinking(conversation: real.Conversation) -> bool:
    return any(
        isinstance(m.get("content"), list) and any(map(is_thinking, m["content"]))
        for m in conversation.messages
    )


async def replay(
    conversation: real.Conversation, budget: int, run: str, counter: Counter, **config: Any
) -> Replay:
    """``conversation`` at ``budget`` (module docstring), checked and billed."""
    await anyio.lowlevel.checkpoint()  # (a conversation with no assistant turn awaits nothing)
    manager = SimpleContextManager(max_tokens=budget, max_tokens_fallback=budget, **config)
    ledger = PrefixLedger()
    previous: list[tuple[str, int]] | None = None
    invalid = left_out = sent = compactions = requests = 0
    fresh = read = write = 0
    context: list[int] = []
    stats: object = None
    for message in conversation.messages:
        if message.get("role") == "assistant":
            view = await manager.get_messages_for_request()
            requests += 1
            if manager.last_compaction_stats is not stats:
                stats = manager.last_compaction_stats
                compactions += 1
            verdict = ledger.check(view)
            invalid += bool(verdict.invalid)
            left_out += verdict.left_out
            sent += verdict.shown
            keyed = keyed_view(view, counter.message_tokens)
            use = cache_use(previous, keyed)
            fresh, read, write = fresh + use.fresh, read + use.cache_read, write + use.cache_write
            context.append(sum(tokens for _, tokens in keyed))
            previous = keyed
            ledger.answered(view, message)
        await manager.add_message(message)
    return Replay(
        conversation.name,
        budget,
        run,
        requests,
        compactions,
        invalid,
        left_out,
        sent,
        round(PRICES.billed(fresh, read, write), 1),
        round(statistics.fmean(context), 1),
    )


def cases(
    conversations: Sequence[real.Conversation] | None = None,
) -> list[tuple[real.Conversation, int]]:
    """(conversation, budget) for every conversation with thinking at every budget its
    replay compacts at (whole conversation above the budget by the independent count)."""
    conversations = real.conversations() if conversations is None else conversations
    counter = Counter()
    return [
        (conversation, budget)
        for conversation in conversations
        if has_thinking(conversation)
        for budget in BUDGETS
        if counter.count_request(conversation.messages) > budget
    ]


def run(
    conversations: Sequence[real.Conversation] | None = None,
    runs: Sequence[tuple[str, dict[str, Any]]] = RUNS,
) -> list[Replay]:
    counter = Counter()

    async def main() -> list[Replay]:
        return [  # noqa: ASYNC910 - the benchmark's only task: nothing cancels it
            await replay(conversation, budget, name, counter, **config)
            for conversation, budget in cases(conversations)
            for name, config in runs
        ]

    with tallied_warnings():
        return anyio.run(main)


def recorded_before() -> list[Replay]:
    """The ``before`` replays recorded in ``BEFORE`` (empty when the file is missing)."""
    if not BEFORE.exists():
        return []
    lines = [line for line in BEFORE.read_text().splitlines() if line.startswith("{")]
    return [Replay(**json.loads(line)) for line in lines]


HEADER: Final = (
    "conversation @ budget",
    "requests",
    "invalid: before / module / kept",
    "left out (module)",
    "thinking sent: before / module / kept",
    "bill: before / module / kept",
    "mean context: before / module / kept",
)


def rows(replays: Sequence[Replay], before: Sequence[Replay]) -> list[list[str]]:
    """One row per case: every run's figures side by side (``-``: not recorded)."""
    by_case: dict[tuple[str, int], dict[str, Replay]] = {}
    for r in [*before, *replays]:
        by_case.setdefault((r.conversation, r.budget), {})[r.run] = r
    out = []
    for (name, budget), found in by_case.items():
        if "module" not in found:
            continue

        def cells(attribute: str, spec: str, found: dict[str, Replay] = found) -> str:
            return " / ".join(
                spec.format(getattr(found[run], attribute)) if run in found else "-"
                for run in ("before", "module", "kept")
            )

        out.append(
            [
                f"{name} @ {budget // 1000}k",
                str(found["module"].requests),
                cells("invalid_requests", "{}"),
                str(found["module"].left_out),
                cells("thinking_sent", "{}"),
                cells("bill", "{:,.0f}"),
                cells("mean_context", "{:,.0f}"),
            ]
        )
    return out


def totals(replays: Sequence[Replay], before: Sequence[Replay]) -> dict[str, Any]:
    """Sums over the cases: requests, invalid requests, blocks left out, bills, and the
    mean context per run (over the cases both runs have)."""
    out: dict[str, Any] = {}
    for run in ("before", "module", "kept"):
        chosen = [r for r in (before if run == "before" else replays) if r.run == run]
        if not chosen:
            continue
        out[run] = {
            "cases": len(chosen),
            "requests": sum(r.requests for r in chosen),
            "invalid_requests": sum(r.invalid_requests for r in chosen),
            "left_out": sum(r.left_out for r in chosen),
            "bill": round(sum(r.bill for r in chosen)),
            "mean_context": round(statistics.fmean(r.mean_context for r in chosen)),
        }
    return out


def main(argv: Sequence[str]) -> int:
    if "--record" in argv:
        replays = run(runs=(("before", {}),))
        BEFORE.write_text(
            "# benchmarks/thinking.py --record: the module's replays, run as 'before'\n"
            + "".join(json.dumps(asdict(r)) + "\n" for r in replays)
        )
        print(f"wrote {BEFORE}")
        return 0
    replays = run()
    before = recorded_before()
    table = [list(HEADER), *rows(replays, before)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    for row in table:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    print(json.dumps(totals(replays, before), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
