"""Design probe: a linear second stage from noisy sufficient statistics with a charged clip.

Not a release kind. Issue 12 asks every CATE kind to beat the constant DP ATE by >= 20 % where
sd(tau) >= 0.5 sd(Y) and n epsilon >= 10^4; on the realistic studies (``bench/studies.py``: 36
covariates, a CATE mostly linear in them) ``cate_vector`` and ``cate_function`` fall back to the
constant there (a James-Stein factor of 0), because their noise is calibrated to the declared
outcome range and their public ridge rule shrinks the linear part away. This probe measures a
candidate replacement, every step of it differentially private, on the same studies:

* rows split in two halves A and B (parallel composition: each half spends the whole epsilon);
* half A: per-arm DP ridge outcome models from noisy sufficient statistics (``dp_linear``), at
  half of epsilon, and on observational designs a DP logistic propensity (output perturbation,
  public clip 0.05) at the other half (RCT: the public probability, the ridge gets all of it);
* half B: AIPW pseudo-outcomes ``Gamma``; a DP 0.9-quantile of ``|Gamma|`` (OpenDP's
  ``make_private_quantile``, 10 % of epsilon) sets the clip ``K = min(B, c Q)`` for each public
  factor ``c``; then one ridge regression of ``clip(Gamma, -K, K)`` on the public unit-ball
  features from noisy sufficient statistics (``dp_linear.DpRidge``, 90 % of epsilon);
* tau_hat(x) = K z(x)' w, against the constant true ATE, the constant DP ATE (the ``ate``
  kind's default release at the whole epsilon), ``cate_vector`` at its defaults and the
  non-private T-learner.

Every figure is PEHE on 2000 test rows. The clip factor ``c`` is the probe's free choice; the
worst-case clip ``B`` (the declared bound) is run beside it.

    python -m bench.cate_basis                 # RCT and observational, strong and none, 3 reps
    python -m bench.cate_basis --quick         # one small cell
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.common import write_result
from bench.realistic import ate_release, cate_release, pehe, t_learner
from bench.studies import Study
from service.mechanisms import dp_linear
from service.mechanisms.noise import OpenDPSampler
from service.releases.kinds.ate import AteParams

DELTA = 1e-6
QUANTILE_SHARE = 0.1
QUANTILE_LEVEL = 0.9
PROPENSITY_CLIP = 0.05
CLIP_FACTORS = (0.75, 1.25, 2.5)

FloatArray = NDArray[np.float64]


def linear_cate(
    x: FloatArray,
    a: FloatArray,
    y: FloatArray,
    study: Study,
    n: int,
    epsilon: float,
    factors: tuple[float, ...],
) -> dict[str, Any]:
    """The probe's pipeline on one sample; one second stage per clip factor (each at the
    whole of half B's budget: alternatives, not a composition)."""
    domain = study.domain(n)
    noise = OpenDPSampler()
    z = dp_linear.unit_ball_features(x, domain.x_lower, domain.x_upper)
    half = n // 2
    za, zb = z[:half], z[half:]
    ridge_share = 1.0 if study.randomised else 0.5
    ridge = dp_linear.DpRidge.plan(half, z.shape[1], ridge_share * epsilon, DELTA / 2)
    w0, w1 = ridge.release(
        za, a[:half], y[:half], y_lower=domain.y_lower, y_upper=domain.y_upper, noise=noise
    )
    mid = (domain.y_lower + domain.y_upper) / 2.0
    radius = (domain.y_upper - domain.y_lower) / 2.0
    mu0, mu1 = mid + radius * (zb @ w0), mid + radius * (zb @ w1)
    if study.randomised:
        pi = np.full(n - half, float(domain.treatment_probability or 0.5))
        clip = min(pi[0], 1.0 - pi[0])
    else:
        lam = dp_linear.default_regularization(half)
        logistic = dp_linear.DpLogistic.plan(half, z.shape[1], 0.5 * epsilon, DELTA / 2, lam)
        w = logistic.release(za, a[:half], noise)
        pi = np.clip(dp_linear.predict_propensity(w, zb), PROPENSITY_CLIP, 1 - PROPENSITY_CLIP)
        clip = PROPENSITY_CLIP
    ab, yb = a[half:], y[half:]
    gamma = mu1 - mu0 + ab * (yb - mu1) / pi - (1.0 - ab) * (yb - mu0) / (1.0 - pi)
    bound = domain.outcome_range * (1.0 + 1.0 / clip)  # |Gamma| <= R (1 + 1 / c)
    grid = np.geomspace(bound / 1000.0, bound, 200)
    quantile = noise.quantile(
        np.abs(gamma), candidates=grid, level=QUANTILE_LEVEL, epsilon=QUANTILE_SHARE * epsilon
    )
    fits: dict[str, Any] = {"dp_quantile": quantile, "bound": bound}
    second = dp_linear.DpRidge.plan(n - half, z.shape[1], (1 - QUANTILE_SHARE) * epsilon, DELTA)
    clips = {f"c={c:g}": min(bound, c * quantile) for c in factors} | {"declared": bound}
    for label, k in clips.items():
        ones = np.ones(n - half)
        _, weights = second.release(zb, ones, gamma, y_lower=-k, y_upper=k, noise=noise)
        fits[label] = (k, weights)
    return fits


def run_cell(het: str, n: int, epsilon: float, reps: int, test_n: int) -> dict[str, Any]:
    study = Study(het)
    domain = study.domain(n)
    rng = np.random.default_rng(np.random.SeedSequence([20261126, n, round(epsilon * 100)]))
    rows: dict[str, list[float]] = {}
    quantiles: list[float] = []
    started = time.perf_counter()
    for _ in range(reps):
        arrays, _ = study.sample(n, rng)
        test, _ = study.sample(test_n, rng)
        truth = study.tau_true(test.x)
        dp_ate, _, _ = ate_release(arrays, domain, AteParams(epsilon=epsilon))
        found = {
            "constant_true_ate": pehe(np.full(test_n, study.true_ate), truth),
            "constant_dp_ate": pehe(np.full(test_n, dp_ate), truth),
            "t_learner": pehe(t_learner(arrays, test.x, seed=0), truth),
            "cate_vector": pehe(
                cate_release("cate_vector", arrays, domain, epsilon, test.x, dp_ate), truth
            ),
        }
        fits = linear_cate(arrays.x, arrays.a, arrays.y, study, n, epsilon, CLIP_FACTORS)
        quantiles.append(float(fits.pop("dp_quantile")))
        fits.pop("bound")
        z_test = dp_linear.unit_ball_features(test.x, domain.x_lower, domain.x_upper)
        for label, (k, weights) in fits.items():
            found[f"linear {label}"] = pehe(k * (z_test @ weights), truth)
        for key, value in found.items():
            rows.setdefault(key, []).append(value)
    constant = float(np.mean(rows["constant_dp_ate"]))
    return {
        "heterogeneity": het,
        "n": n,
        "epsilon": epsilon,
        "reps": reps,
        "dp_quantile_abs_gamma": quantiles,
        "pehe": {key: float(np.mean(values)) for key, values in rows.items()},
        "pehe_values": rows,
        "ratio_to_constant_dp_ate": {
            key: float(np.mean(values)) / constant for key, values in rows.items()
        },
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        cells = [("rct_strong", 2000, 4.0)]
        reps = 1
    else:
        cells = [
            (het, n, eps)
            for het in ("rct_strong", "strong", "rct_none", "none")
            for n, eps in ((5000, 4.0), (20000, 1.0), (20000, 4.0))
        ]
        reps = args.reps
    out = []
    for het, n, eps in cells:
        cell = run_cell(het, n, eps, reps, 2000)
        out.append(cell)
        ratios = {k: round(v, 2) for k, v in cell["ratio_to_constant_dp_ate"].items()}
        print(json.dumps({"cell": [het, n, eps], "ratio": ratios}), flush=True)
    write_result(
        "cate_basis",
        {
            "delta": DELTA,
            "quantile_share": QUANTILE_SHARE,
            "clip_factors": list(CLIP_FACTORS),
            "cells": out,
        },
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
