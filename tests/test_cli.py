"""``amplifier-context-simple replay``: the transcript replay CLI.

Most tests call ``main([...])`` directly; one runs the installed console script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.cli import main, parse_assignment
from amplifier_module_context_simple.cli.replaying import EventLog
from amplifier_module_context_simple.context.config import ContextConfig
from amplifier_module_context_simple.context.counting.estimate import (
    estimate_message,
    estimate_text,
)
from amplifier_module_context_simple.context.ladder.rungs import RUNGS
from amplifier_module_context_simple.testing.provider_rules import Dialect, check_provider_valid

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-transcript.jsonl"
WINDOW = ["--window", "32000", "--max-output", "4000"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], str]:
    """``main(["replay", *argv, "--json"])``: the parsed report and the stderr text."""
    assert main(["replay", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    report: dict[str, Any] = json.loads(captured.out)
    return report, captured.err


def small_session() -> list[dict[str, Any]]:
    """user, assistant+call, tool, assistant, user, assistant: 3 assistant messages."""
    return [
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "list_dir", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(["a.py", "b.py"])},
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "谢谢"},
        {"role": "assistant", "content": "不客气"},
    ]


def write_jsonl(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_sample_transcript_replays_with_compactions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(SAMPLE), *WINDOW]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out
    assert "compaction boundaries" in out
    summary = out.split("\nsummary\n")[1]
    rows = {line[:21].strip(): line[21:].strip() for line in summary.splitlines()[2:]}
    assert int(rows["compaction boundaries"]) >= 3
    assert rows["budget"] == "25,904"  # 32,000 - 4,000 * 0.5 - 4,096
    assert rows["budget source"] == "provider_defaults"
    boundary_rows = [line for line in out.splitlines() if " L" in line and " -> " in line]
    assert len(boundary_rows) == int(rows["compaction boundaries"])
    # each boundary names its level's rung (context/ladder/rungs.py); so does the max level
    named = {f"L{rung.number} {rung.name}" for rung in RUNGS}
    assert all(any(f" {label}" in line for label in named) for line in boundary_rows)
    assert rows["max level"] in {f"{rung.number} {rung.name}" for rung in RUNGS}


def test_console_script_replays_sample_as_json() -> None:
    script = Path(sys.executable).parent / "amplifier-context-simple"
    result = subprocess.run(
        [str(script), "replay", str(SAMPLE), *WINDOW, "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (run,) = report["runs"]
    assert report["messages"] == 420
    assert run["totals"]["compaction_boundaries"] >= 3
    assert run["totals"]["requests"] == len(run["requests"])


def test_requests_are_made_before_each_assistant_message_and_at_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = small_session()
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m, ensure_ascii=False) for m in session])
    report, _ = run_json(capsys, str(path))
    (run,) = report["runs"]
    assistant_positions = [i for i, m in enumerate(session) if m["role"] == "assistant"]
    seen = [r["history_messages"] for r in run["requests"]]
    assert seen == [*assistant_positions, len(session)]
    assert [r["request"] for r in run["requests"]] == [1, 2, 3, 4]
    assert run["budget"]["source"] == "max_tokens_fallback"  # no --window: no provider
    assert run["totals"]["compaction_boundaries"] == 0


def test_malformed_lines_are_reported_and_the_rest_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [json.dumps(m, ensure_ascii=False) for m in small_session()]
    rows = [
        good[0],
        '{"role": "assistant", "content": ',  # line 2: invalid JSON
        good[1],
        good[2],
        '["not", "an", "object"]',  # line 5: not an object
        "",  # line 6: blank, skipped silently
        good[3],
        '{"content": "who said this?"}',  # line 8: no role
        good[4],
        good[5],
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    report, err = run_json(capsys, str(path))
    for number in (2, 5, 8):
        assert f"line {number}:" in err
    assert "line 6" not in err
    assert "invalid JSON" in err and "not a JSON object" in err and "'role'" in err
    assert report["messages"] == 6
    assert [p["number"] for p in report["skipped"]] == [2, 5, 8]
    assert report["runs"][0]["totals"]["requests"] == 4


def test_json_array_transcript(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([*small_session(), 42], indent=2), encoding="utf-8")
    assert main(["replay", str(path), *WINDOW]) == 0
    captured = capsys.readouterr()
    assert "item 7: not a JSON object" in captured.err
    assert "6 messages, 1 skipped" in captured.out
    report, _ = run_json(capsys, str(path))
    assert report["format"] == "array"
    assert report["runs"][0]["totals"]["requests"] == 4


def test_lower_threshold_compacts_more_often(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(SAMPLE), *WINDOW, "--set", "compact_threshold=0.7"]
    report, _ = run_json(capsys, *argv, "--compare", "compact_threshold=0.95")
    low, high = report["runs"]
    assert low["config"] == {"compact_threshold": 0.7}
    assert high["config"] == {"compact_threshold": 0.95}
    assert low["totals"]["requests"] == high["totals"]["requests"]
    assert low["totals"]["compaction_boundaries"] > high["totals"]["compaction_boundaries"] >= 3
    assert low["totals"]["max_view_tokens"] < high["totals"]["max_view_tokens"]
    for run in (low, high):
        compacted = [r["request"] for r in run["requests"] if r["compacted"]]
        assert compacted == [c["request"] for c in run["compactions"]]
        assert run["totals"]["max_view_over_budget"] <= 1

    assert main(["replay", *argv, "--compare", "compact_threshold=0.95"]) == 0
    out = capsys.readouterr().out
    assert "A: compact_threshold=0.7" in out and "B: compact_threshold=0.95" in out
    assert "A level" in out and "B level" in out


def growing_session(turns: int) -> list[dict[str, Any]]:
    """A prompt, then ``turns`` calls with their results (about 62 tokens a turn), then an
    answer: each request before an assistant message sees one more turn."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "read the build log, one part at a time"}
    ]
    for i in range(turns):
        call = {"name": "read_log", "arguments": json.dumps({"part": i})}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"call_{i}", "type": "function", "function": call}],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "content": f"part {i}: {'step ok, ' * 10}",
            }
        )
    messages.append({"role": "assistant", "content": "The build is fine."})
    return messages


def test_the_replay_reports_the_trigger_the_store_fires_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay's trigger is the store's own (``Limits``, from its plan's inputs). At a
    budget of 2,654 the notice reserve is a quarter of it (663, not the configured 800), so
    the store fires at 0.92 x (2,654 - 663) = 1,832 tokens: on the replay's own requests
    (none under it compacts, the first at or over it does) and, on the same history, at
    exactly that meter reading and not one token below. The replay used to report 0.92 x
    (2,654 - 800) = 1,706, under two requests that did not compact (issue 29)."""
    session = growing_session(40)
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m) for m in session])
    report, _ = run_json(capsys, str(path), "--set", "max_tokens=2654")
    (run,) = report["runs"]
    totals, requests = run["totals"], run["requests"]
    trigger = totals["trigger_tokens"]
    assert (totals["budget"], trigger) == (2654, 1832)

    first = next(i for i, r in enumerate(requests) if r["compacted"])
    assert all(r["view_tokens"] < trigger for r in requests[:first])
    assert run["compactions"][0]["request"] == first + 1
    assert run["compactions"][0]["before_tokens"] >= trigger
    assert sum(1706 <= r["view_tokens"] < trigger for r in requests[:first]) == 2

    async def fires_at(used: int) -> bool:
        """Whether a request on the same history compacts at a meter reading of ``used``."""
        log = EventLog()
        manager = SimpleContextManager(max_tokens=2654, token_meter="actual", hooks=log)
        for message in session:
            await manager.add_message(message)
        await manager.on_llm_response("llm:response", {"usage": {"input_tokens": used}})
        await manager.get_messages_for_request()
        return any(event == "context:compaction" for event, _ in log.events)

    assert anyio.run(fires_at, trigger)
    assert not anyio.run(fires_at, trigger - 1)


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "cadence.png"
    argv = ["replay", str(SAMPLE), *WINDOW, "--compare", "target_usage=0.3", "--plot", str(plot)]
    assert main(argv) == 0
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    assert f"plot written to {plot}" in capsys.readouterr().out


def test_plot_without_matplotlib_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m) for m in small_session()])
    assert main(["replay", str(path), "--plot", str(tmp_path / "p.png")]) == 1
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    ("option", "assignment", "key"),
    [
        ("--set", "compact_threshold=1.5", "compact_threshold"),
        ("--set", "compaction_notice_enabled=yes", "compaction_notice_enabled"),
        ("--set", "max_tokens=lots", "max_tokens"),  # the module is lenient here; the CLI not
        ("--set", "compact_treshold=0.5", "compact_treshold"),  # unknown key
        ("--compare", "protected_tool_results=-1", "protected_tool_results"),
    ],
)
def test_bad_configuration_is_a_usage_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    assignment: str,
    key: str,
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m) for m in small_session()])
    assert main(["replay", str(path), option, assignment]) == 2
    captured = capsys.readouterr()
    assert key in captured.err and option in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", "no-equals-sign"],
        ["--window", "32000"],  # without --max-output
        ["--window", "-1", "--max-output", "10"],
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m) for m in small_session()])
    assert main(["replay", str(path), *argv]) == 2
    assert capsys.readouterr().err


def test_unreadable_or_empty_transcript_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err
    nothing = write_jsonl(tmp_path / "nothing.jsonl", ["", "not json", '{"role": ""}'])
    assert main(["replay", str(nothing)]) == 1
    err = capsys.readouterr().err
    assert "line 2:" in err and "line 3:" in err and "no replayable messages" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("compact_threshold=0.7", ("compact_threshold", 0.7)),
        ("protected_tool_results=3", ("protected_tool_results", 3)),
        ("compaction_notice_enabled=false", ("compaction_notice_enabled", False)),
        ("max_tokens=null", ("max_tokens", None)),
        ("compaction_notice_verbosity=minimal", ("compaction_notice_verbosity", "minimal")),
        (" token_meter = actual ", ("token_meter", "actual")),
        ("compaction_notice_verbosity=", ("compaction_notice_verbosity", "")),
    ],
)
def test_set_values_are_json_when_possible(text: str, expected: tuple[str, Any]) -> None:
    assert parse_assignment(text) == expected


def big_output_session(fmt: str, output: str) -> list[dict[str, Any]]:
    """A prompt, one tool call whose result is ``output``, and the answer (OpenAI tool
    message or Anthropic tool_use / tool_result blocks)."""
    prompt = {"role": "user", "content": "dump the log"}
    answer = {"role": "assistant", "content": "The log is long; here is the gist."}
    if fmt == "openai":
        call = {"id": "call_1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
        return [
            prompt,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": output},
            answer,
        ]
    return [
        prompt,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "cat", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": output}],
        },
        answer,
    ]


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_history_tokens_are_counted_as_admitted_after_the_ingress_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    line = "2025-01-01T00:00:00Z worker-7 INFO processed batch 0042 in 17 ms, 3 retries\n"
    output = (line * (2**20 // len(line) + 1))[: 2**20]  # 1 MiB of log lines
    session = big_output_session(fmt, output)
    path = write_jsonl(tmp_path / "big.jsonl", [json.dumps(m) for m in session])
    report, err = run_json(capsys, str(path))
    (run,) = report["runs"]
    last = run["requests"][-1]
    assert last["history_messages"] == len(session)

    async def held() -> int:  # what the module holds after admission
        manager = SimpleContextManager()
        for message in session:
            await manager.add_message(message)
        return sum(estimate_message(m) for m in await manager.get_messages())

    assert last["history_tokens"] == anyio.run(held)
    # about 128 KiB worth of the output, not 1 MiB worth
    cap = 131072
    raw = estimate_text(output)
    capped = estimate_text(output[:cap])
    assert raw > 7 * capped
    assert 0.95 * capped <= last["history_tokens"] <= capped + 200
    # what a request without compaction shows
    assert run["totals"]["compaction_boundaries"] == 0
    assert last["view_tokens"] == last["history_tokens"]
    assert "Traceback" not in err


# -- the bill: simulated prompt cache, prices, the sliding-window baseline ----------------

REAL_GLAIVE = ROOT / "tests" / "data" / "real" / "openai_glaive_zh_composite.jsonl"
"""Real, and every call id unique: views show a reused id under a fresh name (``ids.py``),
which costs its own tokens, so only here are the module's views the window's exactly."""


def test_cache_simulation_and_billing_on_a_prefix_change() -> None:
    from amplifier_module_context_simple.cli import CacheUse, Prices, simulate_cache

    first = [("system", 100), ("a", 50), ("b", 30)]
    grown = [*first, ("c", 20), ("d", 10)]
    changed_at_1 = [("system", 100), ("A", 60), ("b", 30), ("c", 20), ("d", 10), ("e", 5)]
    uses = simulate_cache([first, grown, changed_at_1])
    assert uses == [
        CacheUse(total=180, cache_read=0, cache_write=150, fresh=30, shared_messages=0),
        CacheUse(total=210, cache_read=180, cache_write=20, fresh=10, shared_messages=3),
        CacheUse(total=225, cache_read=100, cache_write=120, fresh=5, shared_messages=1),
    ]
    prices = Prices()
    billed = [prices.billed(u.fresh, u.cache_read, u.cache_write) for u in uses]
    assert billed == [217.5, 53.0, 165.0]
    assert Prices(1.0, 0.5, 2.0).billed(10, 100, 20) == 100.0
    # An unchanged view is read from the cache entirely.
    assert simulate_cache([first, first])[1] == CacheUse(180, 180, 0, 0, 3)


def _sample_transcript() -> Any:
    from amplifier_module_context_simple.cli import parse_transcript

    return parse_transcript(SAMPLE, SAMPLE.read_bytes())


def _results_have_their_calls(view: list[Any]) -> bool:
    from amplifier_module_context_simple.context.formats import tool_ids

    declared: set[str] = set()
    for message in view:
        calls, results, _ = tool_ids(message)
        if not set(results) <= declared:
            return False
        declared |= set(calls)
    return True


@pytest.mark.parametrize("target", [300, 2_000, 12_952])
def test_sliding_window_keeps_calls_with_results_and_fits_the_target(target: int) -> None:
    from amplifier_module_context_simple.cli import sliding_window_view

    messages = [message for _, message in _sample_transcript().messages]
    for end in range(1, len(messages) + 1):
        view = sliding_window_view(messages[:end], target)
        assert _results_have_their_calls(view)
        assert view[-1] is messages[end - 1] or messages[end - 1].get("role") == "tool"
        size = sum(estimate_message(m) for m in view)
        if size > target:  # only the newest unit (call + results), which is never dropped
            assert len([m for m in view if m.get("role") == "assistant"]) <= 1


def test_sliding_window_replay_fits_target_usage_times_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report, _ = run_json(capsys, str(SAMPLE), *WINDOW, "--sliding-window")
    module, sliding = report["runs"]
    assert sliding["name"] == "sliding"
    assert sliding["baseline"].startswith("sliding window")
    target = int(module["totals"]["budget"] * 0.5)
    assert max(r["view_tokens"] for r in sliding["requests"]) <= target
    assert len(sliding["requests"]) == len(module["requests"])


def summary_rows(out: str) -> dict[str, list[str]]:
    """The summary table: title -> cells (split on runs of two or more spaces)."""
    import re

    lines = out.split("\nsummary\n")[1].splitlines()
    rows = {}
    for line in lines[2:]:
        if line.startswith(("bill:", "cache model:")):
            break
        title, *cells = re.split(r"\s{2,}", line.strip())
        rows[title] = cells
    return rows


def test_compare_with_the_sliding_window_on_the_sample(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["replay", str(SAMPLE), *WINDOW, "--compare", "target_usage=0.4", "--sliding-window"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = out.split("\nsummary\n")[1].splitlines()[0].split()
    assert header == ["A", "B", "sliding"]
    rows = summary_rows(out)
    for title in ("total input tokens", "cached share", "cache writes", "billed input", "requests"):
        assert len(rows[title]) == 3
    billed = [float(cell.replace(",", "")) for cell in rows["billed input"]]
    assert billed[0] < billed[2]  # the module's sticky decisions cost less than trimming
    assert rows["requests"] == ["158", "158", "158"]
    assert "prices fresh 1, cache read 0.1, cache write 1.25" in out


def test_compare_with_the_sliding_window_on_a_real_conversation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["replay", str(REAL_GLAIVE), *WINDOW, "--sliding-window"]) == 0
    rows = summary_rows(capsys.readouterr().out)
    for title in ("total input tokens", "cached share", "cache writes", "billed input", "requests"):
        assert len(rows[title]) == 2
    # Within a 32k window this conversation never needs trimming: both bills are equal.
    assert rows["billed input"][0] == rows["billed input"][1]
    assert rows["compaction boundaries"] == ["0", "0"]


def test_json_totals_carry_the_bill_and_the_prices_apply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report, _ = run_json(capsys, str(SAMPLE), *WINDOW)
    totals = report["runs"][0]["totals"]
    assert totals["input_tokens"] == (
        totals["cache_read_tokens"] + totals["cache_write_tokens"] + totals["fresh_tokens"]
    )
    requests = report["runs"][0]["requests"]
    assert sum(r["view_tokens"] for r in requests) == totals["input_tokens"]
    expected = (
        totals["fresh_tokens"]
        + 0.1 * totals["cache_read_tokens"]
        + 1.25 * totals["cache_write_tokens"]
    )
    assert totals["billed_input"] == round(expected, 1)
    flat, _ = run_json(
        capsys, str(SAMPLE), *WINDOW, "--price-cache-read", "1", "--price-cache-write", "1"
    )
    assert flat["runs"][0]["totals"]["billed_input"] == totals["input_tokens"]
    assert flat["prices"] == {"fresh": 1.0, "cache_read": 1.0, "cache_write": 1.0}


def test_bad_price_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(SAMPLE), "--price-fresh", "-1"]) == 2
    assert "--price-fresh" in capsys.readouterr().err


def test_plot_cost_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "cost.png"
    argv = ["replay", str(SAMPLE), *WINDOW, "--sliding-window", "--plot-cost", str(target)]
    assert main(argv) == 0
    assert target.read_bytes().startswith(PNG_SIGNATURE)
    assert f"cost plot written to {target}" in capsys.readouterr().out


# -- the bill at equal context: the context each run keeps, trimmers with hysteresis ---------

REAL_ENTIRE_4 = ROOT / "tests" / "data" / "real" / "anthropic_entire_4.jsonl"


def sized(message: Mapping[str, Any]) -> int:
    """A measure for constructed cases: a message costs the length of its content."""
    return len(message["content"])


def text(label: str, size: int) -> str:
    """``label`` padded to ``size`` characters (distinct contents, exact sizes)."""
    return label.ljust(size, ".")


def call_unit(number: int) -> list[dict[str, Any]]:
    """An assistant call (10) with its result (20): one unit of 30."""
    call_id = f"call_{number}"
    call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": text(f"a{number}", 10), "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": text(f"t{number}", 20)},
    ]


def growing_histories() -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    """System (5), then units U1..U7 alternating a user message (10) and a call unit (30);
    the histories end at U1, U2, ..., U7. Returns (units with the system first, histories)."""
    units: list[list[dict[str, Any]]] = [[{"role": "system", "content": text("s", 5)}]]
    for number in range(1, 8):
        user = [{"role": "user", "content": text(f"u{number}", 10)}]
        units.append(user if number % 2 else call_unit(number))
    histories = [[m for unit in units[: end + 1] for m in unit] for end in range(1, 8)]
    return units, histories


def test_hysteresis_sends_everything_until_over_budget_then_trims_and_appends() -> None:
    from amplifier_module_context_simple.cli import hysteresis_views

    units, histories = growing_histories()
    views = list(hysteresis_views(histories, 60, 0.75, measure=sized))
    s, u1, u2, u3, u4, u5, u6, u7 = units
    assert views == [
        s + u1,  # 15
        s + u1 + u2,  # 45
        s + u1 + u2 + u3,  # 55: everything, still within B = 60
        s + u3 + u4,  # 85 > 60: trimmed, oldest first, to 45 <= 0.75 x 60
        s + u3 + u4 + u5,  # 55: appends again
        s + u5 + u6,  # 85 > 60: trimmed to 45
        s + u5 + u6 + u7,  # 55
    ]
    assert [sum(map(sized, view)) for view in views] == [15, 45, 55, 45, 55, 45, 55]
    for view in views:
        check_provider_valid(view, "openai")


def test_per_request_trimmer_trims_on_every_request_that_needs_it() -> None:
    from amplifier_module_context_simple.cli import sliding_window_view, trimmed_views

    units, histories = growing_histories()
    s, u1, u2, u3, u4, u5, u6, u7 = units
    expected = [s + u1, s + u1 + u2, s + u2 + u3, s + u3 + u4, s + u4 + u5, s + u5 + u6]
    expected.append(s + u6 + u7)
    assert list(trimmed_views(histories, trigger=45, target=45, measure=sized)) == expected
    assert [sliding_window_view(h, 45, measure=sized) for h in histories] == expected


def test_trimmer_targets_are_checked() -> None:
    from amplifier_module_context_simple.cli import hysteresis_views, trimmed_views

    _, histories = growing_histories()
    with pytest.raises(ValueError, match="target <= trigger"):
        trimmed_views(histories, trigger=30, target=45, measure=sized)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        hysteresis_views(histories, 60, 1.5, measure=sized)


def test_dropped_messages_count_what_the_previous_view_sent_and_this_one_does_not() -> None:
    from amplifier_module_context_simple.cli import dropped_messages

    before = [("s", 5), ("x", 1), ("x", 1), ("y", 2)]
    assert dropped_messages(None, before) == 0
    assert dropped_messages(before, [*before, ("z", 3)]) == 0  # appended: not a trim
    assert dropped_messages(before, [("s", 5), ("x", 1), ("y", 2), ("z", 3)]) == 1
    assert dropped_messages(before, [("s", 5), ("z", 3)]) == 3


@pytest.mark.parametrize(("path", "dialect"), [(SAMPLE, "openai"), (REAL_ENTIRE_4, "anthropic")])
def test_hysteresis_views_of_a_replay_are_provider_valid_and_trim_to_the_fraction(
    path: Path, dialect: Dialect
) -> None:
    from amplifier_module_context_simple.cli import (
        hysteresis_views,
        parse_transcript,
        request_histories,
        sliding_window_view,
    )

    transcript = parse_transcript(path, path.read_bytes())
    histories = request_histories(transcript, ContextConfig())
    budget = 6_000
    views = list(hysteresis_views(histories, budget, 0.5))
    trims = 0
    for before, view in zip([[], *views], views, strict=False):
        check_provider_valid(view, dialect)
        newest_unit_only = view == sliding_window_view(view, 0)
        tokens = sum(map(estimate_message, view))
        if any(m not in view for m in before):  # a trim: down to 0.5 x budget
            trims += 1
            assert tokens <= budget // 2 or newest_unit_only
        else:  # everything since the last trim, within the budget
            assert view[: len(before)] == before
            assert tokens <= budget or newest_unit_only
    assert trims >= 2


def test_mean_and_max_view_tokens_are_the_views_of_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = small_session()
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m, ensure_ascii=False) for m in session])
    report, _ = run_json(capsys, str(path), "--sliding-window", "--hysteresis", "0.5")
    # No window: the fallback budget holds everything, so every view is the history so far.
    requests_at = [1, 3, 5, 6]
    views = [sum(map(estimate_message, session[:end])) for end in requests_at]
    for run in report["runs"]:
        totals = run["totals"]
        assert [r["view_tokens"] for r in run["requests"]] == views
        assert totals["mean_view_tokens"] == round(sum(views) / 4, 1)
        assert totals["max_view_tokens"] == views[-1]
        assert totals["trims"] == 0
        assert totals["trims_per_100_requests"] == 0
    assert [run["name"] for run in report["runs"]] == ["A", "sliding", "hyst-0.5"]


def test_reports_show_the_context_and_the_trims_of_every_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [str(REAL_ENTIRE_4), "--window", "16000", "--max-output", "2000"]
    options = ["--sliding-window", "--trimmer-fraction", "0.3", "--hysteresis", "0.5", "0.9"]
    assert main(["replay", *argv, *options, "--equal-context"]) == 0
    out = capsys.readouterr().out
    header = out.split("\nsummary\n")[1].splitlines()[0].split()
    names = ["A", "sliding", "trim-0.3", "hyst-0.5", "hyst-0.9", "equal"]
    assert header == names
    rows = summary_rows(out)
    for title in ("mean view tokens", "max view tokens", "trims", "trims per 100 requests"):
        assert len(rows[title]) == len(names)
    assert "trim: a request whose view leaves out a message" in out
    assert "hyst-0.5: hysteresis: sends all since its last trim; over budget 10,904" in out

    report, _ = run_json(capsys, *argv, *options, "--equal-context")
    runs = {run["name"]: run for run in report["runs"]}
    assert list(runs) == names
    for run in runs.values():
        requests = run["requests"]
        views = [r["view_tokens"] for r in requests]
        assert run["totals"]["mean_view_tokens"] == round(sum(views) / len(views), 1)
        assert run["totals"]["max_view_tokens"] == max(views)
        trims = sum(r["dropped_messages"] > 0 for r in requests)
        assert run["totals"]["trims"] == trims
    # The per-request trimmer trims whenever it drops a unit; with hysteresis at 0.5 far less.
    assert runs["hyst-0.5"]["totals"]["trims"] < runs["sliding"]["totals"]["trims"]
    assert max(r["view_tokens"] for r in runs["trim-0.3"]["requests"]) <= int(10_904 * 0.3)


@pytest.mark.parametrize("path", [SAMPLE, REAL_ENTIRE_4])
def test_equal_context_trimmer_keeps_the_module_s_mean_view(
    capsys: pytest.CaptureFixture[str], path: Path
) -> None:
    from amplifier_module_context_simple.cli import EQUAL_CONTEXT_TOLERANCE

    report, _ = run_json(
        capsys, str(path), "--window", "16000", "--max-output", "2000", "--equal-context"
    )
    module, equal = report["runs"]
    wanted = module["totals"]["mean_view_tokens"]
    got = equal["totals"]["mean_view_tokens"]
    assert abs(got - wanted) <= EQUAL_CONTEXT_TOLERANCE * wanted
    assert "NOT within" not in equal["baseline"]
    assert f"{got:,.1f} is closest to A's {wanted:,.1f}" in equal["baseline"]


def test_equal_context_target_is_the_closest_integer_target() -> None:
    from amplifier_module_context_simple.cli import equal_context_target, trimmed_views

    _, histories = growing_histories()

    def mean_at(target: int) -> float:
        views = trimmed_views(histories, trigger=target, target=target, measure=sized)
        return sum(sum(map(sized, view)) for view in views) / len(histories)

    for wanted in (20.0, 37.5, 41.0, 1_000.0):
        target, got = equal_context_target(histories, wanted, measure=sized)
        assert got == mean_at(target)
        best = min(abs(mean_at(t) - wanted) for t in range(400))
        assert abs(got - wanted) == best


def test_a_measure_counts_views_history_and_bill() -> None:
    from amplifier_module_context_simple.cli import (
        parse_transcript,
        replay,
        replay_hysteresis,
    )

    def one(message: Any) -> int:
        return 1

    path = REAL_ENTIRE_4
    transcript = parse_transcript(path, path.read_bytes())
    module = anyio.run(
        lambda: replay(transcript, ContextConfig(), None, name="A", overrides={}, measure=one)
    )
    hysteresis = replay_hysteresis(transcript, module, 0.5, name="hyst")
    for run in (module, hysteresis):
        for record in run.records:
            assert record.view_tokens == record.view_messages
            assert record.cache.total == record.view_messages
        assert run.totals()["input_tokens"] == sum(r.view_messages for r in run.records)
    assert hysteresis.records[-1].history_tokens == len(transcript.messages)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--hysteresis", "0"),
        ("--hysteresis", "1.5"),
        ("--hysteresis", "nan"),
        ("--hysteresis", "half"),
        ("--trimmer-fraction", "-0.2"),
        ("--trimmer-fraction", "inf"),
    ],
)
def test_bad_trimmer_fraction_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [json.dumps(m) for m in small_session()])
    assert main(["replay", str(path), option, value]) == 2
    captured = capsys.readouterr()
    assert f"argument {option}: expected a fraction in (0, 1], got {value!r}" in captured.err
    assert captured.out == ""
