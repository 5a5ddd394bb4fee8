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
    python -m bench.uplift --kmeans  # DP k-means partition vs regular grid (uplift_kmeans.json)
    python -m bench.uplift --kmeans --quick

``--kmeans`` (adum.md §4 (c), the paper's real-data recipe): PEHE of tables on a DP k-means
partition (DPLloyd, T = 5, eps / 2 for the k-means and eps / 2 for the table, as Betlei et al.;
both charged, the total is eps) next to tables on a regular grid that get the whole eps, at the
same total charge and the same number of cells p, on (i) the sin-uplift DGP (d = 1, uniform X:
the grid's home ground) and (ii) Niu et al.'s Setup B as an RCT (d = 6, X ~ N(0, I), public box
[-4, 4]^6, Y in [-6, 14], tau = x1 + log(1 + e^x2)), where a regular grid of m^6 cells spends
most cells on the empty tails of the box. The grid's p is m^q.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.common import write_result
from service.mechanisms import uplift as up
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler, secure_rng

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


def setup_b(n: int, rng: np.random.Generator) -> tuple[Arrays, NDArray[np.float64]]:
    """Niu et al.'s Setup B (benchmarks.md §3.1) as an RCT: e = 0.5, d = 6."""
    x = rng.normal(size=(n, 6))
    b = np.maximum.reduce([x[:, 0] + x[:, 1], x[:, 2], np.zeros(n)]) + np.maximum(
        x[:, 3] + x[:, 4], 0
    )
    tau = x[:, 0] + np.log1p(np.exp(x[:, 1]))
    a = (rng.uniform(size=n) < 0.5).astype(np.float64)
    y = b + a * tau + rng.normal(size=n)
    return Arrays(x, a, y), tau


def setup_b_domain(n: int) -> PublicDomain:
    return PublicDomain(
        x_lower=np.full(6, -4.0),
        x_upper=np.full(6, 4.0),
        y_lower=-6.0,
        y_upper=14.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def partition_pehe(
    train: Arrays,
    test_x: NDArray[np.float64],
    test_tau: NDArray[np.float64],
    dom: PublicDomain,
    params: up.UpliftParams,
) -> float:
    """One release through ``run`` (production sampler and CSPRNG init), test PEHE."""
    result = up.run(
        train, dom, params, noise=OpenDPSampler(), progress=lambda f, s: None, rng=secure_rng()
    )
    return float(np.mean((test_tau - up.predict(result, test_x)) ** 2))


def kmeans_main(quick: bool) -> None:
    """DP k-means partition vs regular grid at the same total charge (adum.md §4)."""
    started = time.time()
    rows: list[dict[str, Any]] = []
    reps = 3 if quick else 10
    sin_grid = {0.1: [0.5, 1.0, 5.0], 1.0: [0.5, 1.0, 5.0]} if not quick else {0.1: [1.0]}
    sin_cells = (4, 8, 16, 24) if not quick else (8,)
    for sd, epsilons in sin_grid.items():
        dom = domain(10000, sd)
        for epsilon in epsilons:
            for p in sin_cells:
                grid_runs, km_runs = [], []
                for r in range(reps):
                    rng = np.random.default_rng(1000 * r + 7)
                    data = sample(20000, sd, rng)
                    train = Arrays(data.x[:10000], data.a[:10000], data.y[:10000])
                    test = data.x[10000:]
                    tau = np.sin(test[:, 0])
                    grid = up.UpliftParams(epsilon=epsilon, bins=(p,))
                    km = up.UpliftParams(epsilon=epsilon, partition="kmeans", clusters=p)
                    grid_runs.append(partition_pehe(train, test, tau, dom, grid))
                    km_runs.append(partition_pehe(train, test, tau, dom, km))
                row = {
                    "setup": "sin",
                    "noise_sd": sd,
                    "epsilon_total": epsilon,
                    "cells": p,
                    "grid_pehe": float(np.mean(grid_runs)),
                    "kmeans_pehe": float(np.mean(km_runs)),
                    "grid_runs": grid_runs,
                    "kmeans_runs": km_runs,
                }
                rows.append(row)
                print({k: v for k, v in row.items() if not k.endswith("runs")}, flush=True)
    n_train, n_test = (16000, 20000) if not quick else (4000, 5000)
    dom_b = setup_b_domain(n_train)
    b_epsilons = [1.0, 2.0, 5.0] if not quick else [2.0]
    # regular grids: m cells on every covariate (p = m^6; m = 1 is the ATE), and the paper's
    # real-data baseline, a 1-D regular cut of the first covariate into m cells (p = m)
    b_grids: list[tuple[int, ...]] = (
        [(2,) * 6] if quick else [(1,) * 6, (2,) * 6, (4, 1, 1, 1, 1, 1), (8, 1, 1, 1, 1, 1)]
    )
    b_clusters = [8, 16, 32, 64] if not quick else [16]
    b_iterations = [2, 5] if not quick else [5]
    b_reps = 5 if not quick else 2
    for epsilon in b_epsilons:
        runs: dict[tuple[str, int, str], list[float]] = {}
        for r in range(b_reps):
            rng = np.random.default_rng(1000 * r + 11)
            train, _ = setup_b(n_train, rng)
            test, tau = setup_b(n_test, rng)
            test_x = np.clip(test.x, -4.0, 4.0)
            for bins in b_grids:
                params = up.UpliftParams(epsilon=epsilon, bins=bins)
                key = ("grid", int(np.prod(bins)), "bins " + "x".join(map(str, bins)))
                runs.setdefault(key, []).append(partition_pehe(train, test_x, tau, dom_b, params))
            for p in b_clusters:
                for iterations in b_iterations:
                    params = up.UpliftParams(
                        epsilon=epsilon,
                        partition="kmeans",
                        clusters=p,
                        kmeans_iterations=iterations,
                    )
                    key = ("kmeans", p, f"T = {iterations}")
                    runs.setdefault(key, []).append(
                        partition_pehe(train, test_x, tau, dom_b, params)
                    )
        for (kind, cells, detail), values in runs.items():
            row = {
                "setup": "B-rct",
                "epsilon_total": epsilon,
                "partition": kind,
                "cells": cells,
                "detail": detail,
                "pehe": float(np.mean(values)),
                "runs": values,
            }
            rows.append(row)
            print({k: v for k, v in row.items() if k != "runs"}, flush=True)
    out = write_result(
        "uplift_kmeans",
        {
            "setting": {
                "kmeans": "DPLloyd, T = 5, kmeans_share = 0.5 (eps / 2 k-means + eps / 2 table)",
                "grid": "regular grid, the whole eps on the table",
                "sin": {"n_total": 20000, "train": 10000, "reps": reps, "cells": sin_cells},
                "setup_b_rct": {
                    "train": n_train,
                    "test": n_test,
                    "reps": b_reps,
                    "box": [-4.0, 4.0],
                    "y_bounds": [-6.0, 14.0],
                },
                "sampler": "OpenDPSampler (production); k-means init from secure_rng()",
            },
            "rows": rows,
            "seconds": round(time.time() - started, 1),
        },
        quick=quick,
    )
    doc = json.loads(out.read_text())
    doc["command"] = "python -m bench.uplift --kmeans" + (" --quick" if quick else "")
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kmeans", action="store_true", help="DP k-means vs regular grid")
    args = parser.parse_args()
    if args.kmeans:
        kmeans_main(args.quick)
        return
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
                # declared: |d sin / dx| <= 1 on an axis of public width 2, so L = 2 per unit
                # of the box scaled to [0, 1] (suggested_bins' units), and the noise sd s.
                rule = up.suggested_bins(dom, epsilon, lipschitz=2.0, noise_sd=sd)
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
