"""Generate ``observational.csv`` and ``observational_schema.json`` (synthetic; fixed seed).

A clinical-style observational study: sicker and older patients are treated more often
(confounding), and the treatment helps sicker patients more. No real person is in it.

    age      ~ U(18, 90)          severity ~ Beta(2, 2)        bmi ~ N(27, 4²) clipped to [16, 45]
    sex      ~ Bernoulli(0.5)      diabetic ~ Bernoulli(0.15 + 0.25 severity)
    P(treated | x) = logistic(-1.2 + 2.4 severity + 0.02 (age - 50) + 0.3 diabetic)
    tau(x)   = 0.5 + severity                 (so the true ATE is E[tau] = 1.0)
    outcome  = -0.03 (age - 50) - 1.5 severity - 0.4 diabetic + 0.02 (bmi - 27)
               + tau(x) treated + N(0, 0.8²), clipped to the public bounds [-6, 6]

Run ``python examples/data/make_observational.py`` to regenerate the committed files. Seeding the
*data generation* is fine; the service's noise is never seeded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SEED = 20261121
N = 5000
HERE = Path(__file__).resolve().parent

SCHEMA = {
    "covariates": [
        {"name": "age", "lower": 18, "upper": 90, "unit": "years"},
        {"name": "severity", "lower": 0, "upper": 1},
        {"name": "bmi", "lower": 16, "upper": 45, "unit": "kg/m2"},
        {
            "name": "sex",
            "type": "categorical",
            "codes": [0, 1],
            "code_labels": {"0": "female", "1": "male"},
        },
        {
            "name": "diabetic",
            "type": "categorical",
            "codes": [0, 1],
            "code_labels": {"0": "no", "1": "yes"},
        },
    ],
    "treatment": {"name": "treated", "code_labels": {"0": "usual care", "1": "treated"}},
    "outcome": {"name": "outcome", "lower": -6, "upper": 6, "unit": "points"},
    "drop_columns": ["patient_id"],
    "out_of_bounds": "clip",
    "missing": "reject_upload",
    "design": "observational",
    "min_propensity_clip": 0.05,
}


def generate(n: int = N, seed: int = SEED) -> str:
    rng = np.random.default_rng(seed)
    age = rng.uniform(18, 90, n)
    severity = rng.beta(2, 2, n)
    bmi = np.clip(rng.normal(27, 4, n), 16, 45)
    sex = rng.integers(0, 2, n)
    diabetic = (rng.uniform(size=n) < 0.15 + 0.25 * severity).astype(int)
    logit = -1.2 + 2.4 * severity + 0.02 * (age - 50) + 0.3 * diabetic
    treated = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(int)
    tau = 0.5 + severity
    outcome = (
        -0.03 * (age - 50)
        - 1.5 * severity
        - 0.4 * diabetic
        + 0.02 * (bmi - 27)
        + tau * treated
        + rng.normal(0, 0.8, n)
    )
    outcome = np.clip(outcome, -6, 6)
    lines = ["patient_id,age,severity,bmi,sex,diabetic,treated,outcome"]
    lines += [
        f"O{i:05d},{age[i]:.1f},{severity[i]:.3f},{bmi[i]:.1f},{sex[i]},{diabetic[i]},"
        f"{treated[i]},{outcome[i]:.3f}"
        for i in range(n)
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    (HERE / "observational.csv").write_text(generate())
    (HERE / "observational_schema.json").write_text(json.dumps(SCHEMA, indent=2) + "\n")


if __name__ == "__main__":
    main()
