"""Which thinking rule a request's model follows: what the provider reports, or the config.

Two questions decide how a view treats the ``thinking`` / ``redacted_thinking`` blocks of
earlier assistant turns (docs/thinking.md):

- **preserved**: the model checks the prefix of every thinking block a request sends back
  (it must be exactly what the request that produced the block sent). Then a compaction
  leaves out the thinking after the first position it changes, in the view only. Claude
  Fable 5.1 and later, Mythos 5.x, and Opus, Sonnet and Haiku 5.5 and later.
- **keeps_prior**: earlier turns' thinking counts toward the input. Opus 4.5+, Sonnet
  4.6+ and every preserved-thinking model keep it; Sonnet 4.5 and earlier, Opus 4.1 and
  earlier and Haiku through 4.5 drop the thinking of turns before the latest human prompt
  (the current tool-use loop's thinking counts on every model).

The config key ``preserved_thinking`` forces the first answer (``true``/``false``); the
default, ``"auto"``, reads the provider: a ``preserved_thinking`` capability in
``get_model_info()``, else the model id (``get_model_info().id``, else
``get_info().defaults["model"]``). A model we cannot place is treated as preserved and
keeping prior thinking: leaving out thinking after a change is valid on every model with a
prefix check and costs the others only the thinking of the turns after it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..history.history import History
from ..ladder.forms import unthought

__all__ = (
    "DEFAULT_RULE",
    "PRESERVED_THINKING_CHOICES",
    "PriorThinking",
    "Ranges",
    "ThinkingRule",
    "covers",
    "model_id",
    "model_rule",
    "thinking_rule",
    "with_range",
)

logger = logging.getLogger(__name__)

PRESERVED_THINKING_CHOICES: Final = ("auto", True, False)
"""The values of the ``preserved_thinking`` config key."""

_CLAUDE: Final = re.compile(
    r"(?:^|[^a-z])(?P<family>opus|sonnet|haiku|fable|mythos)[-_ .]?(?P<major>\d+)"
    r"(?:[-_.](?P<minor>\d{1,2})(?!\d))?"
)
_CLAUDE_OLD: Final = re.compile(
    r"claude-(?P<major>\d)(?:[-.](?P<minor>\d))?-(?P<family>opus|sonnet|haiku)"
)
_OTHER: Final = re.compile(r"^(?:gpt|o\d|gemini|llama|mistral|qwen|deepseek|grok|command)")

# (family -> the first version with a prefix check, the first that keeps prior thinking)
_FAMILIES: Final[dict[str, tuple[tuple[int, int], tuple[int, int]]]] = {
    "fable": ((5, 1), (0, 0)),
    "mythos": ((5, 1), (0, 0)),
    "opus": ((5, 5), (4, 5)),
    "sonnet": ((5, 5), (4, 6)),
    "haiku": ((5, 5), (5, 0)),
}


Ranges = tuple[tuple[int, int], ...]
"""Seq ranges ``[lo, hi)``, sorted and disjoint: the messages a view shows without their
thinking because a change before them that no compaction of theirs made invalidated it."""


def with_range(ranges: Ranges, lo: int, hi: int) -> Ranges:
    """``ranges`` with ``[lo, hi)`` added (merged with what it overlaps or touches)."""
    if lo >= hi:
        return ranges
    merged: list[tuple[int, int]] = []
    for start, end in sorted([*ranges, (lo, hi)]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def covers(ranges: Ranges, seq: int) -> bool:
    """Whether ``seq`` is in one of ``ranges`` (a handful: a linear look)."""
    return any(lo <= seq < hi for lo, hi in ranges)


@dataclass(frozen=True, slots=True)
class ThinkingRule:
    """The thinking rule of one request's model, and where it was read."""

    preserved: bool
    keeps_prior: bool
    source: str
    """``config``, ``provider_capabilities``, ``model_id`` or ``default``."""
    model: str | None = None


DEFAULT_RULE: Final = ThinkingRule(preserved=True, keeps_prior=True, source="default")


def model_rule(model: str) -> ThinkingRule | None:
    """The rule of a model id we can place, or None."""
    name = model.strip().lower()
    if _OTHER.match(name):
        return ThinkingRule(False, True, "model_id", model)
    match = _CLAUDE_OLD.search(name) or _CLAUDE.search(name)
    if match is None:
        return None
    version = (int(match["major"]), int(match["minor"] or 0))
    preserved_from, keeps_from = _FAMILIES[match["family"]]
    preserved = version >= preserved_from
    return ThinkingRule(preserved, preserved or version >= keeps_from, "model_id", model)


def thinking_rule(setting: object, provider: Any, model: str | None = None) -> ThinkingRule:
    """The rule for a request to ``provider`` under the ``preserved_thinking`` setting.
    ``model``: the provider's ``model_id``, when the caller has read it already.

    A provider that raises, or reports junk, is read as reporting nothing.
    """
    if setting is True or setting is False:
        return ThinkingRule(setting, True, "config")
    if provider is None:
        return DEFAULT_RULE
    try:
        get_model_info = getattr(provider, "get_model_info", None)
        info = get_model_info() if callable(get_model_info) else None
        capabilities = getattr(info, "capabilities", None) if info is not None else None
        if (
            isinstance(capabilities, (list, tuple, set, frozenset))
            and "preserved_thinking" in capabilities
        ):
            return ThinkingRule(True, True, "provider_capabilities", _text(info, "id"))
    except Exception:  # a provider bug must not break the request; fall through
        logger.debug("context-simple: provider.get_model_info() failed", exc_info=True)
    if model is None:
        model = model_id(provider)
    if model is not None:
        rule = model_rule(model)
        if rule is not None:
            return rule
    return DEFAULT_RULE


def model_id(provider: Any) -> str | None:
    """The model ``provider`` reports (``get_model_info().id``, else
    ``get_info().defaults["model"]``), or None. A provider that raises reports nothing."""
    if provider is None:
        return None
    model: object = None
    try:
        get_model_info = getattr(provider, "get_model_info", None)
        info = get_model_info() if callable(get_model_info) else None
        model = getattr(info, "id", None) if info is not None else None
    except Exception:  # a provider bug must not break the request
        logger.debug("context-simple: provider.get_model_info() failed", exc_info=True)
    if not isinstance(model, str):
        try:
            get_info = getattr(provider, "get_info", None)
            defaults = getattr(get_info(), "defaults", None) if callable(get_info) else None
            model = defaults.get("model") if isinstance(defaults, Mapping) else None
        except Exception:
            logger.debug("context-simple: provider.get_info() failed", exc_info=True)
    return model if isinstance(model, str) and model else None


def _text(value: object, name: str) -> str | None:
    found = getattr(value, name, None)
    return found if isinstance(found, str) else None


class PriorThinking:
    """The estimate of each admitted message's thinking blocks, for models that drop the
    thinking of turns before the latest human prompt (``keeps_prior`` False): what a view's
    estimate leaves out. Filled as requests see new messages (a sparse dict of ints, one
    entry per message with thinking); ``reset`` with the history."""

    __slots__ = ("_history", "_scanned", "_tokens")

    def __init__(self) -> None:
        self._history: History | None = None
        self._scanned = 0
        self._tokens: dict[int, int] = {}

    def reset(self) -> None:
        self._history, self._scanned, self._tokens = None, 0, {}

    def uncounted(self, history: History, length: int) -> dict[int, int]:
        """Seq -> thinking estimate of the messages before the latest human prompt of the
        first ``length`` entries of ``history``."""
        if history is not self._history:
            self.reset()
            self._history = history
        publics = history.entries.public
        for seq in range(self._scanned, length):
            public = publics[seq]
            made = None if public is None else unthought(public)
            if made is not None:
                self._tokens[seq] = max(0, made[2])
        self._scanned = max(self._scanned, length)
        last = history.last_human
        if last is None:
            return {}
        return {seq: tokens for seq, tokens in self._tokens.items() if seq < min(last, length)}
