"""ebm_cate's quote: the effect model's public noise scales, a small-n warning and the public
per-prediction noise scale of the versus-ATE verdict. No data, no charge.
"""

from __future__ import annotations

import math
from typing import Any

from scipy.special import ndtri

from service.mechanisms.ate_strict.quote import assumed_pseudo_outcome_sd
from service.mechanisms.domain import PublicDomain
from service.mechanisms.dp_ebm import DP_EBM_LEARNING_RATE
from service.mechanisms.ebm_cate.calibration import (
    make_plan,
    public_parameters,
)
from service.mechanisms.ebm_cate.rules import (
    CALIBRATION_LEVEL,
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
    # A rough public scale for the per-bin noise of one shape function (3 leaves per step):
    # one step's noise sigma_boost / (leaf size ~ n_last / 3), accumulated over the rounds as
    # boosting accumulates it (``boosting_accumulation``).
    step_noise = sigma_boost / max(last / 3.0, 1.0)
    shape_noise = step_noise * boosting_accumulation(rounds, DP_EBM_LEARNING_RATE)
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


def boosting_accumulation(rounds: int, learning_rate: float) -> float:
    """How many one-step noise sds a shape function's bin carries after ``rounds`` rounds.

    Each round adds fresh noise of one step's sd to the bin, and each later round refits the
    residuals, which include that noise, removing ``learning_rate`` of it: the bin's noise
    follows ``e_t = (1 - lr) e_(t-1) + z_t``, so after R rounds its variance is
    ``sum_(t<R) (1 - lr)^(2 t) = (1 - (1 - lr)^(2 R)) / (1 - (1 - lr)^2)`` steps' variances,
    not R of them (a random walk). It levels off at about ``1 / (2 lr)``: at the default 0.01,
    7.0 step sds at 200 rounds and 7.1 at 400, against 14.1 and 20 for a random walk.

    Measured on the realistic studies (bench.ebm_noise, one sample released 3 times at each of
    100-800 rounds): the release-to-release sd of the predictions was 0.92-1.06 of this
    formula's, against 0.27-0.61 of the random walk's, which had made the quoted noise double
    where a public rule doubles the rounds (bench/README.md, "ebm_cate's quoted prediction
    noise"). Public: rounds and learning rate only."""
    keep = (1.0 - learning_rate) ** 2
    if keep >= 1.0:
        return math.sqrt(rounds)
    return math.sqrt((1.0 - keep**rounds) / (1.0 - keep))


def prediction_noise_sd(domain: PublicDomain, quoted: dict[str, Any]) -> float:
    """A public scale of one prediction's privacy noise: the approximate per-bin noise sd of a
    shape function times sqrt(number of the effect model's covariates) (a prediction sums one
    bin of each shape function, with independent noise). Rough, like ``approx_shape_noise_sd``
    itself (bench.ebm_noise: measured 0.78-1.06 of it)."""
    columns = quoted.get("effect_columns")
    width = domain.q if columns is None else len(columns)
    return float(quoted["approx_shape_noise_sd"]) * math.sqrt(width)


# The detection probability at which the quote names the heterogeneity an anchored release can
# show (``detectable_heterogeneity_sd``).
DETECTION_POWER = 0.8


def detectable_heterogeneity_sd(domain: PublicDomain, quoted: dict[str, Any]) -> float | None:
    """The smallest sd(tau) that an anchored release's calibration step (proof step 6.4)
    detects with probability ``DETECTION_POWER``, at best; None for an unanchored quote.

    The release varies only where ``t = S_rg / sqrt(S_gg S_rr / m + sigma^2)`` exceeds the
    ``CALIBRATION_LEVEL`` normal quantile z (else its factor is 0 and it answers its DP ATE for
    every patient). For a model that has learned tau exactly up to its privacy noise (sd s per
    prediction) on m calibration rows whose centred targets have variance v:
    ``S_rg ~ m h^2``, ``S_gg ~ m (h^2 + s^2)``, ``S_rr ~ m v``, so
    ``t(h) = m h^2 / sqrt(m (h^2 + s^2) v + sigma^2)``, and the release varies with probability
    ``Phi(t(h) - z)``. Solved for ``t(h) = z + Phi^-1(DETECTION_POWER)`` (a quadratic in h^2).
    v is the public pseudo-outcome scale the ``ate`` quote assumes (R_Y / 6), at most K^2; a
    learner's own error only raises the answer, so it is a lower bound. Public inputs only."""
    m = quoted.get("calibration_rows")
    sigma = quoted.get("calibration_noise_sd")
    if m is None or sigma is None:
        return None
    m = float(m)
    sigma = float(sigma)
    spread = assumed_pseudo_outcome_sd(domain)
    k = quoted.get("pseudo_outcome_clip")
    if k is not None:
        spread = min(spread, float(k))
    v = spread * spread
    s = prediction_noise_sd(domain, quoted)
    target = float(ndtri(CALIBRATION_LEVEL) + ndtri(DETECTION_POWER))
    t2 = target * target
    # m^2 u^2 - t2 m v u - t2 (m s^2 v + sigma^2) = 0, u = h^2 > 0
    b = t2 * m * v
    c = t2 * (m * s * s * v + sigma * sigma)
    u = (b + math.sqrt(b * b + 4.0 * m * m * c)) / (2.0 * m * m)
    return math.sqrt(u)
