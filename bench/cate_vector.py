"""DP-CATE finite-query vectors beside the functional (GP) release: PEHE vs epsilon.

DGPs of benchmarks.md §5.1. DS1 (p = 2, theta = exp(2 x0) + 3 sin(4 x0)) and DS2 (p = 30,
theta = exp(2 x0) + 3 sin(4 x1)): X ~ U[0, 1]^p, A = 1{X'beta >= eta}, Y = theta(X) A + X'gamma
+ eps, eta, eps ~ U[-1, 1], beta / gamma sparse (support 3, entries U[0, 0.3] / U[0, 1]). 3000
samples: 2700 train, the 300 test X are the d = 300 query points (quick: d = 50). Public
bounds: X in [0, 1]^p, Y in [-1, 5.45 + 3 + 1]. PEHE = sqrt(mean_j (g(x_j) - theta(x_j))^2)
(the root is taken). delta = 1e-5, propensity clip 0.05 everywhere.

Each repetition draws one dataset and runs, on that same dataset and query points, through
the mechanism functions directly (no server):

* ``cate_vector`` R and DR, ``paper`` and ``strict`` (the kind's defaults: ridge by the public
  rule ``suggested_ridge`` in strict mode, 1e-3 in paper mode, 50 random Fourier features,
  lengthscale 0.3; ``--strict-ridges`` sweeps fixed strict ridges instead). Paper mode's fit
  (MLP nuisances, second stage, the sup search for gamma_hat) does not depend on epsilon, so it
  is fitted once per repetition and released with fresh noise at every epsilon (same marginal
  law per cell; the cells of one repetition share the fit). Strict mode refits per epsilon
  (its DP-EBM nuisances depend on epsilon). The paper rows also record gamma_hat / R_Y against
  the quote's public bracket [1, Gamma_max / R_Y].
* ``cate_function`` (R-learner; h = sqrt(q / 6), lambda0 = 0.1 unnormalised, the setting of
  bench/functions.py, not tuned here): strict exact basis (the GP path drawn at the 300 points as
  the service's first evaluation batch does), strict Nystrom (256 public Sobol centres), paper
  exact basis. Refitted per epsilon, as a release would be. Values are reported raw (as the
  service releases them) and clipped to the public CATE range [-R_Y, R_Y] as cate_vector does.
* ``ebm_cate`` DR (the DP-EBM learner of C7), per epsilon.
* non-private references: the paper-mode vector's second stage g* and the paper-mode
  function's g* (KRR with non-private nuisances) at the query points.

    nice -n 10 python -m bench.cate_vector --dataset DS1 --reps 5
    python -m bench.cate_vector --quick    # DS1, one rep, eps {1, 10}, d = 50
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.common import RESULTS, machine
from service.mechanisms import cate_function as cf
from service.mechanisms import cate_vector as cv
from service.mechanisms import ebm_cate
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import OpenDPSampler

Y_LOWER, Y_UPPER = -1.0, 5.45 + 3.0 + 1.0
R_Y = Y_UPPER - Y_LOWER
DELTA = 1e-5
CLIP = 0.05
EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0, 50.0)
TOTAL, TEST = 3000, 300


def theta(name: str, x: NDArray[np.float64]) -> NDArray[np.float64]:
    if name == "DS1":
        return np.asarray(np.exp(2 * x[:, 0]) + 3 * np.sin(4 * x[:, 0]))
    return np.asarray(np.exp(2 * x[:, 0]) + 3 * np.sin(4 * x[:, 1]))


def sample(name: str, n: int, rng: np.random.Generator) -> Arrays:
    p = 2 if name == "DS1" else 30
    coef = np.random.default_rng(2025 + p)
    beta, gamma = np.zeros(p), np.zeros(p)
    support = coef.choice(p, size=min(3, p), replace=False)
    beta[support] = coef.uniform(0, 0.3, support.size)
    gamma[coef.choice(p, size=min(3, p), replace=False)] = coef.uniform(0, 1, min(3, p))
    x = rng.uniform(0, 1, (n, p))
    a = (x @ beta >= rng.uniform(-1, 1, n)).astype(np.float64)
    y = np.clip(theta(name, x) * a + x @ gamma + rng.uniform(-1, 1, n), Y_LOWER, Y_UPPER)
    return Arrays(x, a, y)


def pehe(values: NDArray[np.float64], truth: NDArray[np.float64]) -> float:
    return float(math.sqrt(np.mean((np.asarray(values) - truth) ** 2)))


def _quiet(fraction: float, stage: str) -> None:
    return None


class Rep:
    """One repetition: one dataset, its query points, and every mechanism on it."""

    def __init__(self, name: str, seed: int, d: int) -> None:
        self.name = name
        self.seed = seed
        rng = np.random.default_rng(seed)
        data = sample(name, TOTAL, rng)
        train = TOTAL - TEST
        self.arrays = Arrays(data.x[:train], data.a[:train], data.y[:train])
        self.points = data.x[train : train + d]
        self.truth = theta(name, self.points)
        p = data.x.shape[1]
        self.domain = PublicDomain(
            x_lower=np.zeros(p),
            x_upper=np.ones(p),
            y_lower=Y_LOWER,
            y_upper=Y_UPPER,
            n=train,
            allow_paper_mode=True,
        )
        self.rng = np.random.default_rng(10_000 + seed)
        self.noise = OpenDPSampler()

    # -- cate_vector -------------------------------------------------------------------------
    def vector_params(
        self, mode: str, learner: str, epsilon: float, ridge: float | None = None
    ) -> cv.CateVectorParams:
        params = cv.CateVectorParams(
            points=tuple(tuple(float(v) for v in row) for row in self.points),
            epsilon=epsilon,
            delta=DELTA,
            learner=learner,  # type: ignore[arg-type]
            mode=mode,  # type: ignore[arg-type]
            propensity_clip=CLIP,
        )
        if ridge is None:  # the kind's default: the public rule (strict), 1e-3 (paper)
            ridge = cv.suggested_ridge(self.domain, params)
        return replace(params, ridge=ridge)

    def vector_strict(self, learner: str, epsilon: float, ridge: float | None = None) -> float:
        params = self.vector_params("strict", learner, epsilon, ridge)
        out = cv.run(
            self.arrays, self.domain, params, rng=self.rng, noise=self.noise, progress=_quiet
        )
        return pehe(np.asarray(out["estimates"]), self.truth)

    def vector_paper(
        self, learner: str, epsilons: tuple[float, ...]
    ) -> tuple[dict[float, float], float, float, float]:
        """PEHE per epsilon from one fit; the non-private PEHE; gamma_hat / R_Y; seconds."""
        started = time.perf_counter()
        state = cv.make_plan(self.domain, self.vector_params("paper", learner, epsilons[0]))
        fitted = cv.fit(self.arrays, self.domain, state, rng=self.rng, progress=_quiet)
        out: dict[float, float] = {}
        for epsilon in epsilons:
            plan = cv.make_plan(self.domain, self.vector_params("paper", learner, epsilon))
            released = cv.release(fitted, plan, noise=self.noise)
            out[epsilon] = pehe(np.asarray(released["estimates"]), self.truth)
        assert fitted.gamma_hat is not None
        return (
            out,
            pehe(fitted.estimates, self.truth),
            fitted.gamma_hat / R_Y,
            time.perf_counter() - started,
        )

    # -- cate_function -----------------------------------------------------------------------
    def function(
        self, mode: str, basis: str, epsilon: float, learner: str = "r"
    ) -> tuple[float, float, float]:
        """(PEHE raw, PEHE clipped to [-R_Y, R_Y], non-private PEHE of g* or nan)."""
        params = cf.CateFunctionParams(
            epsilon=epsilon,
            delta=DELTA,
            mode=mode,  # type: ignore[arg-type]
            learner=learner,  # type: ignore[arg-type]
            regularization=0.1,
            lambda_convention="unnormalised",
            propensity_clip=CLIP,
            basis=basis,  # type: ignore[arg-type]
        )
        _, fitted = cf.run(
            self.arrays, self.domain, params, rng=self.rng, noise=self.noise, progress=_quiet
        )
        lower = np.asarray(self.domain.x_lower, np.float64)
        upper = np.asarray(self.domain.x_upper, np.float64)
        _, canonical = cf.canonicalise(cf.scale_to_unit(self.points, lower, upper))
        # the service dedupes canonical points; the test X are distinct
        mean = fitted.mean(canonical)
        nonprivate = float("nan")
        if fitted.kind == "gp":
            path = cf.start_path(fitted, canonical.shape[1], canonical.shape[0] + 512)
            draw = path.draw(canonical, normals=self.noise.standard_normal)
            values = fitted.released(mean, draw.values)
            nonprivate = pehe(mean, self.truth)
        else:
            values = fitted.released(mean)
        return (
            pehe(values, self.truth),
            pehe(np.clip(values, -R_Y, R_Y), self.truth),
            nonprivate,
        )

    # -- ebm_cate ----------------------------------------------------------------------------
    def ebm_dr(self, epsilon: float) -> float:
        params = ebm_cate.EbmCateParams(
            epsilon=epsilon, delta=DELTA, learner="dr", propensity_clip=CLIP
        )
        result = ebm_cate.run(
            self.arrays, self.domain, params, rng=self.rng, progress=_quiet, noise=self.noise
        )
        return pehe(ebm_cate.predict(result, self.points), self.truth)


def public_noise_sd(
    name: str, d: int, epsilons: tuple[float, ...], ridges: list[float] | None = None
) -> dict[str, Any]:
    """The quotes' public noise figures per epsilon (no data): what an analyst is told."""
    rep = Rep.__new__(Rep)
    p = 2 if name == "DS1" else 30
    rep.points = np.full((d, p), 0.5)
    rep.domain = PublicDomain(
        x_lower=np.zeros(p),
        x_upper=np.ones(p),
        y_lower=Y_LOWER,
        y_upper=Y_UPPER,
        n=TOTAL - TEST,
        allow_paper_mode=True,
    )
    out: dict[str, Any] = {}
    for epsilon in epsilons:
        row: dict[str, Any] = {}
        for mode in ("strict", "paper"):
            for learner in ("r", "dr"):
                vparams = rep.vector_params(mode, learner, epsilon)
                quote = cv.quote(rep.domain, vparams)
                key = f"vector {mode} {learner.upper()}"
                row[f"{key} ridge"] = vparams.ridge
                row[key] = [quote.get("noise_sd_lower_bound"), quote["noise_sd_upper_bound"]]
            fparams = cf.CateFunctionParams(
                epsilon=epsilon,
                delta=DELTA,
                mode=mode,
                regularization=0.1,
                lambda_convention="unnormalised",
                propensity_clip=CLIP,
            )
            row[f"function {mode} R pointwise sd"] = cf.quote(rep.domain, fparams)[
                "pointwise_noise_sd"
            ]
        for ridge in ridges or ():
            for learner in ("r", "dr"):
                params = rep.vector_params("strict", learner, epsilon, ridge)
                row[f"vector strict {learner.upper()} ridge {ridge:g}"] = cv.quote(
                    rep.domain, params
                )["noise_sd_upper_bound"]
        out[str(epsilon)] = row
    return out


def summarise(values: list[float]) -> dict[str, Any]:
    finite = [v for v in values if math.isfinite(v)]
    k = len(finite)
    mean = float(np.mean(finite)) if k else float("nan")
    se = float(np.std(finite, ddof=1) / math.sqrt(k)) if k > 1 else float("nan")
    return {"reps": k, "pehe_mean": mean, "pehe_se": se, "pehe_runs": values}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dataset", choices=("DS1", "DS2"), default="DS1")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--paper-reps", type=int, default=None, help="fewer paper-mode fits")
    parser.add_argument("--epsilons", type=float, nargs="*", default=list(EPSILONS))
    parser.add_argument("--budget", type=float, default=1320.0, help="seconds; stop after a rep")
    parser.add_argument(
        "--strict-ridges",
        type=float,
        nargs="*",
        default=None,
        help="only the strict vector, at each of these public ridges (default-choice sweep)",
    )
    args = parser.parse_args()
    ridges: list[float] | None = args.strict_ridges
    name: str = "DS1" if args.quick else args.dataset
    epsilons = (1.0, 10.0) if args.quick else tuple(args.epsilons)
    reps = 1 if args.quick else args.reps
    paper_reps = reps if args.paper_reps is None else args.paper_reps
    d = 50 if args.quick else TEST
    suffix = "-quick" if args.quick else ("_ridge_" if ridges else "_") + name
    out_path = RESULTS / f"cate_vector{suffix}.json"
    runs: dict[str, dict[float, list[float]]] = {}
    extra: dict[str, list[float]] = {"gamma_over_ry_r": [], "gamma_over_ry_dr": []}
    seconds: dict[str, float] = {}
    started = time.time()

    def add(label: str, epsilon: float, value: float, spent: float) -> None:
        runs.setdefault(label, {}).setdefault(epsilon, []).append(value)
        seconds[label] = seconds.get(label, 0.0) + spent

    def timed(label: str, epsilon: float, fn: Any, *fargs: Any) -> Any:
        t0 = time.perf_counter()
        value = fn(*fargs)
        add(label, epsilon, value if isinstance(value, float) else value[0], 0.0)
        seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - t0
        return value

    def write(done_reps: int, complete: bool) -> None:
        rows = [
            {"mechanism": label, "epsilon": eps, **summarise(vals)}
            for label, cells in runs.items()
            for eps, vals in sorted(cells.items(), key=lambda kv: kv[0])
        ]
        lo, hi = cv.paper_gamma_bounds("r", R_Y, CLIP), cv.paper_gamma_bounds("dr", R_Y, CLIP)
        doc = {
            "benchmark": "cate_vector",
            "command": "python -m bench.cate_vector " + " ".join(sys.argv[1:]),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "setting": {
                "dataset": name,
                "n": TOTAL - TEST,
                "queries": d,
                "delta": DELTA,
                "propensity_clip": CLIP,
                "epsilons": list(epsilons),
                "reps_requested": reps,
                "paper_reps_requested": paper_reps,
                "reps_done": done_reps,
                "vector": "ridge suggested_ridge strict / 1e-3 paper, 50 RFF, lengthscale 0.3",
                "function": "R-learner, h = sqrt(q/6), lambda0 = 0.1 unnormalised, 256 centres",
                "pehe": "root mean squared error at the queries; mean and SE over reps",
            },
            "paper_quote_bracket": {
                "r": {"gamma_over_ry": [lo[0] / R_Y, lo[1] / R_Y]},
                "dr": {"gamma_over_ry": [hi[0] / R_Y, hi[1] / R_Y]},
                "realised_gamma_over_ry_r": extra["gamma_over_ry_r"],
                "realised_gamma_over_ry_dr": extra["gamma_over_ry_dr"],
            },
            "public_noise_sd": public_noise_sd(name, d, epsilons, ridges),
            "rows": rows,
            "seconds_by_mechanism": {k: round(v, 1) for k, v in seconds.items()},
            "seconds": round(time.time() - started, 1),
            "complete": complete,
        }
        out_path.write_text(json.dumps(doc, indent=2) + "\n")

    done = 0
    for r in range(reps):
        rep = Rep(name, 100 + r, d)
        for epsilon in epsilons if ridges else ():
            for ridge in ridges or ():
                for learner in ("r", "dr"):
                    label = f"vector strict {learner.upper()} ridge {ridge:g}"
                    timed(label, epsilon, rep.vector_strict, learner, epsilon, ridge)
        for epsilon in epsilons if not ridges else ():
            for learner in ("r", "dr"):
                timed(
                    f"vector strict {learner.upper()}", epsilon, rep.vector_strict, learner, epsilon
                )
            raw = timed(
                "function strict exact R", epsilon, rep.function, "strict", "exact", epsilon
            )
            add("function strict exact R (clipped)", epsilon, raw[1], 0.0)
            raw = timed(
                "function strict nystrom R", epsilon, rep.function, "strict", "nystrom", epsilon
            )
            add("function strict nystrom R (clipped)", epsilon, raw[1], 0.0)
            raw = timed("function paper exact R", epsilon, rep.function, "paper", "exact", epsilon)
            add("function paper exact R (clipped)", epsilon, raw[1], 0.0)
            if math.isfinite(raw[2]) and epsilon == epsilons[0]:
                add("function paper exact R g* (non-private)", 0.0, raw[2], 0.0)
            timed("ebm_cate DR", epsilon, rep.ebm_dr, epsilon)
        if r < paper_reps and not ridges:
            for learner in ("r", "dr"):
                per_eps, nonprivate, ratio, spent = rep.vector_paper(learner, epsilons)
                label = f"vector paper {learner.upper()}"
                for epsilon, value in per_eps.items():
                    add(label, epsilon, value, 0.0)
                seconds[label] = seconds.get(label, 0.0) + spent
                add(f"vector paper {learner.upper()} g* (non-private)", 0.0, nonprivate, 0.0)
                extra[f"gamma_over_ry_{learner}"].append(ratio)
        done = r + 1
        write(done, complete=False)
        print(f"rep {done} done at {time.time() - started:.0f} s", flush=True)
        if time.time() - started > args.budget and done < reps:
            print("time budget reached; stopping after this rep", flush=True)
            break
    write(done, complete=done == reps)
    print(out_path)


if __name__ == "__main__":
    main()
