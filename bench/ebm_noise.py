"""ebm_cate's quoted prediction noise against the noise its releases actually carry.

The quote's ``versus_ate`` verdict compares a public per-prediction noise scale
(``ebm_cate.prediction_noise_sd``) with the heterogeneity it would resolve. This benchmark
releases the DR learner several times on the *same* sample (``shrinkage: "none"``, so the
predictions are the model's) and measures the release-to-release sd of its predictions at 2000
test rows: the noise a release carries, plus the variation of its random folds (so an upper
bound on the privacy noise alone), against the quoted ``prediction_noise_sd`` and against the
random-walk formula the quote used before (each round's noise summed without the later rounds'
refit, ``ebm_cate.boosting_accumulation``).

    python -m bench.ebm_noise            # 4 cells of the realistic studies, 3 releases each
    python -m bench.ebm_noise --rounds 100,200,400,800 --cells strong:20000:4
                                         # one sample at several max_rounds
    python -m bench.ebm_noise --quick    # one small cell, 2 releases
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from bench.common import write_result
from bench.realistic import pehe, secure_rng
from bench.studies import Study
from service.mechanisms import ebm_cate as ec
from service.mechanisms.dp_ebm import DP_EBM_LEARNING_RATE as LEARNING_RATE
from service.mechanisms.noise import OpenDPSampler
from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest

CELLS = (
    ("strong", 20000, 4.0),
    ("strong", 5000, 4.0),
    ("rct_strong", 20000, 1.0),
    ("strong", 100000, 1.0),
)


def run_cell(
    het: str, n: int, epsilon: float, releases: int, max_rounds: int | None = None
) -> dict[str, Any]:
    study = Study(het)
    domain = study.domain(n)
    arrays, _ = study.sample(n, np.random.default_rng(1))
    test, _ = study.sample(2000, np.random.default_rng(2))
    truth = study.tau_true(test.x)
    request = EbmCateRequest(epsilon=epsilon, shrinkage="none", max_rounds=max_rounds)
    quote = EbmCateKind().quote(request, domain)
    quoted = ec.prediction_noise_sd(domain, quote)
    rounds = int(quote["max_rounds"])
    # the random walk: sqrt(rounds) step sds where the quote has boosting_accumulation of them
    random_walk = quoted * math.sqrt(rounds) / ec.boosting_accumulation(rounds, LEARNING_RATE)
    started = time.perf_counter()
    predictions = []
    for _ in range(releases):
        out = EbmCateKind().run(
            arrays, domain, request, rng=secure_rng(), noise=OpenDPSampler(), progress=_quiet
        )
        predictions.append(ec.predict(out, test.x))
    stacked = np.asarray(predictions)
    measured = float(np.sqrt(np.mean(np.var(stacked, axis=0, ddof=1))))
    return {
        "heterogeneity": het,
        "n": n,
        "epsilon": epsilon,
        "releases": releases,
        "max_rounds": rounds,
        "quoted_prediction_noise_sd": quoted,
        "random_walk_formula": random_walk,
        "measured_release_to_release_sd": measured,
        "measured_over_random_walk": measured / random_walk,
        "measured_over_quoted": measured / quoted,
        "pehe": [pehe(p, truth) for p in predictions],
        "seconds": time.perf_counter() - started,
    }


def _quiet(fraction: float, stage: str) -> None:
    del fraction, stage


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--releases", type=int, default=3)
    parser.add_argument(
        "--cells", help="het:n:eps,... (default: the 4 cells of the committed run)", default=None
    )
    parser.add_argument(
        "--rounds", help="max_rounds values to run each cell at (default: the rule's)"
    )
    parser.add_argument("--name", default="ebm_noise")
    args = parser.parse_args()
    if args.quick:
        cells: tuple[tuple[str, int, float], ...] = (("strong", 4000, 4.0),)
    elif args.cells:
        cells = tuple(
            (het, int(n), float(eps))
            for het, n, eps in (item.split(":") for item in args.cells.split(","))
        )
    else:
        cells = CELLS
    rounds: list[int | None] = [int(r) for r in args.rounds.split(",")] if args.rounds else [None]
    releases = 2 if args.quick else args.releases
    out = []
    for het, n, eps in cells:
        for max_rounds in rounds:
            cell = run_cell(het, n, eps, releases, max_rounds)
            out.append(cell)
            print(json.dumps({k: v for k, v in cell.items() if k != "pehe"}), flush=True)
    write_result(
        args.name,
        {"learning_rate": LEARNING_RATE, "cells": out},
        quick=args.quick,
        module="bench.ebm_noise",
    )


if __name__ == "__main__":
    main()
