"""Calibration of the token estimator against a real BPE tokenizer (o200k_base via toktok).

    uv run --frozen python -m benchmarks.calibrate          # the table (held-out corpus)
    uv run --frozen python -m benchmarks.calibrate --fit    # refit the estimator's weights

For every content class of ``benchmarks.corpus`` the table shows the number of samples,
the reference token count, the estimate and their ratio (estimate / reference), plus the
5th/95th percentile of the per-sample ratio. The reference tokenizes exactly what the
estimator counts: the text itself, or for message dicts the provider-visible texts of
``estimate.provider_texts`` (each tokenized as the separate field it is) plus the same
fixed per-message / per-tool-call / image constants.

``calibration_rows()`` is the importable core; ``fit_weights()`` produces the constants
that ``amplifier_module_context_simple/context/estimate.py`` carries (before its safety
margin). The fit uses a different seed from the table, so the table is out-of-sample.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from amplifier_module_context_simple.context.counting import estimate
from benchmarks.corpus import CLASSES, Sample, build_corpus

ENCODING = "o200k_base"
TABLE_SEED = 20250101
TABLE_PER_CLASS = 120
FIT_SEED = 7
FIT_PER_CLASS = 1000

# Acceptance targets (also asserted by tests/context/test_estimate.py on a smaller sample).
CLASS_RATIO_BOUNDS = (0.88, 1.12)
AGGREGATE_RATIO_BOUNDS = (0.95, 1.05)
MAX_UNDERESTIMATE = 0.10


@dataclass(frozen=True)
class Row:
    cls: str
    samples: int
    reference: int
    estimated: int
    p5: float
    p95: float

    @property
    def ratio(self) -> float:
        return self.estimated / self.reference if self.reference else float("nan")


def _count(texts: list[str]) -> list[int]:
    import toktok

    return list(toktok.batch_count(texts, ENCODING)) if texts else []


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def measure(samples: Sequence[Sample]) -> list[tuple[str, int, int]]:
    """(class, reference tokens, estimated tokens) per sample."""
    texts: list[str] = []
    spans: list[tuple[int, int, int]] = []  # (start, end, fixed tokens) into texts
    estimates: list[int] = []
    for sample in samples:
        start = len(texts)
        if sample.message is not None:
            parts, fixed = estimate.provider_texts(sample.message)
            texts.extend(parts)
            estimates.append(estimate.estimate_message(sample.message))
        else:
            assert sample.text is not None
            texts.append(sample.text)
            fixed = 0
            estimates.append(estimate.estimate_text(sample.text))
        spans.append((start, len(texts), fixed))
    counts = _count(texts)
    return [
        (sample.cls, sum(counts[a:b]) + fixed, est)
        for sample, (a, b, fixed), est in zip(samples, spans, estimates, strict=True)
    ]


def calibration_rows(seed: int = TABLE_SEED, per_class: int = TABLE_PER_CLASS) -> list[Row]:
    """One row per content class, then an ``aggregate`` row over all samples."""
    results = measure(build_corpus(seed, per_class))
    rows: list[Row] = []
    for cls in (*CLASSES, "aggregate"):
        chosen = [(r, e) for c, r, e in results if cls in (c, "aggregate")]
        ratios = [e / r for r, e in chosen if r]
        rows.append(
            Row(
                cls=cls,
                samples=len(chosen),
                reference=sum(r for r, _ in chosen),
                estimated=sum(e for _, e in chosen),
                p5=_percentile(ratios, 0.05),
                p95=_percentile(ratios, 0.95),
            )
        )
    return rows


def check_rows(rows: Sequence[Row]) -> list[str]:
    """Acceptance failures (empty when every target holds)."""
    failures: list[str] = []
    lo, hi = CLASS_RATIO_BOUNDS
    for row in rows:
        if row.cls == "aggregate":
            alo, ahi = AGGREGATE_RATIO_BOUNDS
            if not alo <= row.ratio <= ahi:
                failures.append(f"aggregate ratio {row.ratio:.3f} outside [{alo}, {ahi}]")
        elif not lo <= row.ratio <= hi or row.ratio < 1 - MAX_UNDERESTIMATE:
            failures.append(f"{row.cls} ratio {row.ratio:.3f} outside [{lo}, {hi}]")
    return failures


def format_rows(rows: Sequence[Row]) -> str:
    header = (
        f"{'class':<14} {'samples':>7} {'reference':>10} {'estimated':>10} "
        f"{'ratio':>6} {'p5':>6} {'p95':>6}"
    )
    lines = [header]
    lines.extend(
        f"{row.cls:<14} {row.samples:>7} {row.reference:>10} {row.estimated:>10} "
        f"{row.ratio:>6.3f} {row.p5:>6.3f} {row.p95:>6.3f}"
        for row in rows
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Fitting (pure Python weighted least squares on the relative error)
# ---------------------------------------------------------------------------------------


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                if f:
                    m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] if abs(m[i][i]) >= 1e-12 else 0.0 for i in range(n)]


def fit_weights(seed: int = FIT_SEED, per_class: int = FIT_PER_CLASS) -> dict[str, float]:
    """Weights minimising the squared relative error, every text class weighted equally.

    ``estimate.FIXED_WEIGHTS`` are kept as they are; the safety margin is not applied.
    """
    samples = [s for s in build_corpus(seed, per_class) if s.text is not None]
    texts = [s.text for s in samples if s.text is not None]
    refs = _count(texts)
    names = estimate.FEATURES
    free = [i for i, n in enumerate(names) if n not in estimate.FIXED_WEIGHTS]
    per_class_n = {c: sum(1 for s in samples if s.cls == c) for c in CLASSES}
    k = len(free)
    ata = [[0.0] * k for _ in range(k)]
    atb = [0.0] * k
    for sample, text, ref in zip(samples, texts, refs, strict=True):
        if ref <= 0:
            continue
        feats = estimate.text_features(text)
        fixed = sum(feats[names.index(n)] * w for n, w in estimate.FIXED_WEIGHTS.items())
        weight = 1.0 / (ref * ref * per_class_n[sample.cls])
        x = [float(feats[i]) for i in free]
        y = ref - fixed
        for i in range(k):
            if x[i]:
                wx = weight * x[i]
                atb[i] += wx * y
                row = ata[i]
                for j in range(k):
                    row[j] += wx * x[j]
    for i in range(k):
        ata[i][i] += 1e-9
    solution = _solve(ata, atb)
    weights = dict(estimate.FIXED_WEIGHTS)
    for i, value in zip(free, solution, strict=True):
        weights[names[i]] = value
    return {n: weights[n] for n in names}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate")
    parser.add_argument("--fit", action="store_true", help="print refitted weights")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--per-class", type=int, default=None)
    args = parser.parse_args(argv)
    if importlib.util.find_spec("toktok") is None:
        print("toktok (toktok-rs) is required: uv sync --group dev", file=sys.stderr)
        return 2
    if args.fit:
        weights = fit_weights(args.seed or FIT_SEED, args.per_class or FIT_PER_CLASS)
        for name, value in weights.items():
            print(f'    "{name}": {value:.4f},')
        return 0
    rows = calibration_rows(args.seed or TABLE_SEED, args.per_class or TABLE_PER_CLASS)
    print(f"estimator vs {ENCODING} (ratio = estimated / reference)")
    print(format_rows(rows))
    failures = check_rows(rows)
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
