"""epsilon-ADUM uplift tables: PEHE vs partition size p and epsilon (benchmarks.md §6).

DGP (Betlei et al. §3.1.1, exact): X ~ U(-1, 1), T ~ Bernoulli(0.5), Y = T sin X + N(0, s^2),
tau = sin. 20,000 points split 50/50 into train / test (harness default), s in {0.1, 1}.
Public outcome bounds [-1 - 4s, 1 + 4s] (clip and centre). Regular grids of p cells on
[-1, 1]; the service's replace-one scales (Lap(4 / eps), Lap(4 D_y / eps)) through the real
mechanism (OpenDP sampler). Test PEHE = mean over test points of (sin x - u_hat(x))^2.

Baseline (harness only, epsilon-TM): one DP linear regression per arm on polynomial features
of degree k (the Functional Mechanism for squared loss = Laplace noise on the sufficient
statistics sum(phi phi') and sum(phi y), features in [-1, 1]); replace-one calibration (a
record can leave one arm and join the other: L1 sensitivity 2 (D(D + 1) / 2 + D B)); the
degree is tuned per epsilon on the test PEHE (as the paper did; not a private procedure).

    python -m bench.uplift           # reduced grid (README)
    python -m bench.uplift --quick   # s = 0.1, eps in {1, 50}, 3 reps
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.common import write_result
from service.mechanisms import uplift as up
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler

CELLS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def sample(n: int, noise_sd: float, rng: np.random.Generator) -> Arrays:
    x = rng.uniform(-1, 1, (n, 1))
    a = (rng.uniform(size=n) < 0.5).astype(np.float64)
    y = a * np.sin(x[:, 0]) + rng.normal(0, noise_sd, n)
    return Arrays(x, a, y)


def domain(n: int, noise_sd: float) -> PublicDomain:
    bound = 1 + 4 * noise_sd
    return PublicDomain(
        x_lower=np.array([-1.0]),
        x_upper=np.array([1.0]),
        y_lower=-bound,
        y_upper=bound,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def adum_pehe(
    train: Arrays, test: NDArray[np.float64], dom: PublicDomain, p: int, epsilon: float | None
) -> float:
    if epsilon is None:  # non-private ADUM at the same p
        counts, sums = up.aggregates(train.x, train.a, train.y, dom, (p,))
        result = up.table(
            counts,
            sums,
            dom,
            up.UpliftParams(epsilon=1.0, bins=(p,)),
            count_scale=0.0,
            sum_scale=0.0,
        )
        result["grid"] = {"bins": [p], "lower": [-1.0], "upper": [1.0]}
    else:
        result = up.run(
            train,
            dom,
            up.UpliftParams(epsilon=epsilon, bins=(p,)),
            noise=OpenDPSampler(),
            progress=lambda f, s: None,
        )
    estimate = up.predict(result, test[:, None])
    return float(np.mean((np.sin(test) - estimate) ** 2))


def tm_pehe(
    train: Arrays,
    test: NDArray[np.float64],
    bound: float,
    degree: int,
    epsilon: float,
    rng: np.random.Generator,
) -> float:
    """DP two-model baseline (Functional Mechanism for linear regression, replace-one)."""
    dim = degree + 1
    sensitivity = 2.0 * (dim * (dim + 1) / 2 + dim * bound)
    scale = sensitivity / epsilon
    x, y = train.x[:, 0], np.clip(train.y, -bound, bound)
    models = []
    for arm in (0.0, 1.0):
        rows = train.a == arm
        phi = np.vander(x[rows], dim, increasing=True)
        gram = phi.T @ phi
        upper = np.triu_indices(dim)
        noisy = np.zeros((dim, dim))
        noisy[upper] = gram[upper] + rng.laplace(0, scale, len(upper[0]))
        noisy = np.triu(noisy) + np.triu(noisy, 1).T
        moment = phi.T @ y[rows] + rng.laplace(0, scale, dim)
        values, vectors = np.linalg.eigh(noisy)
        values = np.maximum(values, 1.0)  # PSD repair + ridge (post-processing)
        models.append(vectors @ ((vectors.T @ moment) / values))
    phi_test = np.vander(test, dim, increasing=True)
    estimate = phi_test @ models[1] - phi_test @ models[0]
    return float(np.mean((np.sin(test) - estimate) ** 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        sds, epsilons, reps = [0.1], [1.0, 50.0], 3
    else:
        sds, epsilons, reps = [0.1, 1.0], [0.1, 0.5, 1.0, 2.0, 5.0, 50.0, 100.0], 10
    rows: list[dict[str, Any]] = []
    started = time.time()
    for sd in sds:
        dom = domain(10000, sd)
        for epsilon in [*epsilons, None]:
            curve = []
            for p in CELLS:
                values = []
                for r in range(reps):
                    rng = np.random.default_rng(1000 * r + 7)
                    data = sample(20000, sd, rng)
                    train = Arrays(data.x[:10000], data.a[:10000], data.y[:10000])
                    values.append(adum_pehe(train, data.x[10000:, 0], dom, p, epsilon))
                curve.append(float(np.mean(values)))
            best = int(np.argmin(curve))
            row: dict[str, Any] = {
                "noise_sd": sd,
                "epsilon": epsilon,
                "cells": list(CELLS),
                "pehe": curve,
                "best_cells": CELLS[best],
                "best_pehe": curve[best],
            }
            if epsilon is not None:
                rule = up.suggested_bins(dom, epsilon, lipschitz=1.0, noise_sd=sd)
                rule_p = int(rule["suggested_cells"])
                values = []
                for r in range(reps):
                    rng = np.random.default_rng(1000 * r + 7)
                    data = sample(20000, sd, rng)
                    train = Arrays(data.x[:10000], data.a[:10000], data.y[:10000])
                    values.append(adum_pehe(train, data.x[10000:, 0], dom, rule_p, epsilon))
                row["rule_cells"] = rule_p
                row["rule_pehe"] = float(np.mean(values))
                tm = {}
                for degree in (1, 2, 3, 4, 5):
                    runs = []
                    for r in range(reps):
                        rng = np.random.default_rng(1000 * r + 7)
                        data = sample(20000, sd, rng)
                        train = Arrays(data.x[:10000], data.a[:10000], data.y[:10000])
                        runs.append(
                            tm_pehe(
                                train,
                                data.x[10000:, 0],
                                1 + 4 * sd,
                                degree,
                                epsilon,
                                np.random.default_rng(r),
                            )
                        )
                    tm[degree] = float(np.mean(runs))
                best_degree = min(tm, key=lambda k: tm[k])
                row["tm_pehe_by_degree"] = tm
                row["tm_best_degree"] = best_degree
                row["tm_best_pehe"] = tm[best_degree]
            rows.append(row)
            print({k: v for k, v in row.items() if k not in ("pehe", "cells")}, flush=True)
    out = write_result(
        "uplift",
        {
            "setting": {"n_total": 20000, "train": 10000, "reps": reps, "cells": list(CELLS)},
            "rows": rows,
            "seconds": round(time.time() - started, 1),
        },
        quick=args.quick,
    )
    print(out)


if __name__ == "__main__":
    main()
