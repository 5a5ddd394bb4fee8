"""How much of the confounding the observational `ate` default removes, by n * epsilon.

Issue 12's coverage target is missed on observational studies from n * epsilon = 2 * 10^4
(0.74-0.93): the DP nuisance models leave part of the confounding, and the interval, which
treats them as fixed, does not cover that bias. This benchmark states the bias in the units an
epidemiologist reads it in: against the **crude** difference of arm means on the same sample
(a non-private reference, computed here from the simulator's rows: it is never released), the
share of the crude-vs-true gap that the strict default's estimate keeps,

    left = mean(estimate - true ATE) / mean(crude - true ATE)

(0: all the confounding removed; 1: the estimate is the crude difference). Per cell, on fresh
samples of the realistic observational studies (``bench.studies``): that share, the bias of the
crude difference and of the release, the release's coverage and mean half-width, and the same
with the study's 12 confounders declared (``adjustment_columns``: the records' projection onto
them, as in ``bench.nuisance_oracle``'s ``confounders`` variant).

    python -m bench.confounding_left --reps 16
    python -m bench.confounding_left --quick        # CI smoke
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import interval_summary, write_result
from bench.nuisance_oracle import variant_data
from bench.realistic import ate_release
from bench.studies import STUDIES
from service.releases.kinds.ate import AteParams

CELLS = ((20000, 1.0), (20000, 4.0), (100000, 1.0))
HETEROGENEITY = ("none", "strong")
VARIANTS = ("default", "confounders")


def run_cell(
    n: int, epsilon: float, het: str, reps: int, seed: int, variants: tuple[str, ...]
) -> dict[str, Any]:
    study = STUDIES[het]
    domain = study.domain(n)
    rng = np.random.default_rng(seed)
    truth = study.true_ate
    crude: list[float] = []
    errors: dict[str, list[float]] = {name: [] for name in variants}
    halves: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        arrays, _ = study.sample(n, rng)
        a, y = arrays.a, arrays.y
        crude.append(float(y[a == 1].mean() - y[a == 0].mean()) - truth)
        for name in variants:
            data, public = variant_data(name, arrays, domain)
            estimate, half, _ = ate_release(data, public, AteParams(epsilon=epsilon))
            errors[name].append(estimate - truth)
            halves[name].append(half)
    gap = float(np.mean(crude))
    rows = {}
    for name in variants:
        row = interval_summary(errors[name], halves[name])
        row["confounding_left"] = row["bias"] / gap
        rows[name] = row
    return {
        "n": n,
        "epsilon": epsilon,
        "heterogeneity": het,
        "true_ate": truth,
        "crude_bias": gap,
        "crude_sd": float(np.std(crude, ddof=1)) if reps > 1 else None,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke")
    parser.add_argument("--reps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument(
        "--cells", default=",".join(f"{n}:{e:g}" for n, e in CELLS), help="n:eps,n:eps,..."
    )
    parser.add_argument("--het", default=",".join(HETEROGENEITY))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--name", default="confounding_left")
    args = parser.parse_args(argv)
    cells = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in args.cells.split(",")]
    levels = args.het.split(",")
    variants = tuple(args.variants.split(","))
    reps = args.reps
    if args.quick:
        cells, levels, reps = [(2000, 4.0)], ["strong"], 2
    results = []
    with threadpool_limits(1):
        for i, (n, epsilon) in enumerate(cells):
            for j, het in enumerate(levels):
                cell = run_cell(n, epsilon, het, reps, args.seed + 100 * i + j, variants)
                results.append(cell)
                line = " | ".join(
                    f"{name}: left {row['confounding_left']:.2f} bias {row['bias']:+.3f} "
                    f"half {row['mean_half_width']:.3f} cov {row['coverage']:.2f}"
                    for name, row in cell["rows"].items()
                )
                print(f"n {n} eps {epsilon:g} {het}: crude {cell['crude_bias']:+.3f} | {line}")
                write_result(
                    args.name,
                    {"reps": reps, "cells": results, "complete": False},
                    quick=args.quick,
                    module="bench.confounding_left",
                )
    print(
        write_result(
            args.name,
            {"reps": reps, "cells": results, "complete": True},
            quick=args.quick,
            module="bench.confounding_left",
        )
    )


if __name__ == "__main__":
    main()
