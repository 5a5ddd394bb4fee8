"""The ``dp_linear`` nuisance preset and 2-fold cross-fitting of the strict AIPW ATE.

Pins the DP logistic sensitivity (Lee et al. / Chaudhuri et al. 2 / (m lambda), plus the
solver-tolerance term), the per-arm ridge statistics' sensitivity sqrt(6), the cross-fitting
budget (epsilon_nuis + epsilon_stat, every event once) and seeded end-to-end runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from service.mechanisms import ate_strict, dp_linear
from service.mechanisms.ate_strict import AteStrictParams, plan
from service.mechanisms.calibration import (
    analytic_gaussian_multiplier,
    classic_gaussian_multiplier,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import SeededSampler, calibrate_gaussian
from service.mechanisms.records import Composition, Guarantee

TRUE_ATE = 1.0
FORBIDDEN_KEYS = {"theta_hat", "m2_hat", "gamma", "w", "w_hat", "w_tilde", "weights", "folds"}


def make_domain(
    n: int, q: int = 2, *, design: StudyDesign = StudyDesign.OBSERVATIONAL
) -> PublicDomain:
    return PublicDomain(
        x_lower=-np.ones(q),
        x_upper=np.ones(q),
        y_lower=-2.5,
        y_upper=2.5,
        n=n,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )


def synthetic(n: int, q: int, rng: np.random.Generator, *, rct: bool = False) -> Arrays:
    x = rng.uniform(-1.0, 1.0, size=(n, q))
    propensity = np.full(n, 0.5) if rct else 1.0 / (1.0 + np.exp(-x[:, 0]))
    a = (rng.uniform(size=n) < propensity).astype(np.float64)
    y = np.clip(x[:, 0] + 0.5 * x[:, 1] + TRUE_ATE * a + rng.normal(0.0, 0.5, n), -2.5, 2.5)
    return Arrays(x=x, a=a, y=y)


def no_progress(fraction: float, stage: str) -> None:
    del fraction, stage


# ---- features ------------------------------------------------------------------------------


def test_unit_ball_features_have_norm_at_most_one() -> None:
    rng = np.random.default_rng(0)
    lower, upper = np.array([-1.0, 0.0, 5.0]), np.array([1.0, 10.0, 6.0])
    corners = np.array(
        [
            [lo if bit else hi for lo, hi, bit in zip(lower, upper, bits, strict=True)]
            for bits in np.ndindex(2, 2, 2)
        ]
    )
    x = np.vstack([rng.uniform(lower - 1, upper + 1, size=(1000, 3)), corners])
    z = dp_linear.unit_ball_features(x, lower, upper)
    assert z.shape == (x.shape[0], 4)
    assert np.all(np.linalg.norm(z, axis=1) <= 1.0)
    assert np.all(z[:, 0] == dp_linear.INTERCEPT)
    # a box corner reaches the sphere
    assert np.linalg.norm(z[-1]) == pytest.approx(1.0, rel=1e-12)


# ---- DP logistic regression ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("m", "lam", "delta", "epsilon", "printed"),
    [
        (1000, 0.1, 1e-6, 0.1, 1.060),  # private_propensity.md §2.2 table (synthetic)
        (1000, 0.1, 1e-6, 0.99, 0.107),
        (500, 0.1, 1e-6, 0.2, 1.060),  # IHDP
        (500, 0.1, 4e-6, 0.4, 0.503),  # LaLonde code
        (500, 0.1, 4e-6, 0.01, 20.12),
    ],
)
def test_lee_sensitivity_and_classic_sigma(
    m: int, lam: float, delta: float, epsilon: float, printed: float
) -> None:
    nominal = 2.0 / (m * lam)
    sigma = classic_gaussian_multiplier(epsilon, delta) * nominal
    decimals = len(repr(printed).split(".")[1])
    assert abs(sigma - printed) <= 0.5 * 10.0**-decimals * (1 + 1e-9)
    # the service adds the public solver-tolerance term 2 g_tol / lambda, g_tol = 1e-3 / m
    assert dp_linear.logistic_sensitivity(m, lam) == pytest.approx(nominal * 1.001, rel=1e-12)


def _logistic_data(m: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.uniform(-1, 1, size=(m, d - 1))
    z = dp_linear.unit_ball_features(x, -np.ones(d - 1), np.ones(d - 1))
    t = (rng.uniform(size=m) < 1 / (1 + np.exp(-2 * z[:, 1]))).astype(np.float64)
    return z, t


def test_fit_logistic_is_certified_and_adversarial_replacements_respect_the_sensitivity() -> None:
    rng = np.random.default_rng(1)
    worst = 0.0
    for trial in range(12):
        m, d = 200, 3
        lam = [0.01, 0.1, 1.0][trial % 3]
        z, t = _logistic_data(m, d, rng)
        w = dp_linear.fit_logistic(z, t, regularization=lam)
        margin = z @ w
        gradient = z.T @ (1 / (1 + np.exp(-margin)) - t) / m + lam * w
        assert np.linalg.norm(gradient) <= dp_linear.gradient_tolerance(m)
        for corner in ([1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]):
            z2, t2 = z.copy(), t.copy()
            z2[0] = dp_linear.unit_ball_features(np.array([corner]), -np.ones(2), np.ones(2))[0]
            t2[0] = 1.0 - t[0]
            w2 = dp_linear.fit_logistic(z2, t2, regularization=lam)
            ratio = np.linalg.norm(w2 - w) / dp_linear.logistic_sensitivity(m, lam)
            worst = max(worst, float(ratio))
    assert worst <= 1.0
    assert worst > 0.05  # the replacements do move the fit


def test_gradient_descent_fallback_is_within_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    m, lam = 300, 0.5
    z, t = _logistic_data(m, 3, rng)
    exact = dp_linear.fit_logistic(z, t, regularization=lam)
    monkeypatch.setattr(dp_linear, "_NEWTON_STEPS", 0)
    fallback = dp_linear.fit_logistic(z, t, regularization=lam)
    assert np.linalg.norm(fallback - exact) <= 2 * dp_linear.gradient_tolerance(m) / lam


# ---- DP ridge (sufficient statistics) ------------------------------------------------------


def test_ridge_statistics_sensitivity_is_sqrt6() -> None:
    assert dp_linear.RIDGE_STAT_SENSITIVITY == pytest.approx(math.sqrt(6.0), rel=1e-15)
    rng = np.random.default_rng(3)
    q = 2
    lower, upper = -np.ones(q), np.ones(q)
    worst = 0.0
    for _ in range(30):
        m = 50
        x = rng.uniform(-1, 1, size=(m, q))
        z = dp_linear.unit_ball_features(x, lower, upper)
        a = (rng.uniform(size=m) < 0.5).astype(np.float64)
        t = rng.uniform(-1, 1, m)
        base = dp_linear.ridge_statistics(z, a, t)
        assert base.size == dp_linear.ridge_dim(q + 1)
        for _ in range(20):
            z2, a2, t2 = z.copy(), a.copy(), t.copy()
            corner = rng.choice([-1.0, 1.0], size=(1, q))
            z2[0] = dp_linear.unit_ball_features(corner, lower, upper)[0]
            a2[0] = rng.choice([0.0, 1.0])
            t2[0] = rng.choice([-1.0, 1.0])
            change = np.linalg.norm(dp_linear.ridge_statistics(z2, a2, t2) - base)
            worst = max(worst, float(change))
    assert worst <= math.sqrt(6.0)
    assert worst > 1.0


def test_solve_ridge_recovers_a_linear_model_without_noise() -> None:
    rng = np.random.default_rng(4)
    q, m = 3, 5000
    x = rng.uniform(-1, 1, size=(m, q))
    z = dp_linear.unit_ball_features(x, -np.ones(q), np.ones(q))
    a = (rng.uniform(size=m) < 0.5).astype(np.float64)
    w0, w1 = np.array([0.2, 0.5, -0.3, 0.1]), np.array([0.6, -0.2, 0.4, 0.0])
    t = np.where(a == 1, z @ w1, z @ w0)
    fitted0, fitted1 = dp_linear.solve_ridge(dp_linear.ridge_statistics(z, a, t), q + 1, m, 1e-9)
    np.testing.assert_allclose(fitted0, w0, atol=1e-5)
    np.testing.assert_allclose(fitted1, w1, atol=1e-5)


# ---- the strict AIPW with dp_linear and cross-fitting --------------------------------------


def test_dp_linear_record_without_cross_fit_uses_theorem6() -> None:
    domain = make_domain(4000)
    record = plan(domain, AteStrictParams(epsilon=1.0, delta=1e-5, nuisance="dp_linear"))
    assert record.guarantee == Guarantee.STRICT
    assert record.composition == Composition.THEOREM6_MAX
    assert (record.epsilon, record.delta) == (1.0, 1e-5)
    modules = [event.module for event in record.events]
    assert modules == ["propensity", "outcome", "estimation", "estimation"]
    logistic, ridge = record.events[0], record.events[1]
    assert logistic.epsilon == 1.0
    assert ridge.epsilon == 1.0
    # dp_linear's default folds at n eps = 4000 <= 5000 are (0.2, 0.2, 0.6): 800 / 800 / 2400
    assert record.fold_sizes == {"propensity": 800, "outcome": 800, "estimation": 2400}
    assert ate_strict.DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR == (0.2, 0.2, 0.6)
    assert logistic.params["sensitivity_l2"] == dp_linear.logistic_sensitivity(
        800, dp_linear.default_regularization(800)
    )
    assert ridge.params["sensitivity_l2"] == pytest.approx(math.sqrt(6.0))
    assert ridge.params["dim"] == dp_linear.ridge_dim(3)
    json.dumps(record.to_dict())
    # DP-EBM keeps the spec's (0.25, 0.25, 0.5)
    ebm = plan(domain, AteStrictParams(epsilon=1.0, delta=1e-5))
    assert ebm.fold_sizes == {"propensity": 1000, "outcome": 1000, "estimation": 2000}


@pytest.mark.parametrize("design", [StudyDesign.OBSERVATIONAL, StudyDesign.RCT])
def test_cross_fit_record_composes_sequentially_to_epsilon(design: StudyDesign) -> None:
    n = 10_001
    domain = make_domain(n, design=design)
    params = AteStrictParams(
        epsilon=1.0, delta=1e-6, nuisance="dp_linear", cross_fit=True, nuisance_share=0.2
    )
    record = plan(domain, params)
    assert record.composition == Composition.SEQUENTIAL
    assert record.fold_sizes == {"half_1": 5000, "half_2": 5001}
    assert math.fsum(event.epsilon for event in record.events) == pytest.approx(1.0, rel=1e-15)
    assert math.fsum(event.delta for event in record.events) == pytest.approx(1e-6, rel=1e-12)
    assert (record.epsilon, record.delta) == (1.0, 1e-6)
    nuisance = [event for event in record.events if event.module == "nuisance"]
    assert all(event.params["parallel_folds"] == 2 for event in nuisance)
    assert math.fsum(event.epsilon for event in nuisance) == pytest.approx(0.2, rel=1e-12)
    assert len(nuisance) == (2 if design == StudyDesign.OBSERVATIONAL else 1)
    mean = next(e for e in record.events if e.params.get("statistic") == "mean_pseudo_outcome")
    bound = float(mean.params["bound"])
    assert mean.params["sensitivity_l2_nominal"] == pytest.approx(2 * bound / n, rel=1e-15)
    # cross-fitting's default mean share at n = 10^4, eps_stat = 0.8 is 0.8 (s_2 is large)
    assert mean.epsilon == pytest.approx(0.8 * 0.8, rel=1e-12)
    # the quote's inverse uses the same split
    preview = ate_strict.quote(domain, params, target_half_width=0.3)
    eps = preview["epsilon_for_target_half_width"]
    assert preview["half_width_basis"] == "assumed_scale"
    at = ate_strict.quote(domain, replace(params, epsilon=eps))
    assert (
        at["expected_half_width"]
        <= 0.3
        < ate_strict.quote(domain, replace(params, epsilon=eps * 0.999))["expected_half_width"]
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cross_fit": True}, "needs nuisance='dp_linear'"),
        ({"nuisance": "dp_linear", "cross_fit": True, "fold_fractions": (0.5, 0.5)}, "omitted"),
        ({"nuisance": "dp_linear", "cross_fit": True, "nuisance_share": 1.0}, "nuisance_share"),
        ({"nuisance": "dp_ebm", "regularization": 0.1}, "regularization"),
        ({"nuisance": "dp_linear", "regularization": -1.0}, "regularization"),
        ({"nuisance": "dp_linear", "cross_fit": 1}, "boolean"),
    ],
)
def test_cross_fit_validation(changes: dict[str, object], message: str) -> None:
    params = replace(AteStrictParams(epsilon=1.0, delta=1e-6), **changes)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameters, match=message):
        plan(make_domain(4000), params)


def _run(
    arrays: Arrays, domain: PublicDomain, params: AteStrictParams, seed: int
) -> dict[str, Any]:
    return ate_strict.run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(seed),
        noise=SeededSampler(np.random.default_rng(seed + 1)),
        progress=no_progress,
    )


@pytest.mark.parametrize("cross_fit", [False, True])
def test_dp_linear_runs_are_near_the_truth(cross_fit: bool) -> None:
    n = 40_000
    domain = make_domain(n)
    params = AteStrictParams(epsilon=2.0, delta=1e-6, nuisance="dp_linear", cross_fit=cross_fit)
    hits = 0
    for seed in range(6):
        arrays = synthetic(n, 2, np.random.default_rng(100 + seed))
        result = _run(arrays, domain, params, seed)
        # known truth and a fixed cap, not a multiple of the mechanism's own width (issue 13.13):
        # at n = 40k, eps = 2 the half-width is 0.027-0.035 and the error within 0.04
        assert result["half_width"] < 0.06
        assert abs(result["estimate"] - TRUE_ATE) < 0.08
        hits += result["ci_lower"] <= TRUE_ATE <= result["ci_upper"]
        assert not FORBIDDEN_KEYS & set(result)
        assert result["cross_fit"] is cross_fit
        assert result["estimator"] == "aipw"
        json.dumps(result)
    assert hits >= 4
    if cross_fit:
        assert result["n2"] == n


def test_cross_fit_rct_run() -> None:
    n = 20_000
    domain = make_domain(n, design=StudyDesign.RCT)
    arrays = synthetic(n, 2, np.random.default_rng(7), rct=True)
    params = AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear", cross_fit=True)
    result = _run(arrays, domain, params, 3)
    assert result["half_width"] < 0.05  # 0.024 measured
    assert abs(result["estimate"] - TRUE_ATE) < 0.05


def test_cross_fit_half_width_is_closer_to_non_private_than_splitting() -> None:
    """Cross-fitting averages over all n: its noise-only width is below the split version's."""
    domain = make_domain(1_000_000, q=5)
    split = ate_strict.quote(domain, AteStrictParams(epsilon=1.0, delta=1e-7, nuisance="dp_linear"))
    crossed = ate_strict.quote(
        domain,
        AteStrictParams(epsilon=1.0, delta=1e-7, nuisance="dp_linear", cross_fit=True),
    )
    assert crossed["n2"] == 1_000_000
    assert split["n2"] == 500_000  # n eps > 5000: the spec's (0.25, 0.25, 0.5)
    assert crossed["expected_half_width"] < split["expected_half_width"]


def test_logistic_calibration_uses_the_smallest_half() -> None:
    domain = make_domain(2001)
    params = AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear", cross_fit=True)
    record = plan(domain, params)
    logistic = record.events[0]
    assert logistic.params["fit_size"] == 1000
    expected = calibrate_gaussian(
        logistic.epsilon,
        logistic.delta,
        dp_linear.logistic_sensitivity(1000, dp_linear.default_regularization(1000)),
        dim=3,
    )
    assert logistic.params["sigma"] == expected.sigma


# ---- public default rules (issue 3: ridge floor, cross-fitting shares) ------------------------


def test_default_ridge_floor_follows_the_noise_and_is_recorded() -> None:
    domain = make_domain(4000)
    record = plan(domain, AteStrictParams(epsilon=2.0, delta=1e-6, nuisance="dp_linear"))
    ridge = next(e for e in record.events if e.module == "outcome")
    m, d = 1000, 3  # n eps = 8000 > 5000: folds (0.25, 0.25, 0.5)
    sigma = calibrate_gaussian(2.0, 1e-6, math.sqrt(6.0), dim=dp_linear.ridge_dim(d)).sigma
    assert ridge.params["sigma"] == sigma
    assert ridge.params["regularization"] == min(1 / math.sqrt(m), math.sqrt(d) * sigma / m)
    assert ridge.params["regularization"] < 1 / math.sqrt(m)  # noise below the former floor
    # where the noise dominates (small m epsilon) the floor stays at the former m^(-1/2)
    small = plan(make_domain(1000), AteStrictParams(epsilon=0.5, delta=1e-6, nuisance="dp_linear"))
    floor = next(e for e in small.events if e.module == "outcome").params["regularization"]
    assert floor == 1 / math.sqrt(200)
    # an explicit public regularization still wins
    explicit = plan(
        domain,
        AteStrictParams(epsilon=2.0, delta=1e-6, nuisance="dp_linear", regularization=0.25),
    )
    assert next(e for e in explicit.events if e.module == "outcome").params[
        "regularization"
    ] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="positive"):
        dp_linear.default_ridge_regularization(0, 3, 1.0)


def test_default_ridge_floor_shrinks_less_than_the_former_m_half_rule() -> None:
    """At large m epsilon the default floor leaves the slope nearly unshrunk (the AIPW bias fix)."""
    rng = np.random.default_rng(5)
    m, d = 5000, 3
    x = rng.uniform(-1.0, 1.0, size=(m, 2))
    z = dp_linear.unit_ball_features(x, -np.ones(2), np.ones(2))
    a = (rng.uniform(size=m) < 0.5).astype(np.float64)
    t = np.clip(0.8 * x[:, 0] - 0.2 + 0.1 * rng.normal(size=m), -1.0, 1.0)
    stats = dp_linear.ridge_statistics(z, a, t)
    ols = dp_linear.solve_ridge(stats, d, m, 1e-12)[1]
    model = dp_linear.DpRidge.plan(m, d, 10.0, 1e-5)
    new = dp_linear.solve_ridge(stats, d, m, model.regularization)[1]
    old = dp_linear.solve_ridge(stats, d, m, 1.0 / math.sqrt(m))[1]
    assert model.regularization < 0.1 / math.sqrt(m)
    assert abs(new[1] / ols[1] - 1.0) < 0.01  # slope on x0 within 1 % of OLS
    assert abs(old[1] / ols[1] - 1.0) > 0.05  # the former rule shrank it by more than 5 %


@pytest.mark.parametrize(
    ("n", "epsilon", "share", "mean_share"),
    [
        (1_000_000, 1.0, 0.05, 0.9),
        (20_000, 10.0, 0.25, 0.8),
        (20_000, 1.0, 0.5, 0.8),
        (10_000_000, 10.0, 0.05, 0.9),
    ],
)
def test_cross_fit_default_share_rules(
    n: int, epsilon: float, share: float, mean_share: float
) -> None:
    """Nuisance share clip(50000 / (n eps), 0.05, 0.5); mean share 0.9 only if s_2 is small."""
    assert ate_strict.default_nuisance_share(n, epsilon) == pytest.approx(share, rel=1e-12)
    domain = make_domain(n)  # R = 5, c_pi = 0.1: B = 50
    record = plan(
        domain,
        AteStrictParams(epsilon=epsilon, delta=1e-8, nuisance="dp_linear", cross_fit=True),
    )
    nuisance = [e for e in record.events if e.module == "nuisance"]
    assert math.fsum(e.epsilon for e in nuisance) == pytest.approx(share * epsilon, rel=1e-12)
    mean = next(e for e in record.events if e.params.get("statistic") == "mean_pseudo_outcome")
    second = next(
        e for e in record.events if e.params.get("statistic") == "second_moment_pseudo_outcome"
    )
    assert mean.epsilon == pytest.approx((1 - share) * mean_share * epsilon, rel=1e-12)
    # the rule's criterion, recomputed from the record: s_2 at f = 0.9 vs 0.05 (R / 2)^2
    high_s2 = (
        2500
        / n
        * analytic_gaussian_multiplier((1 - share) * 0.1 * epsilon, (1 - share) * 0.1 * 1e-8)
    )
    assert (high_s2 <= 0.05 * 2.5**2) == (mean_share == 0.9)
    assert second.epsilon == pytest.approx((1 - share) * (1 - mean_share) * epsilon, rel=1e-9)
    assert (record.epsilon, record.delta) == (epsilon, 1e-8)


def test_quote_under_the_share_rule_is_consistent_with_epsilon_for_target() -> None:
    domain = make_domain(200_000)
    params = AteStrictParams(epsilon=1.0, delta=1e-7, nuisance="dp_linear", cross_fit=True)
    quote = ate_strict.quote(domain, params, target_half_width=0.01)
    assert quote["nuisance_share"] == ate_strict.default_nuisance_share(200_000, 1.0)
    assert quote["mean_share"] in (0.8, 0.9)
    epsilon = quote["epsilon_for_target_half_width"]
    assert epsilon is not None
    at_target = ate_strict.quote(domain, replace(params, epsilon=epsilon))
    assert at_target["expected_half_width"] <= 0.01
    below = ate_strict.quote(domain, replace(params, epsilon=epsilon * 0.999))
    assert below["expected_half_width"] > 0.01


def test_dp_linear_default_folds_rule_and_quote_across_the_switch() -> None:
    """(0.2, 0.2, 0.6) when n eps <= 5000 (and every fold >= 100), else (0.25, 0.25, 0.5)."""
    domain = make_domain(4000)
    small = plan(domain, AteStrictParams(epsilon=1.25, delta=1e-5, nuisance="dp_linear"))
    assert small.fold_sizes == {"propensity": 800, "outcome": 800, "estimation": 2400}
    large = plan(domain, AteStrictParams(epsilon=1.26, delta=1e-5, nuisance="dp_linear"))
    assert large.fold_sizes == {"propensity": 1000, "outcome": 1000, "estimation": 2000}
    tiny = plan(make_domain(450), AteStrictParams(epsilon=1.0, delta=1e-5, nuisance="dp_linear"))
    assert tiny.fold_sizes == {"propensity": 112, "outcome": 112, "estimation": 226}
    params = AteStrictParams(epsilon=1.0, delta=1e-5, nuisance="dp_linear")
    # the expected half-width jumps up at the switch (eps = 1.25): check both sides
    at_switch = ate_strict.quote(domain, replace(params, epsilon=1.25))["expected_half_width"]
    above = ate_strict.quote(domain, replace(params, epsilon=1.2600001))["expected_half_width"]
    assert above > at_switch
    for target in (at_switch * 1.0001, (at_switch + above) / 2, above * 0.9):
        eps = ate_strict.epsilon_for_half_width(domain, params, target)
        assert eps is not None
        at = ate_strict.quote(domain, replace(params, epsilon=eps))
        assert at["expected_half_width"] <= target
        below = ate_strict.quote(domain, replace(params, epsilon=eps * 0.999))
        assert below["expected_half_width"] > target
