"""Design probe: the power of a charged heterogeneity test before a trial CATE's budget split.

Issue 12's "every CATE kind within 1.1x of the constant DP ATE" is missed on trials without
heterogeneity (1.12-1.81x at n 2*10^4, eps 4 and n 10^5, eps 1): the whole-data anchor gets 35 %
of eps there, because the DRLearner target needs the rest for the effect model. A charged test
before the split could send the whole budget to the anchor when no heterogeneity is found, and
keep the split when it is. It pays only if the test finds strong heterogeneity at a small share
of eps. This module measures that power; it releases nothing and is not a mechanism.

The test (every stand-in below is *optimistic*: a real mechanism would pay for it, so the power
measured here is an upper bound):

* pseudo-outcomes ``psi_i`` on every row, centred at ``theta`` (stand-in for the anchor's DP
  ATE: the sample mean): ``plain`` is ``(A/p - (1-A)/(1-p)) (Y - c)`` with ``c`` the mean of Y;
  ``dr`` adds per-arm linear outcome models fitted by OLS on the other half of the rows
  (stand-in for the anchor's DP linear models, cross-fitted);
* ``r_i = clip(psi_i - theta, -K, K)``, K the 0.98 quantile of ``|psi - theta|`` (stand-in for
  a charged DP quantile);
* covariates ``z_ij`` in [-1, 1]: a binary flag ``2 b - 1``, a continuous covariate ``2 F(x) - 1``
  with its empirical CDF (stand-in for the DP CDF of ``quantile_bins``);
* ``S_j = sum_i r_i z_ij``: replace-one L2 sensitivity ``2 K sqrt(q)``; the analytic Gaussian
  mechanism at the test's share of (eps, delta) (the service splits budgets linearly);
* ``T = sum_j S~_j^2 / (n mean(r^2) + sigma^2)`` (mean(r^2) bounds each coordinate's sampling
  variance, since z^2 <= 1; stand-in for a DP second moment), heterogeneity declared where T
  exceeds the chi-square(q) 0.95 quantile.

Per cell: the rejection rate (false positives on ``rct_none``, power on ``rct_strong``) and the
mean non-centrality ``sum_j S_j^2 / (n mean(r^2) + sigma^2)`` of the noise-free scores.

    python -m bench.het_test --reps 20
    python -m bench.het_test --quick          # CI smoke
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.stats import chi2

from bench.common import write_result
from bench.studies import N_BINARY, RCT_PROBABILITY, STUDIES
from service.mechanisms.calibration import analytic_gaussian_multiplier, default_delta
from service.mechanisms.domain import PublicDomain
from service.mechanisms.effect_screen import scaled_covariates

FloatArray = NDArray[np.float64]
CELLS = ((20000, 4.0), (100000, 1.0), (50000, 1.0), (20000, 1.0))
SHARES = (0.03, 0.05, 0.1)
LEVEL = 0.95
CLIP_QUANTILE = 0.98
# The charged variants: the Gaussian vector's part of the test budget (two DP quantiles the rest).
VECTOR_SHARE = 0.75


def scaled(x: FloatArray, domain: PublicDomain) -> FloatArray:
    """Binary flags to +-1 (``effect_screen``'s box scaling), continuous covariates to
    2 F - 1 by their empirical CDF."""
    z = scaled_covariates(x, domain.x_lower, domain.x_upper)
    n = x.shape[0]
    for j in range(N_BINARY, x.shape[1]):
        ranks = np.argsort(np.argsort(x[:, j], kind="stable"), kind="stable")
        z[:, j] = 2.0 * (ranks + 0.5) / n - 1.0
    return z


def _ols_arm(x: FloatArray, y: FloatArray) -> FloatArray:
    design = np.column_stack([np.ones(x.shape[0]), x])
    return np.asarray(np.linalg.lstsq(design, y, rcond=None)[0], dtype=np.float64)


def pseudo_outcomes(
    x: FloatArray, a: FloatArray, y: FloatArray, kind: str, domain: PublicDomain
) -> FloatArray:
    """Trial pseudo-outcomes with the declared p: ``plain`` (Y centred at its mean), ``median``
    (at its median: the charged variants, whose centre is a DP quantile) or cross-fitted
    ``dr``."""
    p = RCT_PROBABILITY
    weight = a / p - (1.0 - a) / (1.0 - p)
    if kind == "plain":
        return np.asarray(weight * (y - y.mean()), dtype=np.float64)
    if kind == "median":
        return np.asarray(weight * (y - float(np.median(y))), dtype=np.float64)
    z = scaled(x, domain)
    n = y.size
    half = np.arange(n) < n // 2
    psi = np.empty(n)
    for fit, at in ((half, ~half), (~half, half)):
        w1 = _ols_arm(z[fit & (a == 1)], y[fit & (a == 1)])
        w0 = _ols_arm(z[fit & (a == 0)], y[fit & (a == 0)])
        design = np.column_stack([np.ones(int(at.sum())), z[at]])
        mu1, mu0 = design @ w1, design @ w0
        mu_a = np.where(a[at] == 1.0, mu1, mu0)
        psi[at] = mu1 - mu0 + weight[at] * (y[at] - mu_a)
    return psi


def statistic(
    r: FloatArray, z: FloatArray, sigma: float, rng: np.random.Generator
) -> tuple[float, float]:
    """(T with the noisy scores, the noise-free non-centrality)."""
    scores = r @ z
    spread = r.size * float(np.mean(r * r)) + sigma * sigma
    noisy = scores + sigma * rng.standard_normal(scores.size)
    return float(np.sum(noisy**2) / spread), float(np.sum(scores**2) / spread)


def charged_statistic(
    r: FloatArray,
    z: FloatArray,
    bound: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """The centred test with every part paid for except the two quantiles' accuracy: one
    Gaussian release of ``(sum r, sum r z, K sum z)`` (replace-one L2 sensitivity
    ``2 K sqrt(2 q + 1)``) at ``VECTOR_SHARE`` of the test's budget (the rest pays the two DP
    quantiles: the outcome's centre and K), then ``C = S - (S_0 / n) Z`` and
    ``T = C' V^-1 C`` with V the null covariance from released values only (post-processing).
    Returns (T, the noise-free non-centrality ``|S - mean(r) Z|^2 / (n K^2 + sigma^2)``)."""
    n, q = z.shape
    multiplier = analytic_gaussian_multiplier(VECTOR_SHARE * epsilon, VECTOR_SHARE * delta)
    sigma = multiplier * 2.0 * bound * math.sqrt(2 * q + 1)
    s0 = float(r.sum()) + sigma * float(rng.standard_normal())
    s = r @ z + sigma * rng.standard_normal(q)
    zsum = z.sum(axis=0) + (sigma / bound) * rng.standard_normal(q)
    m, zbar = s0 / n, zsum / n
    centred = s - m * zsum
    cov = (sigma**2 * (1.0 + (m / bound) ** 2) + n * bound**2) * np.eye(q)
    cov += sigma**2 * np.outer(zbar, zbar)
    t = float(centred @ np.linalg.solve(cov, centred))
    exact = r @ z - float(r.mean()) * z.sum(axis=0)
    return t, float(np.sum(exact**2) / (n * bound**2 + sigma**2))


def run(reps: int, cells: tuple[tuple[int, float], ...], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for n, epsilon in cells:
        delta = default_delta(n)
        for study_name in ("rct_none", "rct_strong"):
            study = STUDIES[study_name]
            counts: dict[tuple[str, float], list[tuple[bool, float]]] = {}
            clips: dict[str, list[float]] = {}
            for _ in range(reps):
                arrays, _ = study.sample(n, rng)
                domain = study.domain(n)
                z = scaled(arrays.x, domain)
                z_box = scaled_covariates(arrays.x, domain.x_lower, domain.x_upper)
                q = z.shape[1]
                threshold = float(chi2.ppf(LEVEL, q))
                for kind in ("plain", "dr", "charged_cdf", "charged_box"):
                    if kind.startswith("charged"):
                        centred = pseudo_outcomes(arrays.x, arrays.a, arrays.y, "median", domain)
                    else:
                        psi = pseudo_outcomes(arrays.x, arrays.a, arrays.y, kind, domain)
                        centred = psi - psi.mean()
                    bound = float(np.quantile(np.abs(centred), CLIP_QUANTILE))
                    clips.setdefault(kind, []).append(bound)
                    r = np.clip(centred, -bound, bound)
                    for share in SHARES:
                        if kind.startswith("charged"):
                            zz = z if kind == "charged_cdf" else z_box
                            t, lam = charged_statistic(
                                r, zz, bound, share * epsilon, share * delta, rng
                            )
                        else:
                            multiplier = analytic_gaussian_multiplier(
                                share * epsilon, share * delta
                            )
                            sigma = multiplier * 2.0 * bound * math.sqrt(q)
                            t, lam = statistic(r, z, sigma, rng)
                        counts.setdefault((kind, share), []).append((t > threshold, lam))
            for (kind, share), values in counts.items():
                rows.append(
                    {
                        "n": n,
                        "epsilon": epsilon,
                        "study": study_name,
                        "pseudo_outcome": kind,
                        "share": share,
                        "reps": reps,
                        "rejection_rate": float(np.mean([v[0] for v in values])),
                        "noncentrality": float(np.mean([v[1] for v in values])),
                        "clip_K": float(np.mean(clips[kind])),
                    }
                )
                print(
                    f"n {n:6d} eps {epsilon:g} {study_name:10s} {kind:11s} share {share:<4g} "
                    f"reject {rows[-1]['rejection_rate']:.2f} "
                    f"noncentrality {rows[-1]['noncentrality']:7.1f} K {rows[-1]['clip_K']:.1f}",
                    flush=True,
                )
    return {"level": LEVEL, "clip_quantile": CLIP_QUANTILE, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261128)
    parser.add_argument("--name", default="het_test")
    args = parser.parse_args(argv)
    if args.quick:
        result = run(1, ((5000, 4.0),), args.seed)
    else:
        result = run(args.reps, CELLS, args.seed)
    print(write_result(args.name, result, quick=args.quick, module="bench.het_test"))


if __name__ == "__main__":
    main()
