"""T8: the async store as a Hypothesis state machine, on asyncio and on trio (see
``machine.py``). The default tier runs the profile's examples with 25 steps each; the deep
tier runs the deep profile (100 steps per example)."""

from __future__ import annotations

from tests.conftest import DEEP
from tests.reliability.harness import hsettings
from tests.reliability.machine import StoreMachine, TrioStoreMachine

STEPS = {} if DEEP else {"stateful_step_count": 25}

StoreMachine.TestCase.settings = hsettings(**STEPS)
TrioStoreMachine.TestCase.settings = hsettings(**STEPS)

TestStoreOnAsyncio = StoreMachine.TestCase
TestStoreOnTrio = TrioStoreMachine.TestCase
