"""The bill: prices, the simulated prompt cache, and the keys views are compared by.

A view is compared with the previous request's view as ``(message key, tokens)`` pairs
(``keyed_view``): the leading messages they share are read from the cache, the last
message is fresh and everything between is a cache write (``cache_use``), priced by
``Prices``. The same keys tell a trim: a request that no longer sends a message the
previous one sent (``dropped_messages``).
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..context.counting.estimate import estimate_message

__all__ = (
    "DEFAULT_PRICES",
    "CacheUse",
    "Measure",
    "Prices",
    "cache_use",
    "dropped_messages",
    "keyed_view",
    "message_key",
    "simulate_cache",
)


@dataclass(frozen=True, slots=True)
class Prices:
    """Price of one input token relative to a fresh one: fresh, cache read, cache write."""

    fresh: float = 1.0
    cache_read: float = 0.1
    cache_write: float = 1.25

    def billed(self, fresh: int, cache_read: int, cache_write: int) -> float:
        """The billed-input equivalent (in fresh-token units) of these figures."""
        return fresh * self.fresh + cache_read * self.cache_read + cache_write * self.cache_write

    def describe(self) -> str:
        return (
            f"fresh {self.fresh:g}, cache read {self.cache_read:g}, "
            f"cache write {self.cache_write:g} (x a fresh input token)"
        )


DEFAULT_PRICES: Final = Prices()


@dataclass(frozen=True, slots=True)
class CacheUse:
    """One request through the simulated prompt cache (all in view tokens).

    ``total == cache_read + cache_write + fresh``.
    """

    total: int
    cache_read: int
    cache_write: int
    fresh: int
    shared_messages: int
    """Leading messages shared with the previous request's view (read from the cache)."""


def cache_use(
    previous: Sequence[tuple[str, int]] | None, current: Sequence[tuple[str, int]]
) -> CacheUse:
    """The cache figures of a view, given the previous request's view.

    Views are ``(message key, tokens)`` pairs. The common prefix (compared message by
    message) is read from the cache; of the rest, the last message - the new input - is
    fresh and everything before it is written to the cache (the model of the demo's
    ``provider-window``, without its request framing).
    """
    shared = 0
    for before, now in zip(previous or (), current, strict=False):
        if before[0] != now[0]:
            break
        shared += 1
    tokens = [count for _, count in current]
    read = sum(tokens[:shared])
    fresh = tokens[-1] if shared < len(tokens) else 0
    write = sum(tokens[shared:-1]) if shared < len(tokens) else 0
    return CacheUse(sum(tokens), read, write, fresh, shared)


def simulate_cache(views: Sequence[Sequence[tuple[str, int]]]) -> list[CacheUse]:
    """``cache_use`` of each view against the one before it (the first has no cache)."""
    uses: list[CacheUse] = []
    previous: Sequence[tuple[str, int]] | None = None
    for view in views:
        uses.append(cache_use(previous, view))
        previous = view
    return uses


def message_key(message: Mapping[str, Any]) -> str:
    """A digest of what a provider sees of ``message`` (``metadata`` is not sent)."""
    visible = {k: v for k, v in message.items() if k != "metadata"}
    text = json.dumps(visible, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


Measure = Callable[[Mapping[str, Any]], int]
"""Counts one message's tokens: the module's ``estimate_message`` by default; a benchmark
passes an independent tokenizer's count instead (it must not mutate the message)."""


def keyed_view(
    view: Sequence[Mapping[str, Any]], measure: Measure = estimate_message
) -> list[tuple[str, int]]:
    """``view`` as the ``(message_key, tokens)`` pairs ``cache_use`` compares, each
    message's tokens counted by ``measure``."""
    return [(message_key(m), measure(m)) for m in view]


def dropped_messages(
    previous: Sequence[tuple[str, int]] | None, current: Sequence[tuple[str, int]]
) -> int:
    """How many messages of the previous keyed view the current one no longer sends.

    Messages are compared by ``message_key`` (what the provider sees), counted with
    multiplicity: a message sent twice before and once now counts one. A request with a
    positive count is a *trim*: it left out something it had sent. (A dropped message
    whose exact copy arrives in the same request is not seen; a rewritten one is.)
    """
    if previous is None:
        return 0
    before = collections.Counter(key for key, _ in previous)
    before.subtract(key for key, _ in current)
    return sum(count for count in before.values() if count > 0)
