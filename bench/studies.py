"""Simulated observational studies shaped like real clinical data (issue 12's realistic grid).

Each study has q = 36 covariates (30 binary comorbidity-like flags with prevalences 5-50 %, and
6 skewed continuous ones: age, BMI, four lab values), a confounded treatment (about 40 %
treated; propensity from a logistic model in the covariates, mostly within [0.1, 0.9]), and a
right-skewed outcome (a gamma-distributed error with a long right tail, like a length of stay
or a cost). Heterogeneity of the effect tau(x) is one of

* ``none``: tau(x) = tau0 (constant);
* ``moderate``: sd(tau) about 0.25 sd(Y);
* ``strong``: sd(tau) about 0.6 sd(Y).

The **declared** outcome bounds are the honest observed range rounded outward: the 1e-5 and
1 - 1e-5 quantiles of a large reference sample from the DGP (fixed seed), rounded outward to a
round number, so R_Y is about 8-13 sd(Y) as in issue 12. They are a property of the DGP, never of
the sample a benchmark draws. Covariate bounds are declared likewise (binary {0, 1}; continuous
from the DGP's support). A sample is clipped into the declared box, as the service's ingest does.

The true (population) ATE is E[clip(Y(1)) - clip(Y(0))] over a 2 * 10^6 reference sample with the
same errors for both potential outcomes; ``tau_true(x)`` gives each row's CATE (of the unclipped
outcome; the clip moves it by < 1e-4 sd(Y) on average).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign

HETEROGENEITY = ("none", "moderate", "strong")
# Randomised trials with the same covariates and outcome model: treatment with probability 0.5,
# declared in the public schema (design RCT), e.g. ``rct_strong``.
RCT_STUDIES = ("rct_none", "rct_strong")
RCT_PROBABILITY = 0.5
N_BINARY = 30
N_CONTINUOUS = 6
Q = N_BINARY + N_CONTINUOUS
_COEF_SEED = 20261125
_REFERENCE_SEED = 7_000_001
_REFERENCE_N = 2_000_000
# Continuous covariates: (name, lower, upper) declared bounds.
_CONTINUOUS = (
    ("age", 18.0, 100.0),
    ("bmi", 12.0, 70.0),
    ("creatinine", 0.2, 15.0),
    ("crp", 0.0, 300.0),
    ("hba1c", 3.0, 18.0),
    ("sbp", 60.0, 250.0),
)
# The covariates' schema names: the binaries b0 ... b29, then _CONTINUOUS's names.
NAMES = (*(f"b{j}" for j in range(N_BINARY)), *(c[0] for c in _CONTINUOUS))
# Covariate positions (binaries first, then _CONTINUOUS in order) of the effect modifiers:
# the non-zero het_b / het_c below (binaries 0-3; age, creatinine, hba1c). NOT_MODIFIERS are
# three covariates that modify nothing (two binaries and bmi), for a misspecified list.
CREATININE = N_BINARY + 2
EFFECT_MODIFIERS = (0, 1, 2, 3, N_BINARY, CREATININE, N_BINARY + 4)
NOT_MODIFIERS = (4, 5, N_BINARY + 1)
# The confounders (a DAG-based adjustment set an analysis plan would pre-specify): the covariates
# in both the propensity and the outcome model (non-zero beta_b and gamma_b below; every
# continuous one but hba1c, which only the outcome reads).
CONFOUNDERS = (
    (1, 4, 5, 6, 8, 22, 29) + (N_BINARY, N_BINARY + 1, CREATININE) + (N_BINARY + 3, N_BINARY + 5)
)
# Heterogeneity scale (multiplies a unit-sd score): tuned so sd(tau)/sd(Y) is about the label's.
_HET_SCALE = {"none": 0.0, "moderate": 1.0, "strong": 2.6}
TAU0 = 2.0


@dataclass(frozen=True)
class Coefficients:
    prevalence: NDArray[np.float64]  # (30,) binary prevalences
    beta_b: NDArray[np.float64]  # propensity, binary part
    beta_c: NDArray[np.float64]  # propensity, standardised continuous part
    gamma_b: NDArray[np.float64]  # outcome, binary part
    gamma_c: NDArray[np.float64]  # outcome, standardised continuous part
    het_b: NDArray[np.float64]  # effect modifiers, binary part (sparse)
    het_c: NDArray[np.float64]  # effect modifiers, continuous part (sparse)


@cache
def coefficients() -> Coefficients:
    rng = np.random.default_rng(_COEF_SEED)
    prevalence = rng.uniform(0.05, 0.5, size=N_BINARY)
    beta_b = rng.normal(0.0, 0.35, size=N_BINARY) * (rng.uniform(size=N_BINARY) < 0.5)
    beta_c = np.array([0.5, 0.2, 0.25, 0.3, 0.0, 0.15])
    gamma_b = rng.uniform(0.2, 1.2, size=N_BINARY) * (rng.uniform(size=N_BINARY) < 0.6)
    gamma_c = np.array([1.0, 0.4, 0.8, 0.6, 0.3, 0.2])
    het_b = np.zeros(N_BINARY)
    het_b[:4] = [0.9, -0.7, 0.6, 0.5]
    het_c = np.array([0.8, 0.0, -0.5, 0.0, 0.4, 0.0])
    return Coefficients(prevalence, beta_b, beta_c, gamma_b, gamma_c, het_b, het_c)


def _covariates(
    n: int, rng: np.random.Generator
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Raw covariates (binary, continuous in natural units), clipped to the declared box."""
    c = coefficients()
    binary = (rng.uniform(size=(n, N_BINARY)) < c.prevalence).astype(np.float64)
    age = 64.0 + 14.0 * rng.standard_normal(n)
    bmi = 12.0 + rng.lognormal(math.log(15.0), 0.3, size=n)
    creatinine = rng.lognormal(math.log(1.0), 0.5, size=n)
    crp = rng.lognormal(math.log(8.0), 1.1, size=n)
    hba1c = 4.0 + rng.gamma(2.0, 0.9, size=n)
    sbp = 130.0 + 18.0 * rng.standard_normal(n)
    cont = np.column_stack([age, bmi, creatinine, crp, hba1c, sbp])
    lower = np.array([b[1] for b in _CONTINUOUS])
    upper = np.array([b[2] for b in _CONTINUOUS])
    return binary, np.clip(cont, lower, upper)


def _standardised(cont: NDArray[np.float64]) -> NDArray[np.float64]:
    """Fixed (DGP-level) transforms to roughly unit scale; logs for the skewed labs."""
    z = np.empty_like(cont)
    z[:, 0] = (cont[:, 0] - 64.0) / 14.0
    z[:, 1] = (np.log(cont[:, 1] - 11.0) - math.log(16.0)) / 0.3
    z[:, 2] = np.log(cont[:, 2]) / 0.5
    z[:, 3] = (np.log(cont[:, 3] + 0.1) - math.log(8.0)) / 1.1
    z[:, 4] = (cont[:, 4] - 5.8) / 1.27
    z[:, 5] = (cont[:, 5] - 130.0) / 18.0
    return np.clip(z, -4.0, 4.0)


def _het_score(binary: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
    c = coefficients()
    centred = binary - c.prevalence
    raw = centred @ c.het_b + z @ c.het_c + 0.4 * np.tanh(z[:, 0]) * z[:, 2]
    return np.asarray(raw, dtype=np.float64)


def _propensity(binary: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
    c = coefficients()
    logit = -0.55 + (binary - c.prevalence) @ c.beta_b + z @ c.beta_c
    return np.asarray(1.0 / (1.0 + np.exp(-logit)), dtype=np.float64)


def _mu0(binary: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
    c = coefficients()
    return np.asarray(
        6.0 + binary @ c.gamma_b + z @ c.gamma_c + 0.5 * z[:, 0] ** 2, dtype=np.float64
    )


@dataclass(frozen=True)
class Study:
    """One realistic-study DGP (a heterogeneity level) with its declared public schema."""

    heterogeneity: str

    def _raw(
        self, n: int, rng: np.random.Generator
    ) -> tuple[
        NDArray[np.float64],
        NDArray[np.float64],
        NDArray[np.float64],
        NDArray[np.float64],
        NDArray[np.float64],
        NDArray[np.float64],
    ]:
        binary, cont = _covariates(n, rng)
        z = _standardised(cont)
        pi = _propensity(binary, z) if not self.randomised else np.full(n, RCT_PROBABILITY)
        a = (rng.uniform(size=n) < pi).astype(np.float64)
        tau = TAU0 + _HET_SCALE[self.level] * _het_score(binary, z)
        # right-skewed error: gamma(shape 1.2) centred, scale growing with the baseline risk.
        base = _mu0(binary, z)
        err = (rng.gamma(1.2, 3.0, size=n) - 3.6) * (0.6 + 0.08 * base)
        y0 = base + err
        y1 = base + tau + err
        x = np.column_stack([binary, cont])
        return x, a, y0, y1, tau, pi

    @property
    def randomised(self) -> bool:
        return self.heterogeneity.startswith("rct_")

    @property
    def level(self) -> str:
        """The heterogeneity level (``rct_strong`` -> ``strong``)."""
        return self.heterogeneity.removeprefix("rct_")

    @property
    def declared(self) -> tuple[float, float]:
        return _declared_bounds(self.heterogeneity)

    def domain(self, n: int) -> PublicDomain:
        lower = np.concatenate([np.zeros(N_BINARY), [b[1] for b in _CONTINUOUS]])
        upper = np.concatenate([np.ones(N_BINARY), [b[2] for b in _CONTINUOUS]])
        codes: tuple[tuple[int, ...] | None, ...] = (
            *((0, 1) for _ in range(N_BINARY)),
            *(None for _ in range(N_CONTINUOUS)),
        )
        y_lower, y_upper = self.declared
        return PublicDomain(
            x_lower=lower.astype(np.float64),
            x_upper=upper.astype(np.float64),
            y_lower=y_lower,
            y_upper=y_upper,
            n=n,
            design=StudyDesign.RCT if self.randomised else StudyDesign.OBSERVATIONAL,
            treatment_probability=RCT_PROBABILITY if self.randomised else None,
            x_codes=codes,
            x_names=NAMES,
        )

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Arrays, NDArray[np.float64]]:
        """A study of n rows (clipped into the declared box) and each row's true CATE."""
        x, a, y0, y1, tau, _ = self._raw(n, rng)
        low, high = self.declared
        y = np.clip(np.where(a == 1.0, y1, y0), low, high)
        return Arrays(x=x, a=a, y=y), tau

    def tau_true(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """The CATE at covariate rows x (natural units, as ``sample`` returns them)."""
        binary, cont = x[:, :N_BINARY], x[:, N_BINARY:]
        z = _standardised(cont)
        return TAU0 + _HET_SCALE[self.level] * _het_score(binary, z)

    @property
    def true_ate(self) -> float:
        return _reference(self.heterogeneity)["ate"]

    @property
    def facts(self) -> dict[str, float]:
        """Population facts: true ATE, sd(Y), sd(tau), R_Y / sd(Y), treated share, propensity
        range."""
        return dict(_reference(self.heterogeneity))


@cache
def _reference(heterogeneity: str) -> dict[str, float]:
    study = Study(heterogeneity)
    rng = np.random.default_rng(_REFERENCE_SEED)
    x, a, y0, y1, tau, pi = study._raw(_REFERENCE_N, rng)
    low, high = _declared_bounds(heterogeneity)
    y = np.where(a == 1.0, y1, y0)
    return {
        "ate": float(np.mean(np.clip(y1, low, high) - np.clip(y0, low, high))),
        "sd_y": float(np.std(y)),
        "sd_tau": float(np.std(tau)),
        "range_over_sd_y": float((high - low) / np.std(y)),
        "treated_share": float(np.mean(a)),
        "propensity_p01": float(np.quantile(pi, 0.01)),
        "propensity_p99": float(np.quantile(pi, 0.99)),
        "skewness_y": float(np.mean(((y - y.mean()) / y.std()) ** 3)),
    }


@cache
def _declared_bounds(heterogeneity: str) -> tuple[float, float]:
    """Observed range of a large reference sample, rounded outward to a multiple of 5."""
    study = Study(heterogeneity)
    rng = np.random.default_rng(_REFERENCE_SEED + 1)
    _, a, y0, y1, _, _ = study._raw(_REFERENCE_N, rng)
    y = np.where(a == 1.0, y1, y0)
    low, high = np.quantile(y, [1e-5, 1.0 - 1e-5])
    return float(5.0 * math.floor(low / 5.0)), float(5.0 * math.ceil(high / 5.0))


STUDIES = {h: Study(h) for h in (*HETEROGENEITY, *RCT_STUDIES)}

if __name__ == "__main__":
    for name, study in STUDIES.items():
        print(name, study.declared, {k: round(v, 3) for k, v in study.facts.items()})
