"""The long-session benchmark's own plumbing (``benchmarks.long``), on the first messages
of the long sessions at small budgets: every run gives a row, a configuration key the
module rejects gives a "rejected" row and a failed target instead of an exception, the
trimmer is billed on the module's requests, and the targets judge the figures."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import long

BUDGETS = (4_000, 8_000)


@pytest.fixture(scope="module")
def result() -> long.Result:
    pytest.importorskip("toktok")  # the independent counter
    found = [
        dataclasses.replace(s, messages=s.messages[:60], stamps=s.stamps[:60])
        for s in long.sessions()
    ]
    runs = [("module", {}), ("module, unknown", {"no_such_key": True})]
    return long.run(runs, found, budgets=BUDGETS, repeats=1)


def test_every_case_has_its_runs(result: long.Result) -> None:
    cases = {(r.session, r.budget) for r in result.rows}
    assert len(cases) == 2 * len(BUDGETS)
    for session, budget in cases:
        names = [r.run for r in result.rows if (r.session, r.budget) == (session, budget)]
        assert names == ["module", "module, unknown", long.TRIMMER]
    module = [r for r in result.rows if r.run == "module"]
    trimmer = [r for r in result.rows if r.run == long.TRIMMER]
    for mine, trimmed in zip(module, trimmer, strict=True):
        assert mine.requests == trimmed.requests > 0
        assert mine.latency_ms is not None and trimmed.latency_ms is None
        assert mine.cold == trimmed.cold  # the same request times
        assert mine.bill_5m >= mine.bill_none > 0
        assert mine.max_ratio > 0 and mine.mean_messages > 0


def test_a_rejected_key_is_reported_not_raised(result: long.Result) -> None:
    rejected = [r for r in result.rows if r.run == "module, unknown"]
    assert all(r.rejected and "no_such_key" in r.rejected for r in rejected)
    table = long.rows(result)
    assert all(row[1] == "rejected" for row in table if "unknown" in row[0])
    assert all(len(row) == len(long.HEADER) for row in table)
    verdicts = {name: ok for name, _, _, ok in long.targets(result)}
    assert verdicts["long, module, unknown: replayed"] is False
    assert any("no_such_key" in note for note in long.notes(result))


def test_targets_judge_views_over_the_budget(result: long.Result) -> None:
    module = [r for r in result.rows if r.run == "module"]
    over = dataclasses.replace(module[0], over=3, over_single=1, max_ratio=1.2)
    judged = long.Result(result.budgets, [over, *module[1:]], [], [])
    verdicts = {name: (measured, ok) for name, measured, _, ok in long.targets(judged)}
    measured, ok = verdicts["long, module: views over B (o200k) but one message alone"]
    assert not ok
    assert measured.startswith("2 of ")
    assert "max 1.200 x B" in measured


def test_resume_rows_give_every_budget(result: long.Result) -> None:
    header = long.resume_header(result)
    assert len(header) == 2 + len(BUDGETS)
    for row in long.resume_rows(result):
        assert len(row) == len(header)
        assert all(cell.endswith("x") for cell in row[2:])


def test_runs_from_the_command_line() -> None:
    runs = long._parse_runs(["--run", "module, idle 0.7", "idle_compact_at=0.7", "x=true"])
    assert runs == [*long.MODULE_RUNS, ("module, idle 0.7", {"idle_compact_at": 0.7, "x": True})]
    assert long._parse_runs([]) == list(long.MODULE_RUNS)
    with pytest.raises(SystemExit):
        long._parse_runs(["--run", "bad", "novalue"])


def test_a_cheaper_trimmer_keeping_more_is_marked_and_fails(result: long.Result) -> None:
    rows = list(result.rows)
    index = next(i for i, r in enumerate(rows) if r.run == long.TRIMMER)
    module = next(r for r in rows if r.run == "module" and r.budget == rows[index].budget)
    rows[index] = dataclasses.replace(
        rows[index], bill_5m=module.bill_5m - 1, mean_context=module.mean_context + 1
    )
    judged = long.Result(result.budgets, rows, result.resumes, [])
    assert long.rows(judged)[index][0].endswith(f"{long.TRIMMER} *")
    verdicts = {name: (measured, ok) for name, measured, _, ok in long.targets(judged)}
    measured, ok = verdicts[f"long, module: cases {long.TRIMMER} is cheaper (5m) AND keeps more"]
    assert not ok
    assert measured.endswith(f" of {2 * len(BUDGETS)}")
    assert int(measured.split()[0]) >= 1
