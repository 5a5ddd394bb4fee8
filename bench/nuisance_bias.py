"""Where the observational strict ATE's error comes from: the DP nuisance models (issue 12).

On the realistic observational study (``bench.studies``, heterogeneity ``none``), per repetition
a fresh sample, and for each variant the error ``estimate - true ATE``:

* ``naive``: the unadjusted difference in means (what no adjustment gives);
* ``linear_default_lambda`` / ``linear_small_lambda``: **non-private** cross-fitted AIPW with the
  strict ``dp_linear`` nuisances' model family (logistic and per-arm ridge on the public
  unit-ball features) at the public default regularisation (logistic ``m^-1/3``, ridge 0.01)
  and at almost none (1e-5, 1e-7): separates the shrinkage from the privacy noise;
* ``dp_linear``: the strict ``dp_linear`` release at its defaults (``ate`` kind, DP noise);
* ``dp_ebm_lr<r>``: the strict default (DP-EBM nuisances, declared clip) with interpret's
  learning rate r (0.01 is the service's; the learning rate is public and does not change the
  privacy: interpret scales the noise with it).

Figures per variant and epsilon: mean error (bias), its sd over repetitions, the mean CI
half-width of the DP releases, and the share of releases whose interval covers the true ATE.
The non-private variants have no interval. Small repetition counts: a diagnosis, not a
coverage estimate.

    python -m bench.nuisance_bias --n 20000 --eps 4,16 --reps 6
    python -m bench.nuisance_bias --quick            # CI smoke: n 2000, eps 4, 1 rep
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from bench import nuisance_oracle
from bench.common import write_result
from bench.realistic import ate_release
from bench.studies import STUDIES
from service.mechanisms import dp_linear
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.domain import PublicDomain
from service.releases.kinds.ate import AteParams

FloatArray = NDArray[np.float64]
LEARNING_RATES = (0.01, 0.04)


def _linear_aipw(
    x: FloatArray,
    a: FloatArray,
    y: FloatArray,
    domain: PublicDomain,
    lam_pi: float | None,
    lam_mu: float,
    rng: np.random.Generator,
) -> float:
    """Non-private 2-fold cross-fitted AIPW with the dp_linear model family (no noise)."""
    n = a.size
    order = rng.permutation(n)
    halves = (order[: n // 2], order[n // 2 :])
    clip = 0.1
    bound = domain.outcome_range / clip
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    parts = []
    for fit, target in ((halves[0], halves[1]), (halves[1], halves[0])):
        z_fit = dp_linear.unit_ball_features(x[fit], domain.x_lower, domain.x_upper)
        z_target = dp_linear.unit_ball_features(x[target], domain.x_lower, domain.x_upper)
        lam = dp_linear.default_regularization(fit.size) if lam_pi is None else lam_pi
        w = dp_linear.fit_logistic(z_fit, a[fit], regularization=lam)
        pi = np.clip(dp_linear.predict_propensity(w, z_target), clip, 1.0 - clip)
        t = np.clip((y[fit] - midpoint) / (domain.outcome_range / 2.0), -1.0, 1.0)
        stats = dp_linear.ridge_statistics(z_fit, a[fit], t)
        w0, w1 = dp_linear.solve_ridge(stats, z_fit.shape[1], fit.size, lam_mu)
        bounds = {"y_lower": domain.y_lower, "y_upper": domain.y_upper}
        mu0 = dp_linear.predict_outcome(w0, z_target, **bounds)
        mu1 = dp_linear.predict_outcome(w1, z_target, **bounds)
        parts.append(pseudo_outcomes(a[target], y[target], pi, mu0, mu1, bound=bound))
    return float(np.concatenate(parts).mean())


def _summary(errors: list[float], half_widths: list[float]) -> dict[str, Any]:
    e = np.asarray(errors)
    out: dict[str, Any] = {
        "reps": int(e.size),
        "bias": float(e.mean()),
        "sd": float(e.std(ddof=1)) if e.size > 1 else None,
    }
    if half_widths:
        h = np.asarray(half_widths)
        out["mean_half_width"] = float(h.mean())
        out["coverage"] = float(np.mean(np.abs(e) < h))
    return out


def run(n: int, epsilons: tuple[float, ...], reps: int, seed: int) -> dict[str, Any]:
    study = STUDIES["none"]
    domain = study.domain(n)
    truth = study.true_ate
    rng = np.random.default_rng(seed)
    errors: dict[str, list[float]] = {}
    widths: dict[str, list[float]] = {}

    def add(name: str, error: float, half_width: float | None = None) -> None:
        errors.setdefault(name, []).append(error)
        if half_width is not None:
            widths.setdefault(name, []).append(half_width)

    for _ in range(reps):
        arrays, _ = study.sample(n, rng)
        x, a, y = arrays.x, arrays.a, arrays.y
        add("naive", float(y[a == 1].mean() - y[a == 0].mean()) - truth)
        add("linear_default_lambda", _linear_aipw(x, a, y, domain, None, 0.01, rng) - truth)
        add("linear_small_lambda", _linear_aipw(x, a, y, domain, 1e-5, 1e-7, rng) - truth)
        for epsilon in epsilons:
            estimate, half, _ = ate_release(
                arrays, domain, AteParams(epsilon=epsilon, nuisance="dp_linear")
            )
            add(f"dp_linear eps={epsilon:g}", estimate - truth, half)
            for rate in LEARNING_RATES:
                # a public hyperparameter of both DP-EBM nuisances (module docstring)
                with nuisance_oracle.variant(f"lr:{rate}:{rate}", study):
                    estimate, half, _ = ate_release(
                        arrays, domain, AteParams(epsilon=epsilon, nuisance="dp_ebm")
                    )
                add(f"dp_ebm_lr{rate:g} eps={epsilon:g}", estimate - truth, half)
    return {name: _summary(values, widths.get(name, [])) for name, values in errors.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--eps", default="4,16")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=20261125)
    args = parser.parse_args(argv)
    n = 2000 if args.quick else args.n
    epsilons = (4.0,) if args.quick else tuple(float(e) for e in args.eps.split(","))
    reps = 1 if args.quick else args.reps
    with threadpool_limits(1):
        variants = run(n, epsilons, reps, args.seed)
    for name, figures in variants.items():
        cells = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
        )
        print(f"{name:28s} {cells}")
    write_result(
        "nuisance_bias",
        {"n": n, "epsilons": list(epsilons), "reps": reps, "variants": variants},
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
