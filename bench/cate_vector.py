"""DP-CATE finite-query vectors: PEHE vs epsilon on the DP-CATE synthetic DGPs (benchmarks.md §5).

DS1 (p = 2, theta = exp(2 x0) + 3 sin(4 x0)) and DS2 (p = 30, theta = exp(2 x0) + 3 sin(4 x1)):
X ~ U[0, 1]^p, A = 1{X'beta >= eta}, Y = theta(X) A + X'gamma + eps, eta, eps ~ U[-1, 1],
beta / gamma sparse (support 3, entries U[0, 0.3] / U[0, 1]). 3000 samples: 90% train, the
10% test X are the d = 300 query points (quick: d = 50). Public bounds: X in [0, 1]^p,
Y in [-1, 5.45 + 3 + 1]. PEHE = sqrt(mean_j (g(x_j) - theta(x_j))^2) (the root is taken).

R and DR learners, ``paper`` (Theorem 1, heuristic) and ``strict`` (DP-EBM nuisances + ridge
output perturbation, proven) side by side, through the mechanism code directly.

    python -m bench.cate_vector            # reduced grid (see README for the sizes)
    python -m bench.cate_vector --quick    # DS1, R, strict eps {1, 10}, paper eps 10, d = 50
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.common import write_result
from service.mechanisms import cate_vector as cv
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import OpenDPSampler

Y_LOWER, Y_UPPER = -1.0, 5.45 + 3.0 + 1.0


def theta(name: str, x: NDArray[np.float64]) -> NDArray[np.float64]:
    if name == "DS1":
        return np.asarray(np.exp(2 * x[:, 0]) + 3 * np.sin(4 * x[:, 0]))
    return np.asarray(np.exp(2 * x[:, 0]) + 3 * np.sin(4 * x[:, 1]))


def sample(name: str, n: int, rng: np.random.Generator) -> tuple[Arrays, NDArray[np.float64]]:
    p = 2 if name == "DS1" else 30
    coef = np.random.default_rng(2025 + p)
    beta, gamma = np.zeros(p), np.zeros(p)
    support = coef.choice(p, size=min(3, p), replace=False)
    beta[support] = coef.uniform(0, 0.3, support.size)
    gamma[coef.choice(p, size=min(3, p), replace=False)] = coef.uniform(0, 1, min(3, p))
    x = rng.uniform(0, 1, (n, p))
    a = (x @ beta >= rng.uniform(-1, 1, n)).astype(np.float64)
    y = np.clip(theta(name, x) * a + x @ gamma + rng.uniform(-1, 1, n), Y_LOWER, Y_UPPER)
    return Arrays(x, a, y), x


def one(
    name: str, mode: str, learner: str, epsilon: float, d: int, seed: int, total: int = 3000
) -> float:
    rng = np.random.default_rng(seed)
    data, _ = sample(name, total, rng)
    train = total - 300
    arrays = Arrays(data.x[:train], data.a[:train], data.y[:train])
    points = data.x[train : train + d]
    p = data.x.shape[1]
    domain = PublicDomain(
        x_lower=np.zeros(p),
        x_upper=np.ones(p),
        y_lower=Y_LOWER,
        y_upper=Y_UPPER,
        n=train,
        allow_paper_mode=True,
    )
    params = cv.CateVectorParams(
        points=tuple(tuple(float(v) for v in row) for row in points),
        epsilon=epsilon,
        delta=1e-5,
        learner=learner,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        ridge=0.1 if mode == "strict" else 1e-3,
    )
    result = cv.run(
        arrays, domain, params, rng=rng, noise=OpenDPSampler(), progress=lambda f, s: None
    )
    estimates = np.asarray(result["estimates"])
    return float(math.sqrt(np.mean((estimates - theta(name, points)) ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        datasets, epsilons, reps, d = ["DS1"], [1.0, 10.0], 1, 50
        learners: tuple[str, ...] = ("r",)
        totals: tuple[int, ...] = (3000,)
    else:
        datasets, epsilons, reps, d = ["DS1", "DS2"], [1.0, 5.0, 10.0, 50.0], 1, 300
        learners, totals = ("r", "dr"), (3000, 30000)
    rows: list[dict[str, Any]] = []
    started = time.time()
    plan: list[tuple[int, str, str, list[float]]] = []
    for total in totals:
        for name in datasets if total == 3000 else ["DS1"]:
            for mode in ("strict", "paper") if total == 3000 else ("strict",):
                grid = epsilons if total == 3000 else [1.0, 10.0]
                if name == "DS2" and mode == "paper" and not args.quick:
                    grid = [1.0, 10.0]  # the sup search in 30 dimensions is slow (README)
                if args.quick and mode == "paper":
                    grid = [10.0]
                plan.append((total, name, mode, grid))
    for total, name, mode, grid in plan:
        for learner in learners:
            for epsilon in grid:
                values = [one(name, mode, learner, epsilon, d, 100 + r, total) for r in range(reps)]
                row = {
                    "dataset": name,
                    "n": total,
                    "mode": mode,
                    "learner": learner,
                    "epsilon": epsilon,
                    "pehe_mean": float(np.mean(values)),
                    "pehe_runs": values,
                }
                rows.append(row)
                print(row, flush=True)
                # written after every row, so an interrupted run keeps what it measured
                out = write_result(
                    "cate_vector",
                    {
                        "setting": {
                            "n": list(totals),
                            "test_queries": d,
                            "delta": 1e-5,
                            "reps": reps,
                            "ridge_strict": 0.1,
                            "ridge_paper": 1e-3,
                            "n_features": 50,
                            "lengthscale": 0.3,
                            "pehe": "root mean squared error at the queries",
                        },
                        "rows": rows,
                        "seconds": round(time.time() - started, 1),
                        "complete": len(rows) == sum(len(g) * len(learners) for *_, g in plan),
                    },
                    quick=args.quick,
                )
    print(out)


if __name__ == "__main__":
    main()
