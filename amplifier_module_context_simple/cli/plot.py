"""The replay's PNG plots (matplotlib, not a dependency of the package, imported when a
plot is asked for): the views against budget, trigger and history (``write_plot``) and
the cumulative billed input (``write_cost_plot``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .exits import EXIT_FAILURE, CliError
from .runs import Run, cumulative_billed

__all__ = ("use_agg_backend", "write_cost_plot", "write_plot")


def use_agg_backend() -> None:
    """Select matplotlib's non-interactive Agg backend.

    Raises:
        CliError: (exit 1) matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise CliError(
            "--plot needs matplotlib, which is not installed (pip install matplotlib)",
            EXIT_FAILURE,
        ) from exc
    matplotlib.use("Agg")


def write_plot(runs: Sequence[Run], path: Path, title: str) -> None:
    """Write a PNG of view tokens per request, compaction boundaries marked (one colour
    per configuration): against budget and trigger (top) and against the history (bottom).

    Raises:
        CliError: (exit 1) matplotlib is not installed or the file cannot be written.
    """
    use_agg_backend()
    import matplotlib.pyplot as plt

    fig, (cadence, growth) = plt.subplots(2, 1, figsize=(13, 8), sharex=True)
    history = runs[0].records
    growth.plot(
        [r.number for r in history],
        [r.history_tokens for r in history],
        color="0.5",
        label="history (uncompacted)",
    )
    for run, color in zip(runs, ("tab:blue", "tab:orange"), strict=False):
        _plot_run(cadence, growth, run, color)
    cadence.set_title(title)
    cadence.set_ylabel("view tokens (estimated)")
    growth.set_ylabel("tokens (estimated)")
    growth.set_xlabel("request")
    for axes in (cadence, growth):
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(plt, fig, path)


def _plot_run(cadence: Any, growth: Any, run: Run, color: str) -> None:
    """One run's lines: its views on both axes; its compactions, budget and trigger on
    ``cadence``."""
    name = f"{run.name}: {run.label}"
    marks = list(run.compactions)
    x, y = [r.number for r in run.records], [r.view_tokens for r in run.records]
    growth.plot(x, y, color=color, lw=1.2, label=f"{name}: view")
    cadence.plot(x, y, color=color, lw=1.2, label=f"{name}: view")
    cadence.scatter(
        marks,
        [run.records[number - 1].view_tokens for number in marks],
        marker="v",
        color=color,
        zorder=3,
        label=f"{name}: {len(marks)} compactions",
    )
    budget = run.budget["effective_budget"]
    cadence.axhline(budget, color=color, ls="--", lw=1, label=f"{name}: budget {budget:,}")
    trigger = run.trigger_tokens
    cadence.axhline(trigger, color=color, ls=":", lw=1, label=f"{name}: trigger {trigger:,}")


def _save(plt: Any, fig: Any, path: Path) -> None:
    """Write ``fig`` as a PNG to ``path`` and close it.

    Raises:
        CliError: (exit 1) the file cannot be written.
    """
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format="png")
    except OSError as exc:
        raise CliError(f"cannot write plot {path}: {exc.strerror or exc}", EXIT_FAILURE) from exc
    finally:
        plt.close(fig)


def write_cost_plot(runs: Sequence[Run], path: Path, title: str) -> None:
    """Write a PNG of the cumulative billed input per request, one line per run.

    Raises:
        CliError: (exit 1) matplotlib is not installed or the file cannot be written.
    """
    use_agg_backend()
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(11, 5))
    for run in runs:
        billed = cumulative_billed(run.records, run.prices)
        axes.plot(
            [r.number for r in run.records],
            billed,
            lw=1.4,
            label=f"{run.name}: {run.label} ({billed[-1]:,.0f})",
        )
    axes.set_title(f"{title}\nprices: {runs[0].prices.describe()}", fontsize=10)
    axes.set_xlabel("request")
    axes.set_ylabel("cumulative billed input (fresh-token equivalents)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    _save(plt, fig, path)
