"""``amplifier-context-simple replay``: replay a transcript and report the compaction cadence.

::

    amplifier-context-simple replay TRANSCRIPT [--set key=value ...]
        [--window N --max-output N] [--compare key=value ...] [--sliding-window]
        [--trimmer-fraction F ...] [--hysteresis F ...] [--equal-context]
        [--price-fresh X --price-cache-read X --price-cache-write X
         --price-cache-write-1h X] [--times FILE] [--cache-ttl 5m|1h|none]
        [--plot FILE] [--plot-cost FILE] [--json]

The transcript holds one message object per line (Amplifier's ``transcript.jsonl``; blank
lines are skipped) or one JSON array of messages. Messages are admitted in order with
``add_message``; right before each assistant message (where the provider was called) and
once at the end, the tool makes a request with ``get_messages_for_request``. The provider
is a stub whose ``get_info().defaults`` carry ``--window`` and ``--max-output``; without
``--window`` no provider is passed and the module uses its fallback budget.

``--set`` overrides configuration keys (a value is parsed as JSON when it can be -
numbers, ``true``/``false``, ``null`` - and is a string otherwise). ``--compare`` replays
a second configuration (the ``--set`` one plus these overrides) and reports both side by
side.

Baselines replay trimmers on the same requests as the first configuration (A), with B its
effective budget. A trimmer keeps the system messages and drops the oldest other messages
in units (an assistant message with the results of its calls; never a result without its
call), always keeping the newest unit:

- ``--sliding-window``: per request, drops the oldest units until the view fits
  ``target_usage`` x B (run ``sliding``);
- ``--trimmer-fraction F ...``: the same per-request trimmer to F x B (runs ``trim-F``);
- ``--hysteresis F ...``: sends everything since its last trim, and only when that
  exceeds B trims to F x B (runs ``hyst-F``);
- ``--equal-context``: the per-request trimmer whose target is searched (bisection,
  deterministic) so that its mean view tokens come closest to A's; its description gives
  both means and says when they differ by more than 1% (run ``equal``).

F is a fraction in (0, 1]; a value given twice is replayed once. Every run reports the
context it keeps - mean and max view tokens - next to its bill, and its trims: the
requests whose view leaves out a message the previous request's view sent (messages
compared by what the provider sees; a rewritten message counts as left out).

The bill: every run's views are passed through a simulated prompt cache, the one the demo's
``provider-window`` applies. Each view's messages are counted with the module's estimator
(``estimate_message``, not a provider tokenizer); the leading messages a view shares with the
previous request's view are read from the cache, the last message (the new input) is fresh,
and everything between is a cache write. The billed input is ``fresh x --price-fresh +
read x --price-cache-read + write x --price-cache-write`` (defaults 1.0, 0.1, 1.25).
The cache has a lifetime, ``--cache-ttl``: ``5m`` (the default), ``1h`` (writes priced at
``--price-cache-write-1h``, default 2.0) or ``none``. With ``--times FILE`` (a JSON list of
one ISO timestamp per transcript line) a request is made at the time of the message it
comes before (the last one at the last message's), and a request made more than the
lifetime after the previous one finds the cache cold: it writes its whole view (``cache
expiries``); every request refreshes the entry. Without ``--times`` nothing expires.
From Python, another count can replace the estimator: ``replay`` takes a ``measure``
(message -> tokens) that counts its records and bill, the baselines replayed against a run
count with that run's measure, and the trimmer pieces (``trimmed_views``,
``sliding_window_view``, ``hysteresis_views``, ``equal_context_target``, ``keyed_view``)
take one too.

``--plot FILE`` writes a PNG of the views, ``--plot-cost FILE`` one of the cumulative billed
input (both need matplotlib, which is not a dependency of the package). ``--json`` prints
the report as JSON.

Malformed input (invalid JSON, a non-object, a message the module rejects with
``InvalidMessageError``) is reported on stderr with its line (or array item) number and
skipped. Exit codes: 0 replayed; 1 the transcript cannot be read, holds nothing
replayable, or the plot cannot be written (matplotlib missing, unwritable file);
2 usage error (bad option, unknown configuration key, invalid value).

The package, one module per concern (``main`` and every name above import from
``amplifier_module_context_simple.cli``):

- ``arguments``: the parser, ``--set``/``--compare`` assignments and the configuration
  they build;
- ``transcript``: loading a transcript (``parse_transcript``) and the histories held at
  each request (``request_histories``);
- ``bill``: prices, the simulated prompt cache and the message keys views are compared by;
- ``runs``: ``RequestRecord`` and ``Run``, a replay's records, totals and bill;
- ``replaying``: ``replay`` through the module, the provider stub, the event log and the
  warning tally;
- ``trimmers`` and ``baselines``: the trimmers' views and their runs against a module run;
- ``report`` and ``plot``: the text or JSON report and the PNG plots;
- ``command``: the ``replay`` command and ``main``; ``exits``: ``CliError`` and the exit
  codes.
"""

from __future__ import annotations

from .arguments import CONFIG_KEYS as CONFIG_KEYS
from .arguments import build_config as build_config
from .arguments import build_parser as build_parser
from .arguments import parse_assignment as parse_assignment
from .baselines import baseline_run as baseline_run
from .baselines import replay_equal_context as replay_equal_context
from .baselines import replay_hysteresis as replay_hysteresis
from .baselines import replay_sliding_window as replay_sliding_window
from .baselines import replay_trimmer as replay_trimmer
from .bill import CACHE_LIFETIMES as CACHE_LIFETIMES
from .bill import DEFAULT_PRICES as DEFAULT_PRICES
from .bill import FIVE_MINUTES as FIVE_MINUTES
from .bill import NO_EXPIRY as NO_EXPIRY
from .bill import ONE_HOUR as ONE_HOUR
from .bill import CacheLifetime as CacheLifetime
from .bill import CacheUse as CacheUse
from .bill import Measure as Measure
from .bill import Prices as Prices
from .bill import cache_use as cache_use
from .bill import dropped_messages as dropped_messages
from .bill import expired_requests as expired_requests
from .bill import keyed_view as keyed_view
from .bill import message_key as message_key
from .bill import simulate_cache as simulate_cache
from .command import main as main
from .command import run_replay as run_replay
from .exits import EXIT_FAILURE as EXIT_FAILURE
from .exits import EXIT_OK as EXIT_OK
from .exits import EXIT_USAGE as EXIT_USAGE
from .exits import PROG as PROG
from .exits import CliError as CliError
from .plot import use_agg_backend as use_agg_backend
from .plot import write_cost_plot as write_cost_plot
from .plot import write_plot as write_plot
from .replaying import EventLog as EventLog
from .replaying import ProviderInfo as ProviderInfo
from .replaying import ReplayedRequest as ReplayedRequest
from .replaying import WarningTally as WarningTally
from .replaying import WindowProvider as WindowProvider
from .replaying import replay as replay
from .replaying import request_times as request_times
from .replaying import tallied_warnings as tallied_warnings
from .report import CACHE_MODEL as CACHE_MODEL
from .report import SUMMARY_ROWS as SUMMARY_ROWS
from .report import TRIM_MODEL as TRIM_MODEL
from .report import format_table as format_table
from .report import report_dict as report_dict
from .report import report_text as report_text
from .runs import RequestRecord as RequestRecord
from .runs import Run as Run
from .runs import cumulative_billed as cumulative_billed
from .transcript import Problem as Problem
from .transcript import Transcript as Transcript
from .transcript import parse_transcript as parse_transcript
from .transcript import request_histories as request_histories
from .trimmers import EQUAL_CONTEXT_TOLERANCE as EQUAL_CONTEXT_TOLERANCE
from .trimmers import equal_context_target as equal_context_target
from .trimmers import hysteresis_views as hysteresis_views
from .trimmers import sliding_window_view as sliding_window_view
from .trimmers import trimmed_views as trimmed_views

__all__ = (
    "CACHE_LIFETIMES",
    "CONFIG_KEYS",
    "DEFAULT_PRICES",
    "EQUAL_CONTEXT_TOLERANCE",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "FIVE_MINUTES",
    "NO_EXPIRY",
    "ONE_HOUR",
    "PROG",
    "SUMMARY_ROWS",
    "TRIM_MODEL",
    "CacheLifetime",
    "CacheUse",
    "CliError",
    "EventLog",
    "Measure",
    "Prices",
    "Problem",
    "ProviderInfo",
    "ReplayedRequest",
    "RequestRecord",
    "Run",
    "Transcript",
    "WarningTally",
    "WindowProvider",
    "baseline_run",
    "build_config",
    "build_parser",
    "cache_use",
    "cumulative_billed",
    "dropped_messages",
    "equal_context_target",
    "expired_requests",
    "format_table",
    "hysteresis_views",
    "keyed_view",
    "main",
    "message_key",
    "parse_assignment",
    "parse_transcript",
    "replay",
    "replay_equal_context",
    "replay_hysteresis",
    "replay_sliding_window",
    "replay_trimmer",
    "report_dict",
    "report_text",
    "request_histories",
    "request_times",
    "run_replay",
    "simulate_cache",
    "sliding_window_view",
    "tallied_warnings",
    "trimmed_views",
    "use_agg_backend",
    "write_cost_plot",
    "write_plot",
)
