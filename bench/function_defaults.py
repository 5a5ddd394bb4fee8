"""Released CATE functions: PEHE of the default regularisation rule against fixed choices.

In-process (the mechanism the job runs), Nystrom basis with 256 public centres, the RCT DGP of
``bench.functions`` (tau(x) = 1 + sin(2 pi x0) / 2, outcomes in [-2, 3]), n = 4000, eps = 1,
q in (2, 10, 30): the paper's normalised lambda = 1 (lambda0 = 1 / c_q), fixed unnormalised
lambda0 in (0.01, 0.1, 1) and the public rule (``regularization`` omitted), side by side on the
same datasets.

    python -m bench.function_defaults            # 10 releases per cell
    python -m bench.function_defaults --quick    # 2 releases per cell, q = 2
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from bench.common import write_result
from bench.functions import tau
from service.mechanisms import cate_function as mech
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler

CHOICES: tuple[tuple[str, float | None, str], ...] = (
    ("paper normalised lambda = 1", 1.0, "normalised"),
    ("lambda0 = 0.01", 0.01, "unnormalised"),
    ("lambda0 = 0.1", 0.1, "unnormalised"),
    ("lambda0 = 1", 1.0, "unnormalised"),
    ("public rule (default)", None, "normalised"),
)


def data(n: int, q: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, q))
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(x[:, 1] + a * tau(x) + rng.normal(0, 0.5, n), -2, 3)
    return x, a, y


def run(qs: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    rows = []
    for q in qs:
        domain = PublicDomain(
            x_lower=np.zeros(q),
            x_upper=np.ones(q),
            y_lower=-2.0,
            y_upper=3.0,
            n=4000,
            design=StudyDesign.RCT,
            treatment_probability=0.5,
        )
        test = np.random.default_rng(123).uniform(size=(1000, q))
        for label, lam, convention in CHOICES:
            pehe = []
            public: dict[str, Any] = {}
            for rep in range(reps):
                x, a, y = data(4000, q, 1000 + rep)
                params = mech.CateFunctionParams(
                    epsilon=1.0,
                    delta=1e-5,
                    nuisance="none",
                    basis="nystrom",
                    n_centres=256,
                    regularization=lam,
                    lambda_convention=convention,  # type: ignore[arg-type]
                )
                public, fitted = mech.run(
                    Arrays(x, a, y),
                    domain,
                    params,
                    rng=np.random.default_rng(rep),
                    noise=OpenDPSampler(),
                    progress=lambda *_: None,
                )
                values = fitted.released(fitted.mean(test))
                pehe.append(float(np.sqrt(np.mean((values - tau(test)) ** 2))))
            row = {
                "q": q,
                "choice": label,
                "lambda0": public["lambda0"],
                "pointwise_noise_sd": public["pointwise_noise_sd"],
                "pehe_mean": round(float(np.mean(pehe)), 4),
                "pehe_se": round(float(np.std(pehe, ddof=1) / np.sqrt(reps)), 4)
                if reps > 1
                else None,
                "releases": reps,
            }
            rows.append(row)
            print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = run((2,) if args.quick else (2, 10, 30), 2 if args.quick else 10)
    write_result(
        "function_defaults",
        {
            "settings": "RCT p = 0.5, outcomes [-2, 3], n = 4000, eps = 1, delta = 1e-5, "
            "nuisance 'none', R-learner, Nystrom 256 centres, 1000 test points; zero function "
            "PEHE = sqrt(E tau^2) = 1.06",
            "rows": rows,
        },
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
