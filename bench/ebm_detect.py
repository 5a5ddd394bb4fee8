"""Does the quote's detectable heterogeneity predict when an anchored release varies at all?

An anchored ``ebm_cate`` release (shrinkage ``ate``, the strict default) answers its DP ATE for
every patient unless its calibration step (proof step 6.4) detects the heterogeneity: its
``shrinkage_factor`` is then positive. The quote's ``versus_ate.detectable_heterogeneity_sd`` D
is the smallest sd(tau) the step detects with 80 % probability if the learner found tau exactly
(``ebm_cate.detectable_heterogeneity_sd``; a learner's own error only raises it). This benchmark
releases the default on fresh samples of the realistic studies (``bench.studies``) and counts
the releases with a positive factor, beside D and the study's true sd(tau). A correct D has
detection rates near or below 0.8 where D is about sd(tau), near 1 where D is well below it, and
near 0.01 (the test's level) without heterogeneity.

    python -m bench.ebm_detect                 # the committed grid (8 releases a cell)
    python -m bench.ebm_detect --cells moderate:20000:1:declared --reps 4
    python -m bench.ebm_detect --quick         # one small cell, 1 release
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np

from bench.common import write_result
from bench.realistic import secure_rng
from bench.studies import EFFECT_MODIFIERS, Study
from service.mechanisms.noise import OpenDPSampler
from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest

# (heterogeneity, n, epsilon, modifiers): "default" lets the screen choose, "declared" names the
# study's 7 effect modifiers in the schema (as an owner would).
CELLS = tuple(
    (het, n, eps, modifiers)
    for het in ("none", "moderate", "strong")
    for n, eps in ((20000, 1.0), (20000, 4.0), (50000, 1.0))
    for modifiers in ("default", "declared")
)


def run_cell(het: str, n: int, epsilon: float, modifiers: str, reps: int) -> dict[str, Any]:
    study = Study(het)
    domain = study.domain(n)
    if modifiers == "declared":
        domain = dataclasses.replace(domain, effect_modifiers=EFFECT_MODIFIERS)
    request = EbmCateRequest(epsilon=epsilon)
    block = EbmCateKind().quote(request, domain)["versus_ate"]
    factors = []
    started = time.perf_counter()
    for rep in range(reps):
        arrays, _ = study.sample(n, np.random.default_rng([20261129, n, rep]))
        out = EbmCateKind().run(
            arrays, domain, request, rng=secure_rng(), noise=OpenDPSampler(), progress=_quiet
        )
        factors.append(float(out.get("shrinkage_factor", 0.0)))
    facts = study.facts
    return {
        "heterogeneity": het,
        "n": n,
        "epsilon": epsilon,
        "modifiers": modifiers,
        "releases": reps,
        "sd_tau": facts.get("sd_tau"),
        "quoted_detectable_sd": block["detectable_heterogeneity_sd"],
        "quoted_prediction_noise_sd": block["prediction_noise_sd"],
        "quoted_verdict": block["verdict"],
        "detected_rate": float(np.mean([f > 0.0 for f in factors])),
        "shrinkage_factors": factors,
        "seconds_per_release": (time.perf_counter() - started) / max(reps, 1),
    }


def _quiet(fraction: float, stage: str) -> None:
    del fraction, stage


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument(
        "--cells", default=None, help="het:n:eps:modifiers,... (default: the committed grid)"
    )
    parser.add_argument("--name", default="ebm_detect")
    args = parser.parse_args()
    if args.quick:
        cells: tuple[tuple[str, int, float, str], ...] = (("strong", 3000, 4.0, "declared"),)
    elif args.cells:
        cells = tuple(
            (het, int(n), float(eps), modifiers)
            for het, n, eps, modifiers in (item.split(":") for item in args.cells.split(","))
        )
    else:
        cells = CELLS
    reps = 1 if args.quick else args.reps
    out = []
    for het, n, eps, modifiers in cells:
        cell = run_cell(het, n, eps, modifiers, reps)
        out.append(cell)
        print(json.dumps({k: v for k, v in cell.items() if k != "shrinkage_factors"}), flush=True)
        write_result(
            args.name,
            {"cells": out, "complete": False},
            quick=args.quick,
            module="bench.ebm_detect",
        )
    write_result(
        args.name, {"cells": out, "complete": True}, quick=args.quick, module="bench.ebm_detect"
    )


if __name__ == "__main__":
    main()
