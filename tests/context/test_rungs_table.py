"""The rungs are one table (``context/ladder/rungs.py``), and the docs show that table.

docs/design.md section 4.1 is the table a reader sees; ``RUNGS`` is the one the code
reads. Each row of the one is a row of the other, and what follows from the table (the
rung count, the floor's number, rung names) follows from it.
"""

from __future__ import annotations

import re
from pathlib import Path

from amplifier_module_context_simple.context.ladder import ladder as ladder_module
from amplifier_module_context_simple.context.ladder.rungs import (
    ENVELOPES,
    FLOOR_NAME,
    FLOOR_RUNG,
    REMOVE,
    RUNG_COUNT,
    RUNGS,
    TRUNCATE,
    rung_name,
)
from amplifier_module_context_simple.context.policy import negotiable

DESIGN = Path(__file__).parents[2] / "docs" / "design.md"


def section(text: str, heading: str) -> str:
    """The body of the markdown section whose heading starts with ``heading``."""
    start = text.index(f"\n{heading}")
    following = re.search(r"\n#{2,3} ", text[start + 1 :])
    return text[start : start + 1 + following.start()] if following else text[start:]


def table_rows(text: str) -> list[list[str]]:
    """The cells of the markdown table in ``text`` (header and rule left out), stripped
    of their code quotes."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) > 2, "no table"
    return [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_docs_table_is_the_rungs_table() -> None:
    header = "| rung | name | what it reduces | share | what it protects |"
    body = section(DESIGN.read_text(), "### 4.1")
    assert header in body
    documented = table_rows(body[body.index(header) :])
    expected = [
        [str(rung.number), rung.name, rung.reduces, rung.share, rung.protects] for rung in RUNGS
    ]
    assert documented == expected


def test_the_ladder_docstring_points_at_the_table_instead_of_copying_it() -> None:
    doc = ladder_module.__doc__ or ""
    assert "rungs.RUNGS" in doc
    assert not any(rung.reduces in doc for rung in RUNGS)


def test_what_follows_from_the_table() -> None:
    assert RUNG_COUNT == len(RUNGS) == 8
    assert [rung.number for rung in RUNGS] == list(range(1, RUNG_COUNT + 1))
    assert FLOOR_RUNG == RUNG_COUNT + 1 == 9
    # the seam hands the negotiator the same numbers
    assert negotiable.FLOOR_RUNG == FLOOR_RUNG
    assert list(negotiable.Negotiable.rungs) == [rung.number for rung in RUNGS]
    assert [rung_name(n) for n in range(RUNG_COUNT + 2)] == [
        "",
        *(rung.name for rung in RUNGS),
        FLOOR_NAME,
    ]
    assert len({rung.name for rung in RUNGS} | {FLOOR_NAME}) == RUNG_COUNT + 1


def test_the_shares_the_code_reads() -> None:
    """The truncation waves' spans, the removal passes' windows and rung 8's boundary: the
    figures the ladder read from its own literals before the table."""
    spans = {rung.number: rung.results for rung in RUNGS if rung.action == TRUNCATE}
    assert spans == {1: (0.0, 0.25), 2: (0.25, 0.5), 4: (0.5, 0.75), 6: (0.0, 1.0)}
    windows = {rung.number: rung.recent for rung in RUNGS if rung.action == REMOVE}
    assert windows == {3: 1.0, 5: 0.6, 7: 0.3}
    (envelopes,) = (rung for rung in RUNGS if rung.action == ENVELOPES)
    assert envelopes.number == RUNG_COUNT
    assert envelopes.recent == min(windows.values()), "rung 8 drops stubs before the narrowest"
