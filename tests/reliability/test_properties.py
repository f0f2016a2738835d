"""Property tests over generated and corrupted histories (docs/design.md sections 3.1 and 10).

T9: histories in all three tool formats, mixed within one history (parallel calls, results
in any order and split across messages, machine messages between results, envelopes,
developer messages, a pending tail), admitted with ``set_messages`` or ``add_message``,
then ordinary, retaining/hard-fit and measured requests at several pressures. Every view
meets the view invariants (``testing.check_view_invariants``: pairing by id, protected
content, order, no invention, canonical unchanged, isolation, JSON); a request that fails
closed leaves the store exactly as it was; the same inputs give the same views.

T10: a valid history with one corruption (drop, duplicate, swap, replace with junk, insert
junk, bad role), loaded with ``set_messages`` or message by message with ``add_message``:
either a clear ``ValueError``/``TypeError`` with the store unchanged, or views that meet the
invariants - never ``AttributeError``/``KeyError``/``IndexError`` or any other error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.harness import EXAMPLES, hsettings
from tests.reliability.scenarios import cases, configs, corrupted_scenario, scenario
from tests.reliability.strategies import BODIES, History, corrupted, histories


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@hsettings()
@given(case=cases())
async def test_views_of_valid_histories_meet_the_invariants(
    case: dict[str, Any], anyio_backend: str
) -> None:
    """T9: every view of a valid mixed-format history meets the invariants; determinism."""
    EXAMPLES["T9 valid histories"] += 1
    first = await scenario(case)
    if not case["via_add"]:  # add_message stamps times, so compare set_messages runs only
        assert await scenario(case) == first, "same inputs, different views"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@hsettings()
@given(
    data=corrupted(),
    via_add=st.booleans(),
    config=configs,
    fraction=st.floats(0.02, 1.2),
    retain=st.lists(st.sampled_from(BODIES), max_size=1),
)
async def test_corrupted_histories_give_valid_views_or_clear_errors(
    data: tuple[History, str, list[Any]],
    via_add: bool,
    config: dict[str, Any],
    fraction: float,
    retain: list[str],
    anyio_backend: str,
) -> None:
    """T10: corrupted/junk histories -> ValueError/TypeError (store unchanged) or valid views."""
    EXAMPLES["T10 corrupted histories"] += 1
    await corrupted_scenario(data, via_add, config, fraction, retain)


@pytest.mark.deep
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
@hsettings()
@given(case=cases(histories(max_turns=10)))
async def test_views_of_long_histories_on_trio(case: dict[str, Any], anyio_backend: str) -> None:
    """Deep tier: T9 over longer histories, on the trio backend."""
    EXAMPLES["T9 long histories (trio, deep)"] += 1
    await scenario(case)
