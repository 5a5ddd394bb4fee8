"""RCT difference in means (ADUM p = 1, adum.md §7): scales, validation, CI, seeded runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.special import ndtri

from service.mechanisms import ate_rct
from service.mechanisms.ate_rct import AteRctParams, arm_statistics, delta_method_ci, plan
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import SeededSampler
from service.mechanisms.records import Composition, Guarantee

FORBIDDEN_KEYS = {"counts", "sums", "squares", "n_treated", "n_control", "variance_hat"}


def rct_domain(n: int = 2000, *, y_lower: float = -1.0, y_upper: float = 3.0) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(1),
        x_upper=np.ones(1),
        y_lower=y_lower,
        y_upper=y_upper,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def rct_data(n: int, rng: np.random.Generator, *, tau: float = 1.0) -> Arrays:
    x = rng.uniform(size=(n, 1))
    a = (rng.uniform(size=n) < 0.5).astype(np.float64)
    y = np.clip(x[:, 0] + tau * a + rng.uniform(-1, 1, n), -1.0, 3.0)
    return Arrays(x=x, a=a, y=y)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 3.0])
def test_replace_one_scales_match_adum(epsilon: float) -> None:
    domain = rct_domain()
    d_y = domain.outcome_range / 2
    record = plan(domain, AteRctParams(epsilon=epsilon))
    counts, sums, squares = record.events
    # adum.md §7, general Y: Lap(6 / eps), Lap(6 D_y / eps), Lap(6 D_y^2 / eps)
    for event, expected in (
        (counts, 6 / epsilon),
        (sums, 6 * d_y / epsilon),
        (squares, 6 * d_y**2 / epsilon),
    ):
        nominal = float(event.params["sensitivity_l1_nominal"]) / event.epsilon
        assert nominal == pytest.approx(expected, rel=1e-12)
        assert float(event.params["scale"]) == pytest.approx(expected, rel=1e-7)
        assert float(event.params["scale"]) >= float(event.params["sensitivity_l1"]) / event.epsilon
    assert math.fsum(e.epsilon for e in record.events) <= epsilon
    assert math.fsum(e.epsilon for e in record.events) == pytest.approx(epsilon, rel=1e-15)
    assert record.delta == 0.0
    assert record.guarantee == Guarantee.STRICT
    assert record.composition == Composition.SEQUENTIAL
    # binary-Y option: eps / 2 each, Lap(4 / eps), Lap(4 D_y / eps)
    bound = plan(domain, AteRctParams(epsilon=epsilon, variance="public_bound"))
    assert len(bound.events) == 2
    assert float(bound.events[0].params["scale"]) == pytest.approx(4 / epsilon, rel=1e-7)
    assert float(bound.events[1].params["scale"]) == pytest.approx(4 * d_y / epsilon, rel=1e-7)


def test_budget_split_adds_up_for_many_epsilons() -> None:
    for epsilon in np.linspace(0.01, 100, 997):
        record = plan(rct_domain(), AteRctParams(epsilon=float(epsilon)))
        assert math.fsum(e.epsilon for e in record.events) <= float(epsilon)


def test_non_rct_designs_are_refused() -> None:
    domain = PublicDomain(x_lower=np.zeros(1), x_upper=np.ones(1), y_lower=0.0, y_upper=1.0, n=1000)
    with pytest.raises(InvalidParameters, match="only valid for datasets with design 'rct'"):
        plan(domain, AteRctParams(epsilon=1.0))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (AteRctParams(epsilon=0.0), "epsilon"),
        (AteRctParams(epsilon=math.nan), "epsilon"),
        (AteRctParams(epsilon=1.0, alpha=1.5), "alpha"),
        (AteRctParams(epsilon=1.0, variance="other"), "variance"),  # type: ignore[arg-type]
    ],
)
def test_invalid_parameters(params: AteRctParams, message: str) -> None:
    with pytest.raises(InvalidParameters, match=message):
        plan(rct_domain(), params)


def test_arm_statistics_replace_one_sensitivities() -> None:
    rng = np.random.default_rng(0)
    domain = rct_domain(200)
    midpoint, d_y = 1.0, 2.0
    worst = np.zeros(3)
    for _ in range(50):
        data = rct_data(200, rng)
        base = arm_statistics(data.a, data.y, midpoint=midpoint, half_range=d_y)
        for a_new in (0.0, 1.0):
            for y_new in (domain.y_lower, domain.y_upper, midpoint):
                a2, y2 = data.a.copy(), data.y.copy()
                a2[0], y2[0] = a_new, y_new
                moved = arm_statistics(a2, y2, midpoint=midpoint, half_range=d_y)
                change = np.abs(moved - base)
                worst = np.maximum(worst, [change[0:2].sum(), change[2:4].sum(), change[4:6].sum()])
    assert worst[0] <= 2.0
    assert worst[1] <= 2 * d_y * (1 + 1e-12)
    assert worst[2] <= 2 * d_y**2 * (1 + 1e-12)
    assert worst[1] > 1.5 * d_y  # the extremes are reached


def test_delta_method_ci_closed_form() -> None:
    counts = np.array([400.0, 600.0])
    sums = np.array([-40.0, 120.0])  # centred means -0.1 and 0.2
    squares = np.array([160.0, 300.0])  # Q/C = 0.4 and 0.5
    out = delta_method_ci(
        counts, sums, squares, count_scale=6.0, sum_scale=12.0, half_range=2.0, alpha=0.05
    )
    v0 = (0.4 - 0.01) / 400 + (2 * 144 + 0.01 * 2 * 36) / 400**2
    v1 = (0.5 - 0.04) / 600 + (2 * 144 + 0.04 * 2 * 36) / 600**2
    assert out["estimate"] == pytest.approx(0.3, rel=1e-12)
    assert out["half_width"] == pytest.approx(1.959963984540054 * math.sqrt(v0 + v1), rel=1e-12)
    # non-positive noisy counts are floored at 1; means and variances clipped
    floored = delta_method_ci(
        np.array([-3.0, 0.2]),
        np.array([50.0, -50.0]),
        np.array([-1.0, 1e6]),
        count_scale=6.0,
        sum_scale=12.0,
        half_range=2.0,
        alpha=0.05,
    )
    assert floored["estimate"] == pytest.approx(-4.0)
    assert math.isfinite(floored["half_width"])


def test_laplace_normal_approximation_undercoverage_constant() -> None:
    """adum.md §7: a dominant Laplace term covers 1 - exp(-sqrt(2) z): 93.75 % at 95 %."""
    z = float(ndtri(0.975))
    assert 1 - math.exp(-math.sqrt(2) * z) == pytest.approx(0.9375, abs=5e-5)
    z99 = float(ndtri(0.995))
    assert 1 - math.exp(-math.sqrt(2) * z99) == pytest.approx(0.974, abs=5e-4)


def test_seeded_runs_are_near_the_truth_and_release_only_allowed_keys() -> None:
    domain = rct_domain(5000)
    hits = 0
    for seed in range(20):
        result = ate_rct.run(
            rct_data(5000, np.random.default_rng(seed)),
            domain,
            AteRctParams(epsilon=1.0),
            rng=np.random.default_rng(0),
            noise=SeededSampler(np.random.default_rng(100 + seed)),
            progress=lambda fraction, stage: None,
        )
        hits += result["ci_lower"] <= 1.0 <= result["ci_upper"]
        assert abs(result["estimate"] - 1.0) < 0.3
        assert not FORBIDDEN_KEYS & set(result)
        json.dumps(result)
    assert result["guarantee"] == "strict"
    assert result["estimator"] == "rct_difference"
    assert result["delta"] == 0.0
    assert hits >= 17


def test_quote_both_ways() -> None:
    domain = rct_domain(3000)
    params = AteRctParams(epsilon=1.0)
    preview = ate_rct.quote(domain, params, target_half_width=0.05)
    # the privacy noise plus the sampling error at the assumed outcome sd (R / 12), as the aipw
    # quote (a walkthrough's trial: noise only quoted a third of the realised half-width)
    assert preview["half_width_basis"] == "assumed_scale"
    assert preview["assumed_outcome_sd"] == pytest.approx(domain.outcome_range / 12)
    assert preview["expected_half_width_full"] > preview["expected_half_width"]
    assert preview["expected_half_width"] > preview["min_half_width"]
    z = 1.959963984540054
    sampling = z * domain.outcome_range / 12 * math.sqrt(1 / 1500 + 1 / 1500)
    assert preview["expected_half_width"] ** 2 == pytest.approx(
        preview["min_half_width"] ** 2 + sampling**2
    )
    eps = preview["epsilon_for_target_half_width"]
    assert ate_rct.quote(domain, AteRctParams(epsilon=eps))["expected_half_width"] <= 0.05
    assert ate_rct.quote(domain, AteRctParams(epsilon=eps * 0.99))["expected_half_width"] > 0.05
    assert (
        ate_rct.quote(domain, params, target_half_width=1e-9)["epsilon_for_target_half_width"]
        is None
    )


def test_failures_after_data_access_are_generic() -> None:
    domain = rct_domain(100)
    bad = Arrays(x=np.zeros((99, 1)), a=np.zeros(99), y=np.zeros(99))
    with pytest.raises(ReleaseFailed) as info:
        ate_rct.run(
            bad,
            domain,
            AteRctParams(epsilon=1.0),
            rng=np.random.default_rng(0),
            noise=SeededSampler(np.random.default_rng(0)),
            progress=lambda f, s: None,
        )
    assert str(info.value) == "release failed"
    assert info.value.__cause__ is None
