"""``python -m amplifier_module_context_simple.cli``: the console script's ``main``."""

from __future__ import annotations

from .command import main

raise SystemExit(main())
