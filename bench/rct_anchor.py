"""The RCT anchor of ``ebm_cate`` against the constant DP ATE, many samples (issue 12, item 4).

On a trial without heterogeneity (``bench.studies`` ``rct_none``) the anchored ``ebm_cate``
release is its anchor (factor 0), so its PEHE is the anchor's absolute error. With 3 releases
per cell (``bench.realistic``) the ratio of two noisy PEHEs moves a lot; this runs only the
anchor release (``anchor.ate_anchor_params`` at the public share, the strict ATE on all n,
proof step 6.1) and the constant DP ATE (the ``ate`` kind's strict default at the whole budget)
on ``--reps`` fresh training samples per cell, production noise and partition generator, and
reports each one's RMSE around the true ATE and their ratio. ``--shares`` adds the anchor at
other shares of the budget (the default's public rule is ``anchor.ate_anchor_share``).

    python -m bench.rct_anchor --reps 40 --name rct-anchor-vs-ate
    python -m bench.rct_anchor --n 20000 --eps 4 --shares 0.2,0.5,0.7 --reps 40
    python -m bench.rct_anchor --no-anchor --study rct_strong --reps 200   # the ate release only

Each arm's interval is reported as drawn and with the variance inflated by z_0.95 s_2 (the
anchor's released ``ate_anchor_interval``; for the ``ate`` release its ``variance_inflation``).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import write_result
from bench.studies import STUDIES
from service.mechanisms import ate_rct, ate_strict, ebm_cate
from service.mechanisms.anchor import (
    AnchorParams,
    anchor_interval,
    ate_anchor_params,
    ate_anchor_share,
)
from service.mechanisms.noise import OpenDPSampler, secure_rng
from service.releases.kinds.ate import AteKind, AteParams
from service.releases.kinds.ebm_cate import EbmCateRequest, to_mechanism_params


def _quiet(_fraction: float, _stage: str) -> None:
    return None


def _interval(out: dict[str, Any], truth: float) -> dict[str, float]:
    """One release's error, its interval (as released, and with the variance inflated by
    ``z_0.95 s_2``: ``anchor.anchor_interval``) and whether each covers the truth."""
    if "variance_estimate" in out:
        inflated = anchor_interval(out, bound=math.inf)
    else:  # the difference in means: its own interval is the released one
        inflated = {"lower": float(out["ci_lower"]), "upper": float(out["ci_upper"])}
    return {
        "error": float(out["estimate"]) - truth,
        "half_width": float(out["half_width"]),
        "covered": float(out["ci_lower"] <= truth <= out["ci_upper"]),
        "inflated_half_width": (inflated["upper"] - inflated["lower"]) / 2.0,
        "inflated_covered": float(inflated["lower"] <= truth <= inflated["upper"]),
    }


def run_cell(
    n: int,
    epsilon: float,
    reps: int,
    shares: tuple[float, ...],
    study_name: str = "rct_none",
    anchor: bool = True,
) -> dict[str, Any]:
    study = STUDIES[study_name]
    domain = study.domain(n)
    params = to_mechanism_params(EbmCateRequest(epsilon=epsilon), domain)
    arms: dict[str, AnchorParams] = {}
    default_share: float | None = None
    if anchor and study.randomised:
        # ebm_cate's RCT anchor (rct_anchor_share); cate_vector / cate_function use
        # ate_anchor_share, which the observational arm below reads.
        plan = ebm_cate.make_plan(domain, params)
        if plan.rct_anchor is None:
            raise ValueError("not an anchored RCT plan")
        default_share = plan.anchor_share
        arms = {"anchor_default": plan.rct_anchor.params}
    elif anchor:
        chosen = ate_anchor_share(domain, epsilon, params.delta)
        if chosen is None:
            raise ValueError("no room for the anchor")
        default_share = chosen
        arms = {
            "anchor_default": ate_anchor_params(
                domain,
                ate_strict.split_share(epsilon, chosen)[0],
                ate_strict.split_share(params.delta, chosen)[0],
                epsilon,
            )
        }
    for share in shares:
        arms[f"anchor_share_{share:g}"] = ate_anchor_params(
            domain, share * epsilon, share * params.delta, epsilon
        )
    draws: dict[str, list[dict[str, float]]] = {"constant_dp_ate": [], **{k: [] for k in arms}}
    for rep in range(reps):
        arrays, _ = study.sample(n, np.random.default_rng([77, n, rep]))
        out = AteKind().run(
            arrays,
            domain,
            AteParams(epsilon=epsilon),
            rng=secure_rng(),
            noise=OpenDPSampler(),
            progress=_quiet,
        )
        draws["constant_dp_ate"].append(_interval(out, study.true_ate))
        for name, arm in arms.items():
            if isinstance(arm, ate_rct.AteRctParams):  # a trial's anchor below 5 * 10^4
                out = ate_rct.run(
                    arrays, domain, arm, rng=secure_rng(), noise=OpenDPSampler(), progress=_quiet
                )
            else:
                out = ate_strict.run(
                    arrays, domain, arm, rng=secure_rng(), noise=OpenDPSampler(), progress=_quiet
                )
            draws[name].append(_interval(out, study.true_ate))
    rmse = {k: math.sqrt(float(np.mean([d["error"] ** 2 for d in v]))) for k, v in draws.items()}
    summary = {
        k: {
            field: float(np.mean([d[field] for d in v]))
            for field in ("half_width", "covered", "inflated_half_width", "inflated_covered")
        }
        for k, v in draws.items()
    }
    bias = {k: float(np.mean([d["error"] for d in v])) for k, v in draws.items()}
    return {
        "study": study_name,
        "n": n,
        "epsilon": epsilon,
        "reps": reps,
        "default_share": default_share,
        "rmse": rmse,
        "bias": bias,
        "ratio_to_constant_dp_ate": {k: v / rmse["constant_dp_ate"] for k, v in rmse.items()},
        "intervals": summary,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", default="1000,5000,20000")
    parser.add_argument("--eps", default="1,4")
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--shares", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--study", default="rct_none", choices=sorted(STUDIES))
    parser.add_argument(
        "--no-anchor",
        action="store_true",
        help="only the ate release at the whole budget (its interval as drawn and inflated)",
    )
    parser.add_argument("--name", default="rct-anchor-vs-ate")
    args = parser.parse_args(argv)
    shares = tuple(float(s) for s in args.shares.split(",") if s)
    cells = []
    with threadpool_limits(args.threads):
        for n in (int(v) for v in args.n.split(",")):
            for epsilon in (float(v) for v in args.eps.split(",")):
                cell = run_cell(
                    n, epsilon, args.reps, shares, args.study, anchor=not args.no_anchor
                )
                cells.append(cell)
                ratios = {k: round(v, 2) for k, v in cell["ratio_to_constant_dp_ate"].items()}
                cover = {k: round(v["covered"], 3) for k, v in cell["intervals"].items()}
                width = {k: round(v["half_width"], 3) for k, v in cell["intervals"].items()}
                print(f"n={n} eps={epsilon:g} rmse ratios {ratios}", flush=True)
                print(f"   coverage {cover}; half-width {width}", flush=True)
    path = write_result(
        args.name,
        {"cells": cells, "threads": args.threads},
        quick=False,
        module="bench.rct_anchor",
    )
    print(f"wrote {path.name}")


if __name__ == "__main__":
    main()
