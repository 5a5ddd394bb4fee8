"""ebm_cate's quote: the effect model's public noise scales, a small-n warning and the public
per-prediction noise scale of the versus-ATE verdict. No data, no charge.
"""

from __future__ import annotations

import math
from typing import Any

from service.mechanisms.domain import PublicDomain
from service.mechanisms.dp_ebm import DP_EBM_LEARNING_RATE
from service.mechanisms.ebm_cate.calibration import (
    make_plan,
    public_parameters,
)
from service.mechanisms.ebm_cate.rules import (
    SMALL_N_EPSILON_WARNING,
    WARNING_EPSILON_CAP,
    EbmCateParams,
    effect_width,
)


def quote(domain: PublicDomain, params: EbmCateParams) -> dict[str, Any]:
    """Public accuracy preview: the effect model's public noise scales and a small-n warning.

    ``boosting_noise_sd_per_step`` is interpret's sigma_boost for the effect (DR/R) or outcome
    (S) model: the sd of the noise on each leaf's learning-rate-scaled residual sum; divided by
    a leaf's size it is the per-step noise on the shape function. All public.
    """
    state = make_plan(domain, params)
    # the final model's own accounting (with the anchor: the effect fold's remaining budget)
    mu_boost = (state.effect_accounting or state.accounting).mu_boosting
    q = domain.q
    width = q + 1 if params.learner == "s" else effect_width(q, state.params)
    target_range = domain.outcome_range if params.learner == "s" else 2.0 * state.clip_k
    rounds = params.max_rounds
    sigma_boost = math.sqrt(rounds * width) * DP_EBM_LEARNING_RATE * target_range
    sigma_boost /= mu_boost
    last = state.effect_fit_size
    # A rough public scale for the per-bin noise of one shape function (32 bins, 3 leaves per
    # step, 300 rounds): sigma_boost * sqrt(rounds) / (leaf size ~ n_last / 3).
    shape_noise = sigma_boost * math.sqrt(rounds) / max(last / 3.0, 1.0)
    warnings: list[str] = []
    scale = domain.n * min(state.record.epsilon, WARNING_EPSILON_CAP)
    # the unanchored learners only: an anchored release falls back to its DP ATE where the
    # model's deviations are noise (its versus_ate verdict weighs that), so the warning, measured
    # before the anchor, contradicted an anchored quote's verdict
    if params.learner != "s" and not state.anchored and scale < SMALL_N_EPSILON_WARNING:
        warnings.append(
            f"n x epsilon is small ({scale:g} < {SMALL_N_EPSILON_WARNING:g}): on simulated data "
            "the DR learner was then usually less accurate than the constant ATE of learner 's' "
            "(bench/README.md, DP-EBM section)"
        )
    out = {
        **public_parameters(state, domain),
        "boosting_noise_sd_per_step": sigma_boost,
        "approx_shape_noise_sd": shape_noise,
        "warnings": warnings,
    }
    if state.calibration is not None:
        # the anchor's mean reads the whole effect fold (RCT: the ate_strict release's n2)
        out["anchor_rows"] = state.anchor_rows
        out["calibration_rows"] = state.calibration_size
        out["calibration_noise_sd"] = state.calibration.sigma
    return out


# The public formula below (per-bin noise sd times sqrt(q)) overstates the noise a release
# carries: on the realistic studies the release-to-release sd of the DR learner's predictions on
# one sample (privacy noise plus fold variation, an upper bound on the noise) was 0.42-0.59 of
# it in four cells from n eps = 2e4 to 1e5 (bench/README.md, "ebm_cate's quoted prediction
# noise"; bench.ebm_noise). Quote only: it shapes no noise.
PREDICTION_NOISE_CALIBRATION = 0.5


def prediction_noise_sd(domain: PublicDomain, quoted: dict[str, Any]) -> float:
    """A public scale of one prediction's privacy noise: the approximate per-bin noise sd of a
    shape function times sqrt(number of the effect model's covariates) (a prediction sums one
    bin of each shape function, with independent noise), times
    ``PREDICTION_NOISE_CALIBRATION``. Rough, like ``approx_shape_noise_sd`` itself."""
    columns = quoted.get("effect_columns")
    width = domain.q if columns is None else len(columns)
    return float(quoted["approx_shape_noise_sd"]) * math.sqrt(width) * PREDICTION_NOISE_CALIBRATION
