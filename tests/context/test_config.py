"""Configuration: defaults, strict validation, and the two lenient exceptions (docs/configuration.md; docs/design.md section 12)."""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from typing import Any

import pytest

import amplifier_module_context_simple as module
from amplifier_module_context_simple import ContextConfig, SimpleContextManager
from amplifier_module_context_simple.context import config as config_module
from amplifier_module_context_simple.context.history.ingress import marker
from amplifier_module_context_simple.context.store import ContextStore

LOGGER = "amplifier_module_context_simple"

DEFAULTS = {
    "max_tokens": None,
    "max_tokens_fallback": 200_000,
    "compact_threshold": 0.92,
    "target_usage": 0.50,
    "protected_recent": 0.30,
    "protected_tool_results": 5,
    "truncate_chars": 250,
    "compaction_notice_enabled": True,
    "compaction_notice_token_reserve": 800,
    "compaction_notice_verbosity": "normal",
    "compaction_notice_min_level": 1,
    "output_reserve_fraction": 0.5,
    "token_meter": "estimate",
    "max_tool_result_bytes": 131_072,
}

# (key, invalid value): wrong types (bool where an int/number is expected included),
# fractions outside their range, negative counts, NaN and infinities.
INVALID = [
    ("max_tokens_fallback", 0),
    ("max_tokens_fallback", -1),
    ("max_tokens_fallback", True),
    ("max_tokens_fallback", "200000"),
    ("max_tokens_fallback", 1.5),
    ("max_tokens_fallback", None),
    ("compact_threshold", 0),
    ("compact_threshold", 0.0),
    ("compact_threshold", -0.1),
    ("compact_threshold", 1.01),
    ("compact_threshold", 2),
    ("compact_threshold", math.nan),
    ("compact_threshold", math.inf),
    ("compact_threshold", True),
    ("compact_threshold", "0.9"),
    ("compact_threshold", None),
    ("target_usage", 0),
    ("target_usage", -0.5),
    ("target_usage", 1.5),
    ("target_usage", math.nan),
    ("target_usage", False),
    ("protected_recent", -0.1),
    ("protected_recent", 1.1),
    ("protected_recent", math.nan),
    ("protected_recent", True),
    ("protected_recent", "0.3"),
    ("output_reserve_fraction", -0.25),
    ("output_reserve_fraction", 1.5),
    ("output_reserve_fraction", math.nan),
    ("output_reserve_fraction", -math.inf),
    ("output_reserve_fraction", True),
    ("protected_tool_results", -1),
    ("protected_tool_results", True),
    ("protected_tool_results", 2.0),
    ("protected_tool_results", "5"),
    ("truncate_chars", -1),
    ("truncate_chars", False),
    ("truncate_chars", 250.0),
    ("compaction_notice_token_reserve", -800),
    ("compaction_notice_token_reserve", True),
    ("compaction_notice_token_reserve", "800"),
    ("compaction_notice_min_level", -1),
    ("compaction_notice_min_level", True),
    ("compaction_notice_min_level", 1.0),
    ("compaction_notice_enabled", 1),
    ("compaction_notice_enabled", "true"),
    ("compaction_notice_enabled", None),
    ("compaction_notice_verbosity", "loud"),
    ("compaction_notice_verbosity", 3),
    ("compaction_notice_verbosity", None),
    ("max_tool_result_bytes", True),
    ("max_tool_result_bytes", 0),
    ("max_tool_result_bytes", -1),
    ("max_tool_result_bytes", None),
    ("max_tool_result_bytes", "131072"),
    ("max_tool_result_bytes", 131072.0),
    ("count_every_rung", 1),
    ("count_every_rung", "no"),
    ("estimate_margin", -0.01),
    ("estimate_margin", 0.51),
    ("estimate_margin", True),
    ("estimate_margin", float("nan")),
    ("estimate_margin", "0.06"),
    ("cache_lifetime", -1),
    ("cache_lifetime", float("inf")),
    ("cache_lifetime", "300"),
    ("cache_lifetime", None),
    ("idle_compact_at", 0),
    ("idle_compact_at", 1.2),
    ("idle_compact_at", False),
]

INVALID_MAX_TOKENS = [0, -1, -500_000, "500000", 1.5, True, False]


def _ids(case: tuple[str, object]) -> str:
    return f"{case[0]}={case[1]!r}"


def assert_names(error: pytest.ExceptionInfo[ValueError], key: str, value: object) -> None:
    message = str(error.value)
    assert key in message, message
    assert repr(value) in message, message


def test_defaults_on_the_manager() -> None:
    """Every configuration key has the documented default on a bare manager."""
    cm = SimpleContextManager()
    for key, default in DEFAULTS.items():
        assert getattr(cm, key) == default, key
    assert cm.count_every_rung is False
    assert cm.hooks is None


def test_defaults_on_the_config_object() -> None:
    """``ContextConfig()`` carries exactly the documented defaults (plus count_every_rung,
    learn_provider_limits, preserved_thinking and the count and cache keys)."""
    config = dataclasses.asdict(ContextConfig())
    assert config == {
        **DEFAULTS,
        "count_every_rung": False,
        "learn_provider_limits": True,
        "preserved_thinking": "auto",
        "estimate_margin": 0.06,
        "cache_lifetime": 300.0,
        "idle_compact_at": 0.8,
    }
    assert SimpleContextManager().config == ContextConfig()


def test_exported_constants() -> None:
    """The public constants keep their reference values."""
    assert module.DEFAULT_MAX_TOKENS_FALLBACK == 200_000
    assert module.DEFAULT_MAX_TOOL_RESULT_BYTES == 128 * 1024
    assert module.TOKEN_METER_ESTIMATE == "estimate"
    assert module.TOKEN_METER_ACTUAL == "actual"


def test_valid_non_default_values_are_kept() -> None:
    """Valid values at the edges of each range are accepted and stored unchanged."""
    values: dict[str, Any] = {
        "max_tokens": 1,
        "max_tokens_fallback": 1,
        "compact_threshold": 1.0,
        "target_usage": 1,
        "protected_recent": 1.0,
        "protected_tool_results": 0,
        "truncate_chars": 0,
        "compaction_notice_enabled": False,
        "compaction_notice_token_reserve": 0,
        "compaction_notice_verbosity": "minimal",
        "compaction_notice_min_level": 0,
        "output_reserve_fraction": 1.0,
        "token_meter": "actual",
        "max_tool_result_bytes": 205,
        "count_every_rung": True,
    }
    cm = SimpleContextManager(**values)
    for key, value in values.items():
        assert getattr(cm, key) == value, key


@pytest.mark.parametrize("verbosity", ["minimal", "normal", "verbose"])
def test_known_verbosities_are_accepted(verbosity: str) -> None:
    """Each known notice verbosity is accepted."""
    cm = SimpleContextManager(compaction_notice_verbosity=verbosity)
    assert cm.compaction_notice_verbosity == verbosity


@pytest.mark.parametrize("case", INVALID, ids=_ids)
def test_invalid_value_in_constructor_names_key_and_value(case: tuple[str, object]) -> None:
    """The constructor raises ValueError naming the key and the offending value."""
    key, value = case
    keywords: dict[str, Any] = {key: value}
    with pytest.raises(ValueError) as error:
        SimpleContextManager(**keywords)
    assert_names(error, key, value)


@pytest.mark.parametrize("case", INVALID, ids=_ids)
def test_invalid_value_in_from_mapping_names_key_and_value(case: tuple[str, object]) -> None:
    """A mount-style config dict with a bad value raises ValueError naming key and value."""
    key, value = case
    with pytest.raises(ValueError) as error:
        ContextConfig.from_mapping({key: value})
    assert_names(error, key, value)


@pytest.mark.parametrize("value", ["bogus", "", "ACTUAL", None, 1])
def test_unknown_token_meter_warns_and_falls_back(
    value: object, caplog: pytest.LogCaptureFixture
) -> None:
    """An unknown token_meter logs a warning and means "estimate"; it never raises."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cm = SimpleContextManager(token_meter=value)
    assert cm.token_meter == "estimate"
    assert any("unknown token_meter" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value", INVALID_MAX_TOKENS, ids=repr)
def test_invalid_max_tokens_warns_and_means_no_cap(
    value: object, caplog: pytest.LogCaptureFixture
) -> None:
    """An invalid max_tokens logs a warning naming the value and means "no cap"."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cm = SimpleContextManager(max_tokens=value)
    assert cm.max_tokens is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("max_tokens" in w and repr(value) in w for w in warnings), warnings


@pytest.mark.parametrize("value", INVALID_MAX_TOKENS, ids=repr)
def test_invalid_max_tokens_in_mapping_means_no_cap(value: object) -> None:
    """The mount path applies the same max_tokens leniency."""
    assert ContextConfig.from_mapping({"max_tokens": value}).max_tokens is None


@pytest.mark.parametrize("value", [1, 123_456, 200_000, 5_000_000])
def test_valid_max_tokens_pass(value: int, caplog: pytest.LogCaptureFixture) -> None:
    """A positive int max_tokens is kept as the cap, without a warning."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert SimpleContextManager(max_tokens=value).max_tokens == value
        assert module._validated_max_tokens(value) == value
    assert not caplog.records


def test_validated_max_tokens_none_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    """None means no cap and logs nothing."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert module._validated_max_tokens(None) is None
        assert SimpleContextManager(max_tokens=None).max_tokens is None
    assert not caplog.records


def test_min_tool_result_bytes_is_the_marker_length() -> None:
    """The minimum cap is the UTF-8 length of the marker for the largest possible count."""
    expected = len(marker(sys.maxsize).encode("utf-8"))
    assert expected == config_module.MIN_MAX_TOOL_RESULT_BYTES
    if sys.maxsize == 2**63 - 1:
        assert expected == 205


def test_tool_result_bytes_minimum_boundary() -> None:
    """The minimum is accepted; one byte less raises ValueError naming the key."""
    minimum = config_module.MIN_MAX_TOOL_RESULT_BYTES
    assert SimpleContextManager(max_tool_result_bytes=minimum).max_tool_result_bytes == minimum
    assert SimpleContextManager(max_tool_result_bytes=131_082).max_tool_result_bytes == 131_082
    with pytest.raises(ValueError, match="max_tool_result_bytes") as error:
        SimpleContextManager(max_tool_result_bytes=minimum - 1)
    assert str(minimum - 1) in str(error.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("compact_threshold", 2),
        ("compact_threshold", math.nan),
        ("target_usage", 0),
        ("protected_tool_results", -1),
        ("truncate_chars", True),
        ("max_tool_result_bytes", 10),
        ("compaction_notice_enabled", "yes"),
        ("max_tokens_fallback", 0),
    ],
)
def test_setting_an_attribute_later_revalidates(key: str, value: object) -> None:
    """Assigning an invalid value later raises ValueError naming it and changes nothing."""
    cm = SimpleContextManager()
    before = cm.config
    with pytest.raises(ValueError) as error:
        setattr(cm, key, value)
    assert_names(error, key, value)
    assert cm.config is before
    assert getattr(cm, key) == DEFAULTS[key]


def test_setting_a_valid_attribute_later_takes_effect() -> None:
    """A valid later assignment is stored and visible through the config object."""
    cm = SimpleContextManager()
    cm.compact_threshold = 0.99
    cm.max_tokens = 50_000
    assert cm.compact_threshold == 0.99
    assert cm.config.compact_threshold == 0.99
    assert cm.max_tokens == 50_000
    assert cm.config.max_tokens == 50_000


# A valid value other than the default, for every key.
OTHER_VALUES: dict[str, Any] = {
    "max_tokens": 50_000,
    "max_tokens_fallback": 100_000,
    "compact_threshold": 0.8,
    "target_usage": 0.4,
    "protected_recent": 0.2,
    "protected_tool_results": 3,
    "truncate_chars": 100,
    "compaction_notice_enabled": False,
    "compaction_notice_token_reserve": 400,
    "compaction_notice_verbosity": "verbose",
    "compaction_notice_min_level": 2,
    "output_reserve_fraction": 0.25,
    "token_meter": "actual",
    "max_tool_result_bytes": 4096,
    "count_every_rung": True,
    "learn_provider_limits": False,
    "preserved_thinking": False,
    "estimate_margin": 0.1,
    "cache_lifetime": 3600.0,
    "idle_compact_at": 0.7,
}


LENIENT: dict[str, Any] = {"max_tokens": None, "token_meter": "estimate"}


def test_every_configuration_key_is_an_attribute_of_the_manager() -> None:
    """Each key of ``CONFIG_KEYS`` (every ``ContextConfig`` field) is an attribute of the
    manager: it reads the config, a valid write replaces the config with the new value and
    an invalid one raises, changing nothing (``max_tokens`` and ``token_meter`` warn and
    fall back instead). The types the store declares for the type
    checker are ``ContextConfig``'s own."""
    assert tuple(f.name for f in dataclasses.fields(ContextConfig)) == config_module.CONFIG_KEYS
    assert set(OTHER_VALUES) == set(config_module.CONFIG_KEYS)
    declared = ContextStore.__annotations__
    assert declared == {f.name: f.type for f in dataclasses.fields(ContextConfig)}
    for key in config_module.CONFIG_KEYS:
        cm = SimpleContextManager()
        assert getattr(cm, key) == getattr(cm.config, key), key
        setattr(cm, key, OTHER_VALUES[key])
        assert getattr(cm, key) == getattr(cm.config, key) == OTHER_VALUES[key], key
        assert cm.config == dataclasses.replace(ContextConfig(), **{key: OTHER_VALUES[key]})
        before = cm.config
        if key in LENIENT:  # the two documented exceptions: a warning and the fallback
            setattr(cm, key, object())
            assert getattr(cm, key) == LENIENT[key], key
            continue
        with pytest.raises(ValueError, match=key):
            setattr(cm, key, object())
        assert cm.config is before, key


def test_config_object_is_immutable() -> None:
    """The validated config cannot be changed behind the manager's back."""
    config = SimpleContextManager().config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.compact_threshold = 0.1  # type: ignore[misc]  # frozen: the point of the test


def test_unknown_keys_warn_once_in_from_mapping(caplog: pytest.LogCaptureFixture) -> None:
    """Unknown keys produce exactly one warning listing all of them; known keys still apply."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        config = ContextConfig.from_mapping(
            {"compact_treshold": 0.5, "max_token": 10, "target_usage": 0.4}
        )
    assert config.target_usage == 0.4
    assert config.compact_threshold == 0.92
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "compact_treshold" in warnings[0]
    assert "max_token" in warnings[0]


def test_from_mapping_none_and_empty_are_defaults(caplog: pytest.LogCaptureFixture) -> None:
    """A missing or empty config means all defaults, silently."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ContextConfig.from_mapping(None) == ContextConfig()
        assert ContextConfig.from_mapping({}) == ContextConfig()
    assert not caplog.records


@pytest.mark.parametrize("raw", [["max_tokens", 1], "max_tokens=1", 42])
def test_from_mapping_rejects_a_non_mapping(raw: object) -> None:
    """A config that is not a mapping is rejected with a TypeError naming its type."""
    with pytest.raises(TypeError, match="mapping"):
        ContextConfig.from_mapping(raw)  # type: ignore[arg-type]  # deliberately no mapping


def test_from_config_builds_a_manager_with_hooks() -> None:
    """``SimpleContextManager.from_config`` applies the mapping and keeps the hooks object."""
    hooks = object()
    cm = SimpleContextManager.from_config(
        {"truncate_chars": 40, "token_meter": "bogus"}, hooks=hooks
    )
    assert cm.truncate_chars == 40
    assert cm.token_meter == "estimate"
    assert cm.hooks is hooks
