"""Empirical coverage and width of the DP ATE confidence intervals (issue 3; benchmarks.md §4).

Every repetition simulates ONE dataset per cell (DGP, n) and runs every estimator on it, at every
epsilon of the cell, so the methods are compared side by side on the same data. Estimators are
pluggable entries of ``ESTIMATORS``; an entry whose mechanism module (or option) is not present
in ``service.mechanisms`` is skipped and listed under ``unavailable`` in the result file.

Suites (``--suite``, default all):
    grid   Dataset 1, n in {1000, 5000, 20000}, epsilon in {0.5, 1, 2, 5, 10}, delta = 1e-5:
           strict coverage target [0.93, 0.97] at nominal 95 %.
    paper  PrivATE's settings (B1-B3): Dataset 1 and 2 at n = 3000, RCT at n = 1000,
           epsilon = 0.5, delta = 1e-5, 1 - alpha in {0.80, 0.90, 0.95}, next to Tables 1 and 3.
    large  n = 10^6, epsilon = 1 on Dataset 1: strict (split, and cross-fit when available) vs the
           non-private cross-fitted AIPW CI (target ratio <= 1.1) and the non-private split CI.

    python -m bench.ate_coverage --reps 500 --workers 2
    python -m bench.ate_coverage --quick          # CI smoke, < 60 s on 2 cores

Noise: harness runs use ``SeededSampler`` (continuous Gaussian from a seeded numpy generator,
the test-only sampler) so runs are reproducible; the service uses OpenDP's lattice sampler with
the same sigma. All CIs here are ``estimate +- z_{1-alpha/2} * sd``, so one run gives every alpha.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import math
import multiprocessing
import signal
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtri

from bench.common import write_result
from bench.dgp import TAU, Dgp, make_dgp
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import SeededSampler

DELTA = 1e-5
LEVELS = (0.80, 0.90, 0.95)
Z95 = float(ndtri(0.975))

# Published numbers (benchmarks.md §4.3, §4.5), coverage at 1 - alpha: (value, SE).
PAPER_TABLE1 = {
    "dataset1": {
        "standard_kernel": {0.80: (0.792, 0.018), 0.90: (0.902, 0.013), 0.95: (0.960, 0.009)},
        "standard_nn": {0.80: (0.762, 0.019), 0.90: (0.868, 0.015), 0.95: (0.950, 0.010)},
        "naive_kernel": {0.80: (0.008, 0.004), 0.90: (0.036, 0.008), 0.95: (0.038, 0.009)},
        "naive_nn": {0.80: (0.024, 0.007), 0.90: (0.028, 0.007), 0.95: (0.020, 0.006)},
        "privATE_kernel": {0.80: (0.784, 0.018), 0.90: (0.912, 0.013), 0.95: (0.964, 0.008)},
        "privATE_nn": {0.80: (0.824, 0.017), 0.90: (0.894, 0.014), 0.95: (0.962, 0.009)},
    },
    "dataset2": {
        "standard_kernel": {0.80: (0.770, 0.019), 0.90: (0.904, 0.013), 0.95: (0.950, 0.010)},
        "standard_nn": {0.80: (0.800, 0.018), 0.90: (0.912, 0.013), 0.95: (0.952, 0.010)},
        "naive_kernel": {0.80: (0.004, 0.001), 0.90: (0.008, 0.004), 0.95: (0.010, 0.004)},
        "naive_nn": {0.80: (0.012, 0.005), 0.90: (0.008, 0.004), 0.95: (0.016, 0.006)},
        "privATE_kernel": {0.80: (0.848, 0.016), 0.90: (0.910, 0.013), 0.95: (0.958, 0.009)},
        "privATE_nn": {0.80: (0.832, 0.017), 0.90: (0.904, 0.013), 0.95: (0.954, 0.009)},
    },
    "rct": {
        "diff_means_guha_reiter": {
            0.80: (0.820, 0.039),
            0.90: (0.920, 0.027),
            0.95: (0.950, 0.022),
        },
        "privATE_kernel": {0.80: (0.780, 0.042), 0.90: (0.900, 0.030), 0.95: (0.940, 0.024)},
        "privATE_nn": {0.80: (0.880, 0.033), 0.90: (0.890, 0.031), 0.95: (0.970, 0.017)},
    },
}


# ---- estimators -------------------------------------------------------------------------------


@dataclass
class Rep:
    """One simulated dataset and the per-epsilon cache shared by the estimators."""

    dgp: Dgp
    arrays: Arrays
    domain: PublicDomain
    seed: tuple[int, ...]
    delta: float = DELTA
    cache: dict[tuple[str, float], tuple[float, float] | None] = field(default_factory=dict)

    def rng(self, name: str, epsilon: float) -> np.random.Generator:
        """A generator private to (estimator, epsilon) within this repetition."""
        key = [int(b) for b in name.encode()] + [round(epsilon * 1000)]
        return np.random.default_rng(np.random.SeedSequence([*self.seed, *key]))


# An estimator maps (rep, epsilon) to (estimate, sd) with CI = estimate +- z sd, or None when it
# does not apply to this DGP.
EstimatorFn = Callable[[Rep, float], tuple[float, float] | None]


@dataclass(frozen=True)
class Estimator:
    name: str
    description: str
    fn: EstimatorFn
    private: bool = True
    slow: bool = False  # runs only in the first --slow-reps repetitions
    available: Callable[[], bool] = lambda: True


def _progress(_fraction: float, _stage: str) -> None:
    return None


def _strict_module() -> Any:
    return importlib.import_module("service.mechanisms.ate_strict")


def _strict_supports(option: str) -> bool:
    s = _strict_module()
    if option == "cross_fit":
        return "cross_fit" in getattr(s.AteStrictParams, "__dataclass_fields__", {})
    return option in typing.get_args(getattr(s, "Nuisance", object))


def _strict(nuisance: str, **extra: Any) -> EstimatorFn:
    def fn(rep: Rep, epsilon: float) -> tuple[float, float] | None:
        s = _strict_module()
        if nuisance == "none" and not rep.dgp.rct:
            return None
        params = s.AteStrictParams(epsilon=epsilon, delta=rep.delta, nuisance=nuisance, **extra)
        rng = rep.rng(f"strict-{nuisance}-{extra}", epsilon)
        out = s.run(
            rep.arrays, rep.domain, params, rng=rng, noise=SeededSampler(rng), progress=_progress
        )
        return float(out["estimate"]), float(out["half_width"]) / Z95

    return fn


def _module_present(module: str, *attrs: str) -> bool:
    try:
        mod = importlib.import_module(f"service.mechanisms.{module}")
    except ImportError:
        return False
    return all(hasattr(mod, a) for a in attrs)


def _mechanism(
    module: str,
    params_class: str,
    run_name: str = "run",
    *,
    design: str = "any",
    max_epsilon: float = math.inf,
    with_delta: bool = True,
    **extra: Any,
) -> EstimatorFn:
    """Adapter for a mechanism module's ``run``-like function returning estimate/half_width."""

    def fn(rep: Rep, epsilon: float) -> tuple[float, float] | None:
        if (design == "rct") != rep.dgp.rct and design != "any":
            return None
        if not epsilon < max_epsilon:
            return None
        mod = importlib.import_module(f"service.mechanisms.{module}")
        kwargs: dict[str, Any] = {"epsilon": epsilon, **extra}
        if with_delta:
            kwargs["delta"] = rep.delta
        params = getattr(mod, params_class)(**kwargs)
        rng = rep.rng(f"{module}-{run_name}-{extra}", epsilon)
        run = getattr(mod, run_name)
        accepted = inspect.signature(run).parameters
        call: dict[str, Any] = {"rng": rng, "noise": SeededSampler(rng)}
        if "progress" in accepted:
            call["progress"] = _progress
        out = run(rep.arrays, rep.domain, params, **call)
        return float(out["estimate"]), float(out["half_width"]) / float(
            ndtri(1.0 - params.alpha / 2.0)
        )

    return fn


def _crossfit_aipw(
    arrays: Arrays, *, folds: int, rng: np.random.Generator, split: bool = False
) -> tuple[float, float]:
    """Non-private AIPW: logistic propensity (clipped to [0.01, 0.99]), linear outcome on (A, X).

    ``split=False``: K-fold cross-fitting, every row in the estimate (the "Standard" CI).
    ``split=True``: the strict mechanism's 25/25/50 split with non-private nuisances (nuisances
    on the first half, estimate on the second), to separate the cost of splitting from the cost
    of privacy.
    """
    from sklearn.linear_model import LinearRegression, LogisticRegression

    x, a, y = arrays.x, arrays.a, arrays.y
    n = x.shape[0]
    perm = rng.permutation(n)
    gamma = np.empty(n)
    if split:
        fit, est = perm[: n // 2], perm[n // 2 :]
        pairs = [(fit, est)]
    else:
        chunks = np.array_split(perm, folds)
        pairs = [
            (np.concatenate([c for j, c in enumerate(chunks) if j != k]), chunks[k])
            for k in range(folds)
        ]
    used = []
    for fit, est in pairs:
        if np.unique(a[fit]).size < 2:
            pi = np.full(est.size, a[fit].mean())
        else:
            prop = LogisticRegression(C=1e6, max_iter=1000).fit(x[fit], a[fit])
            pi = prop.predict_proba(x[est])[:, 1]
        pi = np.clip(pi, 0.01, 0.99)
        out = LinearRegression().fit(np.column_stack([a[fit], x[fit]]), y[fit])
        mu1 = out.predict(np.column_stack([np.ones(est.size), x[est]]))
        mu0 = out.predict(np.column_stack([np.zeros(est.size), x[est]]))
        ae, ye = a[est], y[est]
        gamma[est] = mu1 - mu0 + ae * (ye - mu1) / pi - (1 - ae) * (ye - mu0) / (1 - pi)
        used.append(est)
    g = gamma[np.concatenate(used)]
    return float(g.mean()), float(g.std(ddof=1) / math.sqrt(g.size))


def _nonprivate(rep: Rep, epsilon: float) -> tuple[float, float] | None:
    key = ("nonprivate_aipw_crossfit", -1.0)
    if key not in rep.cache:
        rep.cache[key] = _crossfit_aipw(rep.arrays, folds=2, rng=rep.rng("np", 0.0))
    return rep.cache[key]


def _nonprivate_split(rep: Rep, epsilon: float) -> tuple[float, float] | None:
    key = ("nonprivate_aipw_split", -1.0)
    if key not in rep.cache:
        rep.cache[key] = _crossfit_aipw(rep.arrays, folds=2, rng=rep.rng("nps", 0.0), split=True)
    return rep.cache[key]


def _naive(rep: Rep, epsilon: float) -> tuple[float, float] | None:
    """Privatised point (strict dp_linear; RCT: strict none), non-private sd: NOT valid."""
    base = ("strict_none" if rep.dgp.rct else "strict_dp_linear", epsilon)
    point = rep.cache.get(base)
    standard = _nonprivate(rep, epsilon)
    if point is None or standard is None:
        return None
    return point[0], standard[1]


ESTIMATORS: tuple[Estimator, ...] = (
    Estimator(
        "strict_dp_ebm",
        "strict AIPW, DP-EBM nuisances, 25/25/50 split",
        _strict("dp_ebm"),
        slow=True,
    ),
    Estimator(
        "strict_none",
        "strict AIPW in an RCT, pi = 0.5, mu = midpoint (Horvitz-Thompson), all n",
        _strict("none"),
    ),
    Estimator(
        "strict_dp_linear",
        "strict AIPW, dp_linear nuisances",
        _strict("dp_linear"),
        available=lambda: _strict_supports("dp_linear"),
    ),
    Estimator(
        "strict_dp_linear_crossfit",
        "strict AIPW, dp_linear nuisances, cross_fit=True",
        _strict("dp_linear", cross_fit=True),
        available=lambda: _strict_supports("dp_linear") and _strict_supports("cross_fit"),
    ),
    Estimator(
        "strict_dp_linear_crossfit_fixed",
        "strict AIPW, dp_linear, cross_fit=True, former fixed shares (nuisance 0.5, mean 0.8)",
        _strict("dp_linear", cross_fit=True, nuisance_share=0.5, mean_share=0.8),
        available=lambda: _strict_supports("dp_linear") and _strict_supports("cross_fit"),
    ),
    Estimator(
        "ipw_strict",
        "strict Lee et al. IPW: DP logistic propensity on D_m, DP mean and 2nd moment on D_n",
        _mechanism("ate_ipw", "AteIpwParams"),
        available=lambda: _module_present("ate_ipw", "run", "AteIpwParams"),
    ),
    Estimator(
        "ipw_paper",
        "PAPER (not DP for D_n): Lee et al. DP propensity, IPTW on D_n in the clear (eps < 1)",
        _mechanism("ate_ipw", "AteIpwParams", "run_paper", max_epsilon=1.0),
        available=lambda: _module_present("ate_ipw", "run_paper"),
    ),
    Estimator(
        "rct_diff_means",
        "strict RCT difference in means (Laplace, pure eps-DP, delta-method CI)",
        _mechanism("ate_rct", "AteRctParams", design="rct", with_delta=False),
        available=lambda: _module_present("ate_rct", "run", "AteRctParams"),
    ),
    Estimator(
        "privATE_paper",
        "PAPER mode PrivATE (Schroeder et al.), kernel preset, Table 1 split 0.9/0.1",
        _mechanism("ate_privATE", "PrivateParams", ate_share=0.9, nuisance="kernel"),
        available=lambda: _module_present("ate_privATE", "run", "PrivateParams"),
    ),
    Estimator(
        "privATE_paper_linear",
        "PAPER mode PrivATE with the 'linear' nuisance preset (logistic, ridge)",
        _mechanism("ate_privATE", "PrivateParams", ate_share=0.9, nuisance="linear"),
        available=lambda: _module_present("ate_privATE", "run", "PrivateParams"),
    ),
    Estimator(
        "nonprivate_aipw_crossfit",
        "NOT PRIVATE: 2-fold cross-fitted AIPW (logistic, linear), 'Standard' CI",
        _nonprivate,
        private=False,
    ),
    Estimator(
        "nonprivate_aipw_split",
        "NOT PRIVATE: AIPW, nuisances on half the rows, estimate on the other half",
        _nonprivate_split,
        private=False,
    ),
    Estimator(
        "naive",
        "NOT PRIVATE: strict dp_linear point (RCT: strict none) with the non-private AIPW sd",
        _naive,
        private=False,
    ),
)


# ---- suites -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    dgp: str
    n: int
    epsilons: tuple[float, ...]
    estimators: tuple[str, ...]
    target: str
    # Per-estimator repetition caps for slow estimators in this cell: ((name, reps), ...).
    caps: tuple[tuple[str, int], ...] = ()
    # The same delta for every method; README §1.7 needs delta < 1 / (smallest fold).
    delta: float = DELTA


def suites(quick: bool) -> dict[str, tuple[Cell, ...]]:
    strict_obs = ("strict_dp_ebm", "strict_dp_linear", "strict_dp_linear_crossfit")
    lee = ("ipw_strict", "ipw_paper")
    common = ("nonprivate_aipw_crossfit", "naive")
    rct_methods = (
        "strict_none",
        "strict_dp_ebm",
        "strict_dp_linear",
        "rct_diff_means",
        "ipw_strict",
        "privATE_paper",
        "privATE_paper_linear",
    )
    if quick:
        return {
            "grid": (Cell("dataset1", 1000, (1.0, 10.0), (*strict_obs, *lee, *common), "smoke"),),
            "paper": (
                Cell(
                    "rct",
                    1000,
                    (0.5,),
                    (*rct_methods, *common),
                    "smoke",
                    caps=(("privATE_paper", 2), ("privATE_paper_linear", 4)),
                ),
            ),
            "large": (),
        }
    grid_eps = (0.5, 1.0, 2.0, 5.0, 10.0)
    paper_obs = (*strict_obs, *lee, "privATE_paper", "privATE_paper_linear", *common)
    return {
        # PrivATE (paper mode) is not in the grid: its kernel preset takes ~10 s per fit at
        # n = 3000 on this machine (measured in the paper suite's mean_seconds).
        "grid": tuple(
            Cell(
                "dataset1",
                n,
                grid_eps,
                (*strict_obs, *lee, *common),
                "strict coverage in [0.93, 0.97]",
            )
            for n in (1000, 5000, 20000)
        ),
        "paper": (
            Cell(
                "dataset1",
                3000,
                (0.5,),
                paper_obs,
                "B1",
                caps=(("privATE_paper", 30), ("privATE_paper_linear", 150)),
            ),
            Cell(
                "dataset2",
                3000,
                (0.5,),
                paper_obs,
                "B2",
                caps=(("privATE_paper", 2), ("privATE_paper_linear", 4)),
            ),
            Cell(
                "rct",
                1000,
                (0.5,),
                (*rct_methods, *common),
                "B3",
                caps=(("privATE_paper", 40), ("privATE_paper_linear", 150)),
            ),
        ),
        "large": (
            Cell(
                "dataset1",
                1_000_000,
                (1.0,),
                (
                    "strict_dp_ebm",
                    "strict_dp_linear",
                    "strict_dp_linear_crossfit",
                    "strict_dp_linear_crossfit_fixed",
                    "ipw_strict",
                    "nonprivate_aipw_crossfit",
                    "nonprivate_aipw_split",
                ),
                "strict width <= 1.1 x non-private cross-fit",
                delta=4e-7,  # 1 / (10 x 250,000), the strict split's smallest fold
            ),
        ),
    }


# ---- running ----------------------------------------------------------------------------------

_BY_NAME = {e.name: e for e in ESTIMATORS}


def _one(task: tuple[int, Cell, int, int, tuple[str, ...], int]) -> dict[str, Any]:
    """Run every estimator of a cell on one simulated dataset; return per-estimator rows."""
    cell_index, cell, rep_index, base_seed, names, _reps = task
    dgp = make_dgp(cell.dgp)
    seed = (base_seed, cell_index, rep_index)
    arrays = dgp.sample(cell.n, np.random.default_rng(np.random.SeedSequence(list(seed))))
    rep = Rep(dgp, arrays, dgp.domain(cell.n), seed, cell.delta)
    rows: dict[str, Any] = {}
    for epsilon in cell.epsilons:
        for name in names:
            est = _BY_NAME[name]
            if not est.private and name != "naive" and epsilon != cell.epsilons[0]:
                continue  # non-private: once per dataset
            t0 = time.perf_counter()
            try:
                value = est.fn(rep, epsilon)
                error = None
            except Exception as exc:  # a failed release is a result too; record its type
                value, error = None, type(exc).__name__
            seconds = time.perf_counter() - t0
            rep.cache[(name, epsilon)] = value
            if value is None and error is None:
                continue
            rows[f"{name}|{epsilon}"] = {
                "estimate": None if value is None else value[0],
                "sd": None if value is None else value[1],
                "error": error,
                "seconds": seconds,
            }
    return {"cell": cell_index, "rep": rep_index, "rows": rows}


def _worker_init() -> None:
    """Workers leave SIGTERM to the pool (only the parent summarises an interrupted run)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _bar(done: int, total: int, start: float, label: str) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    elapsed = time.perf_counter() - start
    eta = elapsed / done * (total - done) if done else float("nan")
    sys.stderr.write(
        f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
        f"{elapsed:6.0f}s eta {eta:6.0f}s"
    )
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def run_suite(
    name: str, cells: tuple[Cell, ...], *, reps: int, slow_reps: int, workers: int, seed: int
) -> dict[str, Any]:
    available = {e.name for e in ESTIMATORS if e.available()}
    # Import every mechanism before forking, so all workers run the same code (files under
    # service/mechanisms change while colleagues work); their hashes go into the result.
    for module in ("ate_strict", "ate_ipw", "ate_rct", "ate_privATE", "dp_linear"):
        if _module_present(module):
            importlib.import_module(f"service.mechanisms.{module}")
    # One task = one group of estimators on repetition r of a cell. Fast estimators form one
    # group (all reps); each slow or capped estimator is its own group (its first reps), on the
    # SAME simulated dataset (seeded by cell and r). Tasks are ordered by the fraction of their
    # group done, so an interrupted run has proportionally filled groups.
    keyed = []
    for i, cell in enumerate(cells):
        names = [n for n in cell.estimators if n in available]
        caps = dict(cell.caps)
        limit = {n: caps.get(n, slow_reps if _BY_NAME[n].slow else reps) for n in names}
        fast = tuple(n for n in names if limit[n] >= reps)
        groups = [(fast, reps)] if fast else []
        groups += [((n,), min(limit[n], reps)) for n in names if limit[n] < reps]
        for group, count in groups:
            keyed += [((r + 0.5) / count, i, r, group) for r in range(count)]
    keyed.sort(key=lambda k: (k[0], k[1]))
    tasks = [(i, cells[i], r, seed, group, reps) for _, i, r, group in keyed]
    start = time.perf_counter()
    results: list[dict[str, Any]] = []
    interrupted = False
    _bar(0, len(tasks), start, name)
    try:
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers, _worker_init) as pool:
                for out in pool.imap_unordered(_one, tasks):
                    results.append(out)
                    _bar(len(results), len(tasks), start, name)
        else:
            for task in tasks:
                results.append(_one(task))
                _bar(len(results), len(tasks), start, name)
    except KeyboardInterrupt:  # SIGINT / SIGTERM: summarise what was measured, say so
        interrupted = True
        sys.stderr.write(f"\ninterrupted after {len(results)}/{len(tasks)} tasks\n")
    wall = time.perf_counter() - start
    summary = []
    for i, cell in enumerate(cells):
        rows = [r["rows"] for r in results if r["cell"] == i]
        keys = sorted(
            {k for r in rows for k in r}, key=lambda k: (k.split("|")[0], float(k.split("|")[1]))
        )
        for key in keys:
            est_name, eps = key.split("|")
            summary.append(
                _summarise(cell, est_name, float(eps), [r[key] for r in rows if key in r])
            )
    return {
        "mechanism_sources_sha256": _source_hashes(),
        "cross_fit_nuisance_share": {
            str(c.n): {str(e): _cross_fit_share(c.n, e) for e in c.epsilons} for c in cells
        },
        "reps_requested": reps,
        "slow_reps_requested": min(slow_reps, reps),
        "interrupted": interrupted,
        "tasks_completed": len(results),
        "wall_seconds": round(wall, 1),
        "cells": [dataclasses.asdict(c) for c in cells],
        "unavailable": sorted({n for c in cells for n in c.estimators} - available),
        "summary": summary,
    }


def _cross_fit_share(n: int, epsilon: float) -> float | None:
    """The default cross-fitting nuisance share at (n, epsilon) (public rule), if defined."""
    rule = getattr(
        importlib.import_module("service.mechanisms.ate_strict"), "default_nuisance_share", None
    )
    return None if rule is None else float(rule(n, epsilon))


def _source_hashes() -> dict[str, str]:
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "service" / "mechanisms"
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(root.rglob("*.py"))
        if p.relative_to(root).as_posix().startswith(("ate_", "dp_linear", "noise", "calibration"))
    }


def _summarise(cell: Cell, name: str, epsilon: float, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["error"] is None]
    est = np.array([r["estimate"] for r in ok])
    sd = np.array([r["sd"] for r in ok])
    out: dict[str, Any] = {
        "dgp": cell.dgp,
        "n": cell.n,
        "epsilon": epsilon if _BY_NAME[name].private or name == "naive" else None,
        "estimator": name,
        "description": _BY_NAME[name].description,
        "reps": len(rows),
        "failures": len(rows) - len(ok),
        "failure_types": sorted({r["error"] for r in rows if r["error"]}),
        "mean_seconds": round(float(np.mean([r["seconds"] for r in rows])), 4),
    }
    if not ok:
        return out
    coverage = {}
    for level in LEVELS:
        z = float(ndtri(0.5 + level / 2))
        p = float(np.mean(np.abs(est - TAU) <= z * sd))
        coverage[f"{level:.2f}"] = {
            "coverage": round(p, 4),
            "se": round(math.sqrt(p * (1 - p) / len(ok)), 4),
        }
    out.update(
        {
            "coverage": coverage,
            "mean_width_95": round(float(np.mean(2 * Z95 * sd)), 6),
            "bias": round(float(np.mean(est) - TAU), 6),
            "rmse": round(float(np.sqrt(np.mean((est - TAU) ** 2))), 6),
        }
    )
    return out


# ate_ci.md §2.12 (c(n, eps, delta) and the variance coefficient) and §3.7 (strict s_theta, s_2,
# minimum 95 % half-width), checked from the public formulas; no data.
B6_CONSTANTS = (
    (3000, 0.45, 9e-6, 0.05200, 8.1127),
    (3000, 0.05, 1e-6, 0.50807, 774.41),
    (3000, 0.25, 5e-6, 0.09581, 27.540),
    (5735, 0.05, 5e-6, 0.26054, 389.31),
    (5735, 0.125, 5e-6, 0.10422, 62.289),
    (5735, 0.25, 5e-6, 0.05211, 15.572),
    (1000, 0.25, 5e-6, 0.26699, 71.284),
)
WORKED_NUMBERS = ((3000, 0.5, 0.5841, 57.82, 1.145), (3000, 1.0, 0.3091, 30.35, 0.606))


def deterministic_checks() -> dict[str, Any]:
    """B6: the spec's constant tables against the mechanisms' public formulas."""
    out: dict[str, Any] = {}
    if _module_present("ate_privATE", "nrs_constant", "variance_term_coefficient"):
        m = importlib.import_module("service.mechanisms.ate_privATE")
        rows = []
        for n, eps, delta, c_spec, v_spec in B6_CONSTANTS:
            c, v = m.nrs_constant(n, eps, delta), m.variance_term_coefficient(n, eps, delta)
            rows.append(
                {
                    "n": n,
                    "epsilon": eps,
                    "delta": delta,
                    "c": round(c, 5),
                    "c_spec": c_spec,
                    "coef": round(v, 4),
                    "coef_spec": v_spec,
                    "match": abs(c - c_spec) < 5e-6 and abs(v - v_spec) <= 5e-5 * v_spec,
                }
            )
        out["privATE_constants"] = rows
    s = importlib.import_module("service.mechanisms.ate_strict")
    dgp = make_dgp("dataset1")
    rows = []
    for n, eps, s_theta, s_2, half in WORKED_NUMBERS:
        q = s.quote(dgp.domain(n), s.AteStrictParams(epsilon=eps, delta=1e-5))
        rows.append(
            {
                "n": n,
                "epsilon": eps,
                "s_theta": round(q["s_theta"], 4),
                "s_theta_spec": s_theta,
                "s_2": round(q["s_2"], 2),
                "s_2_spec": s_2,
                "min_half_width": round(q["min_half_width"], 3),
                "min_half_width_spec": half,
            }
        )
    out["strict_worked_numbers"] = rows
    return out


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def write_named_result(module: str, variant: str, payload: dict[str, Any], *, quick: bool) -> Any:
    """``write_result`` for ``module``, into ``<module>-<variant>.json`` unless variant is all."""
    out = write_result(module, payload, quick=quick)
    if variant == "all":
        return out
    target = out.with_name(out.name.replace(module, f"{module}-{variant}", 1))
    out.replace(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per cell")
    parser.add_argument("--large-reps", type=int, default=None, help="repetitions at n = 10^6")
    parser.add_argument(
        "--slow-reps",
        type=int,
        default=None,
        help="repetitions for the slow estimators (DP-EBM): the first N of --reps",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument("--suite", choices=("grid", "paper", "large", "all"), default="all")
    parser.add_argument(
        "--estimators",
        default=None,
        help="comma-separated subset of estimators to run (default: every estimator of a cell)",
    )
    parser.add_argument(
        "--tag", default=None, help="suffix of the result file name (ate_coverage-<suite>-<tag>)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    reps = args.reps or (20 if args.quick else 500)
    large_reps = args.large_reps or min(reps, 20)
    chosen = ("grid", "paper", "large") if args.suite == "all" else (args.suite,)
    payload: dict[str, Any] = {
        "delta": DELTA,
        "tau": TAU,
        "noise": "SeededSampler (continuous Gaussian, seeded; harness only)",
        "estimators": {e.name: e.description for e in ESTIMATORS},
        "paper": PAPER_TABLE1,
        "suites": {},
        "deterministic": deterministic_checks(),
    }
    only = None if args.estimators is None else set(args.estimators.split(","))
    if only is not None:
        payload["estimators_selected"] = sorted(only)
    for name in chosen:
        cells = suites(args.quick)[name]
        if only is not None:
            cells = tuple(
                dataclasses.replace(c, estimators=tuple(e for e in c.estimators if e in only))
                for c in cells
            )
        if not cells:
            continue
        payload["suites"][name] = run_suite(
            name,
            cells,
            reps=large_reps if name == "large" else reps,
            slow_reps=args.slow_reps if args.slow_reps is not None else (5 if args.quick else reps),
            workers=args.workers,
            seed=args.seed,
        )
        for row in payload["suites"][name]["summary"]:
            cov = row.get("coverage", {}).get("0.95", {}).get("coverage")
            print(  # noqa: T201
                f"{name:6} {row['dgp']:9} n={row['n']:<8} eps={row['epsilon']!s:5} "
                f"{row['estimator']:28} cov95={cov} width={row.get('mean_width_95')} "
                f"fail={row['failures']} t={row['mean_seconds']}s",
                flush=True,
            )
    variant = args.suite if args.tag is None else f"{args.suite}-{args.tag}"
    out = write_named_result("ate_coverage", variant, payload, quick=args.quick)
    print(f"wrote {out}")  # noqa: T201


if __name__ == "__main__":
    main()
