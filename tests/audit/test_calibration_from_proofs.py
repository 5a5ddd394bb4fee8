"""Each planned noise scale against the sensitivity its proof states, recomputed here (issue 13.11).

``test_end_to_end_noise`` shows that every draw of a strict release is a planned event of its
record, at the recorded scale. This file closes the other half: the recorded scale itself. For
every sampler-drawn event of each strict kind, the sensitivity is recomputed from the formula in
``docs/proofs`` using only public values (declared bounds, public fold sizes and clips, public
constants), independently of the mechanism's arithmetic, and the recorded noise must be the
calibration at (at least) that sensitivity. Together the two tests turn red for a noise scale
halved anywhere: in a plan's sensitivity or sigma (here) or between plan and draw (there). The
empirical audits (``test_*_audit.py``) show that the proofs' sensitivities are not exceeded by
adversarial neighbours; the Gaussian and Laplace calibrations themselves are checked against
known values in ``tests/unit/test_noise.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import dp_linear
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.noise import calibrate_gaussian, calibrate_laplace
from service.mechanisms.records import NoiseEvent
from service.releases.kinds import REGISTRY

N = 2000
Y_LOW, Y_HIGH = 0.0, 10.0
R = Y_HIGH - Y_LOW
P = 0.5  # the RCT's public treatment probability


def _domain(design: StudyDesign) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(3),
        x_upper=np.ones(3),
        y_lower=Y_LOW,
        y_upper=Y_HIGH,
        n=N,
        design=design,
        treatment_probability=P if design == StudyDesign.RCT else None,
    )


OBS, RCT = StudyDesign.OBSERVATIONAL, StudyDesign.RCT
CASES: list[tuple[str, dict[str, Any], StudyDesign]] = [
    ("ate", {"epsilon": 1.0}, OBS),  # DP-EBM nuisances, declared clip
    ("ate", {"epsilon": 1.0, "nuisance": "dp_linear"}, OBS),
    ("ate", {"epsilon": 4.0, "nuisance": "dp_linear"}, OBS),  # cross-fitted
    ("ate", {"epsilon": 1.0, "nuisance": "dp_linear", "propensity_clip": 0.2}, OBS),
    ("ate", {"epsilon": 0.5, "estimator": "ipw", "normalization": "horvitz_thompson"}, OBS),
    ("ate", {"epsilon": 4.0, "estimator": "ipw", "normalization": "hajek"}, OBS),
    ("ate", {"epsilon": 1.0, "estimator": "ipw", "trim": 0.1}, OBS),
    ("ate", {"epsilon": 1.0, "estimator": "rct_difference"}, RCT),
    ("ate", {"epsilon": 1.0, "nuisance": "none", "clip": "declared"}, RCT),
    ("ate", {"epsilon": 2.0, "nuisance": "dp_linear", "clip": "declared"}, RCT),
    ("uplift_table", {"epsilon": 1.0}, RCT),
    ("uplift_table", {"epsilon": 1.0, "bins": [2, 1, 1]}, RCT),  # shrinkage "ate", 2 cells
    # one cell, observational, shrinkage "ate": the strict ATE default (uplift_table.md step 6)
    ("uplift_table", {"epsilon": 1.0, "bins": [1, 1, 1]}, OBS),
    ("ebm_cate", {"epsilon": 1.0}, OBS),  # the anchored DR default: calibration sums
    ("ebm_cate", {"epsilon": 4.0, "pseudo_outcome_clip": 2.0}, RCT),
    # the RCT anchor release (proof step 6.1): the ate default there, the difference in means
    ("ebm_cate", {"epsilon": 1.0}, RCT),
    ("cate_vector", {"epsilon": 1.0, "points": [[0.2, 0.5, 0.8]]}, RCT),
    ("cate_vector", {"epsilon": 1.0, "points": [[0.2, 0.5, 0.8]], "learner": "dr"}, OBS),
    ("cate_vector", {"epsilon": 2.0, "points": [[0.5, 0.5, 0.5]], "shrinkage": "none"}, OBS),
    # n eps / q = 2667 >= 1500: the estimator rule picks the ebm_cate release (cate_vector.md §9)
    ("cate_vector", {"epsilon": 4.0, "points": [[0.2, 0.5, 0.8]]}, OBS),
    ("cate_vector", {"epsilon": 4.0, "points": [[0.2, 0.5, 0.8]]}, RCT),
    # the anchored default's whole-data anchor (the ate default; its GP noise is audited in
    # test_end_to_end_noise and tests/api/test_functions.py)
    ("cate_function", {"epsilon": 2.0, "basis": "nystrom", "n_centres": 32}, RCT),
    ("cate_function", {"epsilon": 2.0, "basis": "nystrom", "n_centres": 32}, OBS),
    # n eps / q = 2667 >= 1500: the basis rule's "ebm", the ebm_cate release (cate_function §9)
    ("cate_function", {"epsilon": 4.0}, OBS),
    ("cate_function", {"epsilon": 4.0}, RCT),
]


def _pseudo_outcome_bound(quote: dict[str, Any], params: dict[str, Any], design: Any) -> float:
    """docs/proofs/ate_strict.md §1 (AIPW) and ate_ipw.md §1: B from the declared bounds."""
    if params.get("estimator") == "ipw":
        return (R / 2.0) / _trim(params)  # ate_ipw.md §2: |h| <= (R / 2) / xi
    if design == RCT:
        c = min(P, 1.0 - P)
        return R / (2.0 * c) if params.get("nuisance") == "none" else R / c
    return R / float(quote["propensity_clip"])


def _trim(params: dict[str, Any]) -> float:
    from service.mechanisms.ate_ipw import DEFAULT_TRIM

    return float(params.get("trim", DEFAULT_TRIM))


def _proof_sensitivity(
    event: NoiseEvent, quote: dict[str, Any], params: dict[str, Any], design: Any
) -> float:
    """The sensitivity the proof states for this event (L2 for Gaussians, L1 for Laplace)."""
    statistic = event.params["statistic"]
    folds = quote.get("fold_sizes", {})
    if statistic in ("mean_pseudo_outcome", "mean_ipw_term"):
        return 2.0 * _pseudo_outcome_bound(quote, params, design) / int(quote["n2"])
    if statistic in ("second_moment_pseudo_outcome", "second_moment_ipw_term"):
        return _pseudo_outcome_bound(quote, params, design) ** 2 / int(quote["n2"])
    if statistic == "hajek_arm_sums":
        return math.sqrt(5.0) / (_trim(params) * int(quote["n2"]))  # ate_ipw.md §7
    if statistic == "hajek_arm_second_moments":
        return math.sqrt(6.0) / (_trim(params) ** 2 * int(quote["n2"]))
    if statistic in ("arm_counts", "counts"):
        return 2.0  # a replaced row leaves one cell and joins another (ate_rct.md, uplift.md)
    if statistic in ("arm_centred_sums", "centred_sums"):
        return R  # |y - m| <= R / 2 in the cell it leaves and the one it joins
    if statistic in ("arm_centred_sums_of_squares", "centred_second_moments"):
        return 2.0 * (R / 2.0) ** 2  # uplift_table.md step 5: two arms' sums move by R^2 / 4
    if statistic.startswith("calibration sums"):
        # ebm_cate.md step 6.3: one row's (g^2, r g, (G / K) r^2) moves by (G^2, 2 K G, G K)
        k = float(quote["pseudo_outcome_clip"])
        g = k / 4.0
        return g * math.sqrt(g * g + 5.0 * k * k)
    if statistic == "continuous_covariate_histograms":
        # ate_strict.md §14: a replaced row leaves one cell and joins one in each of the J
        # histograms; every covariate of ``_domain`` is numeric (no codes), so J = 3
        return math.sqrt(2.0 * 3)
    if statistic == "per_arm_ridge_sufficient_statistics":
        return math.sqrt(6.0)  # ate_strict.md "Sensitivity sqrt 6"
    if statistic == "dp_logistic_regression_weights":
        # ate_strict.md: ||w_D - w_D'|| <= 2 / (m lambda) + 2 g_tol / lambda on a fold of m rows
        # (g_tol = 1e-3 / m, private_propensity.md §5); lambda: the request's or the public rule
        m = int(folds.get("propensity") or folds.get("half_1") or folds["estimation"])
        lam = float(event.params.get("regularization") or dp_linear.default_regularization(m))
        return 2.0 / (m * lam) + 2.0 * (1e-3 / m) / lam
    if statistic == "ridge coefficients on random Fourier features":
        # cate_vector.md steps 2-5: 2 C_v B (1 + C_v / sqrt(lambda)) / (lambda n2) + float margin
        c = float(quote["propensity_clip"])
        c_v = 2.0 * (1.0 - c) if params.get("learner", "r") == "r" else 2.0
        bound = R if params.get("learner", "r") == "r" else float(quote["target_bound"])
        lam, n2 = float(quote["ridge"]), int(folds["estimation"])
        # step 5's documented float margin 2 * 2^-20 * T, T = B / sqrt(lambda)
        margin = 2.0 * 2.0**-20 * bound / math.sqrt(lam)
        return 2.0 * c_v * bound * (1.0 + c_v / math.sqrt(lam)) / (lam * n2) + margin
    raise AssertionError(f"no proof formula for {statistic!r}: add it here")


def _dim(event: NoiseEvent) -> int:
    return int(event.params.get("dim", 1))


@pytest.mark.parametrize(("kind", "params", "design"), CASES)
def test_recorded_noise_is_calibrated_to_the_proof_sensitivity(
    kind: str, params: dict[str, Any], design: StudyDesign
) -> None:
    release_kind = REGISTRY[kind]
    request = release_kind.Params.model_validate(params)
    domain = _domain(design)
    record = release_kind.record(request, domain)
    quote = release_kind.quote(request, domain)
    # uplift_table's one-cell observational default is the strict ATE default: its events are
    # that ATE's, with the proof's public values in the quote's ``adjusted_ate`` block
    quote = quote.get("adjusted_ate") or quote
    checked = 0
    anchor = quote.get("anchor_release")
    anchor_quote: dict[str, Any] = {}
    anchor_params: dict[str, Any] = {}
    if anchor:  # the whole-data anchor is the ate default: checked against its own quote
        # (a difference-in-means anchor spends no delta: the ate default at its epsilon)
        anchor_params = {"epsilon": anchor["epsilon"]}
        if anchor["delta"]:
            anchor_params["delta"] = anchor["delta"]
        ate = REGISTRY["ate"]
        anchor_quote = ate.quote(ate.Params.model_validate(anchor_params), domain)
    for event in record.events:
        if event.type not in ("gaussian", "laplace"):
            continue
        if event.params.get("bound") == "adaptive":
            continue  # scale follows the DP clip: audited in test_ate_adaptive_clip_audit
        if event.module.startswith("anchor/"):
            proof = _proof_sensitivity(event, anchor_quote, anchor_params, design)
        else:
            proof = _proof_sensitivity(event, quote, params, design)
        if event.type == "gaussian":
            recorded = float(event.params["sensitivity_l2"])
            # the recorded sensitivity is the proof's, plus at most a documented float margin
            assert proof <= recorded <= proof * (1.0 + 1e-3), (event.params["statistic"], proof)
            # sigma: the calibration at the proof's sensitivity, plus at most the float margin
            floor = calibrate_gaussian(event.epsilon, event.delta, proof, dim=_dim(event))
            ceiling = calibrate_gaussian(event.epsilon, event.delta, proof * 1.001, dim=_dim(event))
            assert floor.sigma <= float(event.params["sigma"]) <= ceiling.sigma
        else:
            recorded = float(event.params["sensitivity_l1"])
            assert proof <= recorded <= proof * (1.0 + 1e-9), (event.params["statistic"], proof)
            floor_l = calibrate_laplace(event.epsilon, proof, dim=_dim(event))
            assert float(event.params["scale"]) >= floor_l.scale * (1.0 - 1e-12)
            assert float(event.params["scale"]) >= proof / event.epsilon
        checked += 1
    assert checked, "no sampler-drawn event with a fixed scale in this case"


def test_effect_screen_events_are_calibrated_to_the_proof_sensitivity() -> None:
    """ebm_cate's effect-modifier screen (proof step 9), on a schema wide enough to run it (12
    covariates, the last two continuous): the histograms at sqrt(2 J) (J = 2), the top-k at
    L-infinity sensitivity 2 K with scale 2 k Delta / epsilon."""
    q = 12
    domain = PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.concatenate([np.ones(q - 2), [50.0, 50.0]]),
        y_lower=Y_LOW,
        y_upper=Y_HIGH,
        n=20_000,
        x_codes=tuple([(0, 1)] * (q - 2) + [None, None]),
    )
    kind = REGISTRY["ebm_cate"]
    request = kind.Params.model_validate({"epsilon": 2.0})
    record = kind.record(request, domain)
    clip_k = float(kind.quote(request, domain)["pseudo_outcome_clip"])
    effect = [e for e in record.events if e.module == "effect"]
    top_k = next(e for e in effect if e.type == "noisy_top_k")
    proof = 2.0 * clip_k
    assert proof <= float(top_k.params["sensitivity_linf"]) <= proof * (1.0 + 1e-3)
    k = int(top_k.params["k"])
    assert float(top_k.params["scale"]) >= 2.0 * k * proof / top_k.epsilon
    histograms = next(
        e for e in effect if e.params.get("statistic") == "continuous_covariate_histograms"
    )
    proof_l2 = math.sqrt(2.0 * 2)
    assert proof_l2 <= float(histograms.params["sensitivity_l2"]) <= proof_l2 * (1.0 + 1e-3)
    floor = calibrate_gaussian(histograms.epsilon, histograms.delta, proof_l2, dim=_dim(histograms))
    assert float(histograms.params["sigma"]) >= floor.sigma
