"""The strict CATE kinds against EconML's non-private DRLearner: PEHE and fit time (issue 12).

Issue 12's targets: "CATE PEHE / non-private DRLearner PEHE at n = 10^5, eps = 1: <= 2" and
"fit time at n = 10^5: <= 2x EconML DRLearner on the same data".

Data: the realistic studies of ``bench.studies`` (observational ``none``, ``strong`` and the
randomised ``rct_none``, ``rct_strong``), the same training samples and test samples as
``bench.realistic`` (its seeds). Per cell (n, epsilon, study) and repetition:

* **DRLearner** (``econml.dr.DRLearner``, EconML 0.17.0, not private): propensity
  ``HistGradientBoostingClassifier``, outcome regression ``HistGradientBoostingRegressor`` (on X
  and the treatment, EconML's layout), final model ``HistGradientBoostingRegressor`` on the
  doubly robust pseudo-outcomes; ``cv=2`` cross-fitting folds (EconML's default, and the folds of
  ``bench.realistic``'s non-private AIPW), propensities clipped at ``min_propensity=0.01`` (as
  the non-private AIPW), scikit-learn defaults otherwise, ``random_state`` = the repetition.
  EconML is an optional ``bench`` extra, imported here only (the service does not depend on it).
* each strict CATE kind at its service defaults through ``bench.realistic.cate_release``
  (``cate_function``, ``cate_vector``, ``ebm_cate``, ``uplift_table`` with
  ``adjustment_partition=true`` on an observational design, ``cate_function_given_anchor``:
  ``cate_function`` anchored at the constant DP ATE release, 2 epsilon in all), the constant
  true ATE and the constant DP ATE (``bench.realistic.ate_release``, ``AteParams(epsilon)``).
  Named only: ``bench.realistic``'s comparator kinds, its ``ebm_cate@<settings>`` kinds (the
  default with request settings, e.g. ``ebm_cate@eps100+bins64``), and ``additive_oracle``
  (not a release: interpret's non-private EBM without interactions, 16 bins, fitted to the
  training rows' true tau, the floor of an additive effect model).

Figures per row: PEHE = sqrt(mean((tau_hat(x) - tau(x))^2)) on ``--test-n`` fresh test rows; its
ratio to DRLearner's PEHE and to the constant DP ATE's PEHE; wall seconds and their ratio to
DRLearner's. Seconds: DRLearner's ``fit`` alone (its ``effect`` at the test rows is reported
apart); a DP kind's seconds are its release *and* its evaluation at the test rows (for
``cate_vector`` the test rows are the release's query points; ``cate_function`` draws its GP
path there), so the time ratio is conservative against the kinds. Both sides run under the same
``threadpool_limits(--threads)`` (default 1: BLAS and OpenMP single-threaded), one after the
other in one process. A kind that raises is recorded with its error; a kind whose release took
longer than ``--slow-seconds`` is not run again in the same (study, epsilon).

    python -m bench.drlearner --quick                  # CI smoke: n 2000, eps 1, none and
                                                       # rct_strong, 1 rep, DRLearner and
                                                       # uplift_table only (seconds)
    python -m bench.drlearner                          # n 10^5, eps 1, the four studies, 1 rep
    python -m bench.drlearner --n 100000 --eps 1 --het none,strong,rct_none,rct_strong \\
        --reps 2 --name drlearner
"""

from __future__ import annotations

import argparse
import math
import os
import time
import traceback
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import write_result
from bench.realistic import (
    CATE_KINDS,
    EXTRA_CATE_KINDS,
    FULL_HET,
    FloatArray,
    _names,
    _sample_seed,
    _seed,
    ate_release,
    cate_release,
    pehe,
)
from bench.studies import STUDIES, Study
from service.mechanisms.domain import Arrays
from service.releases.kinds.ate import AteParams

ECONML_VERSION = "0.17.0"
HETS = ("none", "strong", "rct_none", "rct_strong")
DRLEARNER_SETTINGS = {
    "model_propensity": "HistGradientBoostingClassifier(random_state=rep)",
    "model_regression": "HistGradientBoostingRegressor(random_state=rep) on [X, one-hot T]",
    "model_final": "HistGradientBoostingRegressor(random_state=rep)",
    "cv": 2,
    "min_propensity": 0.01,
    "random_state": "rep",
}


def _clock() -> float:
    return time.perf_counter()


def _error(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def drlearner(arrays: Arrays, x_test: FloatArray, *, seed: int) -> tuple[FloatArray, float, float]:
    """EconML's DRLearner (not private): (tau_hat at x_test, fit seconds, effect seconds)."""
    from econml.dr import DRLearner  # the optional bench extra; never imported by the service
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    learner = DRLearner(
        model_propensity=HistGradientBoostingClassifier(random_state=seed),
        model_regression=HistGradientBoostingRegressor(random_state=seed),
        model_final=HistGradientBoostingRegressor(random_state=seed),
        cv=2,
        min_propensity=0.01,
        random_state=seed,
    )
    started = _clock()
    learner.fit(arrays.y, arrays.a.astype(np.int64), X=arrays.x)
    fitted = _clock() - started
    started = _clock()
    tau = np.asarray(learner.effect(x_test), np.float64).reshape(-1)
    return tau, fitted, _clock() - started


# Not a release: the best additive model of the true CATE, interpret's non-private EBM without
# interactions (16 bins, the DR learner's default max_bins) fitted to the training rows' true
# tau. The floor of any additive effect model (the DP-EBM effect model is one) with those bins:
# no pseudo-outcome noise, no privacy noise (bench/README.md, "What limits ebm_cate").
ADDITIVE_ORACLE = "additive_oracle"
ADDITIVE_ORACLE_BINS = 16


def additive_oracle(
    arrays: Arrays, tau: FloatArray, x_test: FloatArray, *, seed: int
) -> FloatArray:
    """tau_hat at x_test of the EBM without interactions fitted to the true tau (no noise)."""
    from interpret.glassbox import ExplainableBoostingRegressor

    model = ExplainableBoostingRegressor(
        interactions=0, max_bins=ADDITIVE_ORACLE_BINS, outer_bags=1, random_state=seed
    )
    model.fit(arrays.x, tau)
    return np.asarray(model.predict(x_test), np.float64)


def run_cell(
    study: Study,
    het_index: int,
    n: int,
    epsilon: float,
    reps: int,
    kinds: tuple[str, ...],
    test_n: int,
    slow_seconds: float,
) -> dict[str, Any]:
    domain = study.domain(n)
    names = ("drlearner", "constant_true_ate", "constant_dp_ate", *kinds)
    figures: dict[str, dict[str, list[Any]]] = {
        name: {"pehe": [], "sec": [], "errors": []} for name in names
    }
    effect_sec: list[float] = []
    skip: dict[str, str] = {}
    for rep in range(reps):
        arrays, tau_train = study.sample(n, _sample_seed(het_index, n, rep))
        test, _ = study.sample(test_n, _seed(3, het_index, n, round(epsilon * 1000), rep))
        truth = study.tau_true(test.x)
        figures["constant_true_ate"]["pehe"].append(pehe(np.full(test_n, study.true_ate), truth))
        try:
            tau, fit_s, eff_s = drlearner(arrays, test.x, seed=rep)
            figures["drlearner"]["pehe"].append(pehe(tau, truth))
            figures["drlearner"]["sec"].append(fit_s)
            effect_sec.append(eff_s)
        except Exception as exc:
            figures["drlearner"]["errors"].append(_error(exc))
        dp_ate: float | None = None
        try:
            dp_ate, _, seconds = ate_release(arrays, domain, AteParams(epsilon=epsilon))
            figures["constant_dp_ate"]["pehe"].append(pehe(np.full(test_n, dp_ate), truth))
            figures["constant_dp_ate"]["sec"].append(seconds)
        except Exception as exc:
            figures["constant_dp_ate"]["errors"].append(_error(exc))
        for kind in kinds:
            if kind in skip:
                continue
            started = _clock()
            try:
                if kind == ADDITIVE_ORACLE:
                    estimate = additive_oracle(arrays, tau_train, test.x, seed=rep)
                else:
                    estimate = cate_release(kind, arrays, domain, epsilon, test.x, dp_ate)
                figures[kind]["pehe"].append(pehe(estimate, truth))
            except Exception as exc:
                figures[kind]["errors"].append(_error(exc))
            seconds = _clock() - started
            figures[kind]["sec"].append(seconds)
            if seconds > slow_seconds:
                skip[kind] = f"took {seconds:.0f} s in repetition {rep} (> --slow-seconds)"
        print(f"    rep {rep}: " + ", ".join(_brief(figures, k) for k in names), flush=True)

    def mean(values: list[float]) -> float | None:
        return float(np.mean(values)) if values else None

    dr_pehe = mean(figures["drlearner"]["pehe"])
    dr_sec = mean(figures["drlearner"]["sec"])
    dp_pehe = mean(figures["constant_dp_ate"]["pehe"])
    rows: dict[str, Any] = {}
    for name, slot in figures.items():
        p, s = mean(slot["pehe"]), mean(slot["sec"])
        rows[name] = {
            "pehe": p,
            "pehe_values": slot["pehe"],
            "pehe_over_drlearner": p / dr_pehe if p is not None and dr_pehe else None,
            "pehe_over_constant_dp_ate": p / dp_pehe if p is not None and dp_pehe else None,
            "seconds": s,
            "seconds_values": [round(v, 3) for v in slot["sec"]],
            "seconds_over_drlearner_fit": s / dr_sec if s is not None and dr_sec else None,
            "releases": len(slot["pehe"]),
            "failures": len(slot["errors"]),
            "errors": sorted(set(slot["errors"]))[:3],
        }
        if name in skip:
            rows[name]["skipped_after"] = skip[name]
    rows["drlearner"]["effect_seconds"] = mean(effect_sec)
    rows["constant_true_ate"]["seconds"] = None
    return rows


def _brief(figures: dict[str, dict[str, list[Any]]], name: str) -> str:
    slot = figures[name]
    if slot["errors"] and len(slot["errors"]) >= len(slot["pehe"]):
        return f"{name} FAIL"
    p = f"{slot['pehe'][-1]:.3g}" if slot["pehe"] else "-"
    s = f" {slot['sec'][-1]:.1f}s" if slot["sec"] else ""
    return f"{name} {p}{s}"


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def table(cells: list[dict[str, Any]]) -> str:
    head = ["n", "eps", "study", "row", "PEHE", "/DR", "/constDP", "s", "s/DR fit", "fail"]
    lines = ["\t".join(head)]
    for c in cells:
        for name, r in c["rows"].items():
            lines.append(
                "\t".join(
                    [
                        str(c["n"]),
                        _f(c["epsilon"]),
                        c["heterogeneity"],
                        name,
                        _f(r["pehe"]),
                        _f(r["pehe_over_drlearner"]),
                        _f(r["pehe_over_constant_dp_ate"]),
                        _f(r["seconds"]),
                        _f(r["seconds_over_drlearner_fit"]),
                        str(r["failures"]),
                    ]
                )
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke (seconds)")
    parser.add_argument("--n", help="sample sizes (default 100000; --quick 2000)")
    parser.add_argument("--eps", help="epsilons (default 1)")
    parser.add_argument(
        "--het", help=f"studies (default {','.join(HETS)}; --quick none,rct_strong)"
    )
    parser.add_argument("--reps", type=int, help="repetitions per cell (default 1)")
    parser.add_argument(
        "--kinds", help=f"CATE kinds (default all: {','.join(CATE_KINDS)}; --quick uplift_table)"
    )
    parser.add_argument("--test-n", type=int, default=2000, help="PEHE test sample size")
    parser.add_argument(
        "--slow-seconds",
        type=float,
        default=900.0,
        help="a kind whose release took longer is not run again in the cell",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="BLAS / OpenMP threads for both sides (default 1)"
    )
    parser.add_argument("--name", default="drlearner", help="result file bench/results/<name>")
    args = parser.parse_args(argv)

    quick = args.quick
    ns = tuple(int(v) for v in args.n.split(",")) if args.n else ((2000,) if quick else (100000,))
    epsilons = tuple(float(v) for v in args.eps.split(",")) if args.eps else (1.0,)
    default_hets = ("none", "rct_strong") if quick else HETS
    hets = _names(args.het, FULL_HET) if args.het else default_hets
    reps = args.reps if args.reps is not None else 1
    default_kinds = ("uplift_table",) if quick else CATE_KINDS
    allowed = (*CATE_KINDS, *EXTRA_CATE_KINDS, ADDITIVE_ORACLE)
    kinds = (
        _names(args.kinds, allowed, configured=True) if args.kinds is not None else default_kinds
    )

    import econml  # fail early (and outside the timings) when the bench extra is missing
    import sklearn

    started = _clock()
    cells: list[dict[str, Any]] = []
    grid = {
        "n": list(ns),
        "epsilon": list(epsilons),
        "heterogeneity": list(hets),
        "reps": reps,
        "kinds": list(kinds),
        "test_n": args.test_n,
        "threads": args.threads,
        "slow_seconds": args.slow_seconds,
        "drlearner": DRLEARNER_SETTINGS,
        "versions": {
            "econml": econml.__version__,
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
        },
        "seconds_meaning": "drlearner: fit only (effect at the test rows apart); DP kinds: "
        "release plus evaluation at the test rows; constant_dp_ate: the ate release",
        "uplift_table": "adjustment_partition=true on an observational design only where the "
        "default grid has >= 2 cells (one cell: the adjusted DP ATE, uplift_table.md step 6); "
        "uplift_table_declared: the default with the study's effect modifiers declared (the "
        "ebm_cate model as a table where it learns, step 7)",
    }
    load: list[dict[str, Any]] = []

    def save(complete: bool) -> Any:
        payload = {
            "grid": grid,
            "complete": complete,
            "load_average": load,
            "cells": cells,
            "seconds": round(_clock() - started, 1),
        }
        return write_result(args.name, payload, quick=quick, module="bench.drlearner")

    with threadpool_limits(args.threads):
        for n in ns:
            for h in hets:
                for e in epsilons:
                    before = [round(v, 2) for v in os.getloadavg()]
                    print(f"n={n} eps={e:g} study={h} (load {before})", flush=True)
                    rows = run_cell(
                        STUDIES[h],
                        FULL_HET.index(h),
                        n,
                        e,
                        reps,
                        kinds,
                        args.test_n,
                        args.slow_seconds,
                    )
                    after = [round(v, 2) for v in os.getloadavg()]
                    load.append(
                        {"n": n, "epsilon": e, "study": h, "before": before, "after": after}
                    )
                    cells.append({"n": n, "epsilon": e, "heterogeneity": h, "rows": rows})
                    save(False)
                    print(f"[{_clock() - started:7.1f} s] done (load {after})", flush=True)

    print()
    print(
        f"PEHE on {args.test_n} test rows, {reps} rep(s); /DR = over DRLearner's PEHE; "
        "s = seconds (DRLearner: fit); threads",
        args.threads,
    )
    print(table(cells))
    out = save(True)
    print(f"\nwrote {out.name} in {_clock() - started:.0f} s")


if __name__ == "__main__":
    main()
