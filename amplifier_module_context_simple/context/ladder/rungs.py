"""The rungs of the ladder, as one table: what each reduces, which share, what it protects.

``RUNGS`` is the one place a rung is defined. The ladder (``ladder.py``) dispatches on a
rung's ``action`` and reads its ``results`` span or its ``recent`` share from here; how
many rungs there are (``RUNG_COUNT``) and the number an error gives the floor reduction
past them (``FLOOR_RUNG``) follow from it. docs/design.md section 4.1 shows the same table
(``tests/context/test_rungs_table.py`` checks that the two agree); the human-readable
outputs (the replay report, the demo) name a level with ``rung_name``.

What every rung leaves alone, whatever its row says: system messages, request-protected
messages, loaded-tool state, the last ``protected_tool_results`` results and their whole
tool groups, and groups with a call still pending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = (
    "ENVELOPES",
    "FLOOR_NAME",
    "FLOOR_RUNG",
    "REMOVE",
    "RUNGS",
    "RUNG_COUNT",
    "TRUNCATE",
    "Action",
    "Rung",
    "rung_name",
)

Action = Literal["truncate", "remove", "envelopes"]
"""What a rung does to the working view."""

TRUNCATE: Final = "truncate"
"""Truncate the unprotected tool results of a span of the result positions."""
REMOVE: Final = "remove"
"""A removal pass outside a recent window, then stub the user turns outside it."""
ENVELOPES: Final = "envelopes"
"""Stub the machine-written user turns, then drop old stubs."""


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung: its number, a short name, what it does and to which share of the view."""

    number: int
    name: str
    """A short name for reports (``rung_name``)."""
    action: Action
    reduces: str
    """What it reduces, in words (the docs' table)."""
    protects: str
    """What it leaves alone besides what every rung does (the module docstring)."""
    results: tuple[float, float] = (0.0, 0.0)
    """``TRUNCATE``: the span of the result positions it may truncate (fractions of the
    results, as they are when the rung is first applied)."""
    recent: float = 0.0
    """``REMOVE``: the share of ``protected_recent`` its window keeps (the most recent
    messages); ``ENVELOPES``: the share before whose window it drops stubs."""

    @property
    def share(self) -> str:
        """The share it works on, in words (the docs' table)."""
        if self.action == TRUNCATE:
            lo, hi = self.results
            return f"results {lo:.0%} to {hi:.0%}"
        return f"protected_recent * {self.recent}"


_WAVE: Final = "the last protected_tool_results results"
_PASS: Final = "removal pass, then stub the user turns outside the window"
_WINDOW: Final = (
    "the window (the most recent messages), the first and latest human prompts; user turns "
    "are stubbed, never removed, and a group holding one stays"
)

RUNGS: Final = (
    Rung(
        1,
        "truncate-q1",
        TRUNCATE,
        reduces="truncate the oldest quarter of tool results",
        protects=_WAVE,
        results=(0.0, 0.25),
    ),
    Rung(
        2,
        "truncate-q2",
        TRUNCATE,
        reduces="truncate the second quarter",
        protects=_WAVE,
        results=(0.25, 0.50),
    ),
    Rung(3, "remove-wide", REMOVE, reduces=_PASS, protects=_WINDOW, recent=1.0),
    Rung(
        4,
        "truncate-q3",
        TRUNCATE,
        reduces="truncate the third quarter (positions recomputed on the shrunk view)",
        protects=_WAVE,
        results=(0.50, 0.75),
    ),
    Rung(5, "remove-middle", REMOVE, reduces=_PASS, protects=_WINDOW, recent=0.6),
    Rung(
        6,
        "truncate-all",
        TRUNCATE,
        reduces="truncate every unprotected tool result",
        protects=_WAVE,
        results=(0.0, 1.0),
    ),
    Rung(7, "remove-narrow", REMOVE, reduces=_PASS, protects=_WINDOW, recent=0.3),
    Rung(
        8,
        "stub-envelopes",
        ENVELOPES,
        reduces="stub machine-written user envelopes, then drop the stubs before the window",
        protects="human prompts, the last user turn, the stubs inside the window",
        recent=0.3,
    ),
)
"""The rungs in the order the ordinary path climbs them; ``RUNGS[n - 1]`` is rung ``n``."""

assert all(rung.number == number for number, rung in enumerate(RUNGS, 1))

RUNG_COUNT: Final = len(RUNGS)

FLOOR_RUNG: Final = RUNG_COUNT + 1
"""The ``rung`` an error reports once the protected floor itself was reduced (past the
rungs: ``Ladder.reducing_floor``, docs/design.md section 4.4)."""

FLOOR_NAME: Final = "reduce-floor"


def rung_name(number: int) -> str:
    """The short name of rung ``number`` (``FLOOR_RUNG``: the floor reduction); ``""`` for
    a number that names no rung (level 0: nothing was reduced)."""
    if number == FLOOR_RUNG:
        return FLOOR_NAME
    if 1 <= number <= RUNG_COUNT:
        return RUNGS[number - 1].name
    return ""
