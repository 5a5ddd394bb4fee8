"""DP-EBM folds of the observational strict ATE default: the spec's against the outcome-heavy.

On the realistic observational studies (``bench.studies``: 36 covariates, confounded, skewed
outcome, honest bounds), per cell (n, epsilon, heterogeneity) and repetition a fresh sample, and
on that same sample one strict ``ate`` default release (DP-EBM nuisances, declared clip) per fold
set, pinned through ``fold_fractions``:

* ``spec``: (0.25, 0.25, 0.5), propensity / outcome / estimation (the default below
  ``ate_strict.DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON``);
* ``outcome_heavy``: ``ate_strict.dp_ebm_outcome_folds(n)``, (0.1, 0.4, 0.5) (the default from
  it on).

Figures per fold set: bias, sd and RMSE of the estimate against the true ATE, mean CI
half-width, the share of intervals covering the true ATE (with its binomial s.e.), and RMSE
ratio outcome_heavy / spec. The estimation fold is the same size in both, so the half-widths
differ only through the DP variance estimate. Both sets run on the same samples, so their
difference is the folds' (and the DP noise's), not the samples'.

    python -m bench.ate_folds --n 1000,5000,20000 --eps 1,4 --het none,strong --reps 30 \\
        --workers 2
    python -m bench.ate_folds --quick     # CI smoke: n 1000, eps 4, none, 1 rep
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import interval_line, interval_summary, write_result
from bench.realistic import ate_release
from bench.studies import STUDIES
from service.mechanisms import ate_strict
from service.releases.kinds.ate import AteParams


def fold_sets(n: int) -> dict[str, tuple[float, ...]]:
    heavy = ate_strict.dp_ebm_outcome_folds(n)
    sets: dict[str, tuple[float, ...]] = {"spec": ate_strict.DEFAULT_FOLDS_OBSERVATIONAL}
    if heavy is not None:
        sets["outcome_heavy"] = heavy
    return sets


def run_cell(n: int, epsilon: float, het: str, reps: int, seed: int) -> dict[str, Any]:
    study = STUDIES[het]
    domain = study.domain(n)
    truth = study.true_ate
    rng = np.random.default_rng(seed)
    sets = fold_sets(n)
    errors: dict[str, list[float]] = {name: [] for name in sets}
    halves: dict[str, list[float]] = {name: [] for name in sets}
    for _ in range(reps):
        arrays, _ = study.sample(n, rng)
        for name, folds in sets.items():
            estimate, half, _ = ate_release(
                arrays, domain, AteParams(epsilon=epsilon, nuisance="dp_ebm", fold_fractions=folds)
            )
            errors[name].append(estimate - truth)
            halves[name].append(half)
    out: dict[str, Any] = {
        "n": n,
        "epsilon": epsilon,
        "heterogeneity": het,
        "default": "outcome_heavy"
        if ate_strict.default_fold_fractions(domain, "dp_ebm", epsilon=epsilon)
        != ate_strict.DEFAULT_FOLDS_OBSERVATIONAL
        else "spec",
        "folds": {name: list(folds) for name, folds in sets.items()},
        "rows": {name: interval_summary(errors[name], halves[name]) for name in sets},
    }
    if "outcome_heavy" in sets:
        out["rmse_ratio"] = out["rows"]["outcome_heavy"]["rmse"] / out["rows"]["spec"]["rmse"]
    return out


def _cell(job: tuple[int, float, str, int, int]) -> dict[str, Any]:
    with threadpool_limits(1):
        return run_cell(*job)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke")
    parser.add_argument("--n", default="1000,5000,20000")
    parser.add_argument("--eps", default="1,4")
    parser.add_argument("--het", default="none,strong")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--workers", type=int, default=1, help="cells run at once")
    parser.add_argument("--name", default="ate_folds")
    args = parser.parse_args(argv)
    ns = (1000,) if args.quick else tuple(int(v) for v in args.n.split(","))
    epsilons = (4.0,) if args.quick else tuple(float(v) for v in args.eps.split(","))
    hets = ("none",) if args.quick else tuple(args.het.split(","))
    reps = 1 if args.quick else args.reps
    started = time.perf_counter()
    jobs = [
        (n, epsilon, het, reps, args.seed + 1000 * index + n + round(100 * epsilon))
        for n in ns
        for epsilon in epsilons
        for index, het in enumerate(hets)
    ]
    # the slowest cells (largest n) first, so the workers finish together
    jobs.sort(key=lambda job: -job[0])
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        cells = list(pool.map(_cell, jobs))
    for cell in cells:
        line = " | ".join(f"{name} {interval_line(r)}" for name, r in cell["rows"].items())
        print(f"n {cell['n']} eps {cell['epsilon']:g} {cell['heterogeneity']}: {line}")
    write_result(
        args.name,
        {"reps": reps, "cells": cells, "seconds": time.perf_counter() - started},
        quick=args.quick,
        module="bench.ate_folds",
    )


if __name__ == "__main__":
    main()
