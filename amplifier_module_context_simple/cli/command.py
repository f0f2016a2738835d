"""The ``replay`` command and ``main``, the console script's entry point: check the
options, read the transcript, replay the configurations and the baselines, write the
plots and print the report; every failure is a ``CliError`` with its exit code."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from ..context.config import ContextConfig
from .arguments import build_config, build_parser
from .baselines import replay_equal_context, replay_hysteresis, replay_sliding_window
from .bill import CACHE_LIFETIMES, FIVE_MINUTES, CacheLifetime, Prices
from .exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, PROG, CliError
from .plot import use_agg_backend, write_cost_plot, write_plot
from .replaying import WindowProvider, replay, request_times, tallied_warnings
from .report import report_dict, report_text
from .runs import Run
from .transcript import Transcript, parse_transcript

__all__ = ("main", "run_replay")

Configuration = tuple[str, dict[str, Any], ContextConfig]
"""A configuration to replay: its run name, its overrides and the configuration."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``amplifier-context-simple``; returns the exit code (0, 1 or 2)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports usage errors (2) and --help (0) this way
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return run_replay(args)
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.code


def run_replay(args: argparse.Namespace) -> int:
    """The ``replay`` command; ``CliError`` carries its failures."""
    provider = _provider(args)
    if args.plot is not None or args.plot_cost is not None:
        use_agg_backend()  # fail before the replay, not after it
    prices = Prices(
        args.price_fresh,
        args.price_cache_read,
        args.price_cache_write,
        args.price_cache_write_1h,
        CACHE_LIFETIMES[args.cache_ttl],
    )
    configs = _configurations(args, prices.lifetime)
    transcript = _read_transcript(args.transcript)
    times = None if args.times is None else _request_times(args.times, transcript)
    with tallied_warnings() as warnings:
        runs = anyio.run(_replay_all, transcript, configs, provider, prices, times)
    runs += _replay_baselines(transcript, runs[0], args)
    for count, first in warnings.tally.values():
        repeated = f" ({count} times; the first shown)" if count > 1 else ""
        print(f"{PROG}: module warning{repeated}: {first}", file=sys.stderr)
    _write_plots(args, runs)
    _print_report(args, transcript, runs)
    return EXIT_OK


def _provider(args: argparse.Namespace) -> WindowProvider | None:
    """The provider stub ``--window`` and ``--max-output`` describe, or None without them.

    Raises:
        CliError: (exit 2) only one of them is given, or one is not positive.
    """
    if (args.window is None) != (args.max_output is None):
        raise CliError("--window and --max-output go together", EXIT_USAGE)
    if args.window is None:
        return None
    if args.window <= 0 or args.max_output <= 0:
        raise CliError("--window and --max-output must be positive", EXIT_USAGE)
    return WindowProvider(args.window, args.max_output)


def _configurations(
    args: argparse.Namespace, lifetime: CacheLifetime = FIVE_MINUTES
) -> list[Configuration]:
    """A (the ``--set`` overrides) and, with ``--compare``, B (A plus those). The module's
    ``cache_lifetime`` is the bill's ``lifetime`` (``--cache-ttl``; ``none`` is 0, the
    idle-aware rule off) unless the overrides set it.

    Raises:
        CliError: (exit 2) an unknown key or an invalid value.
    """
    base = dict(args.overrides)
    configs = [("A", base, _with_lifetime(build_config(base, "--set"), base, lifetime))]
    if args.compare:
        other = base | dict(args.compare)
        config = build_config(other, "--compare")
        configs.append(("B", other, _with_lifetime(config, other, lifetime)))
    return configs


def _with_lifetime(
    config: ContextConfig, overrides: dict[str, Any], lifetime: CacheLifetime
) -> ContextConfig:
    """``config`` with the bill's cache lifetime, unless ``overrides`` set the key."""
    if "cache_lifetime" in overrides:
        return config
    return dataclasses.replace(config, cache_lifetime=lifetime.module_seconds)


def _read_transcript(path: Path) -> Transcript:
    """The transcript at ``path``; each skipped piece is reported on stderr.

    Raises:
        CliError: (exit 1) the file cannot be read, or holds nothing replayable.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", EXIT_FAILURE) from exc
    transcript = parse_transcript(path, data)
    for problem in transcript.problems:
        print(f"{path}: {problem}; skipped", file=sys.stderr)
    if not transcript.messages:
        raise CliError(f"{path}: no replayable messages", EXIT_FAILURE)
    return transcript


def _request_times(path: Path, transcript: Transcript) -> list[float]:
    """The time of each request (``request_times``) from the ``--times`` file at ``path``:
    a JSON list of one ISO timestamp per transcript line (or array item).

    Raises:
        CliError: (exit 1) the file cannot be read, is not such a list, lacks the
            timestamp of a replayed line or goes back in time between two requests.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"--times: cannot read {path}: {exc.strerror or exc}", EXIT_FAILURE) from exc
    try:
        raw: object = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"--times: {path}: not valid JSON: {exc}", EXIT_FAILURE) from exc
    if not isinstance(raw, list):
        raise CliError(f"--times: {path}: expected a JSON list of timestamps", EXIT_FAILURE)
    stamps: list[datetime.datetime] = []
    for number, stamp in enumerate(raw, start=1):
        try:
            stamps.append(datetime.datetime.fromisoformat(stamp))
        except (TypeError, ValueError):
            raise CliError(
                f"--times: {path}: entry {number} is not an ISO timestamp: {stamp!r}",
                EXIT_FAILURE,
            ) from None
    try:
        return request_times(transcript, stamps)
    except ValueError as exc:
        raise CliError(f"--times: {path}: {exc}", EXIT_FAILURE) from exc


async def _replay_all(
    transcript: Transcript,
    configs: list[Configuration],
    provider: WindowProvider | None,
    prices: Prices,
    times: list[float] | None = None,
) -> list[Run]:
    """Every configuration's module run, in order."""
    return [  # noqa: ASYNC910 - every replay awaits the module
        await replay(
            transcript,
            config,
            provider,
            name=name,
            overrides=overrides,
            prices=prices,
            times=times,
        )
        for name, overrides, config in configs
    ]


def _replay_baselines(
    transcript: Transcript, module_run: Run, args: argparse.Namespace
) -> list[Run]:
    """The baseline runs the options ask for, in option order (a repeated F once)."""
    runs: list[Run] = []
    if args.sliding_window:
        runs.append(replay_sliding_window(transcript, module_run))
    runs += [
        replay_sliding_window(transcript, module_run, name=f"trim-{f:g}", fraction=f)
        for f in dict.fromkeys(args.trimmer_fraction)
    ]
    runs += [
        replay_hysteresis(transcript, module_run, f, name=f"hyst-{f:g}")
        for f in dict.fromkeys(args.hysteresis)
    ]
    if args.equal_context:
        runs.append(replay_equal_context(transcript, module_run))
    return runs


def _write_plots(args: argparse.Namespace, runs: list[Run]) -> None:
    """The ``--plot`` and ``--plot-cost`` files, when asked for."""
    if args.plot is not None:
        write_plot(runs, args.plot, f"context-simple replay of {args.transcript.name}")
    if args.plot_cost is not None:
        title = f"context-simple replay of {args.transcript.name}: cumulative billed input"
        write_cost_plot(runs, args.plot_cost, title)


def _print_report(args: argparse.Namespace, transcript: Transcript, runs: list[Run]) -> None:
    """The report on stdout: JSON with ``--json``, else text and where the plots went."""
    if args.json:
        report = report_dict(transcript, runs, times=args.times)
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    print(report_text(transcript, runs, times=args.times))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    if args.plot_cost is not None:
        print(f"\ncost plot written to {args.plot_cost}")
