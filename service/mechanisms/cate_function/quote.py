"""cate_function's quote: the public constants, the pointwise noise sd and the share of a smooth
heterogeneity the kernel learner keeps at its public regularisation (no data)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from service.mechanisms import gp
from service.mechanisms.cate_function.calibration import (
    CateFunctionParams,
    Plan,
    plan,
    public_parameters,
)
from service.mechanisms.domain import PublicDomain

# The public reference design of the retention: the first RETENTION_POINTS Sobol points of the
# unit box the covariates are scaled to (the kernel's own coordinates).
RETENTION_POINTS = 512


@functools.lru_cache(maxsize=256)
def kernel_retention(q: int, bandwidth: float, regularization: float) -> float:
    """The share of a linear heterogeneity that kernel ridge regression keeps, on the public design.

    The second stage solves ``(K0 + n lambda I) alpha = r`` (exact basis; Nystrom and random
    features approximate it), so its fit of a noise-free signal ``f`` is ``S f`` with ``S =
    K0 (K0 + n lambda I)^-1``: the component of ``f`` along the k-th eigenfunction of the kernel
    (eigenvalue ``mu_k`` of ``K0 / n``) is multiplied by ``mu_k / (mu_k + lambda)``, whatever n.
    On the public Sobol points of [0, 1]^q this returns the mean over the coordinates j of
    ``<f_j, S f_j> / <f_j, f_j>``, ``f_j`` the centred coordinate x_j: how much of a
    heterogeneity that varies linearly along one covariate the learner's mean keeps, before its
    privacy noise. A public number of (q, bandwidth, lambda) only. On real covariates (binary
    ones at the corners of the box) the kernel is rougher and keeps less, so it errs on the
    optimistic side.
    """
    points = gp.sobol_centres(RETENTION_POINTS, q)
    gram = gp.gaussian_kernel(points, points, bandwidth) / RETENTION_POINTS
    eigenvalues, vectors = np.linalg.eigh(gram)
    eigenvalues = np.clip(eigenvalues, 0.0, None)
    keep = eigenvalues / (eigenvalues + regularization)
    coefficients = vectors.T @ (points - points.mean(axis=0))
    energy = coefficients * coefficients
    return float(np.mean((keep[:, None] * energy).sum(axis=0) / energy.sum(axis=0)))


def learner_retention(state: Plan) -> float:
    """``kernel_retention`` at the plan's bandwidth and effective regularisation. The R-learner
    fits ``w f(x)`` with ``w = a - pi_hat``, which scales the data term by ``E[w^2] <= p (1 - p)``
    (p the declared treatment probability, else 1/2), so its effective lambda is ``lambda0 /
    (p (1 - p))``; the DR learner's weights are 1."""
    scale = state.scale
    regularization = scale.lambda0
    if state.params.learner == "r":
        p = 0.5 if state.propensity is None else state.propensity
        regularization /= p * (1.0 - p)
    return kernel_retention(state.q, scale.bandwidth, regularization)


def quote(domain: PublicDomain, params: CateFunctionParams) -> dict[str, Any]:
    """Public preview: the constants, the pointwise noise sd and the learner's retention; no
    data, no charge."""
    state = plan(domain, params)
    out = public_parameters(state)
    out["pointwise_noise_sd"] = state.scale.r0
    out["learner_signal_retention"] = learner_retention(state)
    out["n2"] = state.n2
    return out
