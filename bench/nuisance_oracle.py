"""Which DP nuisance carries the observational strict ATE's bias, and two designs tried on it.

On the realistic observational studies (``bench.studies``), per cell (n, epsilon,
heterogeneity) and repetition a fresh sample, and on that same sample one strict ``ate`` default
release (DP-EBM nuisances, the outcome-heavy folds from n·epsilon = 2·10^4) per variant:

* ``default``: the service's release;
* ``oracle_propensity``: the propensity model replaced by the study's true propensity (known to
  the simulator only), the outcome model the DP-EBM;
* ``oracle_outcome``: the outcome model replaced by the true mu0, mu1, the propensity the DP-EBM;
* ``outcome_clip``: the outcome DP-EBM fitted on Y clipped to its own fold's 1 % / 99 %
  quantiles, the fit's bounds those quantiles. The quantiles are exact here (no privacy): the
  best a charged DP quantile clip could do. The fit's noise scales with the clip range (about
  2.5× below the declared R_Y on these studies);
* ``shared_fold``: the propensity and outcome DP-EBMs both fitted on the union of their two folds
  (half the rows), each at mu / sqrt 2 of the fold's mu-GDP budget, so the pair composes to the
  same mu (Gaussian DP composition) and the release's (epsilon, delta) is unchanged;
* ``lr:<c>:<r>``: the propensity classifier at learning rate c and the outcome regressor at r
  (public hyperparameters: interpret scales each step's noise with the rate, the privacy is
  unchanged). Since ate_strict version 5 the default itself uses (0.04, 0.02) from
  n·epsilon = 10^5 (``dp_ebm_learning_rates``), interpret's 0.01 below;
* ``folds:<p>:<o>:<e>``: the default with these fold fractions (propensity, outcome,
  estimation) instead of the public fold rule's (the delta default follows the smallest fold);
* ``recalibrated``: the DP-EBM propensity recalibrated on the estimation fold itself: its
  scores cut at their own ``CALIBRATION_BINS`` quantiles and each bin's score replaced by the
  bin's treated share (clipped like the scores). Exact, so not a release: the best a charged DP
  histogram recalibration (a Platt-like repair of the under-fitted logit) could do;
* ``quantile_bins``: each continuous covariate replaced by its exact rank in the sample,
  scaled to (0, 1) with public bounds [0, 1], so interpret's private binning (64 equal-width
  cells merged to at most 32 bins) cuts at quantiles instead of at equal widths of the
  declared range (where one cell holds a third of a skewed lab). Exact, so not a release: the
  best a charged DP-quantile transform could do (run without the DP quantile bins);
* ``uniform_bins``: the default without its DP quantile bins (``quantile_bins: false``:
  interpret's equal-width bins of the declared range at the full module budget), the default
  before ate_strict version 6. (Commit 886dbb3 emulated the charged bins as ``dpq:<share>``;
  ``results/nuisance_dpq.json``.)
* ``arm_outcome``: the outcome model as one DP-EBM regressor per arm of the outcome fold (a
  T-learner) instead of one regressor additive in A (which cannot represent a CATE that varies
  with X). Each arm model at the fold's accounting: a replacement inside one arm is a
  replace-one neighbour of that arm's fit only, one that moves a record across arms is an
  add/remove neighbour of each (sqrt 2 of the add/remove mu by GDP composition, below the
  replace-one 2 mu), so the pair costs what the one model did;
* ``outcome_recal``: each arm's DP-EBM outcome prediction replaced by its exact least-squares
  line (a + b mu_hat) on the estimation fold's rows of that arm (a linear repair of an
  under-fitted outcome model; exact, a diagnosis);
* ``platt``: the DP-EBM propensity recalibrated by an exact logistic regression of A on its
  logit on the estimation fold (Platt scaling; a diagnosis); ``platt_outcome`` both repairs;
  ``platt_prognostic``: the logistic regression also on the two outcome predictions
  (balancing the prognostic score);
* ``platt_dp:<share>:<cells>``: a charged Platt emulation: Gaussian-noised treated and control
  counts over ``cells`` public cells of logit(pi_hat) on the estimation fold at ``share`` of the
  release's epsilon (delta 1e-6; the other modules' budgets not reduced, so it flatters the
  design), the 2-parameter logistic fitted to the noisy counts;
* ``interaction_outcome``: one DP-EBM regressor on (A, X, X_treated), X_treated = X for the
  treated and the covariates' public lower bounds for the controls, so each covariate's shape
  may differ by arm (2q + 1 features at the fold's accounting).

The oracle, ``recalibrated`` and ``quantile_bins`` variants are diagnoses, not releases. A cell
at epsilon = 100 shows the nuisances' bias without their privacy noise. Figures per variant:
bias, sd and RMSE of the estimate against the true ATE, the mean CI half-width and the share of
intervals covering the true ATE. All variants run on the same samples.

    python -m bench.nuisance_oracle --reps 16 --workers 2
    python -m bench.nuisance_oracle --cells 100000:1,100000:4 --variants default,shared_fold \\
        --reps 12 --workers 2 --name nuisance_oracle-shared-large
    python -m bench.nuisance_oracle --cells 100000:1,100000:2,100000:4,50000:4 \\
        --variants default,lr:0.04:0.02,lr:0.02:0.02 --reps 12 --workers 2 --seed 20261201 \\
        --name nuisance_lr-large
    python -m bench.nuisance_oracle --cells 100000:1,100000:2,100000:4,50000:4 \\
        --variants default,folds:0.25:0.25:0.5,folds:0.2:0.3:0.5 --reps 12 --workers 2 \\
        --seed 20261203 --name nuisance_lr-folds
    python -m bench.nuisance_oracle --cells 100000:100,100000:4,20000:4 \\
        --variants default,recalibrated,quantile_bins,lr:0.08:0.04 --reps 12 --workers 2 \\
        --seed 20261305 --name nuisance_structure
    python -m bench.nuisance_oracle --cells 100000:4,100000:1,100000:0.5,50000:4,20000:4 \\
        --variants default,uniform_bins --reps 24 --workers 2 --seed 20261311 \\
        --name nuisance_quantile_bins
    python -m bench.nuisance_oracle --cells 20000:1,20000:4,100000:1,5000:4 \\
        --variants default,arm_outcome --reps 20 --workers 2 --seed 20261501 \\
        --name nuisance_outcome_arms
    python -m bench.nuisance_oracle --cells 20000:1,20000:4,100000:1 \\
        --variants default,interaction_outcome --reps 20 --workers 2 --seed 20261501 \\
        --name nuisance_outcome_interactions
    python -m bench.nuisance_oracle --cells 20000:1,20000:4,5000:4 \\
        --variants default,outcome_recal,platt,platt_outcome,platt_prognostic --reps 12 \\
        --workers 2 --seed 20261801 --name nuisance_linear_repair
    python -m bench.nuisance_oracle --cells 20000:1,20000:4,5000:4 \\
        --variants default,platt,platt_dp:0.1:8,platt_dp:0.2:8,platt_dp:0.1:4 --reps 12 \\
        --workers 2 --seed 20261801 --name nuisance_platt_dp
    python -m bench.nuisance_oracle --quick       # CI smoke: n 2000, eps 4, none, 1 rep
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any
from unittest import mock

import numpy as np
from numpy.typing import NDArray
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from bench import studies
from bench.common import interval_line, interval_summary, write_result
from bench.realistic import ate_release
from bench.studies import STUDIES, Study
from service.mechanisms import dp_ebm, partition
from service.mechanisms.ate_strict import estimation
from service.mechanisms.ate_strict.rules import AteStrictParams
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import OpenDPSampler, calibrate_gaussian, release_gaussian
from service.releases.kinds.ate import AteParams

FloatArray = NDArray[np.float64]
VARIANTS = (
    "default",
    "oracle_propensity",
    "oracle_outcome",
    "outcome_clip",
    "shared_fold",
    "recalibrated",
    "arm_outcome",
    "interaction_outcome",
    "quantile_bins",
    "uniform_bins",
    "confounders",
    "confounders_propensity",
)
# Diagnoses run only when named (not in the default list, so the CI smoke stays short).
NAMED_ONLY = ("outcome_recal", "platt", "platt_outcome", "platt_prognostic")
# Parametrised variants that change only the request (``variant_params``), not the estimation.
REQUEST_VARIANT_PREFIXES = ("folds:", "pclip:")
CLIP_LEVEL = 0.01
CALIBRATION_BINS = 20
CELLS = ((20000, 1.0), (20000, 4.0), (5000, 4.0))


def _true_propensity(x: FloatArray) -> FloatArray:
    b = studies.N_BINARY
    return studies._propensity(x[:, :b], studies._standardised(x[:, b:]))


def _true_mu0(x: FloatArray) -> FloatArray:
    b = studies.N_BINARY
    return studies._mu0(x[:, :b], studies._standardised(x[:, b:]))


@functools.lru_cache(maxsize=64)
def _accounting_at(mu_replace_one: float, delta: float) -> dp_ebm.DpEbmAccounting:
    """The DP-EBM accounting whose replace-one mu is at most ``mu_replace_one`` (bisection)."""
    low, high = 1e-4, 1000.0
    for _ in range(80):
        middle = math.sqrt(low * high)
        if dp_ebm.dp_ebm_accounting(middle, delta).mu_replace_one <= mu_replace_one:
            low = middle
        else:
            high = middle
    return dp_ebm.dp_ebm_accounting(low, delta)


def _half(accounting: dp_ebm.DpEbmAccounting) -> dp_ebm.DpEbmAccounting:
    return _accounting_at(accounting.mu_replace_one / math.sqrt(2.0), accounting.delta_p)


@contextmanager
def variant(name: str, study: Study, epsilon: float | None = None) -> Iterator[None]:
    """The estimation module's nuisance functions (and folds) replaced for one variant
    (``epsilon``, the release's: needed by ``platt_dp`` only)."""
    propensity: Callable[..., Any] = dp_ebm.propensity_scores
    outcome: Callable[..., Any] = dp_ebm.outcome_predictions
    folds: Callable[..., Any] = partition.random_folds
    patches: dict[str, Callable[..., Any]] = {}
    if name == "oracle_propensity":

        def true_propensity(*args: Any, clip: float, **_: Any) -> FloatArray:
            return np.clip(_true_propensity(args[2]), clip, 1.0 - clip)

        patches["propensity_scores"] = true_propensity
    elif name == "oracle_outcome":

        def true_outcome(*args: Any, **_: Any) -> tuple[FloatArray, FloatArray]:
            x = args[3]
            mu0 = _true_mu0(x)
            return mu0, mu0 + study.tau_true(x)

        patches["outcome_predictions"] = true_outcome
    elif name == "outcome_clip":

        def clipped_outcome(*args: Any, **kwargs: Any) -> Any:
            x_fit, a_fit, y_fit, x_predict, lower, upper, _, _, accounting = args
            low, high = (float(v) for v in np.quantile(y_fit, [CLIP_LEVEL, 1.0 - CLIP_LEVEL]))
            y_clipped = np.clip(y_fit, low, high)
            return outcome(
                x_fit, a_fit, y_clipped, x_predict, lower, upper, low, high, accounting, **kwargs
            )

        patches["outcome_predictions"] = clipped_outcome
    elif name == "shared_fold":

        def shared_folds(*args: Any) -> Any:
            out = dict(folds(*args))
            if "propensity" in out and "outcome" in out:
                union = np.concatenate([out["propensity"], out["outcome"]])
                out["propensity"] = out["outcome"] = union
            return out

        def half_propensity(*args: Any, **kwargs: Any) -> Any:
            return propensity(*args[:5], _half(args[5]), **kwargs)

        def half_outcome(*args: Any, **kwargs: Any) -> Any:
            return outcome(*args[:8], _half(args[8]), **kwargs)

        patches.update(
            random_folds=shared_folds,
            propensity_scores=half_propensity,
            outcome_predictions=half_outcome,
        )
    elif name == "confounders_propensity":
        keep = list(studies.CONFOUNDERS)

        def confounders_only(*args: Any, **kwargs: Any) -> Any:
            x_fit, a_fit, x_at, low_x, high_x, *rest = args
            return propensity(
                x_fit[:, keep], a_fit, x_at[:, keep], low_x[keep], high_x[keep], *rest, **kwargs
            )

        patches["propensity_scores"] = confounders_only
    elif name.startswith("lr:"):
        classifier_rate, regressor_rate = (float(v) for v in name[3:].split(":"))

        def at_rate(function: Callable[..., Any], rate: float) -> Callable[..., Any]:
            def fitted(*args: Any, **kwargs: Any) -> Any:
                return function(*args, **{**kwargs, "learning_rate": rate})

            return fitted

        patches.update(
            propensity_scores=at_rate(propensity, classifier_rate),
            outcome_predictions=at_rate(outcome, regressor_rate),
        )
    elif name in ("arm_outcome", "interaction_outcome"):
        structure = "arms" if name == "arm_outcome" else "interactions"
        patches["outcome_predictions"] = functools.partial(
            structured_outcome_predictions, structure
        )
    elif name == "recalibrated":
        pseudo_outcomes: Callable[..., Any] = estimation.pseudo_outcomes

        def recalibrated(
            a: FloatArray, y: FloatArray, pi_hat: FloatArray, *args: Any, **kwargs: Any
        ) -> Any:
            return pseudo_outcomes(a, y, recalibrated_propensity(a, pi_hat), *args, **kwargs)

        patches["pseudo_outcomes"] = recalibrated
    elif name in NAMED_ONLY:
        plain: Callable[..., Any] = estimation.pseudo_outcomes

        def linear_repaired(
            a: FloatArray,
            y: FloatArray,
            pi_hat: FloatArray,
            mu0_hat: FloatArray,
            mu1_hat: FloatArray,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            if name in ("outcome_recal", "platt_outcome"):
                mu0_hat, mu1_hat = recalibrated_outcomes(a, y, mu0_hat, mu1_hat)
            if name in ("platt", "platt_outcome"):
                pi_hat = platt_propensity(a, pi_hat, None)
            if name == "platt_prognostic":
                pi_hat = platt_propensity(a, pi_hat, np.column_stack([mu0_hat, mu1_hat]))
            return plain(a, y, pi_hat, mu0_hat, mu1_hat, *args, **kwargs)

        patches["pseudo_outcomes"] = linear_repaired
    elif name.startswith("platt_dp:"):
        if epsilon is None:
            raise ValueError("platt_dp needs the release's epsilon")
        _, share_text, bins_text = name.split(":")
        plain_dp: Callable[..., Any] = estimation.pseudo_outcomes
        epsilon_r = float(share_text) * epsilon

        def dp_repaired(
            a: FloatArray, y: FloatArray, pi_hat: FloatArray, *args: Any, **kwargs: Any
        ) -> Any:
            pi = dp_platt_propensity(a, pi_hat, epsilon_r, 1e-6, int(bins_text))
            return plain_dp(a, y, pi, *args, **kwargs)

        patches["pseudo_outcomes"] = dp_repaired
    elif name not in ("default", "quantile_bins", "uniform_bins", "confounders") and not (
        name.startswith(REQUEST_VARIANT_PREFIXES)
    ):
        raise ValueError(f"unknown variant {name}")
    with ExitStack() as stack:
        for attribute, replacement in patches.items():
            stack.enter_context(mock.patch.object(estimation, attribute, replacement))
        yield


def structured_outcome_predictions(
    structure: str,
    x_fit: FloatArray,
    a_fit: FloatArray,
    y_fit: FloatArray,
    x_predict: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    y_lower: float,
    y_upper: float,
    accounting: dp_ebm.DpEbmAccounting,
    **kwargs: Any,
) -> tuple[FloatArray, FloatArray]:
    """``(mu0_hat, mu1_hat)`` of ``arm_outcome`` (``structure="arms"``: one DP regressor per arm
    of the outcome fold, a T-learner, each at the fold's accounting) or ``interaction_outcome``
    (``"interactions"``: one DP regressor on (A, X, X_treated), X_treated = X for the treated and
    the covariates' lower bounds for the controls, 2q + 1 features at the fold's accounting),
    instead of the service's one regressor additive in A."""
    raw: list[FloatArray] = []
    midpoint = (y_lower + y_upper) / 2.0
    if structure == "arms":
        for arm in (0.0, 1.0):
            rows = a_fit == arm
            model, midpoint = dp_ebm.fit_regressor(
                x_fit[rows], y_fit[rows], lower, upper, y_lower, y_upper, accounting, **kwargs
            )
            raw.append(np.asarray(model.predict(x_predict), np.float64))
    elif structure == "interactions":
        treated_x = np.where(a_fit[:, None] >= 0.5, x_fit, lower[None, :])
        model, midpoint = dp_ebm.fit_regressor(
            np.column_stack([a_fit, x_fit, treated_x]),
            y_fit,
            np.concatenate([[0.0], lower, lower]),
            np.concatenate([[1.0], upper, upper]),
            y_lower,
            y_upper,
            accounting,
            **kwargs,
        )
        ones = np.ones(x_predict.shape[0])
        at_lower = np.broadcast_to(lower, x_predict.shape)
        for indicator, treated in ((0.0 * ones, at_lower), (ones, x_predict)):
            features = np.column_stack([indicator, x_predict, treated])
            raw.append(np.asarray(model.predict(features), np.float64))
    else:
        raise ValueError(f"unknown outcome structure {structure}")
    mu0, mu1 = (
        np.clip(np.nan_to_num(values + midpoint, nan=midpoint), y_lower, y_upper) for values in raw
    )
    return mu0, mu1


def recalibrated_propensity(a: FloatArray, pi_hat: FloatArray) -> FloatArray:
    """``pi_hat`` replaced by the treated share of its own quantile bin (``recalibrated``)."""
    clip = AteStrictParams.propensity_clip
    edges = np.quantile(pi_hat, np.linspace(0.0, 1.0, CALIBRATION_BINS + 1)[1:-1])
    bins = np.searchsorted(edges, pi_hat)
    treated = np.bincount(bins, weights=a, minlength=CALIBRATION_BINS)
    counts = np.bincount(bins, minlength=CALIBRATION_BINS)
    share = np.divide(treated, counts, out=np.full(CALIBRATION_BINS, 0.5), where=counts > 0)
    return np.asarray(np.clip(share[bins], clip, 1.0 - clip), np.float64)


def recalibrated_outcomes(
    a: FloatArray, y: FloatArray, mu0_hat: FloatArray, mu1_hat: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Each arm's outcome model replaced by its exact least-squares line on the rows given
    (``outcome_recal``: what a charged 2-parameter DP regression per arm could at best do)."""
    out = []
    for arm, mu in ((0.0, mu0_hat), (1.0, mu1_hat)):
        rows = a == arm
        design = np.column_stack([np.ones(int(rows.sum())), mu[rows]])
        coef, *_ = np.linalg.lstsq(design, y[rows], rcond=None)
        out.append(np.asarray(coef[0] + coef[1] * mu, np.float64))
    return out[0], out[1]


def platt_propensity(a: FloatArray, pi_hat: FloatArray, extra: FloatArray | None) -> FloatArray:
    """``pi_hat`` recalibrated by an exact logistic regression of A on its logit (and, with
    ``extra``, on the outcome models' predictions: balance of the prognostic score)."""
    clip = AteStrictParams.propensity_clip
    p = np.clip(pi_hat, 1e-6, 1.0 - 1e-6)
    features = np.log(p / (1.0 - p))[:, None]
    if extra is not None:
        features = np.column_stack([features, (extra - extra.mean(0)) / (extra.std(0) + 1e-9)])
    model = LogisticRegression(C=1e6, max_iter=1000).fit(features, a)
    return np.asarray(np.clip(model.predict_proba(features)[:, 1], clip, 1.0 - clip), np.float64)


def dp_platt_propensity(
    a: FloatArray, pi_hat: FloatArray, epsilon: float, delta: float, bins: int
) -> FloatArray:
    """Platt recalibration from Gaussian-noised treated / control counts over ``bins`` public
    cells of logit(pi_hat) in [logit c, logit(1 - c)] (replace-one L2 sensitivity sqrt 2), the
    2-parameter logistic fitted to the noisy counts (post-processing), slope in [0.5, 4]."""
    clip = AteStrictParams.propensity_clip
    edge = math.log((1.0 - clip) / clip)
    p = np.clip(pi_hat, clip, 1.0 - clip)
    logit = np.log(p / (1.0 - p))
    cells = np.clip(((logit + edge) / (2 * edge) * bins).astype(int), 0, bins - 1)
    treated = np.bincount(cells, weights=a, minlength=bins)
    control = np.bincount(cells, weights=1.0 - a, minlength=bins)
    cal = calibrate_gaussian(epsilon, delta, math.sqrt(2.0), dim=2 * bins)
    noisy = release_gaussian(np.concatenate([treated, control]), cal, OpenDPSampler())
    t, c = np.maximum(noisy[:bins], 0.0), np.maximum(noisy[bins:], 0.0)
    centres = -edge + (np.arange(bins) + 0.5) * (2 * edge / bins)
    alpha, beta = 0.0, 1.0
    for _ in range(50):
        q = 1.0 / (1.0 + np.exp(-(alpha + beta * centres)))
        w = (t + c) * q * (1 - q) + 1e-9
        g = np.array([np.sum(t - (t + c) * q), np.sum((t - (t + c) * q) * centres)])
        h = np.array(
            [[w.sum(), (w * centres).sum()], [(w * centres).sum(), (w * centres**2).sum()]]
        )
        step = np.linalg.solve(h + 1e-9 * np.eye(2), g)
        alpha, beta = alpha + step[0], float(np.clip(beta + step[1], 0.5, 4.0))
    out = 1.0 / (1.0 + np.exp(-(alpha + beta * logit)))
    return np.asarray(np.clip(out, clip, 1.0 - clip), np.float64)


def variant_data(name: str, arrays: Arrays, domain: PublicDomain) -> tuple[Arrays, PublicDomain]:
    """The data a variant releases on: the sample, or (``quantile_bins``) its continuous
    covariates replaced by their ranks in (0, 1) with bounds [0, 1], or (``confounders``) only
    the study's confounders (``studies.CONFOUNDERS``: a pre-specified adjustment set)."""
    if name == "confounders":
        keep = list(studies.CONFOUNDERS)
        codes = None if domain.x_codes is None else tuple(domain.x_codes[j] for j in keep)
        return replace(arrays, x=arrays.x[:, keep]), replace(
            domain,
            x_lower=np.asarray(domain.x_lower)[keep],
            x_upper=np.asarray(domain.x_upper)[keep],
            x_codes=codes,
            effect_modifiers=None,
        )
    if name != "quantile_bins":
        return arrays, domain
    x = arrays.x.copy()
    lower = np.array(domain.x_lower, np.float64)
    upper = np.array(domain.x_upper, np.float64)
    for j in range(studies.N_BINARY, x.shape[1]):
        ranks = np.argsort(np.argsort(x[:, j], kind="stable"), kind="stable")
        x[:, j] = (ranks + 0.5) / x.shape[0]
        lower[j], upper[j] = 0.0, 1.0
    return replace(arrays, x=x), replace(domain, x_lower=lower, x_upper=upper)


def variant_params(name: str, epsilon: float) -> AteParams:
    """The request of a variant: the default's with DP-EBM nuisances named (what the variants
    patch; the service's default from n epsilon = 2 * 10^4, where every committed cell lies, and
    ``dp_linear`` below), or with given fold fractions (``folds:``)."""
    if name.startswith("pclip:"):
        return AteParams(epsilon=epsilon, nuisance="dp_ebm", propensity_clip=float(name[6:]))
    if name.startswith("folds:"):
        fractions = tuple(float(v) for v in name[6:].split(":"))
        return AteParams(epsilon=epsilon, nuisance="dp_ebm", fold_fractions=fractions)
    if name in ("uniform_bins", "quantile_bins"):
        return AteParams(epsilon=epsilon, nuisance="dp_ebm", quantile_bins=False)
    return AteParams(epsilon=epsilon, nuisance="dp_ebm")


def run_cell(
    n: int, epsilon: float, het: str, reps: int, seed: int, variants: tuple[str, ...] = VARIANTS
) -> dict[str, Any]:
    study = STUDIES[het]
    domain = study.domain(n)
    rng = np.random.default_rng(seed)
    errors: dict[str, list[float]] = {name: [] for name in variants}
    halves: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        arrays, _ = study.sample(n, rng)
        for name in variants:
            data, public = variant_data(name, arrays, domain)
            with variant(name, study, epsilon):
                estimate, half, _ = ate_release(data, public, variant_params(name, epsilon))
            errors[name].append(estimate - study.true_ate)
            halves[name].append(half)
    rows = {name: interval_summary(errors[name], halves[name]) for name in variants}
    return {
        "n": n,
        "epsilon": epsilon,
        "heterogeneity": het,
        "rows": rows,
        "rmse_ratio": {name: rows[name]["rmse"] / rows["default"]["rmse"] for name in variants},
    }


def _cell(job: tuple[int, float, str, int, int, tuple[str, ...]]) -> dict[str, Any]:
    with threadpool_limits(1):
        return run_cell(*job)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke")
    parser.add_argument("--het", default="none,strong")
    parser.add_argument(
        "--cells", default=None, help="n:eps pairs, e.g. 100000:1,100000:4 (default: CELLS)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="default first")
    parser.add_argument("--reps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--workers", type=int, default=1, help="cells run at once")
    parser.add_argument("--name", default="nuisance_oracle")
    args = parser.parse_args(argv)
    cells: tuple[tuple[int, float], ...] = CELLS
    if args.cells:
        pairs = (pair.split(":") for pair in args.cells.split(","))
        cells = tuple((int(n), float(eps)) for n, eps in pairs)
    if args.quick:
        cells = ((2000, 4.0),)
    variants = tuple(args.variants.split(","))
    known = (
        set(VARIANTS)
        | set(NAMED_ONLY)
        | {
            name
            for name in variants
            if name.startswith(("lr:", "platt_dp:", *REQUEST_VARIANT_PREFIXES))
        }
    )
    if variants[0] != "default" or not set(variants) <= known:
        choices = ", ".join((*VARIANTS[1:], *NAMED_ONLY))
        parser.error(f"--variants: 'default' first, then any of {choices}")
    hets = ("none",) if args.quick else tuple(args.het.split(","))
    reps = 1 if args.quick else args.reps
    started = time.perf_counter()
    jobs = [
        (n, epsilon, het, reps, args.seed + 1000 * index + n + round(100 * epsilon), variants)
        for n, epsilon in cells
        for index, het in enumerate(hets)
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = list(pool.map(_cell, jobs))
    for cell in results:
        print(f"n {cell['n']} eps {cell['epsilon']:g} {cell['heterogeneity']}")
        for name, r in cell["rows"].items():
            print(f"  {name:18s} {interval_line(r)}")
    write_result(
        args.name,
        {"reps": reps, "cells": results, "seconds": time.perf_counter() - started},
        quick=args.quick,
        module="bench.nuisance_oracle",
    )


if __name__ == "__main__":
    main()
