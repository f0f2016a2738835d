"""Text estimates: content-based, script-aware, calibrated against o200k_base.

``estimate_text(text) -> int`` is the estimated o200k tokens for a piece of text;
``text_features(text)`` the feature counts it weighs (used by the calibration benchmark).

How text is estimated
---------------------
A BPE tokenizer first splits text into pre-tokens (a word with its leading space or
punctuation mark, a group of at most three digits, a punctuation run, a whitespace run)
and then spends one or a few tokens on each. The estimator counts pre-token boundaries
directly. Every UTF-8 byte gets one of six classes (whitespace, punctuation, digit, lower,
upper, non-ASCII) with one ``bytes.translate``; the (previous, current, next) class triple
of every byte is formed at once by one big-integer multiplication of ``int.from_bytes``; a
second ``translate`` maps each triple to its weight and ``zlib.adler32`` sums the weights.
Non-ASCII text adds one more ``translate`` that weighs each character by its UTF-8 lead
byte, and drops its continuation bytes first (they weigh nothing and change no neighbour's
weight, see ``_CONTINUATION``). There is no per-character Python loop: about 3 us per KiB
of text. Features:

- ``letters``, ``upper``: ASCII letters and upper-case letters (long words cost more).
- ``digits``, ``digit_runs``: a number of L digits is ceil(L/3) tokens, i.e. about
  digits/3 + 2/3 per run (structural, not fitted).
- ``word_runs``: runs of letters and non-ASCII bytes (words, in any script).
- ``camel``, ``camel_caps``, ``short_hump``: a lower-to-upper transition followed by a
  lower-case letter is a camelCase hump (``getUserName``), which o200k splits into a new
  pre-token of about one token; followed by anything else (``sessionID``, ``aB3``) it
  is an initialism or, mostly, a random string (base64, ids); a single lower-case letter
  between capitals or before a digit (``QzX``, ``Kb9``) is one too. Random strings cost
  far more per character than identifiers, so the three are weighed apart.
- ``punct_runs``, ``punct_merged``: punctuation runs, and the single marks that o200k
  merges into the following word (``.append``, ``_name``).
- ``indent_runs``: whitespace runs of two or more bytes (indentation, blank lines, padding).
- ``space_digit``: a space before a digit is a token of its own in o200k.
- Per-character weights by UTF-8 lead byte, which separate scripts for free: Latin-1 and
  Latin extended, Greek, Cyrillic, Hebrew/Armenian, Arabic, Indic (U+0800-0FFF; Thai is
  split out by its second byte), U+1000-1FFF (Hangul jamo, Georgian, Vietnamese), general
  punctuation and symbols (U+2000-2FFF), kana and CJK punctuation (U+3000-3FFF), Han
  ideographs (U+4000-9FFF), Hangul syllables (U+A000-DFFF), full-width forms
  (U+E000-FFFF) and astral characters (emoji).

``FITTED_WEIGHTS`` is the output of ``python -m benchmarks.calibrate --fit``: least
squares on the relative error, the five text classes weighted equally (``mixed_turns``
is never fitted), over the corpus of ``benchmarks/corpus.py`` with seed 7 and 1,000
samples per class (its code class holds file reads with line numbers, its json class
tool-call arguments with escaped file contents, as agent sessions have them). The
weights are applied multiplied by ``SAFETY_MARGIN`` (1.03) so that budgets err towards
compacting early.

Calibration (``python -m benchmarks.calibrate``): a held-out corpus (seed 20250101, 120
samples per class, 200 B - 8 KB each); reference = toktok o200k_base on exactly the text
counted here (for messages: each provider-visible field, plus the same fixed per-message
and per-tool-call constants); ratio = estimated / reference; p5/p95 = per-sample ratios::

    class          samples  reference  estimated  ratio     p5    p95
    prose              120      65868      67768  1.029  0.984  1.073
    code               120      58705      60850  1.037  0.949  1.114
    json               120      82541      84382  1.022  0.973  1.092
    cjk                120      55336      56717  1.025  0.972  1.104
    other_scripts      120      52434      54503  1.039  0.910  1.186
    mixed_turns        120      59302      60942  1.028  0.973  1.103
    aggregate          720     374186     385162  1.029  0.963  1.114

Known spread inside a class (per-sample p5-p95 above): languages sharing a script differ
(Russian is over-estimated ~20%, Ukrainian and German under-estimated ~9% and ~6%);
initialisms after camelCase (``sessionID``) are over-estimated (~1.35x in a soup of
them: they share ``camel_caps`` with base64); long runs of one punctuation mark
(``=====``) are under-estimated in relative terms (a few tokens either way).

Real conversations (``benchmarks/real.py`` on ``tests/data/real``: validation only,
never fitted). Before the line-numbered reads, the tool-argument JSON and the camelCase
split, code was over-estimated by ~15% (median 1.154): it is Claude Code's ``Read`` of
Go and TypeScript files, every line behind ``     1→``, full of camelCase identifiers,
which the old single ``camel`` weight (1.75, learnt from base64) priced at almost two
tokens per hump where o200k starts one pre-token of about one token; the line prefix
cost 5.5 estimated tokens for 4.3 real ones (now 4.2). Tool calls and JSON results were
under-estimated per message (medians 0.87 and 0.89) although their text was not (1.07
and 0.97): call ids were not counted, and o200k spends 14-20 tokens on every provider id
(``toolu_01...``, ``call_...``), as much as a small call's arguments. Tool-argument text
itself (JSON with ``\\n`` and ``\\"`` escapes) was within 7% and is within 2%. Now
(text alone, estimated / o200k): code 1.05, prose 1.03, tool arguments 1.01, JSON 0.97
(compact records with many short values: under-estimated by ~3%). Thinking blocks are
counted, on purpose: a provider that keeps them bills them (Anthropic keeps the current
tool loop's, and newer models every turn's), but a reference that drops them, as the
benchmark's Chat Completions one does, sees the estimate 2.6% higher over the real set
for that alone (1.050 with them, 1.024 without).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Final

__all__ = [
    "FEATURES",
    "FITTED_WEIGHTS",
    "FIXED_WEIGHTS",
    "SAFETY_MARGIN",
    "estimate_text",
    "text_features",
]

SAFETY_MARGIN: Final = 1.03
"""Multiplier applied to the fitted weights (see the module docstring)."""


# ---------------------------------------------------------------------------------------
# Text: every UTF-8 byte gets a class; (previous, current, next) class triples are formed
# for all bytes at once with big-integer arithmetic; one table lookup weighs them.
# ---------------------------------------------------------------------------------------

_SPACE: Final = 0  # whitespace, including newlines; also the virtual bytes at both ends
_PUNCT: Final = 1
_DIGIT: Final = 2
_LOWER: Final = 3
_UPPER: Final = 4
_NONASCII: Final = 5  # every byte of a non-ASCII character (mostly letters)
_LETTER: Final = (_LOWER, _UPPER)
_WORD: Final = (_LOWER, _UPPER, _NONASCII)


def _byte_class(i: int) -> int:
    if i >= 0x80:
        return _NONASCII
    c = chr(i)
    if "a" <= c <= "z":
        return _LOWER
    if "A" <= c <= "Z":
        return _UPPER
    if "0" <= c <= "9":
        return _DIGIT
    if c in " \t\n\r\x0b\x0c":
        return _SPACE
    return _PUNCT


_CLASS_TABLE: Final = bytes(_byte_class(i) for i in range(256))


_TRIPLE_FACTOR: Final = 1 + (6 << 8) + (36 << 16)
"""Multiplying the class bytes by this puts 36 * class(i - 1) + 6 * class(i) + class(i + 1)
in byte i + 1 (classes are below 6, so no byte carries into the next): one big-integer
operation forms every triple."""


def _shifted_triples(data: bytes) -> bytes:
    """Byte i + 1 is the triple of byte i of ``data``; ``len(data) + 2`` bytes.

    Byte 0 is the triple (space, space, class(0)) and the last byte the one after the
    end (class(n - 1), space, space): the virtual spaces at both ends.
    """
    v = int.from_bytes(data.translate(_CLASS_TABLE), "little")
    return (v * _TRIPLE_FACTOR).to_bytes(len(data) + 2, "little")


def _triples(data: bytes) -> bytes:
    """Byte i is 36 * class(i - 1) + 6 * class(i) + class(i + 1); one extra byte at the end."""
    return _shifted_triples(data)[1:]


def _triple_features(code: int) -> dict[str, int]:
    """The feature counts of one byte, given its (previous, current, next) class triple."""
    prev, cur, nxt = code // 36, code // 6 % 6, code % 6
    out: dict[str, int] = {}
    if cur in _WORD:
        out["word_runs"] = int(prev not in _WORD)
        if cur in _LETTER:
            out["letters"] = 1
        if cur == _UPPER:
            out["upper"] = 1
            if prev == _LOWER:
                out["camel" if nxt == _LOWER else "camel_caps"] = 1
        elif cur == _LOWER and prev == _UPPER and nxt in (_UPPER, _DIGIT):
            out["short_hump"] = 1
    elif cur == _DIGIT:
        out["digits"] = 1
        out["digit_runs"] = int(prev != _DIGIT)
        out["space_digit"] = int(prev == _SPACE)
    elif cur == _PUNCT and prev != _PUNCT:
        out["punct_runs"] = 1
        out["punct_merged"] = int(nxt in _WORD)
    elif cur == _SPACE and prev != _SPACE:
        out["indent_runs"] = int(nxt == _SPACE)
    return out


# Non-ASCII characters by UTF-8 lead byte: (name, first lead byte, last lead byte).
_SCRIPTS: Final[tuple[tuple[str, int, int], ...]] = (
    ("latin_ext", 0xC2, 0xCB),
    ("greek", 0xCC, 0xCF),
    ("cyrillic", 0xD0, 0xD4),
    ("hebrew", 0xD5, 0xD7),
    ("arabic", 0xD8, 0xDF),
    ("indic_thai", 0xE0, 0xE0),
    ("u1000", 0xE1, 0xE1),
    ("symbols", 0xE2, 0xE2),
    ("kana", 0xE3, 0xE3),
    ("han", 0xE4, 0xE9),
    ("hangul", 0xEA, 0xED),
    ("fullwidth", 0xEE, 0xEF),
    ("astral", 0xF0, 0xFF),
)
_THAI: Final = (b"\xe0\xb8", b"\xe0\xb9")  # U+0E00-0E7F, split out of "indic_thai"

FEATURES: Final[tuple[str, ...]] = (
    "letters",
    "upper",
    "digits",
    "digit_runs",
    "word_runs",
    "camel",
    "camel_caps",
    "short_hump",
    "punct_runs",
    "punct_merged",
    "indent_runs",
    "space_digit",
    *(name for name, _, _ in _SCRIPTS),
    "thai",
)
"""Names of the values ``text_features`` returns, in order."""

FIXED_WEIGHTS: Final[Mapping[str, float]] = {"digits": 1 / 3, "digit_runs": 2 / 3}
"""Structural weights the calibration does not fit (a run of L digits is ceil(L/3) tokens)."""

# Fitted by ``python -m benchmarks.calibrate --fit`` (before SAFETY_MARGIN).
FITTED_WEIGHTS: Final[Mapping[str, float]] = {
    "letters": 0.0918,
    "upper": 0.0706,
    "digits": 1 / 3,
    "digit_runs": 2 / 3,
    "word_runs": 0.6056,
    "camel": 0.5019,
    "camel_caps": 1.9082,
    "short_hump": 1.2749,
    "punct_runs": 1.0881,
    "punct_merged": -0.7150,
    "indent_runs": 1.2879,
    "space_digit": 0.5754,
    "latin_ext": 0.7157,
    "greek": 0.2766,
    "cyrillic": 0.1988,
    "hebrew": 0.3213,
    "arabic": 0.1818,
    "indic_thai": 0.2070,
    "u1000": 0.0355,
    "symbols": 0.5214,
    "kana": 0.6541,
    "han": 0.6457,
    "hangul": 0.4105,
    "fullwidth": 0.9939,
    "astral": 1.4988,
    "thai": 0.3549,
}

_UNITS: Final = 32
"""Weights are applied in 1/32 token units, so one ``bytes.translate`` applies them all."""


def _weight_units(name: str) -> float:
    return FITTED_WEIGHTS[name] * SAFETY_MARGIN * _UNITS


def _triple_weight_table() -> bytes:
    table = bytearray(256)
    for code in range(216):
        units = sum(_weight_units(f) * n for f, n in _triple_features(code).items())
        table[code] = max(0, min(255, round(units)))
    return bytes(table)


def _script_weight_table() -> bytes:
    table = bytearray(256)
    for name, lo, hi in _SCRIPTS:
        for i in range(lo, hi + 1):
            table[i] = max(0, min(255, round(_weight_units(name))))
    return bytes(table)


_TRIPLE_WEIGHTS: Final = _triple_weight_table()
_SCRIPT_WEIGHTS: Final = _script_weight_table()
# ``estimate_text`` sums the shifted triples whole: byte 0 (space, space, x) must weigh
# nothing, and it subtracts the last byte (the triple after the end) itself.
assert not any(_TRIPLE_WEIGHTS[:6]), "a triple centred on a leading space has no weight"

_CONTINUATION: Final = bytes(range(0x80, 0xC0))
"""UTF-8 continuation bytes. ``estimate_text`` leaves them out: a non-ASCII byte weighs
the same whatever follows it, nothing after another non-ASCII byte, and nothing as a script
lead byte; so one (lead) byte per character gives the same sums as every byte."""
assert all(
    _TRIPLE_WEIGHTS[36 * prev + 6 * _NONASCII + after]
    == (0 if prev == _NONASCII else _TRIPLE_WEIGHTS[36 * prev + 6 * _NONASCII])
    for prev in range(6)
    for after in range(6)
), "a non-ASCII byte's weight reads only the class before it, and is 0 after another"
assert not any(_SCRIPT_WEIGHTS[byte] for byte in _CONTINUATION)
_THAI_EXTRA_UNITS: Final = _weight_units("thai") - _SCRIPT_WEIGHTS[0xE0]
# zlib.adler32 sums bytes modulo 65521: keep every summed span below that.
_SPAN: Final = 65520 // max(1, *_TRIPLE_WEIGHTS, *_SCRIPT_WEIGHTS)


def _byte_sum(data: bytes, end: int) -> int:
    """Sum of ``data[:end]``, exactly (adler32 in spans that cannot wrap around)."""
    if end <= _SPAN:
        return (zlib.adler32(data[:end] if end < len(data) else data) - 1) & 0xFFFF
    view = memoryview(data)
    return sum(
        (zlib.adler32(view[i : min(end, i + _SPAN)]) - 1) & 0xFFFF for i in range(0, end, _SPAN)
    )


def _sum(data: bytes) -> int:
    """Sum of the bytes of ``data``, exactly."""
    if len(data) <= _SPAN:
        return (zlib.adler32(data) - 1) & 0xFFFF
    return _byte_sum(data, len(data))


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return text.encode("utf-8", "surrogatepass")


def text_features(text: str) -> list[int]:
    """The feature counts of ``text``, aligned with ``FEATURES`` (used for calibration)."""
    data = _encode(text)
    histogram = [0] * 256
    for code in _triples(data)[: len(data)]:
        histogram[code] += 1
    counts = dict.fromkeys(FEATURES, 0)
    for code, n in enumerate(histogram):
        if n:
            for name, k in _triple_features(code).items():
                counts[name] += k * n
    for name, lo, hi in _SCRIPTS:
        counts[name] = sum(data.count(i) for i in range(lo, hi + 1))
    counts["thai"] = data.count(_THAI[0]) + data.count(_THAI[1])
    counts["indic_thai"] -= counts["thai"]
    return [counts[name] for name in FEATURES]


_SHORT_TEXT: Final = 32
"""Texts this short (tool names, flags, small arguments, call ids: a call's id comes back
with its result) recur all through a session: their estimates are remembered
(``_SHORT_ESTIMATES``)."""

_SHORT_ESTIMATES: Final[dict[str, int]] = {}
"""Estimates of short texts; emptied when it holds ``_SHORT_ESTIMATES_MAX`` (a dict, not
``functools.lru_cache``: a miss costs a quarter as much, and most short texts are ids
seen twice in a row, for which recency bookkeeping buys nothing)."""
_SHORT_ESTIMATES_MAX: Final = 4096


def estimate_text(text: str) -> int:
    """Estimated o200k_base tokens for ``text`` (0 for the empty string, else >= 1)."""
    if len(text) <= _SHORT_TEXT:
        tokens = _SHORT_ESTIMATES.get(text)
        if tokens is None:
            if len(_SHORT_ESTIMATES) >= _SHORT_ESTIMATES_MAX:
                _SHORT_ESTIMATES.clear()
            tokens = _SHORT_ESTIMATES[text] = _estimate(text)
        return tokens
    return _estimate(text)


def _estimate(text: str) -> int:
    if not text:
        return 0
    # ``_encode``, ``_shifted_triples`` and ``_sum`` inlined: this runs for every text of
    # every admitted message
    try:
        data = text.encode()
    except UnicodeEncodeError:  # lone surrogates
        data = text.encode("utf-8", "surrogatepass")
    is_ascii = len(data) == len(text)
    leads = data if is_ascii else data.translate(None, _CONTINUATION)  # see ``_CONTINUATION``
    size = len(leads) + 2
    triples = int.from_bytes(leads.translate(_CLASS_TABLE), "little") * _TRIPLE_FACTOR
    weights = triples.to_bytes(size, "little").translate(_TRIPLE_WEIGHTS)
    units = (zlib.adler32(weights) - 1) & 0xFFFF if size <= _SPAN else _byte_sum(weights, size)
    units -= weights[-1]  # the triple after the end
    if not is_ascii:
        units += _sum(leads.translate(_SCRIPT_WEIGHTS))
        if b"\xe0" in data:
            return max(
                1,
                math.ceil(
                    (units + _THAI_EXTRA_UNITS * (data.count(_THAI[0]) + data.count(_THAI[1])))
                    / _UNITS
                ),
            )
    return max(1, (units + _UNITS - 1) // _UNITS)  # ceil(units / _UNITS), in integers
