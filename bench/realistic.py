"""Realistic observational studies: DP ATE and CATE releases at the service's defaults (issue 12).

Data: ``bench.studies`` (36 mixed covariates, confounded ~40 % treated, right-skewed outcome,
honest declared bounds R_Y ~ 8-13 sd(Y); heterogeneity none / moderate / strong). Every release
goes through its kind's adapter (``service.releases.kinds``), so "defaults" are the service's
defaults, with the production noise (``OpenDPSampler``) and partition generator
(``secure_rng``); only the benchmark's data come from a seeded numpy generator.

Per cell (n, epsilon, heterogeneity):

* ATE, ``--reps`` releases, a fresh sample per repetition (sampling and privacy noise both
  count). Non-private baseline: cross-fitted AIPW (``--folds`` folds) with histogram gradient
  boosting (per-arm outcome regressors, propensity classifier clipped to [0.01, 0.99]), CI
  ``+- 1.96 sd(Gamma) / sqrt(n)``. DP estimators (kind ``ate``): ``strict_aipw`` =
  ``AteParams(epsilon)`` (the strict default: AIPW, DP nuisances by the public n epsilon rule),
  ``strict_dp_ebm`` (``nuisance="dp_ebm"``), ``strict_dp_linear`` (``nuisance="dp_linear"``),
  ``strict_ipw`` (``estimator="ipw"``). Figures: mean CI width and its ratio to the non-private
  width, bias, coverage of the true (population) ATE, RMSE, the quote's
  ``expected_half_width`` over the realised mean half-width, mean fit seconds. The non-private
  fit is shared by the epsilons of a repetition (the same sample).
* CATE, ``--cate-reps`` releases: PEHE = sqrt(mean((tau_hat(x) - tau(x))^2)) over a fresh test
  sample of ``--test-n`` rows from the same study, for each CATE kind at its defaults, read the
  way a client reads it: ``cate_function`` evaluated at the test points as the function
  endpoint does (exact basis: one GP sample path drawn in batches of ``batch_max``, rounded to
  the output lattice); ``cate_vector`` with the test points as its query points;
  ``ebm_cate`` / ``uplift_table`` through the predict endpoint's post-processing
  (``ebm_cate.predict`` / ``uplift.predict``). Next to them: the constant true ATE (PEHE =
  sd(tau) on the test rows), the constant DP ATE (the strict default ``ate`` release on the same
  training sample) and a non-private T-learner (histogram gradient boosting per arm).
  A kind that raises is recorded with its error; a kind whose repetition takes longer than
  ``--slow-seconds`` is not run at larger n for the same (epsilon, heterogeneity).

    python -m bench.realistic --quick                  # CI smoke: n 1000, eps 1, het none,
                                                       # strong, 2 reps (strict default 1),
                                                       # CATE 1 rep
    python -m bench.realistic                          # full grid (hours)
    python -m bench.realistic --n 1000,5000,20000 --eps 1,4 --het none,strong \\
        --reps 50 --cate-reps 2 --name realistic-before
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
import traceback
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from bench import studies
from bench.common import write_result
from bench.studies import STUDIES, Study
from service.functions.payload import SECRET_KEY, FunctionSecret
from service.mechanisms import cate_function as cf
from service.mechanisms import ebm_cate, uplift
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler, secure_rng
from service.releases.kinds.ate import AteKind, AteParams
from service.releases.kinds.cate_function import CateFunctionKind, CateFunctionParams
from service.releases.kinds.cate_vector import CateVectorKind, CateVectorRequest
from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest
from service.releases.kinds.uplift_table import UpliftTableKind, UpliftTableRequest

Z95 = 1.959963984540054
FULL_N = (1000, 2000, 5000, 20000, 100000)
FULL_EPS = (0.5, 1.0, 4.0)
FULL_HET = ("none", "moderate", "strong", "rct_none", "rct_strong")  # append only: seeds
ATE_ESTIMATORS: dict[str, dict[str, Any]] = {
    "strict_aipw": {},
    "strict_dp_ebm": {"nuisance": "dp_ebm"},
    "strict_dp_linear": {"nuisance": "dp_linear"},
    "strict_ipw": {"estimator": "ipw"},
    "strict_aipw_adaptive": {"clip": "adaptive"},
    "strict_dp_linear_adaptive": {"nuisance": "dp_linear", "clip": "adaptive"},
}
# Run only when named: each nuisance preset on the study's 12 declared confounders
# (adjustment_columns, ate_strict proof 15), for the preset rule at a smaller adjustment set.
EXTRA_ATE_ESTIMATORS: dict[str, dict[str, Any]] = {
    # trials only: the strict DP difference in means (ate_rct), all rows, pure epsilon
    "strict_rct_difference": {"estimator": "rct_difference"},
    # the aipw estimator named: on trials below the estimator rule's n * epsilon the omitted
    # estimator (strict_aipw) is rct_difference
    "strict_aipw_named": {"estimator": "aipw"},
    "strict_dp_ebm_confounders": {
        "nuisance": "dp_ebm",
        "adjustment_columns": list(studies.CONFOUNDERS),
    },
    "strict_dp_linear_confounders": {
        "nuisance": "dp_linear",
        "adjustment_columns": list(studies.CONFOUNDERS),
    },
}
ALL_ATE_ESTIMATORS = {**ATE_ESTIMATORS, **EXTRA_ATE_ESTIMATORS}
# cate_function_given_anchor: the default cate_function with the constant DP ATE release's
# estimate as its public anchor (an analyst who already has that release: 2 epsilon in all)
CATE_KINDS = (
    "cate_function",
    "cate_vector",
    "ebm_cate",
    "uplift_table",
    "cate_function_given_anchor",
)
# Comparators run only when named: ebm_cate_unshrunk is the ebm_cate default's DR learner with
# shrinkage "none" (what the anchor and the calibration rows cost where the model learns).
# ebm_cate_modifiers: the default with effect_columns = the study's true effect modifiers (an
# analyst's correct pre-specification); _over adds three covariates that modify nothing, _under
# leaves out creatinine (a modifier, and half of the tanh(age) x creatinine interaction).
# ebm_cate_rounds200: the default with the effect model's former 200 rounds (the rounds rule's
# comparator where n eps per covariate reaches 10^4).
# uplift_table_declared: the uplift_table default where the owner's schema declares the study's
# true effect modifiers (effect_modifier: true): the rule's ebm estimator where the DP-EBM learns
# on them, else the table's default (uplift_table.md steps 6-7); cate_vector_declared and
# cate_function_declared: those kinds' defaults on the same schema. *_confounders: the kind's
# default where the schema declares the study's 12 confounders (adjust_for: true): its DP
# nuisances and its anchor adjust for those only (ebm_cate.md step 8, cate_function.md §8);
# ebm_cate_modifiers_confounders: ebm_cate_modifiers on that schema (both declarations).
# uplift_table_declared_ebm: uplift_table_declared with the ebm estimator asked for.
# cate_function_exact and cate_vector_ridge: those kinds' own estimators (the exact kernel
# basis, the ridge), the comparators of the rule that runs the ebm release instead.
# ebm_cate_given_anchor: the ebm_cate default anchored at the constant DP ATE release's estimate
# (ebm_cate.md step 6.5: an analyst who already has that release; no anchor share).
EXTRA_CATE_KINDS = (
    "ebm_cate_given_anchor",
    "uplift_table_declared_ebm",
    "cate_function_exact",
    "cate_vector_ridge",
    "uplift_table_declared",
    "cate_vector_declared",
    "cate_function_declared",
    "ebm_cate_confounders",
    "ebm_cate_modifiers_confounders",
    "cate_vector_confounders",
    "cate_function_confounders",
    "ebm_cate_unshrunk",
    "ebm_cate_rounds200",
    # the DR learner's outcome model on its DP-measured range / on the declared range, whatever
    # the public rule says at this n * epsilon (ebm_cate.outcome_range_rule)
    "ebm_cate_range",
    "ebm_cate_no_range",
    "ebm_cate_modifiers",
    "ebm_cate_modifiers_over",
    "ebm_cate_modifiers_under",
)
RANGE_KINDS = {"ebm_cate_range": True, "ebm_cate_no_range": False}
MODIFIER_SETS = {
    "ebm_cate_modifiers": studies.EFFECT_MODIFIERS,
    "ebm_cate_modifiers_over": tuple(sorted((*studies.EFFECT_MODIFIERS, *studies.NOT_MODIFIERS))),
    "ebm_cate_modifiers_under": tuple(
        j for j in studies.EFFECT_MODIFIERS if j != studies.CREATININE
    ),
}
# ebm_cate@<settings>: the ebm_cate default with request settings joined by "+" (a probe of what
# limits the DR learner, bench/README.md "What limits ebm_cate at n = 10^5"): eps<E> releases at
# epsilon E instead of the cell's, bins<B> sets max_bins, rounds<R> max_rounds, k<F> the
# pseudo-outcome clip F x R_Y, unshrunk the shrinkage "none", declaredrange the outcome model on
# the declared bounds (outcome_range false: version 6's first stage). Example:
# ebm_cate@eps100+bins64.
CONFIGURED_EBM = "ebm_cate@"
FloatArray = NDArray[np.float64]


def ebm_settings(kind: str) -> dict[str, Any]:
    """The request settings of an ``ebm_cate@<settings>`` kind (see ``CONFIGURED_EBM``); the
    clip as ``k_of_range`` (a multiple of R_Y). Raises ``ValueError`` on an unknown setting."""
    settings: dict[str, Any] = {}
    for item in kind.removeprefix(CONFIGURED_EBM).split("+"):
        if item == "unshrunk":
            settings["shrinkage"] = "none"
        elif item == "declaredrange":
            settings["outcome_range"] = False
        elif item.startswith("eps"):
            settings["epsilon"] = float(item[3:])
        elif item.startswith("bins"):
            settings["max_bins"] = int(item[4:])
        elif item.startswith("rounds"):
            settings["max_rounds"] = int(item[6:])
        elif item.startswith("k"):
            settings["k_of_range"] = float(item[1:])
        else:
            raise ValueError(f"unknown ebm_cate setting {item!r} in {kind!r}")
    return settings


def configured_ebm_request(kind: str, epsilon: float, domain: PublicDomain) -> EbmCateRequest:
    """The request of an ``ebm_cate@<settings>`` kind at the cell's ``epsilon``."""
    settings = {"epsilon": epsilon, **ebm_settings(kind)}
    fraction = settings.pop("k_of_range", None)
    if fraction is not None:
        settings["pseudo_outcome_clip"] = fraction * domain.outcome_range
    return EbmCateRequest(**settings)


def _quiet(_fraction: float, _stage: str) -> None:
    return None


def _clock() -> float:
    return time.perf_counter()


# ---- non-private baselines --------------------------------------------------------------------


def _hgb_regressor(seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(random_state=seed)


def nonprivate_aipw(arrays: Arrays, *, folds: int, seed: int) -> tuple[float, float]:
    """Cross-fitted AIPW with gradient boosting: (estimate, sd(Gamma) / sqrt(n))."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    x, a, y = arrays.x, arrays.a, arrays.y
    n = x.shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    chunks = np.array_split(perm, folds)
    gamma = np.empty(n)
    for k, est in enumerate(chunks):
        fit = np.concatenate([c for j, c in enumerate(chunks) if j != k])
        prop = HistGradientBoostingClassifier(random_state=seed).fit(x[fit], a[fit])
        pi = np.clip(prop.predict_proba(x[est])[:, 1], 0.01, 0.99)
        mu = {}
        for arm in (0.0, 1.0):
            rows = fit[a[fit] == arm]
            mu[arm] = _hgb_regressor(seed).fit(x[rows], y[rows]).predict(x[est])
        ae, ye = a[est], y[est]
        gamma[est] = (
            mu[1.0] - mu[0.0] + ae * (ye - mu[1.0]) / pi - (1 - ae) * (ye - mu[0.0]) / (1 - pi)
        )
    return float(gamma.mean()), float(gamma.std(ddof=1) / math.sqrt(n))


def t_learner(arrays: Arrays, x_test: FloatArray, *, seed: int) -> FloatArray:
    """Non-private T-learner: one gradient-boosting regressor per arm."""
    x, a, y = arrays.x, arrays.a, arrays.y
    mu = {}
    for arm in (0.0, 1.0):
        rows = a == arm
        mu[arm] = _hgb_regressor(seed).fit(x[rows], y[rows]).predict(x_test)
    return np.asarray(mu[1.0] - mu[0.0], dtype=np.float64)


def pehe(estimate: FloatArray, truth: FloatArray) -> float:
    return float(np.sqrt(np.mean((np.asarray(estimate, np.float64) - truth) ** 2)))


# ---- DP releases through the kinds' adapters ----------------------------------------------------


def ate_release(
    arrays: Arrays, domain: PublicDomain, params: AteParams
) -> tuple[float, float, float]:
    """(estimate, half_width, seconds) of one ``ate`` release."""
    started = _clock()
    out = AteKind().run(
        arrays, domain, params, rng=secure_rng(), noise=OpenDPSampler(), progress=_quiet
    )
    return float(out["estimate"]), float(out["half_width"]), _clock() - started


def _evaluate_function(secret: FunctionSecret, domain: PublicDomain, x: FloatArray) -> FloatArray:
    """The function endpoint's answers at the (distinct) test points, in batches of batch_max."""
    fitted = secret.fitted
    lower = np.asarray(domain.x_lower, np.float64)
    upper = np.asarray(domain.x_upper, np.float64)
    codes, canonical = cf.canonicalise(cf.scale_to_unit(x, lower, upper))
    _, first, inverse = np.unique(codes, axis=0, return_index=True, return_inverse=True)
    distinct = canonical[first]
    if fitted.kind != "gp":
        values = fitted.released(fitted.mean(distinct))
        return np.asarray(values[inverse.reshape(-1)], np.float64)
    path = cf.start_path(fitted, secret.q, secret.t_max)  # with the reference draw, if any
    values = np.empty(distinct.shape[0])
    for start in range(0, distinct.shape[0], secret.batch_max):
        batch = distinct[start : start + secret.batch_max]
        draw = path.draw(batch, normals=OpenDPSampler().standard_normal, jitter=secret.jitter)
        values[start : start + batch.shape[0]] = fitted.released(fitted.mean(batch), draw.values)
        path.append(draw)
    return np.asarray(values[inverse.reshape(-1)], np.float64)


def cate_release(
    kind: str,
    arrays: Arrays,
    domain: PublicDomain,
    epsilon: float,
    x_test: FloatArray,
    dp_ate: float | None = None,
) -> FloatArray:
    """Per-point CATE at x_test from one release of ``kind`` at its defaults."""
    options: dict[str, Any] = {"rng": secure_rng(), "noise": OpenDPSampler(), "progress": _quiet}
    if kind in ("cate_function", "cate_function_given_anchor", "cate_function_exact"):
        params = CateFunctionParams(
            epsilon=epsilon, basis="exact" if kind == "cate_function_exact" else None
        )
        if kind == "cate_function_given_anchor":
            if dp_ate is None:
                raise ValueError("no DP ATE release to anchor at")
            bound = domain.outcome_range
            params = CateFunctionParams(
                epsilon=epsilon, anchor=float(np.clip(dp_ate, -bound, bound))
            )
        out = CateFunctionKind().run(arrays, domain, params, **options)
        return _evaluate_function(out[SECRET_KEY], domain, x_test)
    if kind in ("cate_vector", "cate_vector_ridge"):
        request = CateVectorRequest(
            points=x_test.tolist(),
            epsilon=epsilon,
            estimator="ridge" if kind == "cate_vector_ridge" else None,
        )
        out = CateVectorKind().run(arrays, domain, request, **options)
        return np.asarray(out["estimates"], np.float64)
    ebm_kinds = ("ebm_cate", "ebm_cate_unshrunk", "ebm_cate_rounds200", *RANGE_KINDS)
    if kind in (*ebm_kinds, *MODIFIER_SETS):
        shrinkage = "none" if kind == "ebm_cate_unshrunk" else None
        modifiers = MODIFIER_SETS.get(kind)
        ebm_request = EbmCateRequest(
            epsilon=epsilon,
            shrinkage=shrinkage,
            effect_columns=None if modifiers is None else list(modifiers),
            max_rounds=ebm_cate.DR_DEFAULT_MAX_ROUNDS if kind == "ebm_cate_rounds200" else None,
            outcome_range=RANGE_KINDS.get(kind),
        )
        out = EbmCateKind().run(arrays, domain, ebm_request, **options)
        return ebm_cate.predict(out, x_test)
    if kind == "ebm_cate_given_anchor":
        if dp_ate is None:
            raise ValueError("no DP ATE release to anchor at")
        bound = domain.outcome_range
        given = EbmCateRequest(epsilon=epsilon, anchor=float(np.clip(dp_ate, -bound, bound)))
        out = EbmCateKind().run(arrays, domain, given, **options)
        return ebm_cate.predict(out, x_test)
    if kind.startswith(CONFIGURED_EBM):
        out = EbmCateKind().run(
            arrays, domain, configured_ebm_request(kind, epsilon, domain), **options
        )
        return ebm_cate.predict(out, x_test)
    if kind.endswith("_confounders"):
        adjusted = dataclasses.replace(domain, adjustment_set=studies.CONFOUNDERS)
        base = kind.removesuffix("_confounders")
        return cate_release(base, arrays, adjusted, epsilon, x_test, dp_ate)
    if kind in ("cate_vector_declared", "cate_function_declared"):
        declared = dataclasses.replace(domain, effect_modifiers=studies.EFFECT_MODIFIERS)
        base = kind.removesuffix("_declared")
        return cate_release(base, arrays, declared, epsilon, x_test, dp_ate)
    if kind in ("uplift_table_declared", "uplift_table_declared_ebm"):
        declared = dataclasses.replace(domain, effect_modifiers=studies.EFFECT_MODIFIERS)
        estimator = "ebm" if kind == "uplift_table_declared_ebm" else None
        out = UpliftTableKind().run(
            arrays, declared, UpliftTableRequest(epsilon=epsilon, estimator=estimator), **options
        )
        return uplift.predict(out, x_test)
    if kind == "uplift_table":
        # One cell (the default grid on these 36 covariates) is no adjustment set, so nothing
        # is asserted there: on an observational design the default then releases the adjusted
        # DP ATE (uplift_table.md step 6). With >= 2 default cells the owner asserts that the
        # cells are a valid adjustment set (refused otherwise on an observational design).
        cells = math.prod(uplift.default_bins(domain, epsilon))
        request = UpliftTableRequest(
            epsilon=epsilon,
            adjustment_partition=domain.design != StudyDesign.RCT and cells > 1,
        )
        out = UpliftTableKind().run(arrays, domain, request, **options)
        return uplift.predict(out, x_test)
    raise ValueError(f"unknown CATE kind {kind}")


# ---- one cell ---------------------------------------------------------------------------------


def _seed(*parts: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([20261125, *parts]))


def _sample_seed(het_index: int, n: int, rep: int) -> np.random.Generator:
    """The training sample of repetition ``rep`` (shared by the ATE and CATE parts)."""
    return _seed(1, het_index, n, rep)


def _summary(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def run_ate(
    study: Study,
    het_index: int,
    n: int,
    epsilons: tuple[float, ...],
    reps: int,
    folds: int,
    estimators: tuple[str, ...],
    caps: dict[str, int],
    nonprivate_reps: int | None = None,
) -> tuple[dict[float, dict[str, Any]], dict[float, list[float | None]]]:
    """ATE figures for every epsilon of (study, n): one sample per repetition, shared by eps.

    ``caps[name]``: the estimator runs in the first ``caps[name]`` repetitions only;
    ``nonprivate_reps``: the non-private AIPW likewise (its width is stable over a few
    repetitions, and at n = 10^5 it costs most of the run). Also returns the strict default's
    estimate per repetition (for the CATE's constant DP ATE).
    """
    truth = study.true_ate
    domain = study.domain(n)
    np_est: list[float] = []
    np_sd: list[float] = []
    np_sec: list[float] = []
    dp: dict[tuple[float, str], dict[str, list[Any]]] = {
        (e, name): {"est": [], "hw": [], "sec": [], "errors": []}
        for e in epsilons
        for name in estimators
    }
    default_estimates: dict[float, list[float | None]] = {e: [] for e in epsilons}
    for rep in range(reps):
        arrays, _ = study.sample(n, _sample_seed(het_index, n, rep))
        if nonprivate_reps is None or rep < nonprivate_reps:
            started = _clock()
            est, sd = nonprivate_aipw(arrays, folds=folds, seed=rep)
            np_sec.append(_clock() - started)
            np_est.append(est)
            np_sd.append(sd)
        for e in epsilons:
            default_estimates[e].append(None)
            for name in estimators:
                if rep >= caps.get(name, reps):
                    continue
                slot = dp[(e, name)]
                try:
                    estimate, half, seconds = ate_release(
                        arrays, domain, AteParams(epsilon=e, **ALL_ATE_ESTIMATORS[name])
                    )
                except Exception as exc:  # a failed release is a result, not a crash
                    slot["errors"].append(f"{type(exc).__name__}: {exc}")
                    continue
                if not ALL_ATE_ESTIMATORS[name]:
                    default_estimates[e][-1] = estimate
                slot["est"].append(estimate)
                slot["hw"].append(half)
                slot["sec"].append(seconds)
    est_a, sd_a = np.asarray(np_est), np.asarray(np_sd)
    np_width = float(np.mean(2.0 * Z95 * sd_a))
    nonprivate = {
        "estimator": f"AIPW, {folds}-fold cross-fit, HistGradientBoosting (not private)",
        "reps": int(est_a.size),
        "mean_width": np_width,
        "bias": float(np.mean(est_a) - truth),
        "rmse": float(np.sqrt(np.mean((est_a - truth) ** 2))),
        "coverage": float(np.mean(np.abs(est_a - truth) <= Z95 * sd_a)),
        "mean_seconds": _summary(np_sec),
    }
    out: dict[float, dict[str, Any]] = {}
    for e in epsilons:
        cell: dict[str, Any] = {"nonprivate_aipw": nonprivate}
        for name in estimators:
            slot = dp[(e, name)]
            params = AteParams(epsilon=e, **ALL_ATE_ESTIMATORS[name])
            try:
                quoted: float | None = float(AteKind().quote(params, domain)["expected_half_width"])
            except Exception:
                quoted = None
            est = np.asarray(slot["est"], np.float64)
            hw = np.asarray(slot["hw"], np.float64)
            row: dict[str, Any] = {
                "params": params.model_dump(exclude_defaults=True),
                "reps": int(est.size),
                "failures": len(slot["errors"]),
                "errors": sorted(set(slot["errors"]))[:3],
                "quoted_half_width": quoted,
            }
            if est.size:
                width = float(np.mean(2.0 * hw))
                covered = float(np.mean(np.abs(est - truth) <= hw))
                row |= {
                    "mean_width": width,
                    "width_ratio": width / np_width,
                    "bias": float(np.mean(est) - truth),
                    "rmse": float(np.sqrt(np.mean((est - truth) ** 2))),
                    "coverage": covered,
                    "coverage_se": math.sqrt(covered * (1.0 - covered) / est.size),
                    "quote_over_realised_half_width": (
                        quoted / float(np.mean(hw)) if quoted is not None else None
                    ),
                    "mean_seconds": float(np.mean(slot["sec"])),
                }
            cell[name] = row
        out[e] = cell
    return out, default_estimates


def run_cate(
    study: Study,
    het_index: int,
    n: int,
    epsilon: float,
    reps: int,
    kinds: tuple[str, ...],
    test_n: int,
    skip: dict[str, str],
    default_estimates: list[float | None],
) -> dict[str, Any]:
    """PEHE of each kind at its defaults and the baselines over ``reps`` training samples.

    The training samples are the ATE part's first ``reps`` samples; the constant DP ATE reuses
    that part's strict default release on the sample when there is one.
    """
    domain = study.domain(n)
    figures: dict[str, dict[str, list[Any]]] = {
        name: {"pehe": [], "sec": [], "errors": []}
        for name in ("constant_true_ate", "constant_dp_ate", "t_learner", *kinds)
    }
    for rep in range(reps):
        arrays, _ = study.sample(n, _sample_seed(het_index, n, rep))
        test, _ = study.sample(test_n, _seed(3, het_index, n, round(epsilon * 1000), rep))
        truth = study.tau_true(test.x)
        figures["constant_true_ate"]["pehe"].append(pehe(np.full(test_n, study.true_ate), truth))
        dp_ate = default_estimates[rep] if rep < len(default_estimates) else None
        if dp_ate is None:
            try:
                dp_ate, _, seconds = ate_release(arrays, domain, AteParams(epsilon=epsilon))
                figures["constant_dp_ate"]["sec"].append(seconds)
            except Exception as exc:
                figures["constant_dp_ate"]["errors"].append(f"{type(exc).__name__}: {exc}")
        if dp_ate is not None:
            figures["constant_dp_ate"]["pehe"].append(pehe(np.full(test_n, dp_ate), truth))
        started = _clock()
        figures["t_learner"]["pehe"].append(pehe(t_learner(arrays, test.x, seed=rep), truth))
        figures["t_learner"]["sec"].append(_clock() - started)
        for kind in kinds:
            if kind in skip:
                continue
            started = _clock()
            try:
                estimate = cate_release(kind, arrays, domain, epsilon, test.x, dp_ate)
                figures[kind]["pehe"].append(pehe(estimate, truth))
            except Exception as exc:
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                figures[kind]["errors"].append(line)
            seconds = _clock() - started
            figures[kind]["sec"].append(seconds)
    out: dict[str, Any] = {"reps": reps, "test_n": test_n}
    for name, slot in figures.items():
        if name in skip:
            out[name] = {"skipped": skip[name]}
            continue
        out[name] = {
            "pehe": _summary(slot["pehe"]),
            "pehe_values": slot["pehe"],
            "mean_seconds": _summary(slot["sec"]),
            "failures": len(slot["errors"]),
            "errors": sorted(set(slot["errors"]))[:3],
        }
    return out


# ---- tables -----------------------------------------------------------------------------------


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def ate_table(cells: list[dict[str, Any]], estimators: tuple[str, ...]) -> str:
    head = ["n", "eps", "het", "np width", "np cov"]
    for name in estimators:
        short = name.replace("strict_", "")
        head += [f"{short} ratio", f"{short} cov", f"{short} bias", f"{short} q/r", f"{short} s"]
    lines = ["\t".join(head)]
    for c in cells:
        ate = c["ate"]
        row = [str(c["n"]), _f(c["epsilon"]), c["heterogeneity"]]
        row += [_f(ate["nonprivate_aipw"]["mean_width"]), _f(ate["nonprivate_aipw"]["coverage"])]
        for name in estimators:
            r = ate[name]
            row += [
                _f(r.get("width_ratio")),
                _f(r.get("coverage")),
                _f(r.get("bias")),
                _f(r.get("quote_over_realised_half_width")),
                _f(r.get("mean_seconds"), 2),
            ]
        lines.append("\t".join(row))
    return "\n".join(lines)


def cate_table(cells: list[dict[str, Any]], kinds: tuple[str, ...]) -> str:
    names = ("constant_true_ate", "constant_dp_ate", "t_learner", *kinds)
    head = ["n", "eps", "het", *names, *(f"{k} s" for k in kinds)]
    lines = ["\t".join(head)]
    for c in cells:
        cate = c.get("cate")
        if cate is None:
            continue
        row = [str(c["n"]), _f(c["epsilon"]), c["heterogeneity"]]
        for name in names:
            fig = cate[name]
            if "skipped" in fig:
                row.append("skip")
            elif fig["pehe"] is None:
                row.append("FAIL")
            else:
                row.append(_f(fig["pehe"]))
        row += [_f(cate[k].get("mean_seconds"), 2) for k in kinds]
        lines.append("\t".join(row))
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------------------------


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def _names(text: str, allowed: tuple[str, ...], configured: bool = False) -> tuple[str, ...]:
    """Comma-separated names from ``allowed`` (with ``configured``, also ``ebm_cate@<settings>``
    kinds); "" or "none" is the empty list unless "none" is itself a name (the heterogeneity
    level: ``--het none`` is that level)."""
    if text == "" or (text == "none" and "none" not in allowed):
        return ()
    names = tuple(v for v in text.split(",") if v)
    unknown = set(names) - set(allowed)
    for name in sorted(unknown):
        if configured and name.startswith(CONFIGURED_EBM):
            try:
                ebm_settings(name)
            except ValueError as exc:
                raise SystemExit(str(exc)) from exc
            unknown.discard(name)
    if unknown:
        raise SystemExit(f"unknown names {sorted(unknown)}; choose from {list(allowed)}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke grid")
    parser.add_argument("--n", help=f"sample sizes (default {','.join(map(str, FULL_N))})")
    parser.add_argument("--eps", help="epsilons (default 0.5,1,4)")
    parser.add_argument("--het", help="heterogeneity levels (default none,moderate,strong)")
    parser.add_argument("--reps", type=int, help="ATE releases per cell (default 200)")
    parser.add_argument(
        "--aipw-reps",
        type=int,
        help="cap on the strict default's (DP-EBM, ~5 s each) releases per cell "
        "(default --reps; --quick 1)",
    )
    parser.add_argument(
        "--nonprivate-reps",
        type=int,
        help="cap on the non-private AIPW's repetitions per cell (default --reps)",
    )
    parser.add_argument("--cate-reps", type=int, help="CATE releases per cell (default 5)")
    parser.add_argument(
        "--cate-n", help="sizes at which the CATE part runs (default every --n; --quick 1000)"
    )
    parser.add_argument("--kinds", help=f"CATE kinds (default all: {','.join(CATE_KINDS)})")
    parser.add_argument(
        "--estimators",
        help=f"DP ATE estimators (default all of {','.join(ATE_ESTIMATORS)}; also "
        f"{','.join(EXTRA_ATE_ESTIMATORS)})",
    )
    parser.add_argument("--folds", type=int, default=2, help="non-private AIPW folds (2 or 5)")
    parser.add_argument("--test-n", type=int, default=2000, help="CATE test sample size")
    parser.add_argument(
        "--slow-seconds",
        type=float,
        default=900.0,
        help="a CATE kind whose repetition took longer is skipped at larger n",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS / OpenMP threads (default 1: stable times on a shared machine)",
    )
    parser.add_argument("--name", default="realistic", help="result file bench/results/<name>")
    args = parser.parse_args(argv)

    quick = args.quick
    ns = _ints(args.n) if args.n else ((1000,) if quick else FULL_N)
    epsilons = _floats(args.eps) if args.eps else ((1.0,) if quick else FULL_EPS)
    hets = _names(args.het, FULL_HET) if args.het else (("none", "strong") if quick else FULL_HET)
    reps = args.reps if args.reps is not None else (2 if quick else 200)
    cate_reps = args.cate_reps if args.cate_reps is not None else (1 if quick else 5)
    kinds = (
        _names(args.kinds, CATE_KINDS + EXTRA_CATE_KINDS, configured=True)
        if args.kinds is not None
        else CATE_KINDS
    )
    estimators = (
        _names(args.estimators, tuple(ALL_ATE_ESTIMATORS))
        if args.estimators is not None
        else tuple(ATE_ESTIMATORS)
    )

    with threadpool_limits(args.threads):
        _run(args, quick, ns, epsilons, hets, reps, cate_reps, kinds, estimators)


def _run(
    args: argparse.Namespace,
    quick: bool,
    ns: tuple[int, ...],
    epsilons: tuple[float, ...],
    hets: tuple[str, ...],
    reps: int,
    cate_reps: int,
    kinds: tuple[str, ...],
    estimators: tuple[str, ...],
) -> None:
    aipw_reps = args.aipw_reps if args.aipw_reps is not None else (1 if quick else None)
    # DP-EBM estimators take seconds per release: capped at --aipw-reps
    slow = ("strict_aipw", "strict_dp_ebm", "strict_aipw_adaptive")
    caps = {} if aipw_reps is None else dict.fromkeys(slow, aipw_reps)
    cate_ns = _ints(args.cate_n) if args.cate_n else ((1000,) if quick else ns)
    started = _clock()
    facts = {}
    for h in hets:
        facts[h] = {
            "declared_outcome_bounds": list(STUDIES[h].declared),
            **STUDIES[h].facts,
        }
    print(f"study facts ready in {_clock() - started:.1f} s", flush=True)

    cells: list[dict[str, Any]] = []
    grid = {
        "n": list(ns),
        "epsilon": list(epsilons),
        "heterogeneity": list(hets),
        "reps": reps,
        "strict_aipw_reps": min(reps, caps.get("strict_aipw", reps)),
        "nonprivate_reps": min(reps, args.nonprivate_reps or reps),
        "cate_reps": cate_reps,
        "cate_n": [n for n in ns if n in cate_ns],
        "kinds": list(kinds),
        "estimators": {name: ALL_ATE_ESTIMATORS[name] for name in estimators},
        "nonprivate_folds": args.folds,
        "test_n": args.test_n,
        "threads": args.threads,
        "uplift_table": "adjustment_partition=true on an observational design only where the "
        "default grid has >= 2 cells (one cell is no adjustment set: the default then releases "
        "the adjusted DP ATE, uplift_table.md step 6)",
    }

    def save(complete: bool) -> Any:
        payload = {
            "grid": grid,
            "studies": facts,
            "complete": complete,
            "cells": cells,
            "seconds": round(_clock() - started, 1),
        }
        return write_result(args.name, payload, quick=quick, module="bench.realistic")

    # n outer, heterogeneity inner: an interrupted run still has every level at the smaller n
    # (the file is rewritten after each cell, "complete": false until the end).
    skip: dict[tuple[str, float], dict[str, str]] = {(h, e): {} for h in hets for e in epsilons}
    for n in ns:
        for h in hets:
            het_index = FULL_HET.index(h)  # seeds do not depend on the levels chosen
            study = STUDIES[h]
            ate, defaults = (
                run_ate(
                    study,
                    het_index,
                    n,
                    epsilons,
                    reps,
                    args.folds,
                    estimators,
                    caps,
                    args.nonprivate_reps,
                )
                if reps > 0
                else ({}, {e: [] for e in epsilons})
            )
            for e in epsilons:
                cell: dict[str, Any] = {"n": n, "epsilon": e, "heterogeneity": h}
                if reps > 0:
                    cell["ate"] = ate[e]
                if cate_reps > 0 and n in cate_ns:
                    cate = run_cate(
                        study,
                        het_index,
                        n,
                        e,
                        cate_reps,
                        kinds,
                        args.test_n,
                        skip[(h, e)],
                        defaults[e],
                    )
                    cell["cate"] = cate
                    for kind in kinds:
                        seconds = cate[kind].get("mean_seconds")
                        if seconds is not None and seconds > args.slow_seconds:
                            skip[(h, e)][kind] = (
                                f"took {seconds:.0f} s per release at n = {n} "
                                f"(> --slow-seconds {args.slow_seconds:g})"
                            )
                cells.append(cell)
                save(False)
                print(f"[{_clock() - started:7.1f} s] done n={n} eps={e:g} het={h}", flush=True)

    print()
    if reps > 0:
        print(
            f"ATE ({reps} releases per cell, strict_aipw {grid['strict_aipw_reps']}"
            "; width = mean CI width; ratio = DP width / non-private width; q/r = quoted / "
            "realised half-width; s = seconds per release)"
        )
        print(ate_table(cells, estimators))
        print()
    if cate_reps > 0:
        print(f"CATE PEHE on {args.test_n} test rows ({cate_reps} releases per cell); seconds")
        print(cate_table(cells, kinds))
    out = save(True)
    print(f"\nwrote {out.name} in {_clock() - started:.0f} s")


if __name__ == "__main__":
    main()
