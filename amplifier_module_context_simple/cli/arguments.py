"""The command line's arguments: the parser (``build_parser``), the ``--set KEY=VALUE``
assignments (``parse_assignment``) and the configuration they build (``build_config``)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ..context.config import CONFIG_KEYS, ContextConfig
from .bill import CACHE_LIFETIMES, DEFAULT_PRICES
from .exits import EXIT_USAGE, PROG, CliError

__all__ = ("CONFIG_KEYS", "build_config", "build_parser", "parse_assignment")


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)``; the value is JSON when it parses, else the string.

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty key.
    """
    key, sep, raw = (part.strip() for part in text.partition("="))
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE, got {text!r} (a TRANSCRIPT after --set/--compare needs "
            "a -- before it)"
        )
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def build_config(overrides: dict[str, Any], option: str) -> ContextConfig:
    """The validated configuration for ``overrides`` (strict: no lenient fallbacks).

    Raises:
        CliError: (exit 2) an unknown key, or the module's ``ValueError`` for a value.
    """
    unknown = sorted(set(overrides) - set(CONFIG_KEYS))
    if unknown:
        raise CliError(
            f"{option}: unknown configuration key {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(CONFIG_KEYS)})",
            EXIT_USAGE,
        )
    try:
        return ContextConfig(**overrides)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}", EXIT_USAGE) from exc


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``amplifier-context-simple`` parser and its one command, ``replay``."""
    parser = argparse.ArgumentParser(prog=PROG, description="Tools for context-simple.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay_cmd = commands.add_parser(
        "replay",
        help="replay a transcript and report the compaction cadence",
        description="Replay a transcript request by request and report when compaction fires.",
    )
    _add_configurations(replay_cmd)
    _add_baselines(replay_cmd)
    _add_prices(replay_cmd)
    _add_cache(replay_cmd)
    _add_outputs(replay_cmd)
    return parser


def _add_configurations(replay_cmd: argparse.ArgumentParser) -> None:
    """The transcript, the configurations replayed (``--set``, ``--compare``) and the
    provider's window."""
    replay_cmd.add_argument("transcript", type=Path, metavar="TRANSCRIPT")
    replay_cmd.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        type=parse_assignment,
        metavar="KEY=VALUE",
        help="override a configuration key (value parsed as JSON when possible)",
    )
    replay_cmd.add_argument(
        "--compare",
        nargs="+",
        action="extend",
        default=[],
        type=parse_assignment,
        metavar="KEY=VALUE",
        help="also replay the --set configuration with these overrides, side by side",
    )
    replay_cmd.add_argument("--window", type=int, metavar="N", help="provider context window")
    replay_cmd.add_argument(
        "--max-output", type=int, metavar="N", help="provider max output tokens"
    )


def _add_baselines(replay_cmd: argparse.ArgumentParser) -> None:
    """The baseline trimmers replayed next to the module."""
    baselines = replay_cmd.add_argument_group(
        "baselines",
        "trimmers replayed on the same requests as A (B is A's effective budget); each "
        "reports the context it keeps (mean and max view tokens) next to its bill",
    )
    baselines.add_argument(
        "--sliding-window",
        action="store_true",
        help="a per-request trimmer (drops the oldest units until the view fits) to "
        "target_usage x B (run 'sliding')",
    )
    baselines.add_argument(
        "--trimmer-fraction",
        nargs="+",
        action="extend",
        default=[],
        type=_fraction,
        metavar="F",
        help="a per-request trimmer to F x B, F in (0, 1] (runs 'trim-F')",
    )
    baselines.add_argument(
        "--hysteresis",
        nargs="+",
        action="extend",
        default=[],
        type=_fraction,
        metavar="F",
        help="a trimmer with hysteresis: sends everything since its last trim and only "
        "when that exceeds B trims to F x B, F in (0, 1] (runs 'hyst-F')",
    )
    baselines.add_argument(
        "--equal-context",
        action="store_true",
        help="a per-request trimmer whose target is searched so its mean view tokens "
        "equal A's (run 'equal'): the bill at equal context",
    )


def _add_prices(replay_cmd: argparse.ArgumentParser) -> None:
    """The bill's prices, in fresh-token units."""
    for option, default, what in (
        ("--price-fresh", DEFAULT_PRICES.fresh, "a fresh input token"),
        ("--price-cache-read", DEFAULT_PRICES.cache_read, "a token read from the cache"),
        (
            "--price-cache-write",
            DEFAULT_PRICES.cache_write,
            "a token written to the 5-minute cache (or to one without expiry)",
        ),
        (
            "--price-cache-write-1h",
            DEFAULT_PRICES.cache_write_1h,
            "a token written to the 1-hour cache",
        ),
    ):
        replay_cmd.add_argument(
            option,
            type=_price,
            default=default,
            metavar="X",
            help=f"price of {what}, in fresh-token units (default {default:g})",
        )


def _add_cache(replay_cmd: argparse.ArgumentParser) -> None:
    """The cache's lifetime and the request times it expires by."""
    replay_cmd.add_argument(
        "--times",
        type=Path,
        metavar="FILE",
        help="a JSON list of one ISO timestamp per transcript line: a request is made at "
        "the time of the message it comes before, and one made more than the cache "
        "lifetime after the previous request finds the cache cold",
    )
    replay_cmd.add_argument(
        "--cache-ttl",
        choices=tuple(CACHE_LIFETIMES),
        default=DEFAULT_PRICES.lifetime.name,
        help="the prompt cache's lifetime: 5m (default), 1h (writes priced at "
        "--price-cache-write-1h) or none (never expires); without --times nothing expires",
    )


def _add_outputs(replay_cmd: argparse.ArgumentParser) -> None:
    """The plots and the report's form."""
    replay_cmd.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot")
    replay_cmd.add_argument(
        "--plot-cost",
        type=Path,
        metavar="FILE",
        help="write a PNG of the cumulative billed input per run",
    )
    replay_cmd.add_argument("--json", action="store_true", help="print the report as JSON")
