"""amplifier-core's own conformance suites, run against this package.

The kernel's pytest plugin silently skips these unless it finds the module path; the
project sets ``--module-path`` in ``addopts`` and ``test_conformance_suites_ran`` fails the
run if any inherited test was skipped or did not run.
"""

from __future__ import annotations

from amplifier_core.validation.behavioral import ContextBehaviorTests
from amplifier_core.validation.structural import ContextStructuralTests


class TestContextSimpleBehavior(ContextBehaviorTests):
    pass


class TestContextSimpleStructural(ContextStructuralTests):
    pass
