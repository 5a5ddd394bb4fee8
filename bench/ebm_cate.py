"""DP-EBM CATE learners (Niu et al.): CATE MSE on Setups A-E next to the authors' CSV.

Service configuration only (benchmarks.md §3.7 N2): public bounds declared a priori per setup
(below), all features continuous, centred targets, replace-one epsilon_p, pseudo-outcome clip
K = R_Y / 2 fixed a priori, a uniformly random 25/25/50 partition (DR, R) or all rows (S).
DGPs: the *code* versions of benchmarks.md §3.1 (A-E). The test set is 50,000 fresh draws
(the paper uses 250,000). MSE of CATE = mean over test points of (tau_hat - tau)^2, averaged
over the runs. ``eps`` is the charged epsilon; ``eps* = 1.867`` is the charge whose epsilon_p
equals the CSV's nominal 1 (identical noise, benchmarks.md §3.7 N2).

    python -m bench.ebm_cate            # reduced grid (README)
    python -m bench.ebm_cate --target   # the N2 target cell: DR, n = 16000, eps = 1, 10 runs
    python -m bench.ebm_cate --quick    # Setup B, n = 4000, DR eps in {1, 16}, S eps 1, 1 run

    python -m bench.ebm_cate --crossover --seed0 700001   # DR vs S by n, eps (quote warning)
    python -m bench.ebm_cate --screen '{"name": {...}}' --batch B --setups C --reps 10

``--target`` runs three configurations side by side on the same data, all with public
quantities only (request parameters fixed before looking at any private data; ``CONFIGS``):
``niu`` is the configuration above (K = R_Y / 2, Niu et al.'s 25/25/50 folds, interpret's
max_bins = 32 and max_rounds = 300); ``service`` is the release kind's default for the DR
learner, read from ``ebm_cate.service_defaults`` (K = 0.3 R_Y, folds 10/40/50 with at least 100
propensity records, RCT 30/70, max_bins = 16, max_rounds = 200 for the effect model; the
nuisances keep 300); ``previous`` is the earlier default (folds 20/20/60). The rules were chosen
on ``--screen`` runs (results/ebm_cate_screening.json) on other seeds, so the target's own
seeds (``TARGET_SEED0``) were not used to choose them.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from bench.common import RESULTS, machine, write_result
from service.mechanisms import ebm_cate as ec
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler
from service.mechanisms.partition import fold_sizes

# Authors' CSV (benchmarks.md §3.5, Tables A-E), MSE of CATE at eps = 1 / 4 / 16.
REFERENCE: dict[tuple[str, int, str], tuple[float, float, float]] = {
    ("A", 4000, "dr"): (3.34, 0.418, 0.078),
    ("A", 4000, "r"): (1.87, 0.234, 0.0476),
    ("A", 4000, "s"): (0.101, 0.0876, 0.0882),
    ("A", 16000, "dr"): (0.407, 0.0607, 0.0368),
    ("A", 16000, "r"): (0.205, 0.0395, 0.0235),
    ("A", 16000, "s"): (0.0852, 0.088, 0.088),
    ("B", 4000, "dr"): (5.6, float("nan"), float("nan")),
    ("B", 4000, "r"): (1.6, 0.676, 0.534),
    ("B", 4000, "s"): (1.31, 1.28, 1.27),
    ("B", 16000, "dr"): (0.563, 0.125, 0.0747),
    ("B", 16000, "r"): (0.676, 0.522, 0.489),
    ("B", 16000, "s"): (1.28, 1.27, 1.27),
    ("C", 4000, "dr"): (6.81, 1.16, 0.435),
    ("C", 4000, "r"): (1.99, 0.481, 0.203),
    ("C", 4000, "s"): (0.607, 0.317, 0.246),
    ("C", 16000, "dr"): (1.12, 0.373, 0.288),
    ("C", 16000, "r"): (0.578, 0.182, 0.114),
    ("C", 16000, "s"): (0.296, 0.239, 0.23),
    ("D", 4000, "dr"): (8.45, 1.55, 0.616),
    ("D", 4000, "r"): (3.67, 1.53, 1.01),
    ("D", 4000, "s"): (2.0, 1.86, 1.85),
    ("D", 16000, "dr"): (1.41, 0.549, 0.468),
    ("D", 16000, "r"): (1.38, 0.972, 0.91),
    ("D", 16000, "s"): (1.86, 1.83, 1.83),
    ("E", 4000, "dr"): (22.7, 5.43, 2.55),
    ("E", 4000, "r"): (25.3, 8.83, 6.06),
    ("E", 4000, "s"): (10.6, 10.2, 10.1),
    ("E", 16000, "dr"): (5.25, 2.34, 1.87),
    ("E", 16000, "r"): (9.92, 6.03, 5.52),
    ("E", 16000, "s"): (10.2, 10.1, 10.1),
}
NOMINAL_INDEX = {1.0: 0, 1.867: 0, 4.0: 1, 16.0: 2}

# Public request parameters of a DR/R release: pseudo-outcome clip K as a fraction of the public
# outcome range R_Y, and the fold fractions (observational: propensity, outcome, effect; RCT:
# outcome, effect), interpret's max_bins and max_rounds (privacy-neutral; max_rounds is the
# effect model's, the nuisances keep 300). ``service`` is not listed: it is whatever
# ``ebm_cate.service_defaults`` gives (the release kind's defaults), so the bench cannot drift
# from the service.
CONFIGS: dict[str, dict[str, Any]] = {
    "niu": {
        "k_of_range": 0.5,
        "folds": (0.25, 0.25, 0.5),
        "folds_rct": (0.5, 0.5),
        "max_bins": 32,
        "max_rounds": 300,
    },
    # The DR default of 2026-11-24 02:00-06:00 UTC (the 20 % outcome fold missed Setup C).
    "previous": {
        "k_of_range": 0.3,
        "folds": (0.2, 0.2, 0.6),
        "folds_rct": (0.3, 0.7),
        "max_bins": 16,
        "max_rounds": 200,
    },
}
# The --target seeds are TARGET_SEED0 + 100 r, never used while screening. Earlier target runs:
# 90_001 (results/ebm_cate_target_v1.json) and 120_001 (results/ebm_cate_target_v2.json).
TARGET_SEED0 = 150_001
SCREENING = "ebm_cate_screening"
DR_K_OF_RANGE = ec.DR_DEFAULT_K_OF_RANGE


# Public bounds declared a priori (not from data): X box, Y range.
BOUNDS: dict[str, tuple[float, float, float, float]] = {
    "A": (0.0, 1.0, -4.0, 8.0),
    "B": (-4.0, 4.0, -6.0, 14.0),
    "C": (-4.0, 4.0, -5.0, 16.0),
    "D": (-4.0, 4.0, -12.0, 16.0),
    "E": (-6.0, 6.0, -15.0, 25.0),
}
_M = np.random.default_rng(1).uniform(-1, 1, (12, 12))  # Setup E covariance (code version)
SIGMA_E = (_M @ _M.T)[:6, :6]


def generate(setup: str, n: int, rng: np.random.Generator) -> tuple[Arrays, NDArray[np.float64]]:
    """(X, T, Y) and tau(X) from the code versions of Setups A-E (benchmarks.md §3.1)."""
    data, truth = generate_with_truth(setup, n, rng)
    return data, truth["tau"]


def generate_with_truth(
    setup: str, n: int, rng: np.random.Generator
) -> tuple[Arrays, dict[str, NDArray[np.float64]]]:
    """``generate`` plus the true nuisances: ``tau``, ``e`` = P(T = 1 | X) and ``b`` =
    E[Y | T = 0, X] (for Setup E, ``b`` includes the heteroscedastic draw; E[b | X] differs)."""
    if setup == "A":
        x = rng.uniform(0, 1, (n, 6))
        b = np.sin(np.pi * x[:, 0] * x[:, 1]) + 2 * (x[:, 2] - 0.5) ** 2 + x[:, 3] + 0.5 * x[:, 4]
        e = np.clip(np.sin(np.pi * x[:, 0] * x[:, 1]), 0.1, 0.9)
        tau = (x[:, 0] + x[:, 1]) / 2
    elif setup == "B":
        x = rng.normal(size=(n, 6))
        b = np.maximum.reduce([x[:, 0] + x[:, 1], x[:, 2], np.zeros(n)]) + np.maximum(
            x[:, 3] + x[:, 4], 0
        )
        e = np.full(n, 0.5)
        tau = x[:, 0] + np.log1p(np.exp(x[:, 1]))
    elif setup == "C":
        x = rng.normal(size=(n, 6))
        b = 2 * np.log1p(np.exp(x[:, 0] + x[:, 1] + x[:, 2]))
        e = 1 / (1 + np.exp(x[:, 1] + x[:, 2]))
        tau = np.ones(n)
    elif setup == "D":
        x = rng.normal(size=(n, 6))
        b = np.maximum(0, x[:, 0] + x[:, 1]) + np.maximum(0, x[:, 3] + x[:, 4])
        e = 1 / (1 + np.exp(-x[:, 0]) + np.exp(-x[:, 1]))
        tau = np.maximum(x[:, 0] + x[:, 1] + x[:, 2], 0) - np.maximum(x[:, 3] + x[:, 4], 0)
    else:
        z = rng.multivariate_normal(np.zeros(6), SIGMA_E, size=n)
        x = np.column_stack([z[:, :3], (z[:, 3:] > 1).astype(float)])
        beta = np.linspace(0, 3, 6)
        xi = rng.normal(size=n)
        b = x @ beta + (x[:, 0] + 1) * xi + x[:, 0] * x[:, 5]
        b = b + np.where((x[:, 2] > -0.5) & (x[:, 2] < 0.5), 0.8, 0.2)
        e = np.clip(expit(x[:, 0] + x[:, 5]), 0.1, 0.9)
        tau = x[:, 1] - x[:, 2] + x[:, 3] + x[:, 4] + x[:, 5] + 5 * expit(x[:, 0])
    t = (rng.uniform(size=n) < e).astype(np.float64)
    y = b + rng.normal(size=n) + t * tau
    return Arrays(x, t, y), {"tau": tau, "e": e, "b": b}


def one(
    setup: str,
    n: int,
    learner: str,
    epsilon: float,
    seed: int,
    test: int,
    config: str = "niu",
) -> float:
    """One fit; setup ``B-rct`` is Setup B with its design (an RCT, e = 0.5) declared."""
    rct = setup == "B-rct"
    setup = setup.removesuffix("-rct")
    rng = np.random.default_rng(seed)
    data, _ = generate(setup, n, rng)
    x_test, tau_test = generate(setup, test, rng)
    lo, hi, y_lo, y_hi = BOUNDS[setup]
    domain = PublicDomain(
        x_lower=np.full(6, lo),
        x_upper=np.full(6, hi),
        y_lower=y_lo,
        y_upper=y_hi,
        n=n,
        design=StudyDesign.RCT if rct else StudyDesign.OBSERVATIONAL,
        treatment_probability=0.5 if rct else None,
        allow_paper_mode=True,
    )
    if learner == "s" or config == "service":
        chosen: dict[str, Any] = ec.service_defaults(domain, learner, epsilon)  # type: ignore[arg-type]
    else:
        given = CONFIGS[config]
        chosen = {
            "pseudo_outcome_clip": (y_hi - y_lo) * given["k_of_range"],
            "fold_fractions": tuple(given["folds_rct"] if rct else given["folds"]),
            "max_bins": given["max_bins"],
            "max_rounds": given["max_rounds"],
        }
    params = ec.EbmCateParams(
        epsilon=epsilon,
        delta=1e-5,
        learner=learner,  # type: ignore[arg-type]
        **chosen,
    )
    # the anchored default (shrinkage "ate") draws its anchor and calibration noise here
    result = ec.run(
        data, domain, params, rng=rng, progress=lambda f, s: None, noise=OpenDPSampler()
    )
    estimate = ec.predict(result, np.clip(x_test.x, lo, hi))
    return float(np.mean((estimate - tau_test) ** 2))


def screen(spec: str, batch: str, setups: list[str], reps: int, seed0: int) -> None:
    """Append one screening batch to results/ebm_cate_screening.json (DR, n = 16000, eps = 1).

    ``spec`` is JSON: ``{"name": {overrides of CONFIGS["previous"]}, ...}`` (``"service"`` for
    the service default). Screening seeds must differ from ``TARGET_SEED0``'s.
    """
    target_seeds = {TARGET_SEED0 + 100 * r for r in range(100)}
    if target_seeds & {seed0 + 100 * r for r in range(reps)}:
        raise SystemExit("screening seeds overlap the target seeds")
    configs: dict[str, dict[str, Any]] = json.loads(spec)
    for name, overrides in configs.items():
        if name != "service":
            CONFIGS[name] = {**CONFIGS["previous"], **overrides}
    path = RESULTS / f"{SCREENING}.json"
    doc = json.loads(path.read_text())
    for setup in setups:
        for name in configs:
            values = [
                one(setup, 16000, "dr", 1.0, seed0 + 100 * r, 20000, name) for r in range(reps)
            ]
            row: dict[str, Any] = {
                "batch": batch,
                "setup": setup,
                "config": name,
                "params": CONFIGS.get(name, "service defaults"),
                "seeds": f"{seed0} + 100 r, r < {reps}",
                "mse": float(np.mean(values)),
                "mse_se": float(np.std(values, ddof=1) / np.sqrt(reps)),
                "mse_runs": values,
            }
            doc["rows"].append(row)
            print(setup, name, round(row["mse"], 3), "+-", round(row["mse_se"], 3), flush=True)
    doc.setdefault("batches", {})[batch] = {
        "command": "python -m bench.ebm_cate --screen '" + spec + f"' --batch {batch} "
        f"--setups {','.join(setups)} --reps {reps} --seed0 {seed0}",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def crossover(reps: int, seed0: int) -> None:
    """DR (service default) against the S-learner's constant ATE by n and eps, Setups A-E
    (results/ebm_cate_crossover.json): where the quote's small-n warning should start."""
    rows: list[dict[str, Any]] = []
    started = time.time()
    for setup in ["A", "B", "C", "D", "E"]:
        for n in [1000, 2000, 4000, 8000, 16000]:
            for epsilon in [1.0, 4.0]:
                row: dict[str, Any] = {"setup": setup, "n": n, "epsilon_charged": epsilon}
                for learner in ("dr", "s"):
                    values = [
                        one(setup, n, learner, epsilon, seed0 + 100 * r, 20000, "service")
                        for r in range(reps)
                    ]
                    row[learner] = float(np.mean(values))
                    row[f"{learner}_se"] = float(np.std(values, ddof=1) / np.sqrt(reps))
                rows.append(row)
                print(row, flush=True)
    write_result(
        "ebm_cate_crossover",
        {
            "setting": {
                "learners": "dr and s with ebm_cate.service_defaults",
                "seeds": f"{seed0} + 100 r, r < {reps}",
                "delta": 1e-5,
                "test_points": 20000,
            },
            "rows": rows,
            "seconds": round(time.time() - started, 1),
        },
        quick=False,
    )


def _mean_psi(
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    e: NDArray[np.float64],
    mu0: NDArray[np.float64],
    mu1: NDArray[np.float64],
    k: float,
) -> float:
    """Mean of the DR pseudo-outcome clipped to [-K, K], as in ``ebm_cate``."""
    return float(np.mean(pseudo_outcomes(a, y, e, mu0, mu1, bound=k)))


def diagnose(setup: str, reps: int, seed0: int) -> None:
    """Where the DR pseudo-outcome's bias comes from (results/ebm_cate_diagnosis.json).

    DR, n = 16000, charged eps = 1: on the effect fold, the RMSE of the DP nuisances against
    the truth and the mean of the clipped pseudo-outcome (what the effect model's average
    estimates) with the DP nuisances, with the true e, and with the true mu, for the earlier and
    the current default folds (same data and partition seed per fit). The nuisances are the
    service's (``dp_ebm.propensity_scores`` / ``outcome_predictions``).
    """
    from service.mechanisms.dp_ebm import (
        outcome_predictions,
        propensity_scores,
        solve_dp_ebm_epsilon_p,
    )

    lo, hi, y_lo, y_hi = BOUNDS[setup]
    lower, upper = np.full(6, lo), np.full(6, hi)
    k = DR_K_OF_RANGE * (y_hi - y_lo)
    accounting = solve_dp_ebm_epsilon_p(1.0, 1e-5)
    folds = {"previous": CONFIGS["previous"]["folds"], "service": ec.DR_DEFAULT_FOLDS}
    rows: list[dict[str, Any]] = []
    for r in range(reps):
        for name, fractions in folds.items():
            rng = np.random.default_rng(seed0 + 100 * r)
            data, truth = generate_with_truth(setup, 16000, rng)
            x = np.clip(data.x, lower, upper)
            a, y = data.a, np.clip(data.y, y_lo, y_hi)
            sizes = fold_sizes(16000, fractions)
            cut = np.cumsum(sizes)[:-1]
            p_rows, o_rows, e_rows = np.split(rng.permutation(16000), cut)
            x2, a2, y2 = x[e_rows], a[e_rows], y[e_rows]
            e_hat = propensity_scores(
                x[p_rows], a[p_rows], x2, lower, upper, accounting, clip=0.05, max_bins=16
            )
            mu0, mu1 = outcome_predictions(
                x[o_rows],
                a[o_rows],
                y[o_rows],
                x2,
                lower,
                upper,
                y_lo,
                y_hi,
                accounting,
                max_bins=16,
            )
            e_true = np.clip(truth["e"][e_rows], 0.05, 0.95)
            b = truth["b"][e_rows]
            tau = truth["tau"][e_rows]

            row = {
                "fit": r,
                "folds": name,
                "fold_sizes": list(sizes),
                "tau_mean": float(np.mean(tau)),
                "rmse_e_hat": float(np.sqrt(np.mean((e_hat - e_true) ** 2))),
                "rmse_mu0_hat": float(np.sqrt(np.mean((mu0 - b) ** 2))),
                "sd_mu0_true": float(np.std(b)),
                "mean_mu1_minus_mu0_hat": float(np.mean(mu1 - mu0)),
                "mean_psi_dp": _mean_psi(a2, y2, e_hat, mu0, mu1, k),
                "mean_psi_true_e": _mean_psi(a2, y2, e_true, mu0, mu1, k),
                "mean_psi_true_mu": _mean_psi(a2, y2, e_hat, b, b + tau, k),
            }
            rows.append(row)
            print(row, flush=True)
    write_result(
        "ebm_cate_diagnosis",
        {
            "setting": {
                "setup": setup,
                "n": 16000,
                "epsilon_charged": 1.0,
                "delta": 1e-5,
                "k": k,
                "max_bins": 16,
                "seeds": f"{seed0} + 100 r, r < {reps}",
            },
            "rows": rows,
        },
        quick=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--target",
        action="store_true",
        help="the N2 target only: DR, n = 16000, eps = 1, three configurations side by side",
    )
    parser.add_argument("--reps", type=int, default=None, help="fits per cell (override)")
    parser.add_argument("--screen", help="JSON of named configurations to screen (see screen)")
    parser.add_argument("--batch", default="screen", help="--screen: the batch's name")
    parser.add_argument("--setups", default="A,B,C,D,E", help="--screen: setups")
    parser.add_argument("--seed0", type=int, default=300_001, help="--screen: first seed")
    parser.add_argument("--diagnose", help="setup: DP vs true nuisances (see diagnose)")
    parser.add_argument("--crossover", action="store_true", help="DR vs S by n and eps")
    args = parser.parse_args()
    if args.crossover:
        crossover(args.reps or 10, args.seed0)
        return
    if args.diagnose:
        diagnose(args.diagnose, args.reps or 5, args.seed0)
        return
    if args.screen:
        screen(args.screen, args.batch, args.setups.split(","), args.reps or 10, args.seed0)
        return
    grid: dict[str, list[float]]
    configs, seed0 = ["niu"], 1
    if args.target:
        setups, sizes, reps, test = ["A", "B", "C", "D", "E", "B-rct"], [16000], 10, 50000
        grid = {"dr": [1.0]}
        configs, seed0 = ["niu", "previous", "service"], TARGET_SEED0
    elif args.quick:
        setups, sizes, reps, test = ["B"], [4000], 1, 10000
        grid = {"dr": [1.0, 16.0], "s": [1.0]}
    else:
        setups, sizes, reps, test = ["A", "B", "C", "D", "E"], [16000], 2, 50000
        grid = {"dr": [1.0, 1.867, 4.0, 16.0], "r": [1.0, 16.0], "s": [1.0, 16.0]}
    if args.reps is not None:
        reps = args.reps
    rows: list[dict[str, Any]] = []
    started = time.time()
    for setup in setups:
        for n in sizes:
            for learner, epsilons in grid.items():
                for epsilon in epsilons:
                    for config in configs:
                        values = [
                            one(setup, n, learner, epsilon, seed0 + 100 * r, test, config)
                            for r in range(reps)
                        ]
                        key = (setup.removesuffix("-rct"), n, learner)
                        value = REFERENCE[key][NOMINAL_INDEX[epsilon]]
                        reference = None if np.isnan(value) else value
                        row = {
                            "setup": setup,
                            "n": n,
                            "learner": learner,
                            "config": config,
                            "epsilon_charged": epsilon,
                            "mse": float(np.mean(values)),
                            "mse_se": float(np.std(values, ddof=1) / np.sqrt(reps))
                            if reps > 1
                            else None,
                            "mse_runs": values,
                            "reference_csv_nominal_eps": reference,
                        }
                        rows.append(row)
                        print(row, flush=True)
    out = write_result(
        "ebm_cate_target" if args.target else "ebm_cate",
        {
            "setting": {
                "bounds": BOUNDS,
                "configs": {**CONFIGS, "service": "ebm_cate.service_defaults"},
                "seeds": f"{seed0} + 100 r, r < reps",
                "delta": 1e-5,
                "reps": reps,
                "test_points": test,
                "note": "eps 1.867 is the charge whose epsilon_p equals the CSV's nominal 1",
            },
            "rows": rows,
            "seconds": round(time.time() - started, 1),
        },
        quick=args.quick,
    )
    if args.target:  # write_result names the command after the file; state the real one
        doc = json.loads(out.read_text())
        doc["command"] = "python -m bench.ebm_cate --target" + (
            f" --reps {args.reps}" if args.reps is not None else ""
        )
        out.write_text(json.dumps(doc, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
