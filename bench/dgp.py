"""PrivATE synthetic DGPs (spec benchmarks.md §4.1), seeded, with their public domains.

    X ~ U[0, 1]^p,  A ~ Bernoulli(clip((1 + X'beta) / 2, 0.1, 0.9)),  Y = tau A + X'gamma + eps,
    eps ~ U[-1, 1],  tau = 1 (homogeneous; CATE = 1).

beta and gamma are sparse with independent random supports of size s (seeded):
non-zero beta_j ~ U[0, 0.3], gamma_j ~ U[0, 1].

* Dataset 1: p = 2, s = 2.  Outcome bounds [-1, 4] (= [-1, tau + s + 1]).
* Dataset 2: p = 24, s = 6. Outcome bounds [-1, 8].
* RCT (App. E.1): p = 1, A ~ Bernoulli(0.5), Y as in Dataset 1 with s = p = 1; bounds [-1, 3]
  (R = 4, as in ate_ci.md §3.7); the assignment probability 0.5 is public.

Public domains are declared from the DGP's known support (X in [0, 1]^p, |eps| <= 1,
0 <= X'gamma <= s), never from a sample. The true propensity (1 + X'beta) / 2 is >= 0.5 and
is clipped to [0.1, 0.9], so the strict default propensity clip c = 0.1 contains it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign

TAU = 1.0


@dataclass(frozen=True)
class Dgp:
    """One PrivATE DGP: dimensions, coefficients (fixed by the coefficient seed) and bounds."""

    name: str
    p: int
    s: int
    beta: NDArray[np.float64]
    gamma: NDArray[np.float64]
    y_lower: float
    y_upper: float
    rct: bool = False

    def domain(self, n: int) -> PublicDomain:
        """The public domain at size n (declared from the DGP's support)."""
        if self.rct:
            return PublicDomain(
                x_lower=np.zeros(self.p),
                x_upper=np.ones(self.p),
                y_lower=self.y_lower,
                y_upper=self.y_upper,
                n=n,
                design=StudyDesign.RCT,
                treatment_probability=0.5,
                allow_paper_mode=True,  # harness: PrivATE paper mode is a comparator
            )
        return PublicDomain(
            x_lower=np.zeros(self.p),
            x_upper=np.ones(self.p),
            y_lower=self.y_lower,
            y_upper=self.y_upper,
            n=n,
            design=StudyDesign.OBSERVATIONAL,
            allow_paper_mode=True,  # harness: PrivATE paper mode is a comparator
        )

    def propensity(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.rct:
            return np.full(x.shape[0], 0.5)
        return np.asarray(np.clip((1.0 + x @ self.beta) / 2.0, 0.1, 0.9), dtype=np.float64)

    def sample(self, n: int, rng: np.random.Generator) -> Arrays:
        """n i.i.d. rows (X, A, Y)."""
        x = rng.uniform(0.0, 1.0, size=(n, self.p))
        a = (rng.uniform(size=n) < self.propensity(x)).astype(np.float64)
        y = TAU * a + x @ self.gamma + rng.uniform(-1.0, 1.0, size=n)
        return Arrays(x=x, a=a, y=y)


def _sparse(rng: np.random.Generator, p: int, s: int, high: float) -> NDArray[np.float64]:
    out = np.zeros(p)
    support = rng.choice(p, size=s, replace=False)
    out[support] = rng.uniform(0.0, high, size=s)
    return out


def make_dgp(name: str, *, coef_seed: int = 2025) -> Dgp:
    """``dataset1``, ``dataset2`` or ``rct``; beta and gamma drawn once from ``coef_seed``."""
    rng = np.random.default_rng(coef_seed)
    if name == "dataset1":
        p, s, rct = 2, 2, False
    elif name == "dataset2":
        p, s, rct = 24, 6, False
    elif name == "rct":
        p, s, rct = 1, 1, True
    else:
        raise ValueError(f"unknown DGP {name!r}")
    beta = np.zeros(p) if rct else _sparse(rng, p, s, 0.3)
    gamma = _sparse(rng, p, s, 1.0)
    # Declared bounds: -1 <= Y <= tau + s + 1 (gamma_j <= 1 by construction, X in [0, 1]).
    return Dgp(name, p, s, beta, gamma, -1.0, TAU + s + 1.0, rct)


def schema(dgp: Dgp) -> dict[str, object]:
    """The public upload schema of a DGP's CSV (columns x0..x{p-1}, a, y)."""
    out: dict[str, object] = {
        "covariates": [{"name": f"x{j}", "lower": 0, "upper": 1} for j in range(dgp.p)],
        "treatment": {"name": "a"},
        "outcome": {"name": "y", "lower": dgp.y_lower, "upper": dgp.y_upper},
        "out_of_bounds": "clip",
        "missing": "reject_upload",
    }
    if dgp.rct:
        out["design"] = "rct"
        out["treatment_probability"] = 0.5
    return out
