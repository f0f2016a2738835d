"""Fixtures for the example modules' tests.

The examples drive a real ``AmplifierSession`` (a Rust kernel bound to asyncio), so their
async tests run on anyio's asyncio backend only. ``examples/`` goes on ``sys.path`` for
``conversation``; the two example packages are installed (editable) by the ``demo``
dependency group, and their directories are added too so the tests also run without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
for _path in (EXAMPLES, EXAMPLES / "provider-window", EXAMPLES / "loop-negotiating"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))


@pytest.fixture
def anyio_backend() -> str:
    """asyncio only: the kernel's session runs on asyncio."""
    return "asyncio"
