"""Statistics for comparing conditions: seeded bootstrap intervals, paired tests, pairing.

Pure functions over numpy arrays and plain rows; nothing here reads files or config.
Every resampling draws from a ``numpy.random.Generator`` built by
:func:`pipeline.core.seeding.labelled_rng` from the config seed and a label, so an interval
depends on the seed and on what it measures, never on the order in which intervals are
computed::

    rng = labelled_rng(cfg.seed, "success_rate")
    est = bootstrap_mean(won, n_resamples=2000, level=0.95, rng=rng)   # Estimate
    diff = paired_bootstrap_diff(won_c2, won_c1, n_resamples=2000, level=0.95,
                                 rng=labelled_rng(cfg.seed, "diff", "C2_vs_C1"))
    p = mcnemar_exact(b=3, c=11)                                       # two-sided, exact

Degenerate inputs are answered, not refused: zero variance or a single observation gives
the interval ``[value, value]``; no observation gives ``Estimate(None, None, None, 0)``
(``null`` in JSON, never NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

#: Cap on resampled values held in memory at once (rows x observations per chunk).
_CHUNK_VALUES = 4_000_000
#: Digits kept in JSON output: enough for any rate/mean here, and it hides float noise
#: such as a mean of identical values differing from the value in the 17th digit.
DIGITS = 6


class PairingError(ValueError):
    """The paired design is broken: duplicate keys, or one task played with different seeds."""


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap percentile interval.

    Attributes:
        value: The statistic on the observed data (None when there is no data).
        ci_low: Lower interval bound (None when there is no data).
        ci_high: Upper interval bound.
        n: Number of observations (pairs, for a paired estimate).
    """

    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int

    def as_dict(self, digits: int = DIGITS) -> dict[str, Any]:
        """JSON-ready ``{"value", "ci_low", "ci_high", "n"}`` (rounded; None stays null)."""
        return {"value": _round(self.value, digits), "ci_low": _round(self.ci_low, digits),
                "ci_high": _round(self.ci_high, digits), "n": int(self.n)}


def _round(x: float | None, digits: int) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), digits) + 0.0  # + 0.0 turns -0.0 into 0.0


def bootstrap_statistic(
    columns: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    n_resamples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Bootstrap distribution of ``statistic`` over rows resampled with replacement.

    The same resampled row indices are applied to every column, so columns stay aligned
    (pairs stay pairs; a numerator stays with its denominator).

    Args:
        columns: 1-D arrays of equal length ``n`` (n >= 1).
        statistic: Takes one ``(b, n)`` array per column and returns a ``(b,)`` array.
        n_resamples: Number of bootstrap resamples ``B`` (>= 1).
        rng: The Generator to draw from.

    Returns:
        Array of shape ``(B,)``.
    """
    cols = [np.asarray(c, dtype=np.float64) for c in columns]
    n = len(cols[0])
    if n < 1 or any(len(c) != n for c in cols):
        raise ValueError(f"bootstrap needs equal-length non-empty columns, got lengths {[len(c) for c in cols]}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples}: expected >= 1")
    out = np.empty(n_resamples, dtype=np.float64)
    step = max(1, _CHUNK_VALUES // n)
    for start in range(0, n_resamples, step):
        b = min(step, n_resamples - start)
        idx = rng.integers(0, n, size=(b, n))
        out[start:start + b] = statistic(*(c[idx] for c in cols))
    return out


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of a bootstrap distribution at ``level`` (e.g. 0.95)."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected in (0, 1)")
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return math.nan, math.nan
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _estimate(value: float, samples: np.ndarray, level: float, n: int) -> Estimate:
    lo, hi = percentile_interval(samples, level)
    # A statistic with no spread (zero variance, one observation) has the interval
    # [value, value]; floating noise in resampled means must not make it [v-1e-17, v].
    if np.allclose(samples, value, rtol=0, atol=1e-12):
        lo = hi = value
    return Estimate(float(value), lo, hi, n)


def _mean(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=1)


def bootstrap_mean(values: Iterable[float], *, n_resamples: int, level: float,
                   rng: np.random.Generator) -> Estimate:
    """Mean (a rate, for 0/1 values) with its bootstrap percentile interval."""
    x = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
    if x.size == 0:
        return Estimate(None, None, None, 0)
    samples = bootstrap_statistic([x], _mean, n_resamples=n_resamples, rng=rng)
    return _estimate(float(x.mean()), samples, level, x.size)


def bootstrap_ratio(numerators: Iterable[float], denominators: Iterable[float], *, n_resamples: int,
                    level: float, rng: np.random.Generator) -> Estimate:
    """Ratio of sums (e.g. invalid actions / turns) resampled by unit (episode).

    Resampling whole episodes keeps the turns of one episode together (a cluster
    bootstrap): turns of an episode are not independent. A resample whose denominator
    sums to 0 is dropped from the interval.
    """
    num = np.asarray(list(numerators), dtype=np.float64)
    den = np.asarray(list(denominators), dtype=np.float64)
    if num.shape != den.shape:
        raise ValueError(f"bootstrap_ratio: {num.size} numerators vs {den.size} denominators")
    if num.size == 0 or den.sum() == 0:
        return Estimate(None, None, None, int(num.size))

    def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        s = b.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(s > 0, a.sum(axis=1) / np.where(s > 0, s, 1.0), np.nan)

    samples = bootstrap_statistic([num, den], ratio, n_resamples=n_resamples, rng=rng)
    return _estimate(float(num.sum() / den.sum()), samples, level, num.size)


def paired_bootstrap_diff(treatment: Iterable[float], control: Iterable[float], *, n_resamples: int,
                          level: float, rng: np.random.Generator) -> Estimate:
    """Mean of ``treatment - control`` over pairs, with a paired bootstrap interval.

    Pairs (one task under both conditions) are resampled together, so the interval
    accounts for the correlation the paired design creates (it is narrower than the
    interval of two independent samples when outcomes are correlated).
    """
    t = np.asarray(list(treatment), dtype=np.float64)
    c = np.asarray(list(control), dtype=np.float64)
    if t.shape != c.shape:
        raise PairingError(f"paired_bootstrap_diff: {t.size} treatment values vs {c.size} control values")
    if t.size == 0:
        return Estimate(None, None, None, 0)
    d = t - c
    samples = bootstrap_statistic([d], _mean, n_resamples=n_resamples, rng=rng)
    return _estimate(float(d.mean()), samples, level, d.size)


def cluster_bootstrap_diff(treatment: Iterable[float], control: Iterable[float], clusters: Iterable[Hashable], *,
                           n_resamples: int, level: float, rng: np.random.Generator) -> Estimate:
    """Mean of ``treatment - control`` over pairs, with a cluster bootstrap interval.

    Tasks of one scene share its grounding and memory, so their outcomes are not
    independent: whole clusters (scenes) are resampled with replacement and the statistic
    is the mean paired difference over the pairs of the drawn clusters. With one cluster
    the interval is the paired bootstrap's (nothing else can be resampled).
    """
    t = np.asarray(list(treatment), dtype=np.float64)
    c = np.asarray(list(control), dtype=np.float64)
    keys = list(clusters)
    if t.shape != c.shape or len(keys) != t.size:
        raise PairingError(f"cluster_bootstrap_diff: {t.size} treatment, {c.size} control values, {len(keys)} clusters")
    if t.size == 0:
        return Estimate(None, None, None, 0)
    d = t - c
    names = sorted(set(keys), key=str)
    if len(names) < 2:
        return paired_bootstrap_diff(t, c, n_resamples=n_resamples, level=level, rng=rng)
    index = {k: i for i, k in enumerate(names)}
    ids = np.fromiter((index[k] for k in keys), dtype=np.int64, count=len(keys))
    sums = np.bincount(ids, weights=d, minlength=len(names))
    counts = np.bincount(ids, minlength=len(names)).astype(np.float64)
    draws = rng.integers(0, len(names), size=(int(n_resamples), len(names)))
    samples = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    return _estimate(float(d.mean()), samples, level, d.size)


def mcnemar_power(n_pairs: int, p_b: float, p_c: float, alpha: float) -> float:
    """Exact power of the two-sided exact McNemar test at level ``alpha``.

    ``p_b`` / ``p_c``: the probabilities that a pair is discordant in the treatment's /
    the control's favour. The number of discordant pairs is Binomial(n, p_b + p_c); given
    D of them, the test rejects when the exact binomial p-value of b among D is at most
    ``alpha``; the power sums the probability of those outcomes.

    Example:
        >>> round(mcnemar_power(40, 0.275, 0.025, 0.05), 2)   # 25-point effect, 30% discordance
        0.84
    """
    from scipy.stats import binom  # deferred: heavy optional dependency (scipy.stats)

    n = int(n_pairs)
    psi = float(p_b) + float(p_c)
    if n <= 0 or psi <= 0:
        return 0.0
    q = float(p_b) / psi
    p_d = binom.pmf(np.arange(n + 1), n, psi)
    power = 0.0
    for d in range(1, n + 1):
        ks = np.arange(d + 1)
        pvals = np.minimum(1.0, 2.0 * binom.cdf(np.minimum(ks, d - ks), d, 0.5))
        reject = ks[pvals <= alpha * (1 + 1e-12)]
        if reject.size:
            power += p_d[d] * float(binom.pmf(reject, d, q).sum())
    return float(min(1.0, power))


def mcnemar_mde(n_pairs: int, alpha: float, *, power: float = 0.8, discordance: float = 0.35,
                step: float = 0.005) -> float | None:
    """The smallest success difference the exact McNemar test detects with ``power``.

    At a planning discordance rate ``discordance`` (= p_b + p_c, the share of tasks whose
    outcome differs between the conditions), the difference p_b - p_c is raised in
    ``step``s until :func:`mcnemar_power` reaches ``power``. None when even a difference
    equal to the discordance (every discordant pair one way) is not enough.
    """
    def enough(i: int) -> bool:
        delta = min(discordance, i * step)
        return mcnemar_power(n_pairs, (discordance + delta) / 2, (discordance - delta) / 2, alpha) >= power

    hi = int(round(discordance / step))
    if hi < 1 or not enough(hi):
        return None
    lo = 0  # power grows with the difference: bisect for the first step that is enough
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return round(min(discordance, hi * step), 6)


def gee_check(treatment: Sequence[bool], control: Sequence[bool], clusters: Sequence[Hashable]) -> dict[str, Any]:
    """A logistic GEE (statsmodels) of success on condition, scenes as clusters (exchangeable).

    A cross-check of the exact test that accounts for tasks sharing a scene; returns the
    treatment's log-odds coefficient, its robust p-value and the cluster count, or
    ``{"estimable": False, "reason": ...}`` when the model cannot be fitted (one outcome
    everywhere, one cluster, perfect separation).
    """
    y = np.asarray([*map(float, treatment), *map(float, control)])
    n_clusters = len(set(clusters))
    if n_clusters < 2:
        return {"estimable": False, "reason": f"{n_clusters} cluster(s): needs at least 2", "clusters": n_clusters}
    if y.size == 0 or y.min() == y.max():
        return {"estimable": False, "reason": "every outcome is the same", "clusters": n_clusters}
    if all(bool(t) == bool(c) for t, c in zip(treatment, control, strict=True)):
        # The coefficient is 0 and its robust variance 0: statsmodels returns a p-value of 0/0
        # rounding (0.64 on one run, 0.07 on a rerun of the same bytes), or NaN.
        return {"estimable": False, "reason": "no discordant pair: the same outcome in every pair",
                "clusters": n_clusters}
    for arm, ys in (("treatment", treatment), ("control", control)):
        if len({bool(v) for v in ys}) == 1:
            # One arm's outcomes all the same: the log-odds has no finite estimate (quasi-complete
            # separation). Decided here, from the outcomes: the solver's iterates only drift, and
            # whether they overflow to inf or stop at a large finite value (+23 with p < 0.001)
            # depended on NumPy's SIMD code for exp/log (AVX-512 against AVX2), a CPU-dependent
            # report.
            outcome = "succeeds" if bool(ys[0]) else "fails"
            return {"estimable": False, "reason": f"no finite estimate (separation: the {arm} {outcome} "
                                                  "in every task)", "clusters": n_clusters}
    import warnings

    import statsmodels.api as sm  # deferred: heavy optional dependency (statsmodels)

    x = np.column_stack([np.ones(y.size), np.r_[np.ones(len(treatment)), np.zeros(len(control))]])
    index = {k: i for i, k in enumerate(sorted(set(clusters), key=str))}
    groups = np.asarray([index[k] for k in [*clusters, *clusters]])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = sm.GEE(y, x, groups=groups, family=sm.families.Binomial(),
                         cov_struct=sm.cov_struct.Exchangeable()).fit()
        coef, pval = float(res.params[1]), float(res.pvalues[1])
    except (ValueError, np.linalg.LinAlgError, ZeroDivisionError) as exc:
        return {"estimable": False, "reason": f"{type(exc).__name__}: {exc}", "clusters": n_clusters}
    if not (math.isfinite(coef) and math.isfinite(pval)):
        return {"estimable": False, "reason": "no finite estimate (separation)", "clusters": n_clusters}
    return {"estimable": True, "log_odds": _round(coef, DIGITS), "p_value": _round(pval, 10), "clusters": n_clusters}


def verdict(p_holm: float | None, b: int, c: int, alpha: float) -> str:
    """The primary verdict: ``better`` / ``worse`` only when the Holm-adjusted exact McNemar
    p-value is below ``alpha`` (direction from b vs c); the bootstrap interval is the
    effect size, never the verdict."""
    if p_holm is None or p_holm >= alpha or b == c:
        return "no detectable difference"
    return "better" if b > c else "worse"


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pair counts.

    Args:
        b: Pairs where the treatment succeeded and the control failed.
        c: Pairs where the control succeeded and the treatment failed.

    Returns:
        ``P(|B - n/2| >= |b - n/2|)`` for ``B ~ Binomial(n = b + c, 1/2)``: the exact
        binomial test on the discordant pairs; 1.0 when there are none.

    Example:
        >>> mcnemar_exact(0, 5)
        0.0625
    """
    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    from scipy.stats import binomtest  # deferred: heavy optional dependency (scipy.stats)

    return float(min(1.0, binomtest(b, n, 0.5, alternative="two-sided").pvalue))


def mcnemar_table(treatment: Iterable[bool], control: Iterable[bool]) -> dict[str, int]:
    """2x2 table of paired binary outcomes: ``both``, ``b`` (treatment only), ``c`` (control only), ``neither``."""
    t = np.asarray(list(treatment), dtype=bool)
    c = np.asarray(list(control), dtype=bool)
    if t.shape != c.shape:
        raise PairingError(f"mcnemar_table: {t.size} treatment outcomes vs {c.size} control outcomes")
    return {"both": int((t & c).sum()), "b": int((t & ~c).sum()), "c": int((~t & c).sum()),
            "neither": int((~t & ~c).sum())}


def ratio_of_paired_diffs(num_t: Sequence[float], num_c: Sequence[float], den_t: Sequence[float],
                          den_c: Sequence[float], *, n_resamples: int, level: float,
                          rng: np.random.Generator) -> Estimate:
    """``mean(num_t - num_c) / mean(den_t - den_c)`` over tasks, with an interval that
    resamples tasks (all four outcomes of a task stay together).

    The model's utilisation of a condition (its success difference over the reader's, on
    the same tasks). No value when the denominator's difference is 0; resamples whose
    denominator is 0 are left out of the interval.

    Example:
        >>> est = ratio_of_paired_diffs([1, 1, 0, 0], [0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 0],
        ...                             n_resamples=200, level=0.95, rng=np.random.default_rng(0))
        >>> est.value
        0.5
    """
    cols = [np.asarray(list(x), dtype=np.float64) for x in (num_t, num_c, den_t, den_c)]
    if len({c.size for c in cols}) != 1:
        raise PairingError(f"ratio_of_paired_diffs: columns of lengths {[c.size for c in cols]}")
    n = cols[0].size
    den = float((cols[2] - cols[3]).mean()) if n else 0.0
    if n == 0 or den == 0:
        return Estimate(None, None, None, n)

    def ratio(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
        dd = (c - d).mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(dd != 0, (a - b).mean(axis=1) / np.where(dd != 0, dd, 1.0), np.nan)

    samples = bootstrap_statistic(cols, ratio, n_resamples=n_resamples, rng=rng)
    return _estimate(float((cols[0] - cols[1]).mean()) / den, samples, level, n)


def paired_binary(treatment: Sequence[bool], control: Sequence[bool], *, n_resamples: int, level: float,
                  rng: np.random.Generator) -> dict[str, Any]:
    """Everything reported for a paired binary outcome (success under two conditions).

    Returns:
        ``{"n_pairs", "treatment", "control", "diff": Estimate dict, "table", "p_value"}``
        where ``treatment`` / ``control`` are the success rates on the paired tasks and
        ``p_value`` is the exact McNemar p-value.
    """
    table = mcnemar_table(treatment, control)
    n = len(treatment)
    diff = paired_bootstrap_diff(np.asarray(treatment, float), np.asarray(control, float),
                                 n_resamples=n_resamples, level=level, rng=rng)
    return {
        "n_pairs": n,
        "treatment": _round(float(np.mean(treatment)), DIGITS) if n else None,
        "control": _round(float(np.mean(control)), DIGITS) if n else None,
        "diff": diff.as_dict(),
        "table": table,
        "p_value": _round(mcnemar_exact(table["b"], table["c"]), 10),
    }


def paired_continuous(treatment: Sequence[float], control: Sequence[float], *, n_resamples: int, level: float,
                      rng: np.random.Generator) -> dict[str, Any]:
    """Means under both conditions and the paired mean difference with its interval."""
    n = len(treatment)
    diff = paired_bootstrap_diff(treatment, control, n_resamples=n_resamples, level=level, rng=rng)
    return {
        "n_pairs": n,
        "treatment": _round(float(np.mean(treatment)), DIGITS) if n else None,
        "control": _round(float(np.mean(control)), DIGITS) if n else None,
        "diff": diff.as_dict(),
    }


def wilcoxon_paired(treatment: Sequence[float], control: Sequence[float]) -> dict[str, Any]:
    """The Wilcoxon signed-rank test of paired values (turns per task under two conditions).

    Pairs with no difference are left out (``zero_method="wilcox"``); with none left the
    p-value is 1. Exact distribution up to 50 non-zero pairs (scipy's ``method="auto"``),
    the normal approximation with ties corrected above.

    Returns:
        ``{"n_pairs", "nonzero", "treatment", "control", "diff" (mean paired difference),
        "statistic", "p_value"}``.
    """
    from scipy.stats import wilcoxon  # deferred: heavy optional dependency (scipy.stats)

    t, c = np.asarray(treatment, float), np.asarray(control, float)
    if t.shape != c.shape:
        raise PairingError(f"wilcoxon_paired: {len(t)} treatment values vs {len(c)} control values")
    d = t - c
    nonzero = int(np.count_nonzero(d))
    out: dict[str, Any] = {"n_pairs": int(len(d)), "nonzero": nonzero,
                           "treatment": _round(float(t.mean()), DIGITS) if len(t) else None,
                           "control": _round(float(c.mean()), DIGITS) if len(c) else None,
                           "diff": _round(float(d.mean()), DIGITS) if len(d) else None,
                           "statistic": None, "p_value": 1.0}
    if nonzero:
        res = wilcoxon(d, zero_method="wilcox", alternative="two-sided", method="auto")
        out["statistic"] = _round(float(res.statistic), DIGITS)
        out["p_value"] = _round(float(res.pvalue), 10)
    return out


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (family-wise error over several comparisons).

    Example:
        >>> holm([0.01, 0.04, 0.03])
        [0.03, 0.06, 0.06]
    """
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: (pvalues[j], j))):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))  # type: ignore[arg-type]
        out[i] = round(running, 10)
    return out


def pair_rows(
    treatment: Iterable[Mapping[str, Any]],
    control: Iterable[Mapping[str, Any]],
    *,
    key: str = "episode_id",
    seed_key: str | None = "seed",
    where: tuple[str, str] = ("treatment", "control"),
) -> tuple[list[tuple[Mapping[str, Any], Mapping[str, Any]]], list[Hashable], list[Hashable]]:
    """Match rows of two conditions by ``key`` (the paired design: same task, same seed).

    Args:
        treatment: Rows of the treatment condition.
        control: Rows of the control condition.
        key: Column identifying the task (``episode_id`` is the same across conditions).
        seed_key: Column that must be equal within a pair (the per-task sampling seed);
            None skips the check.
        where: Names of the two sides, for error messages.

    Returns:
        ``(pairs, only_treatment, only_control)``: pairs sorted by key, and the keys
        found on one side only.

    Raises:
        PairingError: A key occurs twice on one side, or a pair's seeds differ.
    """
    def index(rows: Iterable[Mapping[str, Any]], side: str) -> dict[Hashable, Mapping[str, Any]]:
        out: dict[Hashable, Mapping[str, Any]] = {}
        for r in rows:
            k = r[key]
            if k in out:
                raise PairingError(f"{side}: {key}={k!r} occurs twice; cannot pair by {key}")
            out[k] = r
        return out

    a, b = index(treatment, where[0]), index(control, where[1])
    common = sorted(set(a) & set(b), key=str)
    pairs = [(a[k], b[k]) for k in common]
    if seed_key is not None:
        bad = [k for k in common if seed_key in a[k] and seed_key in b[k] and a[k][seed_key] != b[k][seed_key]]
        if bad:
            k = bad[0]
            raise PairingError(
                f"{len(bad)} paired task(s) were played with different seeds, e.g. {key}={k!r}: "
                f"{where[0]} {seed_key}={a[k][seed_key]} vs {where[1]} {seed_key}={b[k][seed_key]} "
                "(conditions must share per-task seeds)")
    return pairs, sorted(set(a) - set(b), key=str), sorted(set(b) - set(a), key=str)
