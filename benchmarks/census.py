"""Which tracked objects a loaded session adds, by type: what to remove to make it lean.

    uv run --frozen python -m benchmarks.census [--messages 16000] [--top 25]

In this process: the history of ``--messages`` messages (``benchmarks.histories``) decoded
from its JSON (the caller's messages, as ``benchmarks.footprint`` holds them), the module's
one-off lazy state built first (``footprint.warm_up``). Then the objects the collector
tracks are taken as they are (every one kept alive, so no id is reused), a manager is
given the history (``set_messages``), and it serves one compacting request (half the
history's estimated tokens; the view dropped). After each step, with ``gc.collect()``
first, every tracked object not there before is counted by type: the objects the module
holds on to, per message, and the references they hold (``gc.get_referents``: what a
full collection follows from them). Each type's commonest *shape* says what they are: a tuple's or
list's length and its items' types, a dict's keys.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Final

from amplifier_module_context_simple import SimpleContextManager
from benchmarks import footprint, histories

MESSAGES: Final = 16_000
TOP: Final = 25


class Census:
    """The tracked objects that appear after it is taken (its own bookkeeping excepted)."""

    def __init__(self) -> None:
        gc.collect()
        self._before = gc.get_objects()  # kept alive: a freed object's id could be reused
        self._known = {id(o) for o in self._before}
        self._known.update((id(self._before), id(self._known), id(self.__dict__)))

    def ignore(self, *objects: object) -> None:
        """Leave ``objects`` (the census's own results) out of later counts."""
        self._known.update(map(id, objects))

    def new(self) -> list[object]:
        """Every tracked object not there when the census was taken."""
        gc.collect()
        objects = gc.get_objects()  # before the filter's own objects exist
        return [o for o in objects if id(o) not in self._known]

    @staticmethod
    def by_type(objects: Iterable[object]) -> Counter[str]:
        return Counter(type_name(o) for o in objects)


PACKAGE: Final = "amplifier_module_context_simple."


def type_name(o: object) -> str:
    """The type's qualified name, its module before it unless builtin (the package's
    own prefix dropped)."""
    kind = type(o)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}".removeprefix(PACKAGE)


def _types(items: Iterable[object], most: int) -> str:
    names = [type(x).__name__ for x in itertools.islice(items, most + 1)]
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def shape(o: object) -> str:
    """What an object is made of, briefly: a named tuple's fields and their values'
    types, a tuple's, list's or set's length and items' types, a dict's keys."""
    fields = getattr(type(o), "_fields", None)
    if isinstance(o, tuple) and fields:
        return " ".join(f"{f}:{type(v).__name__}" for f, v in zip(fields, o, strict=False))
    if isinstance(o, tuple | list | set | frozenset):
        return f"len {len(o)} ({_types(o, 4)})"
    if isinstance(o, dict):
        keys = sorted(map(str, o))
        return "keys " + ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
    return ""


def commonest_shapes(objects: Iterable[object], name: str, most: int = 3) -> str:
    """The ``most`` commonest shapes of the objects of type ``name``, with their shares."""
    shapes = Counter(shape(o) for o in objects if type_name(o) == name)
    total = shapes.total()
    return "; ".join(f"{s} [{c / total:.0%}]" for s, c in shapes.most_common(most) if s)


async def take(n: int) -> tuple[int, Counter[str], Counter[str], list[object]]:
    """``(messages, after set_messages, after the compacting request, the new objects)``."""
    text = json.dumps(histories.history(n))
    await footprint.warm_up(text)
    history = json.loads(text)
    budget = footprint.budget_of(history)
    census = Census()
    store = SimpleContextManager()
    await store.set_messages(history)
    admitted = census.by_type(census.new())
    census.ignore(admitted)
    await footprint.compact(store, budget)
    added = census.new()
    return len(history), admitted, census.by_type(added), added  # noqa: ASYNC910 - a benchmark


def report(
    n: int, admitted: Counter[str], loaded: Counter[str], added: list[object], top: int
) -> str:
    names = sorted(loaded.keys() | admitted.keys(), key=lambda k: (-loaded[k], k))
    width = max(len("type"), *(len(k) for k in names[:top]))
    refs = references_by_type(added)
    lines = [
        (
            f"tracked objects the module added to a {n:,}-message history, by type, and the "
            "references they hold (what a full collection follows)"
        ),
        (
            f"{'type':<{width}} | {'set_messages':>12} | {'+ request':>10} | {'per msg':>7} | "
            f"{'refs':>7} | commonest shape"
        ),
    ]
    lines += [
        f"{name:<{width}} | {admitted[name]:>12,} | {loaded[name]:>10,} | "
        f"{loaded[name] / n:>7.2f} | {refs[name]:>7,} | {commonest_shapes(added, name)}"
        for name in names[:top]
    ]
    rest = names[top:]
    if rest:
        lines.append(
            f"{f'({len(rest)} more types)':<{width}} | {sum(admitted[k] for k in rest):>12,} | "
            f"{sum(loaded[k] for k in rest):>10,} | {sum(loaded[k] for k in rest) / n:>7.2f} | "
            f"{sum(refs[k] for k in rest):>7,} |"
        )
    total, after_set = loaded.total(), admitted.total()
    lines.append(
        f"{'total':<{width}} | {after_set:>12,} | {total:>10,} | {total / n:>7.2f} | "
        f"{refs.total():>7,} | {refs.total() / n:.2f} references per message"
    )
    return "\n".join(lines)


def references_by_type(objects: Iterable[object]) -> Counter[str]:
    """The references (``gc.get_referents``) the objects of each type hold."""
    refs: Counter[str] = Counter()
    for o in objects:
        refs[type_name(o)] += len(gc.get_referents(o))
    return refs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.census")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--top", type=int, default=TOP)
    args = parser.parse_args(argv)
    n, admitted, loaded, added = asyncio.run(take(args.messages))
    print(report(n, admitted, loaded, added, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
