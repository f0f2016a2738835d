"""The preserved-thinking oracle (``testing/thinking_oracle.py``) on hand-built requests.

Each test builds a short sequence of requests and answers by hand, in the wire shapes the
providers document, and asserts the one verdict the rule gives."""

from __future__ import annotations

from typing import Any

from amplifier_module_context_simple.testing.thinking_oracle import PrefixLedger

SYSTEM = {"role": "system", "content": "You are terse."}


def answer(n: int, text: str = "ok", *, thinking_first: bool = True) -> dict[str, Any]:
    thinking = {"type": "thinking", "thinking": f"thought {n}", "signature": f"sig-{n}"}
    blocks: list[Any] = [{"type": "text", "text": f"{text} {n}"}]
    blocks.insert(0 if thinking_first else 1, thinking)
    return {"role": "assistant", "content": blocks}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def stripped(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "content": [b for b in message["content"] if b["type"] != "thinking"]}


def run(ledger: PrefixLedger, view: list[dict[str, Any]], reply: dict[str, Any]) -> None:
    assert ledger.check(view).ok
    ledger.answered(view, reply)


def test_an_append_only_conversation_is_valid() -> None:
    ledger = PrefixLedger()
    view = [SYSTEM, user("hi")]
    for n in range(4):
        reply = answer(n)
        verdict = ledger.check(view)
        assert (verdict.invalid, verdict.left_out, verdict.shown) == ((), 0, n)
        ledger.answered(view, reply)
        view = [*view, reply, user(f"next {n}")]


def test_a_notice_moved_to_the_tail_invalidates_the_answer_after_it() -> None:
    ledger = PrefixLedger()
    notice = user("<notice>")
    first = [SYSTEM, user("hi"), notice]
    reply = answer(1)
    run(ledger, first, reply)
    moved = [SYSTEM, user("hi"), reply, user("more"), notice]
    assert ledger.check(moved).invalid == ("thinking:signature:sig-1",)
    kept = [SYSTEM, user("hi"), notice, reply, user("more")]
    assert ledger.check(kept).ok


def test_a_changed_earlier_message_invalidates_every_later_block() -> None:
    ledger = PrefixLedger()
    view = [SYSTEM, user("a long tool output")]
    first = answer(1)
    run(ledger, view, first)
    view2 = [*view, first, user("b")]
    second = answer(2)
    run(ledger, view2, second)
    changed = [SYSTEM, user("a l[...]"), first, user("b"), second, user("c")]
    assert ledger.check(changed).invalid == ("thinking:signature:sig-1", "thinking:signature:sig-2")


def test_a_block_after_an_invalid_one_is_invalid_even_with_its_own_prefix() -> None:
    ledger = PrefixLedger()
    # sig-2 was produced after a view that already showed sig-1 invalid: its own prefix
    # matches, yet the provider rejects every block after the first invalid one
    ledger.answered([SYSTEM, user("x")], answer(1))
    view = [SYSTEM, user("y"), answer(1), user("z")]
    ledger.answered(view, answer(2))
    verdict = ledger.check([*view, answer(2), user("w")])
    assert verdict.invalid == ("thinking:signature:sig-1", "thinking:signature:sig-2")


def test_a_change_to_the_system_prompt_invalidates_everything() -> None:
    ledger = PrefixLedger()
    reply = answer(1)
    run(ledger, [SYSTEM, user("hi")], reply)
    other = {"role": "system", "content": "You are verbose."}
    assert ledger.check([other, user("hi"), reply, user("more")]).invalid


def test_blocks_before_the_thinking_in_its_own_message_are_part_of_its_prefix() -> None:
    ledger = PrefixLedger()
    reply = answer(1, "preamble", thinking_first=False)
    run(ledger, [SYSTEM, user("hi")], reply)
    edited = {**reply, "content": [{"type": "text", "text": "pre"}, reply["content"][1]]}
    assert ledger.check([SYSTEM, user("hi"), edited, user("more")]).invalid


def test_a_thinking_block_removed_from_an_unchanged_prefix_is_left_out() -> None:
    ledger = PrefixLedger()
    reply = answer(1)
    run(ledger, [SYSTEM, user("hi")], reply)
    verdict = ledger.check([SYSTEM, user("hi"), stripped(reply), user("more")])
    assert (verdict.invalid, verdict.left_out) == ((), 1)


def test_thinking_removed_after_a_change_is_not_left_out() -> None:
    ledger = PrefixLedger()
    reply = answer(1)
    run(ledger, [SYSTEM, user("a long tool output")], reply)
    verdict = ledger.check([SYSTEM, user("a l[...]"), stripped(reply), user("more")])
    assert (verdict.invalid, verdict.left_out) == ((), 0)


def test_consecutive_user_messages_merge_into_one_turn() -> None:
    # the provider merges consecutive user turns: a message appended to the turn a block
    # was answered after changes that turn (a notice placed before the answer would)
    ledger = PrefixLedger()
    reply = answer(1)
    run(ledger, [SYSTEM, user("a"), user("b")], reply)
    assert ledger.check([SYSTEM, user("a"), user("b"), reply, user("c"), user("d")]).ok
    assert ledger.check([SYSTEM, user("a"), user("b"), user("x"), reply]).invalid


def test_amplifier_and_openai_shapes_and_redacted_blocks() -> None:
    ledger = PrefixLedger()
    call = {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "opaque-1"},
            {"type": "thinking", "thinking": "t", "signature": "s", "visibility": "internal"},
            {"type": "tool_call", "id": "c1", "name": "read", "input": {"path": "a"}},
        ],
        "tool_calls": [{"id": "c1", "tool": "read", "arguments": {"path": "a"}}],
    }
    run(ledger, [SYSTEM, user("read a")], call)
    result = {"role": "tool", "tool_call_id": "c1", "content": "file a"}
    view = [SYSTEM, user("read a"), call, result]
    assert ledger.check(view).shown == 2
    assert ledger.check(view).ok
    shortened = {**result, "content": "fi[...]"}
    # the result is after both blocks: their prefix is unchanged
    assert ledger.check([SYSTEM, user("read a"), call, shortened]).ok
    # metadata is never sent: it is not part of any prefix
    tagged = {**user("read a"), "metadata": {"source": "x"}}
    assert ledger.check([SYSTEM, tagged, call, result]).ok
