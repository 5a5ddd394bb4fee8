"""cate_vector's public accuracy preview (no data, no charge)."""

from __future__ import annotations

import math
from typing import Any

from service.mechanisms.cate_vector.calibration import (
    FEATURE_NORM,
    CateVectorParams,
    _mean_linear_norm,
    _public,
    c_constant,
    make_plan,
    paper_gamma_bounds,
)
from service.mechanisms.domain import PublicDomain


def quote(domain: PublicDomain, params: CateVectorParams) -> dict[str, Any]:
    """Public accuracy preview, from public quantities only (no data access).

    Strict: coordinate j's noise is ``phi(x_j)' N(0, sigma^2 I)`` with ``||phi|| <= C = 2``,
    so its sd is at most ``2 sigma``. Paper: the realised noise sd ``r = gamma_hat c`` is
    data-dependent and never released; ``paper_gamma_bounds`` brackets it for every dataset:
    ``c R_Y <= r <= c Gamma_max``.
    """
    state = make_plan(domain, params)
    out = _public(state)
    if state.theta is not None:
        out["noise_sd_upper_bound"] = FEATURE_NORM * state.theta.sigma
        out["theta_sigma"] = state.theta.sigma
    else:
        c = c_constant(state.record.epsilon, state.record.delta, state.n2)
        lower, upper = paper_gamma_bounds(params.learner, state.cate_bound, state.clip)
        out["c"] = c
        out["noise_sd_lower_bound"] = c * lower
        out["noise_sd_upper_bound"] = c * upper
        out["noise_sd_note"] = (
            "paper mode: the noise sd per coordinate is gamma_hat * c with a data-dependent "
            "gamma_hat (never released); for every dataset it lies between the two public "
            "bounds (worst case over the public bounds and propensity clip)"
        )
    return out


def rms_noise_sd(domain: PublicDomain, params: CateVectorParams) -> float:
    """Root-mean-square privacy-noise sd over the query points, from public inputs only.

    Strict: coordinate j's noise is ``phi(x_j)' N(0, sigma^2 I)``; over the public random
    feature draw ``E ||phi(x)||^2 = 2 + ||2u - 1||^2 / q`` (intercept 1, linear part, and D cosines
    of uniform phase with weight 2 / D each), so the RMS sd is
    ``sigma sqrt(2 + mean_j ||2 u_j - 1||^2 / q)``. Paper: the public lower bound ``c R_Y``-type
    bound of ``quote`` (the realised sd is data-dependent and never released).
    """
    state = make_plan(domain, params)
    if state.theta is None:
        return float(quote(domain, params)["noise_sd_lower_bound"])
    return state.theta.sigma * math.sqrt(2.0 + _mean_linear_norm(domain, params.points))
