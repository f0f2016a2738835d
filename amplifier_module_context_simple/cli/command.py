"""The ``replay`` command and ``main``, the console script's entry point: check the
options, read the transcript, replay the configurations and the baselines, write the
plots and print the report; every failure is a ``CliError`` with its exit code."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from ..context.config import ContextConfig
from .arguments import build_config, build_parser
from .baselines import replay_equal_context, replay_hysteresis, replay_sliding_window
from .bill import Prices
from .exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, PROG, CliError
from .plot import use_agg_backend, write_cost_plot, write_plot
from .replaying import WindowProvider, replay, tallied_warnings
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
    prices = Prices(args.price_fresh, args.price_cache_read, args.price_cache_write)
    configs = _configurations(args)
    transcript = _read_transcript(args.transcript)
    with tallied_warnings() as warnings:
        runs = anyio.run(_replay_all, transcript, configs, provider, prices)
    runs += _replay_baselines(transcript, runs[0], args)
    for count, first in warnings.tally.values():
        times = f" ({count} times; the first shown)" if count > 1 else ""
        print(f"{PROG}: module warning{times}: {first}", file=sys.stderr)
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


def _configurations(args: argparse.Namespace) -> list[Configuration]:
    """A (the ``--set`` overrides) and, with ``--compare``, B (A plus those).

    Raises:
        CliError: (exit 2) an unknown key or an invalid value.
    """
    base = dict(args.overrides)
    configs = [("A", base, build_config(base, "--set"))]
    if args.compare:
        other = base | dict(args.compare)
        configs.append(("B", other, build_config(other, "--compare")))
    return configs


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


async def _replay_all(
    transcript: Transcript,
    configs: list[Configuration],
    provider: WindowProvider | None,
    prices: Prices,
) -> list[Run]:
    """Every configuration's module run, in order."""
    return [  # noqa: ASYNC910 - every replay awaits the module
        await replay(transcript, config, provider, name=name, overrides=overrides, prices=prices)
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
        print(json.dumps(report_dict(transcript, runs), indent=2, ensure_ascii=False))
        return
    print(report_text(transcript, runs))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    if args.plot_cost is not None:
        print(f"\ncost plot written to {args.plot_cost}")
