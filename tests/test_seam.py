"""The seam between the store and the negotiation (docs/design.md section 5).

Three promises, each checked from outside the code it constrains:

- no runtime module reads or writes another object's underscore members (the parser
  finds every ``x._name`` whose ``x`` is not ``self`` or ``cls``);
- nothing on the store's public surface commits a negotiated request's decisions: the
  commit is handed out once, to the request's ``RequestTransaction``, and only
  ``negotiator/transaction.py`` claims it;
- the transaction's machine is not reachable from a public attribute of anything a
  caller is given.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import amplifier_module_context_simple as package
from amplifier_module_context_simple import (
    RequestTransaction,
    SimpleContextManager,
    TransactionStateError,
    TxnState,
)
from amplifier_module_context_simple.negotiator.transaction import _Machine
from tests.negotiator.orchestrator import conversation, counting, proportional

PACKAGE_DIR = Path(package.__file__).parent
RUNTIME = sorted(
    p for p in PACKAGE_DIR.rglob("*.py") if "testing" not in p.relative_to(PACKAGE_DIR).parts
)


def foreign_private_accesses(source: str) -> list[str]:
    """Every ``x._name`` in ``source`` whose ``x`` is not ``self`` or ``cls`` (dunders are
    Python's, not an object's private members)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_access_finder_sees_what_it_looks_for() -> None:
    """The finder is not blind: it reports another object's member and spares ``self``."""
    source = "def f(self, store):\n    self._mine = store._theirs\n    return cls._ok, a.b._c\n"
    assert foreign_private_accesses(source) == ["2: store._theirs", "3: a.b._c"]


def test_no_runtime_module_touches_another_objects_private_members() -> None:
    offenders = {
        str(path.relative_to(PACKAGE_DIR)): found
        for path in RUNTIME
        if (found := foreign_private_accesses(path.read_text()))
    }
    assert offenders == {}


def calls_of(name: str) -> set[str]:
    """The runtime modules (relative paths) that call or pass ``x.name`` for some ``x``."""
    users = set()
    for path in RUNTIME:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == name:
                users.add(str(path.relative_to(PACKAGE_DIR)))
    return users


def test_only_the_transaction_claims_the_commit() -> None:
    assert calls_of("claim_commit") == {"negotiator/transaction.py"}


def test_only_the_store_reaches_its_commit_primitive() -> None:
    """``ContextStore._commit`` is used by the store alone: at the ordinary path's commit
    boundary and in the link it hands a negotiated request (whose commit the transaction
    claims)."""
    assert calls_of("_commit") == {"context/store.py"}


def test_the_store_surface_has_no_way_to_a_negotiation() -> None:
    """No public name of the manager opens a negotiation or commits: the measured view is
    the one route, and it returns the transaction."""
    public = {name for name in dir(SimpleContextManager) if not name.startswith("_")}
    assert {n for n in public if "commit" in n or "negotiat" in n or "seam" in n} == set()


# -- on a real negotiation ------------------------------------------------------------------

CONFIG: dict[str, Any] = {"token_meter": "actual", "max_tokens": 10_000}
HISTORY = conversation(6, size=1200, rounds=1)


async def compacting_request() -> tuple[SimpleContextManager, dict[str, Any]]:
    store = SimpleContextManager(**CONFIG, protected_tool_results=1)
    await store.set_messages(HISTORY)
    result = await store.get_measured_request_view(
        provider=None, retain_contents=[], count_view=counting(proportional(1.0, limit=10_000))
    )
    return store, result


@pytest.mark.anyio
async def test_a_negotiated_request_commits_only_through_its_transaction() -> None:
    """The request returns with the store's decisions as they were; they change when, and
    only when, the returned transaction commits."""
    store, result = await compacting_request()
    transaction = result["transaction"]
    assert isinstance(transaction, RequestTransaction) and transaction.has_changes
    before = store.version
    assert store.last_compaction_stats is None
    assert await transaction.commit() is True
    assert store.version == (before[0], before[1] + 1)
    assert store.last_compaction_stats == transaction.stats


@pytest.mark.anyio
async def test_a_seam_hands_out_its_commit_once() -> None:
    """The transaction claimed the commit when it was created: a second claim raises and
    the store is unchanged."""
    store = SimpleContextManager(**CONFIG)
    await store.set_messages(HISTORY)
    seam = await store._open_negotiation(None, [])
    _Machine(seam)
    version = store.version
    with pytest.raises(TransactionStateError, match="can't claim the commit when state=CLAIMED"):
        seam.claim_commit()
    assert store.version == version


def public_reach(root: object, depth: int) -> list[object]:
    """Every object reachable from ``root`` through public attributes (and the values of
    dicts and lists), ``depth`` steps deep."""
    seen: dict[int, object] = {}
    frontier = [root]
    for _ in range(depth):
        following: list[object] = []
        for obj in frontier:
            if id(obj) in seen or isinstance(obj, str | int | float | bool | type(None)):
                continue
            seen[id(obj)] = obj
            if isinstance(obj, dict):
                following.extend(obj.values())
            elif isinstance(obj, list | tuple):
                following.extend(obj)
            else:
                for name in dir(obj):
                    if name.startswith("_"):
                        continue
                    value = getattr(obj, name, None)
                    if not callable(value):
                        following.append(value)
        frontier = following
    return list(seen.values())


@pytest.mark.anyio
async def test_the_machine_is_not_reachable_from_what_a_caller_holds() -> None:
    store, result = await compacting_request()
    reached = public_reach(result, 4) + public_reach(store, 3)
    assert [type(o).__name__ for o in reached if isinstance(o, _Machine)] == []
    assert result["transaction"].state is TxnState.READY
