"""`uplift_table` at declared cut points against equal-width bins, on a skewed effect modifier.

The walkthrough's complaint: `bins` cuts each covariate into equal widths of its declared range,
and a skewed lab declared with its honest range (creatinine 0.2-15 mg/dl, median 1.0) puts
nearly every patient in the first cell, so the table cannot show the effect changing with it.
`cut_points` takes the thresholds an analyst would cut at anyway (public, from the request).

On the realistic trials (``bench.studies``: randomised, 36 covariates, skewed outcome, honest
bounds), an uplift table over two effect modifiers, age and creatinine, with the same number of
cells (4 x 4 = 16) either way:

* ``regular``: ``bins`` 4 on age and on creatinine (equal widths of 18-100 and 0.2-15);
* ``cut_points``: age at 50 / 65 / 80 and creatinine at 0.7 / 1.0 / 1.5 (clinical thresholds
  fixed before looking at any data, not the sample's quantiles);
* ``quantile_cuts``: each cut at its DP quartiles (10 % of epsilon buys them; the oracle and the
  crowding are those of the first release's grid).

Per release, the PEHE on a fresh population sample beside: the constant DP ATE (the strict
``ate`` default on the same sample, for every patient), the constant true ATE, and each grid's
**oracle**: the true mean CATE in each cell (a large reference sample; non-private, never a
release), which is the best any table on that grid can do.

    python -m bench.uplift_cuts --reps 10
    python -m bench.uplift_cuts --quick        # CI smoke
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from bench.common import write_result
from bench.realistic import ate_release
from bench.studies import CREATININE, N_BINARY, STUDIES, Study
from service.mechanisms import uplift
from service.mechanisms.noise import OpenDPSampler, secure_rng
from service.releases.kinds.ate import AteParams
from service.releases.kinds.uplift_table import UpliftTableKind, UpliftTableRequest

AGE = N_BINARY
CUT_POINTS = {"age": [50.0, 65.0, 80.0], "creatinine": [0.7, 1.0, 1.5]}
BINS = 4
CELLS = ((5000, 1.0), (5000, 4.0), (20000, 1.0), (20000, 4.0))
HETEROGENEITY = ("rct_strong", "rct_none")
TEST_N = 20_000
REFERENCE_N = 400_000

FloatArray = NDArray[np.float64]


def requests(epsilon: float, q: int) -> dict[str, UpliftTableRequest]:
    bins = [1] * q
    bins[AGE] = bins[CREATININE] = BINS
    return {
        "regular": UpliftTableRequest(epsilon=epsilon, bins=bins),
        "cut_points": UpliftTableRequest(epsilon=epsilon, cut_points=CUT_POINTS),
        "quantile_cuts": UpliftTableRequest(
            epsilon=epsilon, quantile_cuts={"age": BINS, "creatinine": BINS}
        ),
    }


def _cells(grid: dict[str, Any], x: FloatArray) -> NDArray[np.int64]:
    """Each row's cell on a released grid (the lookup's own rule)."""
    cells = int(np.prod(grid["bins"]))
    return uplift.predict({"grid": grid, "uplift": list(range(cells))}, x).astype(np.int64)


def oracle(study: Study, grid: dict[str, Any], x_test: FloatArray, seed: int) -> FloatArray:
    """The best table on ``grid``: each cell's true mean CATE (reference sample), looked up."""
    arrays, tau = study.sample(REFERENCE_N, np.random.default_rng(seed))
    cells = _cells(grid, arrays.x)
    total = np.bincount(cells, weights=tau, minlength=int(np.prod(grid["bins"])))
    count = np.bincount(cells, minlength=total.size)
    means = np.where(count > 0, total / np.maximum(count, 1), float(np.mean(tau)))
    return np.asarray(means[_cells(grid, x_test)], np.float64)


def largest_share(edges: list[float], values: FloatArray) -> float:
    """The share of ``values`` in the most crowded cell of one covariate's edges."""
    index = np.searchsorted(np.asarray(edges[1:-1], np.float64), values, side="right")
    return float(np.bincount(index).max() / values.size)


def pehe(estimate: FloatArray | float, truth: FloatArray) -> float:
    return float(np.sqrt(np.mean((np.asarray(estimate) - truth) ** 2)))


def run_cell(n: int, epsilon: float, het: str, reps: int, seed: int) -> dict[str, Any]:
    study = STUDIES[het]
    domain = study.domain(n)
    rng = np.random.default_rng(seed)
    test, tau_test = study.sample(TEST_N, np.random.default_rng(seed + 1))
    x_test = test.x
    kind = UpliftTableKind()
    options = {"noise": OpenDPSampler(), "progress": lambda f, s: None}
    scores: dict[str, list[float]] = {
        name: [] for name in ("regular", "cut_points", "quantile_cuts", "constant_dp_ate")
    }
    crowded: dict[str, float] = {}
    oracles: dict[str, float] = {}
    for rep in range(reps):
        arrays, _ = study.sample(n, rng)
        for name, request in requests(epsilon, domain.q).items():
            out = kind.run(arrays, domain, request, rng=secure_rng(), **options)
            scores[name].append(pehe(uplift.predict(out, x_test), tau_test))
            if rep == 0:
                grid = out["grid"]
                oracles[name] = pehe(oracle(study, grid, x_test, seed + 2), tau_test)
                edges = grid.get("edges") or uplift.regular_edges(domain, tuple(grid["bins"]))
                crowded[name] = largest_share(edges[CREATININE], x_test[:, CREATININE])
        estimate, _, _ = ate_release(arrays, domain, AteParams(epsilon=epsilon))
        scores["constant_dp_ate"].append(pehe(estimate, tau_test))
    constant_true = pehe(study.true_ate, tau_test)
    dp = float(np.mean(scores["constant_dp_ate"]))
    rows = {
        name: {
            "pehe": float(np.mean(values)),
            "pehe_se": float(np.std(values, ddof=1) / np.sqrt(len(values))) if reps > 1 else None,
            "over_constant_dp_ate": float(np.mean(values)) / dp,
        }
        for name, values in scores.items()
    }
    for name in ("regular", "cut_points", "quantile_cuts"):
        rows[name]["oracle_pehe"] = oracles[name]
        rows[name]["largest_creatinine_cell_share"] = crowded[name]
    return {
        "n": n,
        "epsilon": epsilon,
        "heterogeneity": het,
        "sd_tau": study.facts["sd_tau"],
        "constant_true_ate_pehe": constant_true,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument(
        "--cells", default=",".join(f"{n}:{e:g}" for n, e in CELLS), help="n:eps,n:eps,..."
    )
    parser.add_argument("--het", default=",".join(HETEROGENEITY))
    parser.add_argument("--name", default="uplift_cuts")
    args = parser.parse_args(argv)
    cells = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in args.cells.split(",")]
    levels = args.het.split(",")
    reps = args.reps
    if args.quick:
        cells, levels, reps = [(2000, 4.0)], ["rct_strong"], 2
    results = []
    with threadpool_limits(1):
        for i, (n, epsilon) in enumerate(cells):
            for j, het in enumerate(levels):
                cell = run_cell(n, epsilon, het, reps, args.seed + 100 * i + 10 * j)
                results.append(cell)
                line = " | ".join(
                    f"{name} {row['pehe']:.3f} ({row['over_constant_dp_ate']:.2f}x"
                    + (f", oracle {row['oracle_pehe']:.3f}" if "oracle_pehe" in row else "")
                    + ")"
                    for name, row in cell["rows"].items()
                )
                print(
                    f"n {n} eps {epsilon:g} {het}: true-ATE constant "
                    f"{cell['constant_true_ate_pehe']:.3f} | {line}"
                )
                write_result(
                    args.name,
                    {"reps": reps, "cells": results, "complete": False},
                    quick=args.quick,
                    module="bench.uplift_cuts",
                )
    print(
        write_result(
            args.name,
            {"reps": reps, "cells": results, "complete": True},
            quick=args.quick,
            module="bench.uplift_cuts",
        )
    )


if __name__ == "__main__":
    main()
