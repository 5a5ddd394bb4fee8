"""Strict DP AIPW ATE (ate_ci.md §3): plan/record, validation, sensitivity, end-to-end runs."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pydantic
import pytest
from numpy.typing import NDArray

from service.mechanisms import ate_strict
from service.mechanisms.ate_strict import (
    AteStrictParams,
    aggregate,
    confidence_interval,
    d2_statistics,
    plan,
    pseudo_outcomes,
    quote,
    run,
)
from service.mechanisms.calibration import gdp_delta, gdp_epsilon
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import dp_ebm_accounting, solve_dp_ebm_epsilon_p
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import SeededSampler
from service.mechanisms.records import Composition, Guarantee
from service.releases.kinds import REGISTRY
from service.releases.kinds.ate import AteKind, AteParams, to_mechanism_params

TRUE_ATE = 1.0


def make_domain(
    n: int = 3000,
    q: int = 2,
    *,
    y_lower: float = -2.5,
    y_upper: float = 2.5,
    design: StudyDesign = StudyDesign.OBSERVATIONAL,
    p: float | None = None,
    min_clip: float = 0.01,
) -> PublicDomain:
    return PublicDomain(
        x_lower=-np.ones(q),
        x_upper=np.ones(q),
        y_lower=y_lower,
        y_upper=y_upper,
        n=n,
        design=design,
        treatment_probability=p,
        min_propensity_clip=min_clip,
    )


def synthetic(n: int, q: int, rng: np.random.Generator, *, rct_p: float | None = None) -> Arrays:
    """Y = x0 + 0.5 x1 + A + N(0, 0.5^2), clipped to [-4, 4]; confounded unless rct_p is set."""
    x = rng.uniform(-1.0, 1.0, size=(n, q))
    propensity = np.full(n, rct_p) if rct_p is not None else 1.0 / (1.0 + np.exp(-x[:, 0]))
    a = (rng.uniform(size=n) < propensity).astype(np.float64)
    y = np.clip(x[:, 0] + 0.5 * x[:, 1] + TRUE_ATE * a + rng.normal(0.0, 0.5, n), -4.0, 4.0)
    return Arrays(x=x, a=a, y=y)


def _matches_printed(value: float, printed: float) -> bool:
    decimals = len(repr(printed).split(".")[1])
    return abs(value - printed) <= 0.5 * 10.0**-decimals * (1 + 1e-9)


def no_progress(fraction: float, stage: str) -> None:
    del fraction, stage


# ---- plan / record -------------------------------------------------------------------------


def test_record_observational_defaults() -> None:
    domain = make_domain(n=3000)
    params = AteStrictParams(epsilon=0.5, delta=1e-5)
    record = plan(domain, params)
    assert record.mechanism == "ate_strict"
    assert record.guarantee == Guarantee.STRICT
    assert record.composition == Composition.THEOREM6_MAX
    assert record.neighbouring == "replace-one"
    assert (record.epsilon, record.delta) == (0.5, 1e-5)
    assert record.fold_sizes == {"propensity": 750, "outcome": 750, "estimation": 1500}
    modules = [event.module for event in record.events]
    assert modules == ["propensity", "outcome", "estimation", "estimation"]
    assert [event.type for event in record.events] == [
        "gdp_module",
        "gdp_module",
        "gaussian",
        "gaussian",
    ]
    for event in record.events[:2]:
        assert (event.epsilon, event.delta) == (0.5, 1e-5)
        mu = float(event.params["mu"])
        assert gdp_delta(0.5, mu) <= 1e-5  # replace-one guarantee of the DP-EBM fit
        assert 0 < float(event.params["epsilon_p"]) < 0.5
    mean, second = record.events[2], record.events[3]
    assert mean.epsilon + second.epsilon == 0.5
    assert mean.delta + second.delta == 1e-5
    assert mean.epsilon == pytest.approx(0.4)
    bound = 5.0 / 0.1
    assert mean.params["sensitivity_l2_nominal"] == pytest.approx(2 * bound / 1500, rel=1e-15)
    assert second.params["sensitivity_l2_nominal"] == pytest.approx(bound**2 / 1500, rel=1e-15)
    for event in (mean, second):
        sigma = float(event.params["sigma"])
        effective = float(event.params["sensitivity_l2_effective"])
        assert (
            effective
            >= float(event.params["sensitivity_l2"])
            >= float(event.params["sensitivity_l2_nominal"])
        )
        assert gdp_delta(event.epsilon, effective / sigma) <= event.delta
    json.dumps(record.to_dict())  # serialisable


def test_record_outcome_module_measures_its_range_from_the_threshold() -> None:
    """proof §16: from n eps = 2 * 10^4 the DP-EBM outcome module spends SHARE of its epsilon
    on two DP quantiles (delta 0) and the rest on the model, adding up exactly like the
    propensity module; below it the declared range at the full module budget."""
    threshold = ate_strict.OUTCOME_RANGE_MIN_N_EPSILON
    below = plan(
        make_domain(n=20_000),
        AteStrictParams(epsilon=0.999 * threshold / 20_000, delta=1e-6, quantile_bins=False),
    )
    assert [e.module for e in below.events].count("outcome") == 1
    record = plan(
        make_domain(n=20_000),
        AteStrictParams(epsilon=0.5 * threshold / 10_000, delta=1e-6, quantile_bins=False),
    )
    assert [event.type for event in record.events] == [
        "gdp_module",
        "exponential_quantile",
        "exponential_quantile",
        "gdp_module",
        "gaussian",
        "gaussian",
    ]
    epsilon = record.epsilon
    propensity, low, high, outcome = record.events[:4]
    assert {e.module for e in (low, high, outcome)} == {"outcome"}
    assert [low.params["level"], high.params["level"]] == [0.02, 0.98]
    assert low.delta == high.delta == 0.0
    assert low.epsilon + high.epsilon == pytest.approx(0.1 * epsilon)
    assert (outcome.epsilon, outcome.delta) == (pytest.approx(0.9 * epsilon), record.delta)
    assert math.fsum(e.epsilon for e in (low, high, outcome)) == epsilon
    assert outcome.params["target_range"] == "measured"
    assert outcome.params["target_range_max"] == 5.0
    assert (propensity.epsilon, propensity.delta) == (epsilon, record.delta)
    for event, budget in ((propensity, epsilon), (outcome, outcome.epsilon)):
        mu = float(event.params["mu"])
        assert gdp_delta(budget, mu) <= record.delta  # replace-one guarantee of the DP-EBM fit
        assert 0 < float(event.params["epsilon_p"]) < budget


@pytest.mark.parametrize(
    ("big_r", "clip", "n", "epsilon", "s_theta", "s_2", "half_width"),
    [
        (5.0, 0.1, 3000, 0.5, 0.5841, 57.82, 1.145),
        (5.0, 0.1, 3000, 1.0, 0.3091, 30.35, 0.606),
        (1.0, 0.1, 5735, 0.1, 0.2677, 5.341, 0.525),
        (1.0, 0.1, 5735, 0.25, 0.1156, 2.299, 0.227),
        (1.0, 0.1, 5735, 0.5, 0.0611, 1.209, 0.120),
        (4.0, 0.5, 1000, 0.5, 0.2804, 4.441, 0.550),
    ],
)
def test_quote_reproduces_worked_numbers(
    big_r: float,
    clip: float,
    n: int,
    epsilon: float,
    s_theta: float,
    s_2: float,
    half_width: float,
) -> None:
    """ate_ci.md §3.7 (25/25/50, f = 0.8, analytic Gaussian, delta = 1e-5)."""
    domain = make_domain(n=n, y_lower=-big_r / 4, y_upper=3 * big_r / 4)
    params = AteStrictParams(epsilon=epsilon, delta=1e-5, propensity_clip=clip)
    preview = quote(domain, params)
    # Printed to 4 significant digits; s_2 sits on a rounding boundary in two rows (2.29849 and
    # 1.20929 printed as 2.299 and 1.209), and the half-widths came from the rounded s_theta.
    assert _matches_printed(preview["s_theta"], s_theta)
    assert preview["s_2"] == pytest.approx(s_2, rel=2.5e-4)
    assert preview["min_half_width"] == pytest.approx(half_width, abs=1e-3)
    assert preview["min_half_width"] == pytest.approx(1.959963984540054 * preview["s_theta"])
    assert preview["bound"] == pytest.approx(big_r / clip)
    assert preview["n2"] == n - 2 * math.floor(0.25 * n)


def test_quote_inverse_epsilon_for_half_width() -> None:
    domain = make_domain(n=3000)
    params = AteStrictParams(epsilon=0.5, delta=1e-5)
    preview = quote(domain, params, target_half_width=0.606)
    needed = preview["epsilon_for_target_half_width"]
    # the worked example's noise-only half-width is 0.606 at eps = 1 (ate_ci.md §3.7); the
    # expected half-width adds the sampling error at the assumed scale R / 6 and the second
    # moment's noise in the variance estimate, so the inverse needs a little more
    assert 1.0 < needed < 1.1
    reached = quote(domain, replace(params, epsilon=needed))
    assert reached["expected_half_width"] <= 0.606
    assert reached["min_half_width"] < reached["expected_half_width"]
    below = quote(domain, replace(params, epsilon=needed * (1 - 1e-6)))
    assert below["expected_half_width"] > 0.606
    assert ate_strict.epsilon_for_half_width(domain, params, 1e-9) is None
    assert ate_strict.epsilon_for_half_width(domain, params, 1e6) == ate_strict.MIN_EPSILON


def test_record_rct_designs() -> None:
    domain = make_domain(n=1000, design=StudyDesign.RCT, p=0.25, y_lower=-1.0, y_upper=3.0)
    record = plan(domain, AteStrictParams(epsilon=1.0, delta=1e-5))
    assert record.fold_sizes == {"outcome": 500, "estimation": 500}
    assert [event.module for event in record.events] == ["outcome", "estimation", "estimation"]
    assert record.events[1].params["bound"] == pytest.approx(4.0 / 0.25)
    none = plan(domain, AteStrictParams(epsilon=1.0, delta=1e-5, nuisance="none"))
    assert none.fold_sizes == {"estimation": 1000}
    assert none.composition == Composition.SEQUENTIAL
    assert [event.type for event in none.events] == ["gaussian", "gaussian"]
    # |Y - midpoint| <= R / 2, so B = R / (2 min(p, 1 - p)).
    assert none.events[0].params["bound"] == pytest.approx(4.0 / (2 * 0.25))
    assert (none.epsilon, none.delta) == (1.0, 1e-5)


def test_dp_ebm_epsilon_p_rule_matches_readme_table() -> None:
    """README §1.2: exact epsilon_p at delta = 1e-5, beta = 0.1 (rounded down)."""
    for target, printed in [(1, 0.5415), (2, 1.0696), (4, 2.0938), (8, 4.0472), (16, 7.7045)]:
        accounting = solve_dp_ebm_epsilon_p(float(target), 1e-5)
        assert math.floor(accounting.epsilon_p * 1e4) / 1e4 == printed
        assert gdp_delta(float(target), accounting.mu_replace_one) <= 1e-5
    # At 128 interpret's own (erf-based) mu sits below the exact root, i.e. it adds more noise,
    # so the epsilon_p valid for the noise actually added is above the exact-mu value 49.5179.
    accounting = solve_dp_ebm_epsilon_p(128.0, 1e-5)
    assert accounting.epsilon_p >= 49.5179
    assert gdp_delta(128.0, accounting.mu_replace_one) <= 1e-5
    # Passing eps / 2 is fine at eps = 8 and not at 16 (README §1.2: 16 gives 16.67).
    assert gdp_epsilon(dp_ebm_accounting(4.0, 1e-5).mu_replace_one, 1e-5) <= 8.0
    assert round(gdp_epsilon(dp_ebm_accounting(8.0, 1e-5).mu_replace_one, 1e-5), 2) == 16.67


def test_dp_ebm_accounting_matches_fitted_noise_scales() -> None:
    from interpret.privacy import DPExplainableBoostingClassifier

    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=(300, 3))
    a = (rng.uniform(size=300) < 0.5).astype(np.int64)
    accounting = dp_ebm_accounting(0.7, 1e-5)
    model = DPExplainableBoostingClassifier(
        epsilon=0.7,
        delta=1e-5,
        feature_types=["continuous"] * 3,
        privacy_bounds=[(-1.0, 1.0)] * 3,
        n_jobs=1,
        max_rounds=20,
    )
    model.fit(x, a)
    assert model.noise_scale_binning_ == pytest.approx(math.sqrt(3) / accounting.mu_binning)
    expected = math.sqrt(20 * 3) * 0.01 * 1.0 / accounting.mu_boosting
    assert model.noise_scale_boosting_ == pytest.approx(expected)


# ---- validation ----------------------------------------------------------------------------

BASE = AteStrictParams(epsilon=1.0, delta=1e-5)


@pytest.mark.parametrize(
    ("domain_kwargs", "changes", "fragment"),
    [
        ({}, {"epsilon": math.nan}, "epsilon"),
        ({}, {"epsilon": math.inf}, "epsilon"),
        ({}, {"epsilon": 0.0}, "epsilon"),
        ({}, {"epsilon": -1.0}, "epsilon"),
        ({}, {"epsilon": 5e-324}, "subnormal"),
        ({}, {"epsilon": 1000.0}, "epsilon"),
        ({}, {"delta": 0.0}, "delta"),
        ({}, {"delta": 1.0 / 750}, "delta"),  # smallest fold is 750
        ({}, {"delta": math.nan}, "delta"),
        ({}, {"alpha": 1.0}, "alpha"),
        ({}, {"alpha_v": 0.0}, "alpha_v"),
        ({}, {"mean_share": 1.0}, "mean_share"),
        ({}, {"mean_share": 0.0}, "mean_share"),
        ({"min_clip": 0.2}, {}, "propensity_clip"),  # default 0.1 below the owner's minimum
        ({}, {"propensity_clip": 0.6}, "propensity_clip"),
        ({}, {"pseudo_outcome_clip": 50.0}, "pseudo_outcome_clip"),  # K must be < R/c = 50
        ({}, {"pseudo_outcome_clip": -1.0}, "pseudo_outcome_clip"),
        ({}, {"fold_fractions": (0.3, 0.3, 0.3)}, "sum to 1"),
        ({}, {"fold_fractions": (0.5, 0.5)}, "3 entries"),
        ({}, {"fold_fractions": (-0.25, 0.75, 0.5)}, "fold fraction"),
        ({}, {"fold_fractions": (0.01, 0.49, 0.5)}, "at least"),  # a 30-record fold
        ({"n": 300}, {}, "at least"),  # minimum-n guard
        ({}, {"nuisance": "none"}, "RCT"),
        ({"design": StudyDesign.RCT}, {}, "treatment_probability"),
        ({"design": StudyDesign.RCT, "p": 1.0}, {}, "treatment_probability"),
        ({"design": StudyDesign.RCT, "p": 0.5}, {"fold_fractions": (0.25, 0.25, 0.5)}, "2"),
        ({"y_lower": 1.0, "y_upper": 1.0}, {}, "outcome bounds"),
    ],
)
def test_plan_rejects_invalid_requests(
    domain_kwargs: dict[str, Any], changes: dict[str, Any], fragment: str
) -> None:
    domain = make_domain(**domain_kwargs)
    with pytest.raises(InvalidParameters, match=fragment):
        plan(domain, replace(BASE, **changes))


def test_plan_rejects_bad_covariate_box() -> None:
    domain = replace(make_domain(), x_upper=np.array([1.0, -1.0]))
    with pytest.raises(InvalidParameters, match="covariate bounds"):
        plan(domain, BASE)


def _estimation_events(record: Any) -> list[Any]:
    return [event for event in record.events if event.module == "estimation"]


def test_valid_clip_and_k() -> None:
    domain = make_domain(min_clip=0.2)
    record = plan(domain, replace(BASE, propensity_clip=0.25, pseudo_outcome_clip=10.0))
    assert _estimation_events(record)[0].params["bound"] == 10.0


# ---- sensitivity (ate_ci.md §3.9) ----------------------------------------------------------


def _statistics(
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    pi: NDArray[np.float64],
    mu0: NDArray[np.float64],
    mu1: NDArray[np.float64],
    *,
    bound: float,
) -> tuple[float, float]:
    return d2_statistics(pseudo_outcomes(a, y, pi, mu0, mu1, bound=bound), bound=bound)


@pytest.mark.parametrize("clip_k", [None, 7.5])
def test_replacing_one_row_by_a_box_vertex_respects_the_sensitivities(
    clip_k: float | None,
) -> None:
    rng = np.random.default_rng(3)
    y_lo, y_hi, c = -1.0, 4.0, 0.1
    natural = (y_hi - y_lo) / c
    bound = natural if clip_k is None else clip_k
    domain = make_domain(n=400, y_lower=y_lo, y_upper=y_hi)
    params = replace(BASE, propensity_clip=c, pseudo_outcome_clip=clip_k)
    record = plan(domain, params)
    n2 = record.fold_sizes["estimation"]
    limit_theta = 2 * bound / n2
    limit_m2 = bound**2 / n2
    mean_event, second_event = _estimation_events(record)
    calibrated_theta = float(mean_event.params["sensitivity_l2"])
    calibrated_m2 = float(second_event.params["sensitivity_l2"])
    vertices = list(
        itertools.product((0.0, 1.0), (y_lo, y_hi), (c, 1 - c), (y_lo, y_hi), (y_lo, y_hi))
    )
    worst_theta = worst_m2 = 0.0
    for _ in range(40):
        a = (rng.uniform(size=n2) < 0.5).astype(np.float64)
        y = rng.uniform(y_lo, y_hi, n2)
        pi = rng.uniform(c, 1 - c, n2)
        mu0 = rng.uniform(y_lo, y_hi, n2)
        mu1 = rng.uniform(y_lo, y_hi, n2)
        if rng.uniform() < 0.5:  # some datasets already sit on vertices
            i = int(rng.integers(n2))
            a[i], y[i], pi[i], mu0[i], mu1[i] = vertices[int(rng.integers(len(vertices)))]
        theta, m2 = _statistics(a, y, pi, mu0, mu1, bound=bound)
        i = int(rng.integers(n2))
        for vertex in vertices:
            arrays = [arr.copy() for arr in (a, y, pi, mu0, mu1)]
            for array, value in zip(arrays, vertex, strict=True):
                array[i] = value
            theta2, m22 = _statistics(*arrays, bound=bound)
            worst_theta = max(worst_theta, abs(theta2 - theta))
            worst_m2 = max(worst_m2, abs(m22 - m2))
    assert worst_theta <= limit_theta * (1 + 1e-12)
    assert worst_m2 <= limit_m2 * (1 + 1e-12)
    assert worst_theta <= calibrated_theta
    assert worst_m2 <= calibrated_m2
    # The range of Gamma is exactly [-R/c, R/c] at the vertices (ate_ci.md §3.3).
    gammas = [
        float(pseudo_outcomes(*(np.array([v]) for v in vertex), bound=math.inf)[0])
        for vertex in vertices
    ]
    assert max(gammas) == pytest.approx(natural)
    assert min(gammas) == pytest.approx(-natural)


def test_pseudo_outcomes_are_total_and_bounded() -> None:
    one = np.array([1.0])
    gamma = pseudo_outcomes(one, np.array([math.nan]), one * 0.5, one, one, bound=3.0)
    assert gamma.tolist() == [0.0]
    gamma = pseudo_outcomes(one, one * 1e300, one * 0.5, one * 0, one * 0, bound=3.0)
    assert gamma.tolist() == [3.0]


def test_confidence_interval_formula() -> None:
    out = confidence_interval(1.0, 5.0, s_theta=0.1, s_2=2.0, n2=100, alpha=0.05)
    variance = 5.0 - 1.0 + 0.01
    assert out["variance_estimate"] == pytest.approx(variance)
    half = 1.959963984540054 * math.sqrt(variance / 100 + 0.01)
    assert out["ci_lower"] == pytest.approx(1.0 - half)
    assert out["ci_upper"] == pytest.approx(1.0 + half)
    inflated = confidence_interval(
        1.0, 5.0, s_theta=0.1, s_2=2.0, n2=100, alpha=0.05, variance_inflation=True
    )
    assert inflated["variance_used"] == pytest.approx(variance + 1.6448536269514722 * 2.0)
    clamped = confidence_interval(3.0, 1.0, s_theta=0.1, s_2=2.0, n2=100, alpha=0.05)
    assert clamped["variance_estimate"] == 0.0


# ---- runs ----------------------------------------------------------------------------------

ALLOWED_KEYS = {
    "estimate",
    "ci_lower",
    "ci_upper",
    "ci_level",
    "half_width",
    "variance_estimate",
    "s_theta",
    "s_2",
    "n2",
    "mode",
    "guarantee",
    "design",
    "nuisance",
    "epsilon",
    "delta",
    "alpha",
    "propensity_clip",
    "treatment_probability",
    "pseudo_outcome_clip",
    "bound",
    "fold_sizes",
    "mean_share",
    "variance_inflation",
    "alpha_v",
    "estimator",
    "cross_fit",
    "nuisance_share",
    "clip",
    "bound_max",
    "quantile_bins",
    "outcome_range",
    "adjustment_columns",
}
FORBIDDEN_FRAGMENTS = ("theta_hat", "m2_hat", "gamma", "fold_membership", "model", "assign")


def _run(arrays: Arrays, domain: PublicDomain, params: AteStrictParams, seed: int) -> Any:
    stages: list[tuple[float, str]] = []
    result = run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(seed),
        noise=SeededSampler(np.random.default_rng(seed + 1)),
        progress=lambda fraction, stage: stages.append((fraction, stage)),
    )
    return result, stages


def test_observational_run_is_near_the_truth_and_releases_only_allowed_keys() -> None:
    n = 12_000
    domain = make_domain(n=n, y_lower=-4.0, y_upper=4.0)
    arrays = synthetic(n, 2, np.random.default_rng(11))
    params = AteStrictParams(epsilon=4.0, delta=1e-6)
    result, stages = _run(arrays, domain, params, seed=12)
    assert set(result) == ALLOWED_KEYS
    assert not any(fragment in key for key in result for fragment in FORBIDDEN_FRAGMENTS)
    json.dumps(result)
    # sampling sd ~ 0.05 here; 0.3 is > 5 sd of the total error
    assert abs(result["estimate"] - TRUE_ATE) < 0.3
    # the CI is the published formula of the released public values (this seeded interval,
    # [1.017, ...], misses the truth 1: the DP nuisances' bias, issue 12)
    z = 1.959963984540054
    expected = z * math.sqrt(result["variance_estimate"] / result["n2"] + result["s_theta"] ** 2)
    assert result["half_width"] == pytest.approx(expected, rel=1e-12)
    assert result["ci_lower"] == pytest.approx(result["estimate"] - expected, rel=1e-12)
    assert result["ci_upper"] == pytest.approx(result["estimate"] + expected, rel=1e-12)
    assert result["ci_level"] == 0.95
    assert result["n2"] == n // 2
    # n epsilon = 48000 >= 2 * 10^4: DP-EBM's outcome-heavy default folds (0.1, 0.4, 0.5)
    assert result["fold_sizes"] == {"propensity": 1200, "outcome": 4800, "estimation": 6000}
    fractions = [fraction for fraction, _ in stages]
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0
    assert [stage for _, stage in stages] == [
        "partition",
        "propensity",
        "outcome",
        "estimation",
        "done",
    ]


@pytest.mark.parametrize("nuisance", ["none", "dp_ebm"])
def test_rct_runs_are_near_the_truth(nuisance: str) -> None:
    n = 20_000
    domain = make_domain(n=n, design=StudyDesign.RCT, p=0.5, y_lower=-4.0, y_upper=4.0)
    arrays = synthetic(n, 2, np.random.default_rng(21), rct_p=0.5)
    params = AteStrictParams(epsilon=2.0, delta=1e-6, nuisance=nuisance)  # type: ignore[arg-type]
    result, stages = _run(arrays, domain, params, seed=22)
    assert abs(result["estimate"] - TRUE_ATE) < 0.3
    assert result["treatment_probability"] == 0.5
    assert result["propensity_clip"] is None
    expected_stages = ["partition", "estimation", "done"]
    if nuisance == "dp_ebm":
        expected_stages.insert(1, "outcome")
    assert [stage for _, stage in stages] == expected_stages


def test_single_class_propensity_fold_does_not_fail() -> None:
    """Public anchor rows keep interpret's ``classes_`` constant (no data-dependent failure)."""
    n = 1200
    domain = make_domain(n=n)
    arrays = synthetic(n, 2, np.random.default_rng(5))
    arrays = Arrays(x=arrays.x, a=np.ones(n), y=arrays.y)
    result, _ = _run(arrays, domain, AteStrictParams(epsilon=1.0, delta=1e-5), seed=6)
    assert math.isfinite(result["estimate"])


def test_failures_after_data_access_are_generic() -> None:
    domain = make_domain(n=1000, design=StudyDesign.RCT, p=0.5)
    params = AteStrictParams(epsilon=1.0, delta=1e-5, nuisance="none")
    wrong_shape = Arrays(x=np.zeros((999, 2)), a=np.zeros(999), y=np.zeros(999))
    with pytest.raises(ReleaseFailed) as caught:
        _run(wrong_shape, domain, params, seed=1)
    assert str(caught.value) == "release failed"
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__

    class Exploding:
        def gaussian(self, values: Any, *, sigma: float, sensitivity_l2: float) -> Any:
            raise RuntimeError("secret value 0.1234")

        def laplace(self, values: Any, *, scale: float, sensitivity_l1: float) -> Any:
            raise RuntimeError("secret")

    arrays = synthetic(1000, 2, np.random.default_rng(2), rct_p=0.5)
    with pytest.raises(ReleaseFailed) as caught:
        run(
            arrays,
            domain,
            params,
            rng=np.random.default_rng(3),
            noise=Exploding(),
            progress=no_progress,
        )
    assert "secret" not in str(caught.value)


def test_invalid_parameters_are_raised_before_data_access() -> None:
    calls: list[str] = []
    domain = make_domain(n=1000)
    with pytest.raises(InvalidParameters):
        run(
            synthetic(1000, 2, np.random.default_rng(0)),
            domain,
            replace(BASE, epsilon=-1.0),
            rng=np.random.default_rng(0),
            noise=SeededSampler(np.random.default_rng(0)),
            progress=lambda fraction, stage: calls.append(stage),
        )
    assert calls == []


# ---- the kind adapter ----------------------------------------------------------------------


def test_kind_registry_and_params() -> None:
    kind = REGISTRY["ate"]
    assert isinstance(kind, AteKind)
    assert kind.name == "ate"
    domain = make_domain(n=3000)
    params = AteParams(epsilon=0.5)
    record = kind.record(params, domain)
    assert record.delta == 1e-5  # min(1e-5, 1 / (10 * 750))
    big = make_domain(n=1_000_000)
    # n epsilon >= 2 * 10^4: folds (0.1, 0.4, 0.5), so 1 / (10 * 100000)
    assert kind.record(params, big).delta == pytest.approx(1e-6)
    preview = kind.quote(AteParams(epsilon=0.5, target_half_width=0.606), domain)
    mechanism = to_mechanism_params(AteParams(epsilon=0.5), domain)
    assert preview["epsilon_for_target_half_width"] == ate_strict.epsilon_for_half_width(
        domain, mechanism, 0.606
    )
    with pytest.raises(pydantic.ValidationError, match="not DP for the estimation fold"):
        AteParams(mode="paper", estimator="ipw", epsilon=1.0)
    with pytest.raises(pydantic.ValidationError):
        AteParams(epsilon=1.0, seed=3)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        AteParams(epsilon=math.inf)
    with pytest.raises(pydantic.ValidationError):
        AteParams(epsilon=1.0, nuisance="kernel")


def test_kind_run_delegates() -> None:
    n = 2000
    domain = make_domain(n=n, design=StudyDesign.RCT, p=0.5, y_lower=-4.0, y_upper=4.0)
    arrays = synthetic(n, 2, np.random.default_rng(8), rct_p=0.5)
    result = AteKind().run(
        arrays,
        domain,
        {"epsilon": 1.0, "nuisance": "none"},
        rng=np.random.default_rng(9),
        noise=SeededSampler(np.random.default_rng(10)),
        progress=no_progress,
    )
    assert result["delta"] == 1e-5
    assert result["fold_sizes"] == {"estimation": n}


# ---- charged adaptive clipping (proof §13) ----------------------------------------------------


def test_adaptive_clip_excludes_a_public_clip_and_charges_the_same_total() -> None:
    domain = make_domain(n=4000, y_lower=-20.0, y_upper=20.0)
    with pytest.raises(InvalidParameters, match="exclude each other"):
        plan(
            domain,
            AteStrictParams(epsilon=1.0, delta=1e-6, adaptive_clip=True, pseudo_outcome_clip=5.0),
        )
    declared = plan(domain, AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear"))
    adaptive = plan(
        domain, AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear", adaptive_clip=True)
    )
    assert (adaptive.epsilon, adaptive.delta) == (declared.epsilon, declared.delta) == (1.0, 1e-6)
    estimation = [e for e in adaptive.events if e.module == "estimation"]
    assert [e.type for e in estimation] == ["exponential_quantile", "gaussian", "gaussian"]
    assert math.fsum(e.epsilon for e in estimation) == 1.0  # Theorem 6: the fold's own total
    assert estimation[0].epsilon == pytest.approx(ate_strict.ADAPTIVE_CLIP_SHARE)


def test_adaptive_clip_narrows_the_interval_on_a_wide_declared_range() -> None:
    """Honest bounds 40 sd wide: the declared-bound release is several times wider."""
    n = 20_000
    domain = make_domain(n=n, y_lower=-20.0, y_upper=20.0)
    arrays = synthetic(n, 2, np.random.default_rng(21))
    common: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-6, "nuisance": "dp_linear"}
    declared, _ = _run(arrays, domain, AteStrictParams(**common), seed=3)
    adaptive, _ = _run(arrays, domain, AteStrictParams(**common, adaptive_clip=True), seed=3)
    assert adaptive["clip"] == "adaptive"
    assert declared["clip"] == "declared"
    assert declared["bound"] == adaptive["bound_max"] == 40.0 / 0.1
    assert adaptive["bound"] < adaptive["bound_max"] / 10
    assert adaptive["half_width"] < declared["half_width"] / 3
    # observational: the DP nuisances' shrinkage leaves a bias of ~0.06 here (issue 12 notes)
    assert abs(adaptive["estimate"] - TRUE_ATE) < 0.15


def test_adaptive_clip_covers_in_a_randomised_trial() -> None:
    """With the public assignment probability the AIPW term is unbiased for any outcome model,
    so the narrow interval must cover: 20 releases, at most 3 misses (P < 0.02 at 0.95)."""
    n = 4000
    domain = make_domain(n=n, y_lower=-20.0, y_upper=20.0, design=StudyDesign.RCT, p=0.5)
    params = AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear", adaptive_clip=True)
    misses, widths = 0, []
    for rep in range(20):
        arrays = synthetic(n, 2, np.random.default_rng(100 + rep), rct_p=0.5)
        result, _ = _run(arrays, domain, params, seed=200 + rep)
        misses += not result["ci_lower"] < TRUE_ATE < result["ci_upper"]
        widths.append(result["half_width"])
    assert misses <= 3
    declared, _ = _run(arrays, domain, replace(params, adaptive_clip=False), seed=1)
    assert max(widths) < declared["half_width"] / 3


def test_adaptive_quote_states_its_scale_assumption_and_solves_for_a_target() -> None:
    domain = make_domain(n=20_000, y_lower=-20.0, y_upper=20.0)
    params = AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear", adaptive_clip=True)
    out = quote(domain, params, target_half_width=0.4)
    assert out["half_width_basis"] == "assumed_scale"
    assert out["assumed_pseudo_outcome_sd"] == 40.0 / ate_strict.ADAPTIVE_QUOTE_RANGE_RATIO
    assert out["min_half_width"] < out["expected_half_width"] < out["max_noise_half_width"]
    sampling = 1.959963984540054 * out["assumed_pseudo_outcome_sd"] / math.sqrt(out["n2"])
    assert out["expected_half_width"] > sampling
    epsilon = out["epsilon_for_target_half_width"]
    assert epsilon is not None
    at_target = quote(domain, replace(params, epsilon=epsilon))
    assert at_target["expected_half_width"] <= 0.4 * (1 + 1e-9)
    below = quote(domain, replace(params, epsilon=epsilon * 0.9))
    assert below["expected_half_width"] > 0.4
    # no epsilon beats the sampling error the quote assumes
    assert (
        quote(domain, params, target_half_width=sampling * 0.9)["epsilon_for_target_half_width"]
        is None
    )


def test_quantile_law_matches_opendp_draws() -> None:
    """The quote's law of the DP quantile is OpenDP's: 3,000 draws of make_private_quantile
    on a fixed vector fall on each candidate as often as ``quantile_law`` says (a softmax with
    the exponential mechanism's factor 2, or a law off by a factor in the scale, is 0.07 away
    in total variation; the sampling error of the frequencies is about 0.02)."""
    from service.mechanisms.ate_strict.quote import quantile_law
    from service.mechanisms.noise import OpenDPSampler

    values = np.abs(np.random.default_rng(0).normal(size=500))
    candidates = np.array([0.5, 1.0, 1.3, 1.645, 2.0, 3.0])
    below = np.array([(values < c).mean() for c in candidates])
    law = quantile_law(below, 0.9, values.size, 0.05)
    sampler = OpenDPSampler()
    draws = [
        sampler.quantile(values, candidates=candidates, level=0.9, epsilon=0.05)
        for _ in range(3000)
    ]
    frequencies = np.array([np.mean(np.isclose(draws, c)) for c in candidates])
    assert 0.5 * np.abs(frequencies - law).sum() < 0.035
    softmax = np.exp(-0.05 * np.abs(below * 500 - 450) / 2.0)
    assert 0.5 * np.abs(softmax / softmax.sum() - law).sum() > 0.06


def test_adaptive_quote_averages_the_width_over_the_quantile_noise() -> None:
    """At small n * epsilon the DP quantile often lands far above the assumed scale, so the
    expected half-width exceeds the one at the noise-free clip; at large n * epsilon the law
    concentrates and the two agree."""
    from service.mechanisms.ate_strict.quote import assumed_clip, expected_adaptive_half_width

    def widths(n: int, epsilon: float) -> tuple[float, float]:
        domain = make_domain(n=n, y_lower=-20.0, y_upper=20.0, design=StudyDesign.RCT, p=0.5)
        params = AteStrictParams(
            epsilon=epsilon, delta=1e-6, nuisance="dp_linear", adaptive_clip=True
        )
        state = ate_strict.make_plan(domain, params)
        z = 1.959963984540054
        clip = assumed_clip(domain, state)
        sigma = ate_strict.adaptive_calibrations(state, clip)[0].sigma
        sd = ate_strict.assumed_pseudo_outcome_sd(domain)
        at_clip = z * math.sqrt(sd * sd / state.n2 + sigma * sigma)
        return expected_adaptive_half_width(domain, state, z)["half_width"], at_clip

    expected, at_clip = widths(1000, 0.5)
    assert expected > 1.2 * at_clip
    expected, at_clip = widths(200_000, 4.0)
    assert expected == pytest.approx(at_clip, rel=0.05)


def test_kind_default_clip_is_adaptive_on_rct_and_declared_otherwise() -> None:
    rct = make_domain(n=4000, design=StudyDesign.RCT, p=0.5)
    observational = make_domain(n=4000)
    aipw = "aipw"  # a trial's omitted estimator is the difference in means at this n eps
    assert to_mechanism_params(AteParams(epsilon=1.0, estimator=aipw), rct).adaptive_clip is True
    # the single release (chunks = 1; left out, the chunks rule releases in chunks at this n eps)
    single = AteParams(epsilon=1.0, chunks=1)
    assert to_mechanism_params(single, observational).adaptive_clip is False
    assert (
        to_mechanism_params(AteParams(epsilon=1.0, clip="adaptive"), observational).adaptive_clip
        is True
    )
    assert (
        to_mechanism_params(
            AteParams(epsilon=1.0, estimator=aipw, pseudo_outcome_clip=3.0), rct
        ).adaptive_clip
        is False
    )
    with pytest.raises(pydantic.ValidationError):
        AteParams(epsilon=1.0, estimator="ipw", clip="adaptive")


def test_kind_default_nuisance_is_dp_linear_on_rct_and_by_n_epsilon_otherwise() -> None:
    rct = make_domain(n=4000, design=StudyDesign.RCT, p=0.5)
    observational = make_domain(n=4000, q=36)
    assert to_mechanism_params(AteParams(epsilon=1.0, estimator="aipw"), rct).nuisance == (
        "dp_linear"
    )
    # observational, 36 covariates: dp_linear below n epsilon = 2 * 10^4, DP-EBM from there (the
    # single release's rule: chunks = 1, as the chunks rule would cut these requests in chunks)
    assert (
        to_mechanism_params(AteParams(chunks=1, epsilon=4.5), observational).nuisance == "dp_linear"
    )
    assert to_mechanism_params(AteParams(chunks=1, epsilon=5.0), observational).nuisance == "dp_ebm"
    # at most 12 covariates seen (q, the declared set or the request's columns): from 10^4
    few = make_domain(n=4000, q=2)
    assert to_mechanism_params(AteParams(chunks=1, epsilon=2.4), few).nuisance == "dp_linear"
    assert to_mechanism_params(AteParams(chunks=1, epsilon=2.5), few).nuisance == "dp_ebm"
    declared = replace(observational, adjustment_set=tuple(range(12)))
    assert to_mechanism_params(AteParams(chunks=1, epsilon=2.5), declared).nuisance == "dp_ebm"
    assert to_mechanism_params(AteParams(chunks=1, epsilon=2.4), declared).nuisance == "dp_linear"
    named = AteParams(chunks=1, epsilon=2.5, adjustment_columns=list(range(12)))
    assert to_mechanism_params(named, observational).nuisance == "dp_ebm"
    assert (
        to_mechanism_params(AteParams(chunks=1, epsilon=2.5), observational).nuisance == "dp_linear"
    )
    # 24 covariates: halfway, n epsilon 15000
    half = AteParams(chunks=1, epsilon=3.75, adjustment_columns=list(range(24)))
    assert to_mechanism_params(half, observational).nuisance == "dp_ebm"
    below = AteParams(chunks=1, epsilon=3.7, adjustment_columns=list(range(24)))
    assert to_mechanism_params(below, observational).nuisance == "dp_linear"
    assert to_mechanism_params(AteParams(chunks=1, epsilon=20.0), rct).nuisance == "dp_linear"
    # a preset-only option names its preset
    binned = AteParams(chunks=1, epsilon=1.0, quantile_bins=True)
    assert to_mechanism_params(binned, observational).nuisance == "dp_ebm"
    crossed = AteParams(chunks=1, epsilon=4.0, cross_fit=True)
    assert to_mechanism_params(crossed, observational).nuisance == "dp_linear"
    explicit = AteParams(chunks=1, epsilon=1.0, nuisance="dp_ebm")
    assert to_mechanism_params(explicit, rct).nuisance == "dp_ebm"
    # the cross-fit rule is observational only: a trial keeps its (outcome, estimation) halves
    trial = AteParams(chunks=1, epsilon=2.0, estimator="aipw")
    assert to_mechanism_params(trial, rct).cross_fit is False


def test_the_linear_nuisance_threshold_by_the_number_of_columns() -> None:
    threshold = ate_strict.linear_nuisance_threshold
    assert threshold(1) == threshold(12) == 10_000.0
    assert threshold(24) == pytest.approx(15_000.0)
    assert threshold(36) == threshold(500) == 20_000.0
    values = [threshold(p) for p in range(1, 60)]
    assert values == sorted(values)  # never falls as the models see more covariates


@pytest.mark.parametrize("design", [StudyDesign.OBSERVATIONAL, StudyDesign.RCT])
@pytest.mark.parametrize(("n", "epsilon"), [(1000, 0.5), (5000, 1.0), (20000, 4.0)])
def test_default_params_are_what_an_epsilon_only_ate_request_runs(
    design: StudyDesign, n: int, epsilon: float
) -> None:
    """``ate_strict.default_params`` (the CATE kinds' whole-data anchor) is exactly the
    ``ate`` kind's single-release aipw default (``chunks: 1``): same nuisance, cross-fitting,
    clip and delta rules (the estimator named: a trial's omitted one is the difference in means
    below n eps 5 * 10^4)."""
    domain = PublicDomain(
        x_lower=np.zeros(3),
        x_upper=np.ones(3),
        y_lower=0.0,
        y_upper=10.0,
        n=n,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )
    single = AteParams(epsilon=epsilon, estimator="aipw", chunks=1)
    assert to_mechanism_params(single, domain) == ate_strict.default_params(domain, epsilon)
    explicit = AteParams(epsilon=epsilon, delta=1e-7, chunks=1)
    assert to_mechanism_params(explicit, domain) == ate_strict.default_params(domain, epsilon, 1e-7)
    # left out, chunks follows its rule: in chunks on an observational dataset in its range
    omitted = to_mechanism_params(AteParams(epsilon=epsilon, estimator="aipw"), domain)
    if aggregate.default_chunks(domain, epsilon) is None:
        assert omitted == ate_strict.default_params(domain, epsilon)
    else:
        assert isinstance(omitted, aggregate.AggregateParams)


def test_dp_ebm_default_folds_rule() -> None:
    """DP-EBM (observational): (0.1, 0.4, 0.5) from n eps = 2 * 10^4, the propensity fold
    raised to 100 records from the outcome fold, the spec's (0.25, 0.25, 0.5) below the switch,
    where the raised folds do not fit, and without epsilon (cate_function's call)."""
    domain = make_domain(n=10_000)
    below = plan(domain, AteStrictParams(epsilon=1.99, delta=1e-6))
    assert below.fold_sizes == {"propensity": 2500, "outcome": 2500, "estimation": 5000}
    at = plan(domain, AteStrictParams(epsilon=2.0, delta=1e-6))
    assert at.fold_sizes == {"propensity": 1000, "outcome": 4000, "estimation": 5000}
    # the switch moves neither the estimation fold nor the noise-only quote
    assert ate_strict.quote(domain, AteStrictParams(epsilon=1.99, delta=1e-6))["n2"] == 5000
    small = plan(make_domain(n=800), AteStrictParams(epsilon=50.0, delta=1e-6))
    assert small.fold_sizes == {"propensity": 100, "outcome": 299, "estimation": 401}
    tiny = plan(make_domain(n=400), AteStrictParams(epsilon=60.0, delta=1e-6))
    assert tiny.fold_sizes == {"propensity": 100, "outcome": 100, "estimation": 200}
    assert ate_strict.dp_ebm_outcome_folds(400) is None
    assert ate_strict.default_fold_fractions(domain, "dp_ebm") == (0.25, 0.25, 0.5)
    linear = plan(domain, AteStrictParams(epsilon=2.0, delta=1e-6, nuisance="dp_linear"))
    assert linear.fold_sizes == {"propensity": 2500, "outcome": 2500, "estimation": 5000}


def test_dp_ebm_learning_rate_rule_reaches_the_record_and_the_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """interpret's 0.01 below n eps = 10^5, (0.04, 0.02) from it; with the outcome model's
    range measured the regressor's 0.02 from n eps = 2 * 10^4: in the record's nuisance events
    and in the fits the run makes (classifier, regressor)."""
    rule = ate_strict.dp_ebm_learning_rates
    threshold = ate_strict.DP_EBM_FAST_LEARNING_MIN_N_EPSILON
    measured = ate_strict.MEASURED_RANGE_FAST_REGRESSOR_MIN_N_EPSILON
    assert rule(10_000, 0.999 * threshold / 10_000) == (0.01, 0.01)
    assert rule(10_000, threshold / 10_000) == ate_strict.DP_EBM_FAST_LEARNING_RATES == (0.04, 0.02)
    assert rule(10_000, threshold / 10_000, True) == (0.04, 0.02)
    assert rule(10_000, 0.999 * threshold / 10_000, True) == (0.01, 0.02)
    assert rule(10_000, measured / 10_000, True) == (0.01, 0.02)
    assert rule(10_000, 0.999 * measured / 10_000, True) == (0.01, 0.01)

    def rates(state: Any) -> list[Any]:
        return [
            event.params.get("learning_rate")
            for event in state.record.events
            if event.type == "gdp_module" or "learning_rate" in event.params
        ]

    declared = AteStrictParams(epsilon=9.9, delta=1e-6, outcome_range=False)
    slow = ate_strict.make_plan(make_domain(n=10_000), declared)
    fast = ate_strict.make_plan(make_domain(n=10_000), AteStrictParams(epsilon=10.0, delta=1e-6))
    middle = ate_strict.make_plan(make_domain(n=10_000), AteStrictParams(epsilon=9.9, delta=1e-6))
    assert (slow.learning_rates, fast.learning_rates) == ((0.01, 0.01), (0.04, 0.02))
    assert middle.learning_rates == (0.01, 0.02)
    assert rates(slow)[:2] == [0.01, 0.01]
    assert rates(fast)[:2] == [0.04, 0.02]
    assert rates(middle)[:2] == [0.01, 0.02]
    # dp_linear has no learning rate in its record
    linear = ate_strict.make_plan(
        make_domain(n=10_000), AteStrictParams(epsilon=10.0, delta=1e-6, nuisance="dp_linear")
    )
    assert not any(rate is not None for rate in rates(linear))

    from service.mechanisms.ate_strict import estimation

    seen: dict[str, float] = {}
    propensity, outcome = estimation.propensity_scores, estimation.outcome_predictions

    def spy(name: str, function: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen[name] = kwargs["learning_rate"]
            return function(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(estimation, "propensity_scores", spy("propensity", propensity))
    monkeypatch.setattr(estimation, "outcome_predictions", spy("outcome", outcome))
    n = 2000
    domain = make_domain(n=n, y_lower=-4.0, y_upper=4.0)
    arrays = synthetic(n, 2, np.random.default_rng(5))
    _run(arrays, domain, AteStrictParams(epsilon=50.0, delta=1e-6), seed=6)
    assert seen == {"propensity": 0.04, "outcome": 0.02}
    _run(arrays, domain, AteStrictParams(epsilon=4.0, delta=1e-6), seed=6)
    assert seen == {"propensity": 0.01, "outcome": 0.01}
    _run(arrays, domain, AteStrictParams(epsilon=10.0, delta=1e-6), seed=6)
    assert seen == {"propensity": 0.01, "outcome": 0.02}


def test_fitted_noise_check_reads_the_learning_rate() -> None:
    """A fit at learning rate 0.04 passes the check at 0.04 and fails it at 0.08 (noise below
    the planned calibration for that rate): the check sees the rate the fit used."""
    from service.mechanisms import dp_ebm

    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(400, 3))
    a = (rng.uniform(size=400) < 0.5).astype(np.float64)
    accounting = dp_ebm.dp_ebm_accounting(1.0, 1e-6)
    lower, upper = -np.ones(3), np.ones(3)
    model = dp_ebm.fit_classifier(x, a, lower, upper, accounting, max_rounds=20, learning_rate=0.04)
    assert model.learning_rate == 0.04
    dp_ebm.check_fitted_noise(model, accounting, 3, 1.0, max_rounds=20, learning_rate=0.04)
    with pytest.raises(dp_ebm.PrivacyConfigurationError):
        dp_ebm.check_fitted_noise(model, accounting, 3, 1.0, max_rounds=20, learning_rate=0.08)


@pytest.mark.parametrize(("n", "epsilon"), [(2_000, 0.5), (40_000, 2.0)])
def test_expected_half_width_matches_releases_at_the_assumed_scale(n: int, epsilon: float) -> None:
    """With the declared clip, on data at the quote's assumption for nuisance "none" (a trial at
    p = 1/2 without an outcome model, so Gamma = +-2 (Y - midpoint), and a skewed Y near the
    lower bound with rms(Y - midpoint) = R / 3, so a pseudo-outcome sd of 2 R / 3) the realised
    half-widths average to the quote within 10 %; where the sampling error dominates (n 40000,
    eps 2) the noise-only figure is far short of it."""
    domain = make_domain(n=n, y_lower=-2.0, y_upper=2.0, design=StudyDesign.RCT, p=0.5)
    params = AteStrictParams(epsilon=epsilon, delta=1e-6, nuisance="none")
    preview = quote(domain, params)
    assert preview["half_width_basis"] == "assumed_scale"
    assert preview["assumed_pseudo_outcome_sd"] == pytest.approx(2.0 * 4.0 / 3.0)
    rng = np.random.default_rng(17)
    widths = []
    for rep in range(30):
        x = rng.uniform(-1.0, 1.0, size=(n, 2))
        a = (rng.uniform(size=n) < 0.5).astype(np.float64)
        # rms(Y - 0) = sqrt(1.25^2 + 0.46^2) = 1.33 = R / 3
        y = np.clip(-1.25 + rng.gamma(4.0, 0.23, n) - 0.92, -2.0, 2.0)
        result, _ = _run(Arrays(x=x, a=a, y=y), domain, params, seed=300 + rep)
        widths.append(result["half_width"])
    assert np.mean(widths) == pytest.approx(preview["expected_half_width"], rel=0.10)
    if n == 40_000:
        assert np.mean(widths) > 2.0 * preview["min_half_width"]
