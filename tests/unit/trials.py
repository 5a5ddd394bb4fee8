"""A seeded trial for the anchor tests (test data, not a benchmark DGP)."""

from __future__ import annotations

import numpy as np

from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign


def prognostic_rct(n: int, q: int, seed: int) -> tuple[Arrays, PublicDomain]:
    """A trial with p = 0.5, tau = 1 everywhere and q covariates that explain most of Y."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, q))
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(x @ np.linspace(3.0, 0.5, q) + a + rng.normal(0, 0.5, n), -2.0, 14.0)
    dom = PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.ones(q),
        y_lower=-2.0,
        y_upper=14.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    return Arrays(x, a, y), dom
