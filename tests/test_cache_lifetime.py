"""The replay bill's cache lifetime: ``--times`` and ``--cache-ttl`` (cli/bill.py).

A request is made at the time of the message it comes before (the last one at the last
message's); one made more than the lifetime after the previous request finds the cache
cold and writes its whole view. Without times nothing expires and the bill is the one the
CLI gave before it had a lifetime.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple.cli import (
    FIVE_MINUTES,
    NO_EXPIRY,
    ONE_HOUR,
    CacheUse,
    Prices,
    Run,
    Transcript,
    baseline_run,
    build_config,
    expired_requests,
    main,
    parse_transcript,
    replay,
    request_histories,
    request_times,
    simulate_cache,
)
from amplifier_module_context_simple.context.counting.estimate import estimate_message

START = datetime.datetime(2026, 3, 9, 2, 10, tzinfo=datetime.UTC)


def session() -> list[dict[str, Any]]:
    """Eight messages, four of them assistant ones (lines 2, 4, 6, 8): five requests."""
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
        {"role": "assistant", "content": "Two files: a.py and b.py."},
        {"role": "user", "content": "what is in a.py? " + "please look closely " * 20},
        {"role": "assistant", "content": "A module. " * 30},
        {"role": "user", "content": "and b.py?"},
        {"role": "assistant", "content": "Another module."},
    ]


OFFSETS = (0, 10, 20, 310, 320, 611, 620, 4212)
"""Seconds after START of each line. Requests: 1 at line 2 (10 s), 2 at line 4 (310 s:
300 s later, not more than 5 minutes: warm), 3 at line 6 (611 s: 301 s later, cold at
5m, warm at 1h), 4 at line 8 (4212 s: 3601 s later, cold at both), 5 at the end (line 8's
time: 0 s later, warm)."""


def write_files(tmp_path: Path, offsets: tuple[int, ...] = OFFSETS) -> tuple[Path, Path]:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("".join(json.dumps(m) + "\n" for m in session()), encoding="utf-8")
    times = tmp_path / "t.times.json"
    stamps = [(START + datetime.timedelta(seconds=s)).isoformat() for s in offsets]
    times.write_text(json.dumps(stamps), encoding="utf-8")
    return transcript, times


def report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["replay", *argv, "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def figures(run: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(cache read, cache write, fresh) per request."""
    return [
        (r["cache_read_tokens"], r["cache_write_tokens"], r["fresh_tokens"])
        for r in run["requests"]
    ]


def tokens() -> list[int]:
    """t[i]: the estimate of message i (the views of this session are its histories)."""
    return [estimate_message(m) for m in session()]


# -- the model ----------------------------------------------------------------------------------


def test_cache_use_when_expired_writes_the_whole_view_and_keeps_the_shared_count() -> None:
    from amplifier_module_context_simple.cli import cache_use

    before = [("s", 100), ("a", 50)]
    now = [("s", 100), ("a", 50), ("b", 20), ("c", 5)]
    assert cache_use(before, now) == CacheUse(175, 150, 20, 5, 2)
    assert cache_use(before, now, expired=True) == CacheUse(175, 0, 170, 5, 2, expired=True)
    # an unchanged view, cold: written again but its last message, which is fresh
    assert cache_use(now, now, expired=True) == CacheUse(175, 0, 170, 5, 4, expired=True)


def test_expired_requests_follow_the_gap_to_the_previous_request() -> None:
    times = [0.0, 300.0, 601.0, 4202.0, 4202.0]
    assert expired_requests(times, FIVE_MINUTES) == [False, False, True, True, False]
    assert expired_requests(times, ONE_HOUR) == [False, False, False, True, False]
    assert expired_requests(times, NO_EXPIRY) == [False] * 5
    assert expired_requests(None, FIVE_MINUTES) == []
    with pytest.raises(ValueError, match="request 3 is earlier than request 2"):
        expired_requests([0.0, 5.0, 4.0])


def test_simulate_cache_with_times_hand_computed() -> None:
    views = [
        [("s", 100), ("a", 50)],
        [("s", 100), ("a", 50), ("b", 30)],  # 200 s later: warm
        [("s", 100), ("a", 50), ("b", 30), ("c", 20)],  # 400 s later: cold at 5m
    ]
    times = [0.0, 200.0, 600.0]
    five = simulate_cache(views, times=times, lifetime=FIVE_MINUTES)
    assert five == [
        CacheUse(150, 0, 100, 50, 0),
        CacheUse(180, 150, 0, 30, 2),
        CacheUse(200, 0, 180, 20, 3, expired=True),
    ]
    prices = Prices()
    bills = [prices.billed(u.fresh, u.cache_read, u.cache_write) for u in five]
    assert bills == [50 + 125.0, 30 + 15.0, 20 + 225.0]
    # none, and no times whatever the lifetime: today's model
    old = simulate_cache(views)
    assert simulate_cache(views, times=times, lifetime=NO_EXPIRY) == old
    assert simulate_cache(views, lifetime=ONE_HOUR) == old
    assert old[2] == CacheUse(200, 180, 0, 20, 3)
    with pytest.raises(ValueError, match="2 request times for 3 views"):
        simulate_cache(views, times=times[:2])


def test_prices_state_the_one_hour_write_and_pick_it_by_lifetime() -> None:
    assert Prices().write_price == 1.25
    assert Prices(lifetime=NO_EXPIRY).write_price == 1.25
    hour = Prices(lifetime=ONE_HOUR)
    assert (hour.cache_write, hour.cache_write_1h, hour.write_price) == (1.25, 2.0, 2.0)
    assert hour.billed(10, 100, 20) == 10 + 10.0 + 40.0
    assert Prices(1.0, 0.5, 2.0).billed(10, 100, 20) == 100.0  # positional, as before
    assert "cache write 2 (the 1h cache's; 5m: 1.25)" in hour.describe()
    assert Prices().describe().startswith("fresh 1, cache read 0.1, cache write 1.25 (x")


# -- the request times --------------------------------------------------------------------------


def test_request_times_are_the_times_of_the_messages_they_come_before(tmp_path: Path) -> None:
    path, _ = write_files(tmp_path)
    transcript = parse_transcript(path, path.read_bytes())
    stamps = [START + datetime.timedelta(seconds=s) for s in OFFSETS]
    base = START.timestamp()
    assert [t - base for t in request_times(transcript, stamps)] == [10, 310, 611, 4212, 4212]
    naive = [stamp.replace(tzinfo=None) for stamp in stamps]  # read as UTC
    assert request_times(transcript, naive) == request_times(transcript, stamps)
    with pytest.raises(ValueError, match="no timestamp for line 8 "):
        request_times(transcript, stamps[:7])
    backwards = [*stamps[:5], stamps[0], *stamps[6:]]
    with pytest.raises(ValueError, match="line 6 is earlier than that of line 4"):
        request_times(transcript, backwards)


# -- the CLI: hand-computed bills ---------------------------------------------------------------


def test_gaps_under_and_over_five_minutes_hand_computed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript, times = write_files(tmp_path)
    t = tokens()
    got = report(capsys, str(transcript), "--times", str(times))
    (run,) = got["runs"]
    assert [r["view_messages"] for r in run["requests"]] == [1, 3, 5, 7, 8]
    assert [r["cache_expired"] for r in run["requests"]] == [False, False, True, True, False]
    expected = [
        (0, 0, t[0]),  # the first request: its one message is fresh
        (t[0], t[1], t[2]),  # 300 s later: warm
        (0, sum(t[:4]), t[4]),  # 301 s later: cold, the whole view written
        (0, sum(t[:6]), t[6]),  # 3601 s later: cold
        (sum(t[:7]), 0, t[7]),  # at once: warm, read up to the new message
    ]
    assert figures(run) == expected
    fresh = t[0] + t[2] + t[4] + t[6] + t[7]
    read = t[0] + sum(t[:7])
    write = t[1] + sum(t[:4]) + sum(t[:6])
    totals = run["totals"]
    assert (totals["fresh_tokens"], totals["cache_read_tokens"]) == (fresh, read)
    assert totals["cache_write_tokens"] == write
    assert totals["billed_input"] == round(fresh + 0.1 * read + 1.25 * write, 1)
    assert totals["cache_expiries"] == 2
    assert totals["prefix_breaks"] == 0  # the views are append-only: no policy break
    assert got["prices"] == {"fresh": 1.0, "cache_read": 0.1, "cache_write": 1.25}
    assert got["cache_lifetime"]["name"] == "5m"
    assert got["cache_lifetime"]["seconds"] == 300.0
    assert got["cache_lifetime"]["times"] == str(times)


def test_one_hour_cache_hand_computed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transcript, times = write_files(tmp_path)
    t = tokens()
    got = report(capsys, str(transcript), "--times", str(times), "--cache-ttl", "1h")
    (run,) = got["runs"]
    assert [r["cache_expired"] for r in run["requests"]] == [False, False, False, True, False]
    expected = [
        (0, 0, t[0]),
        (t[0], t[1], t[2]),
        (sum(t[:3]), t[3], t[4]),  # 301 s later: warm in the 1-hour cache
        (0, sum(t[:6]), t[6]),  # 3601 s later: cold
        (sum(t[:7]), 0, t[7]),
    ]
    assert figures(run) == expected
    fresh = t[0] + t[2] + t[4] + t[6] + t[7]
    read = t[0] + sum(t[:3]) + sum(t[:7])
    write = t[1] + t[3] + sum(t[:6])
    assert run["totals"]["billed_input"] == round(fresh + 0.1 * read + 2.0 * write, 1)
    assert got["prices"] == {"fresh": 1.0, "cache_read": 0.1, "cache_write": 2.0}
    assert got["cache_lifetime"]["cache_write_5m"] == 1.25
    # the 1-hour write price is an option of its own
    cheap = report(
        capsys, str(transcript), "--times", str(times), "--cache-ttl", "1h",
        "--price-cache-write-1h", "1.5",
    )  # fmt: skip
    billed = cheap["runs"][0]["totals"]["billed_input"]
    assert billed == round(fresh + 0.1 * read + 1.5 * write, 1)


def test_none_and_no_times_are_the_old_bill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript, times = write_files(tmp_path)
    t = tokens()
    old = report(capsys, str(transcript))
    none = report(capsys, str(transcript), "--times", str(times), "--cache-ttl", "none")
    untimed_hour = report(capsys, str(transcript), "--cache-ttl", "1h")
    assert none["runs"] == old["runs"]
    assert old["runs"][0]["totals"]["cache_expiries"] == 0
    assert figures(old["runs"][0]) == [
        (0, 0, t[0]),
        (t[0], t[1], t[2]),
        (sum(t[:3]), t[3], t[4]),
        (sum(t[:5]), t[5], t[6]),
        (sum(t[:7]), 0, t[7]),
    ]
    # 1h without times: nothing expires, only the write price differs
    assert figures(untimed_hour["runs"][0]) == figures(old["runs"][0])
    before, hour = old["runs"][0]["totals"], untimed_hour["runs"][0]["totals"]
    gap = hour["billed_input"] - before["billed_input"]
    assert gap == pytest.approx(0.75 * before["cache_write_tokens"], abs=0.11)


def test_text_report_says_the_lifetime_and_counts_the_expiries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript, times = write_files(tmp_path)
    assert main(["replay", str(transcript), "--times", str(times)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^cache expiries +2$", out, re.MULTILINE)
    assert f"cache lifetime: 5m; request times from {times}: a request made more" in out
    assert "cache write 1.25 (x a fresh input token); cache lifetime 5m" in out
    assert main(["replay", str(transcript)]) == 0
    assert "cache lifetime: 5m; no request times (--times), so the cache never expires" in (
        capsys.readouterr().out
    )
    assert main(["replay", str(transcript), "--cache-ttl", "none"]) == 0
    assert "cache lifetime: none; the cache never expires" in capsys.readouterr().out


def test_baselines_find_the_cache_cold_on_the_same_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript, times = write_files(tmp_path)
    got = report(
        capsys, str(transcript), "--times", str(times), "--sliding-window", "--hysteresis", "0.5"
    )
    module, *baselines = got["runs"]
    expired = [r["cache_expired"] for r in module["requests"]]
    assert expired == [False, False, True, True, False]
    for run in baselines:
        assert [r["cache_expired"] for r in run["requests"]] == expired
        assert run["totals"]["cache_expiries"] == 2
    # the budget is large: every trimmer sends what the module sends, and bills the same
    assert all(figures(run) == figures(module) for run in baselines)


def test_a_baseline_against_a_timed_run_needs_as_many_requests(tmp_path: Path) -> None:
    path, _ = write_files(tmp_path)
    transcript = parse_transcript(path, path.read_bytes())
    config = build_config({}, "--set")
    times = [10.0, 20.0, 1000.0, 1010.0, 1010.0]

    async def timed() -> Run:
        return await replay(transcript, config, None, name="A", overrides={}, times=times)

    run = anyio.run(timed)
    histories = request_histories(transcript, config)
    same = baseline_run(run, histories, histories, name="copy", description="copy")
    assert [r.cache for r in same.records] == [r.cache for r in run.records]
    with pytest.raises(ValueError, match="4 histories for the 5 timed requests of A"):
        baseline_run(run, histories[:4], histories[:4], name="short", description="short")
    untimed = dataclasses.replace(run, records=[])
    assert baseline_run(untimed, histories[:4], histories[:4], name="x", description="x")


def test_replay_needs_one_time_per_request(tmp_path: Path) -> None:
    path, _ = write_files(tmp_path)
    transcript = parse_transcript(path, path.read_bytes())
    config = build_config({}, "--set")

    async def short() -> Run:
        return await replay(transcript, config, None, name="A", overrides={}, times=[1.0, 2.0])

    with pytest.raises(ValueError, match="2 request times for 5 requests"):
        anyio.run(short)


def test_on_request_sees_every_view_and_its_call_time(tmp_path: Path) -> None:
    from amplifier_module_context_simple.cli import ReplayedRequest

    path, _ = write_files(tmp_path)
    transcript = parse_transcript(path, path.read_bytes())
    seen: list[ReplayedRequest] = []

    async def observed() -> Run:
        return await replay(
            transcript, build_config({}, "--set"), None, name="A", overrides={},
            on_request=seen.append,
        )  # fmt: skip

    run = anyio.run(observed)
    assert [r.record for r in seen] == run.records
    assert [len(r.view) for r in seen] == [1, 3, 5, 7, 8]
    assert all(len(r.keyed) == len(r.view) and r.seconds >= 0 for r in seen)


# -- the CLI: bad times -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("not json", "not valid JSON"),
        ('{"a": 1}', "expected a JSON list of timestamps"),
        ('["2026-03-09T02:10:00Z", 5]', "entry 2 is not an ISO timestamp: 5"),
        ('["2026-03-09T02:10:00Z", "yesterday"]', "entry 2 is not an ISO timestamp"),
        ('["2026-03-09T02:10:00Z"]', "no timestamp for line 2 (1 timestamps)"),
    ],
)
def test_bad_times_file_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    transcript, times = write_files(tmp_path)
    if content is None:
        times.unlink()
    else:
        times.write_text(content, encoding="utf-8")
    assert main(["replay", str(transcript), "--times", str(times)]) == 1
    err = capsys.readouterr().err
    assert "--times" in err
    assert message in err


def test_times_going_back_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transcript, times = write_files(tmp_path, (0, 10, 20, 310, 320, 5, 620, 4212))
    assert main(["replay", str(transcript), "--times", str(times)]) == 1
    assert "line 6 is earlier than that of line 4" in capsys.readouterr().err


def test_bad_cache_ttl_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transcript, _ = write_files(tmp_path)
    assert main(["replay", str(transcript), "--cache-ttl", "10m"]) == 2
    assert "--cache-ttl" in capsys.readouterr().err


# -- the module's clock: its idle-aware rule sees the request times ------------------------------
#
# The history of tests/context/test_idle.py (a prompt and eight tool rounds: nine requests),
# at a budget B whose idle trigger (compact_threshold x idle_compact_at of the policy
# budget) the whole history just reaches while staying under the trigger: only the last
# request, made once every message is in, can compact, and only after an idle gap.


def idle_messages() -> list[dict[str, Any]]:
    from tests.context.test_idle import history

    return history()


def idle_budget(**config: Any) -> int:
    from tests.context.test_idle import budget_at, estimate, idle_fraction

    settings = build_config(config, "--set")
    estimated = anyio.run(estimate, idle_messages())
    return budget_at(estimated, idle_fraction(settings), settings)


def idle_times(gap: float) -> list[float]:
    """Nine requests 10 s apart, the last ``gap`` seconds after the one before."""
    times = [10.0 * i for i in range(8)]
    return [*times, times[-1] + gap]


def idle_replay(times: list[float] | None, **config: Any) -> Run:
    messages = idle_messages()
    transcript = Transcript(
        Path("idle.jsonl"), "line", [(n, m) for n, m in enumerate(messages, start=1)], []
    )
    budget = idle_budget()
    overrides = {"max_tokens": budget, "max_tokens_fallback": budget, **config}

    async def replayed() -> Run:
        return await replay(
            transcript,
            build_config(overrides, "--set"),
            None,
            name="A",
            overrides=overrides,
            times=times,
        )

    return anyio.run(replayed)


def compacted(run: Run) -> list[int]:
    """The numbers of the requests that compacted."""
    return [r.number for r in run.records if r.compaction is not None]


def test_replay_module_compacts_after_a_gap_over_the_lifetime() -> None:
    assert compacted(idle_replay(idle_times(301.0))) == [9]


def test_replay_module_does_not_compact_without_the_gap() -> None:
    assert compacted(idle_replay(idle_times(10.0))) == []


def test_replay_module_does_not_compact_after_a_gap_with_a_zero_cache_lifetime() -> None:
    assert compacted(idle_replay(idle_times(301.0), cache_lifetime=0)) == []


def test_replay_without_times_sees_no_gap() -> None:
    """Without times the module's clock is constant: no request is ever idle, whatever
    the wall time between the requests."""
    assert compacted(idle_replay(None)) == []


def write_idle_files(tmp_path: Path, gap: float) -> tuple[Path, Path]:
    """The idle history as a transcript, line n at 10 n s after START but the last line,
    ``gap`` s after the one before (the last request's time)."""
    messages = idle_messages()
    transcript = tmp_path / "idle.jsonl"
    transcript.write_text("".join(json.dumps(m) + "\n" for m in messages), encoding="utf-8")
    offsets = [10.0 * n for n in range(1, len(messages))]
    offsets.append(offsets[-1] + gap)
    times = tmp_path / "idle.times.json"
    stamps = [(START + datetime.timedelta(seconds=s)).isoformat() for s in offsets]
    times.write_text(json.dumps(stamps), encoding="utf-8")
    return transcript, times


def cli_compacted(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> list[int]:
    """The requests that compacted in a CLI replay of the idle history, with a gap of
    1,000 s (over 5 minutes, under an hour) before the last request."""
    transcript, times = write_idle_files(tmp_path, 1000.0)
    budget = idle_budget()
    got = report(
        capsys, str(transcript), "--times", str(times),
        "--set", f"max_tokens={budget}", f"max_tokens_fallback={budget}", *argv,
    )  # fmt: skip
    return [r["request"] for r in got["runs"][0]["requests"] if r["compacted"]]


def test_cli_module_lifetime_follows_the_five_minute_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli_compacted(capsys, tmp_path, "--cache-ttl", "5m") == [9]


def test_cli_module_lifetime_follows_the_one_hour_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli_compacted(capsys, tmp_path, "--cache-ttl", "1h") == []


def test_cli_cache_ttl_none_turns_the_module_rule_off(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli_compacted(capsys, tmp_path, "--cache-ttl", "none") == []


def test_cli_explicit_cache_lifetime_wins_over_the_cache_ttl(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ("--cache-ttl", "1h", "--set", "cache_lifetime=300")
    assert cli_compacted(capsys, tmp_path, *argv) == [9]


def test_cli_compare_can_set_its_own_cache_lifetime(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    transcript, times = write_idle_files(tmp_path, 1000.0)
    budget = idle_budget()
    got = report(
        capsys, str(transcript), "--times", str(times),
        "--set", f"max_tokens={budget}", f"max_tokens_fallback={budget}",
        "--compare", "cache_lifetime=0",
    )  # fmt: skip
    compactions = [[r["request"] for r in run["requests"] if r["compacted"]] for run in got["runs"]]
    assert compactions == [[9], []]
