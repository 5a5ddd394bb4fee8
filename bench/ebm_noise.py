"""ebm_cate's quoted prediction noise against the noise its releases actually carry.

The quote's ``versus_ate`` verdict compares a public per-prediction noise scale
(``ebm_cate.prediction_noise_sd``) with the heterogeneity it would resolve. This benchmark
releases the DR learner several times on the *same* sample (``shrinkage: "none"``, so the
predictions are the model's) and measures the release-to-release sd of its predictions at 2000
test rows: the noise a release carries, plus the variation of its random folds (so an upper
bound on the privacy noise alone). Its ratio to the public formula without the calibration
constant is what ``ebm_cate.PREDICTION_NOISE_CALIBRATION`` is set from.

    python -m bench.ebm_noise            # 4 cells of the realistic studies, 3 releases each
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
from service.mechanisms.noise import OpenDPSampler
from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest

CELLS = (
    ("strong", 20000, 4.0),
    ("strong", 5000, 4.0),
    ("rct_strong", 20000, 1.0),
    ("strong", 100000, 1.0),
)


def run_cell(het: str, n: int, epsilon: float, releases: int) -> dict[str, Any]:
    study = Study(het)
    domain = study.domain(n)
    arrays, _ = study.sample(n, np.random.default_rng(1))
    test, _ = study.sample(2000, np.random.default_rng(2))
    truth = study.tau_true(test.x)
    request = EbmCateRequest(epsilon=epsilon, shrinkage="none")
    quote = EbmCateKind().quote(request, domain)
    quoted = ec.prediction_noise_sd(domain, quote)
    uncalibrated = float(quote["approx_shape_noise_sd"]) * math.sqrt(domain.q)
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
        "quoted_prediction_noise_sd": quoted,
        "uncalibrated_formula": uncalibrated,
        "measured_release_to_release_sd": measured,
        "measured_over_uncalibrated": measured / uncalibrated,
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
    args = parser.parse_args()
    cells = (("strong", 4000, 4.0),) if args.quick else CELLS
    releases = 2 if args.quick else args.releases
    out = []
    for het, n, eps in cells:
        cell = run_cell(het, n, eps, releases)
        out.append(cell)
        print(json.dumps({k: v for k, v in cell.items() if k != "pehe"}), flush=True)
    write_result(
        "ebm_noise",
        {"calibration": ec.PREDICTION_NOISE_CALIBRATION, "cells": out},
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
