"""T8: the async store as a Hypothesis state machine, on asyncio and on trio (see
``machine.py``). The default tier runs the profile's examples with 25 steps each; the deep
tier runs 100 steps per example over 200 examples per backend (20,000 steps each): the
profile's 2,000 examples of 100 portal-driven steps would take hours, and step count is
what explores interleavings."""

from __future__ import annotations

from tests.conftest import DEEP
from tests.reliability.harness import hsettings
from tests.reliability.machine import StoreMachine, TrioStoreMachine

STEPS = {"max_examples": 200, "stateful_step_count": 100} if DEEP else {"stateful_step_count": 25}

StoreMachine.TestCase.settings = hsettings(**STEPS)
TrioStoreMachine.TestCase.settings = hsettings(**STEPS)

TestStoreOnAsyncio = StoreMachine.TestCase
TestStoreOnTrio = TrioStoreMachine.TestCase
