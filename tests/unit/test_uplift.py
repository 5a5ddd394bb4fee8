"""uplift_table (epsilon-ADUM): scales, sensitivities, guards, the p heuristic, seeded runs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from service.mechanisms import uplift as up
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import OpenDPSampler, SeededSampler
from service.mechanisms.records import Composition, Guarantee
from service.mechanisms.uplift.estimation import _deviation_traces


def domain(n: int = 20000, *, q: int = 1, rct: bool = True) -> PublicDomain:
    return PublicDomain(
        x_lower=np.full(q, -1.0),
        x_upper=np.full(q, 1.0),
        y_lower=-5.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.RCT if rct else StudyDesign.OBSERVATIONAL,
        treatment_probability=0.5 if rct else None,
    )


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 5.0])
def test_replace_one_scales(epsilon: float) -> None:
    """adum.md §3.2: Lap(4 / eps) counts and Lap(4 D_y / eps) sums, D_y = W / 2 (+ lattice)."""
    record = up.plan(domain(), up.UpliftParams(epsilon=epsilon, bins=(10,), shrinkage="none"))
    counts, sums = record.events
    assert float(counts.params["scale"]) == pytest.approx(4.0 / epsilon, rel=1e-7)
    assert float(sums.params["scale"]) == pytest.approx(4.0 * 5.0 / epsilon, rel=1e-7)
    assert counts.params["dim"] == 20
    assert record.guarantee == Guarantee.STRICT
    assert record.composition == Composition.CELLS
    assert record.epsilon == pytest.approx(epsilon)
    assert record.delta == 0.0


def test_cell_index_row_major() -> None:
    lower, upper = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    points = np.array([[0.0, 0.0], [0.99, 0.0], [0.0, 0.99], [1.0, 1.0], [0.5, 0.25], [2.0, -1.0]])
    np.testing.assert_array_equal(up.cell_index(points, lower, upper, (2, 4)), [0, 4, 3, 7, 5, 4])


def test_replace_one_sensitivity_of_the_aggregates() -> None:
    rng = np.random.default_rng(0)
    dom = domain(300, q=2)
    x = rng.uniform(-1, 1, (300, 2))
    a = (rng.uniform(size=300) < 0.5).astype(float)
    y = rng.uniform(-5, 5, 300)
    counts, sums = up.aggregates(x, a, y, dom, (3, 2))
    worst_c = worst_s = 0.0
    for xv in ([-1, -1], [1, 1], [0.1, -0.5]):
        for av in (0.0, 1.0):
            for yv in (-5.0, 5.0, 0.0):
                for row in (0, 1, 2):
                    x2, a2, y2 = x.copy(), a.copy(), y.copy()
                    x2[row], a2[row], y2[row] = xv, av, yv
                    c2, s2 = up.aggregates(x2, a2, y2, dom, (3, 2))
                    worst_c = max(worst_c, float(np.abs(c2 - counts).sum()))
                    worst_s = max(worst_s, float(np.abs(s2 - sums).sum()))
    assert worst_c == 2.0
    assert worst_s <= up.sum_sensitivity(10.0, 300)


def test_guards_floor_counts_and_clip_means() -> None:
    dom = domain()
    params = up.UpliftParams(epsilon=1.0, bins=(2,))
    out = up.table(
        np.array([-3.0, 0.5, 100.0, 100.0]),
        np.array([50.0, -50.0, 100.0, -100.0]),
        dom,
        params,
        count_scale=4.0,
        sum_scale=20.0,
    )
    assert out["mean_control"] == [5.0, 1.0]  # 50 / max(-3, 1) clipped to y_hi
    assert out["mean_treated"] == [-5.0, -1.0]
    assert out["uplift"] == [-10.0, -2.0]
    assert out["low_count"] == [True, False]


def test_observational_needs_an_adjustment_partition() -> None:
    # the refusal names every way out (an analyst followed the guide's example into it)
    with pytest.raises(InvalidParameters, match="adjustment_partition=true.*effect_columns"):
        up.plan(domain(rct=False), up.UpliftParams(epsilon=1.0, bins=(4,)))
    up.plan(domain(rct=False), up.UpliftParams(epsilon=1.0, bins=(4,), adjustment_partition=True))


@pytest.mark.parametrize(
    "params",
    [
        up.UpliftParams(epsilon=1.0, bins=(4, 4)),
        up.UpliftParams(epsilon=1.0, bins=(0,)),
        up.UpliftParams(epsilon=1.0, bins=(up.MAX_CELLS + 1,)),
        up.UpliftParams(epsilon=1.0, bins=(4,), min_count=0.5),
        # above the public n no cell can reach it (1e300 overflowed the quote)
        up.UpliftParams(epsilon=1.0, bins=(4,), min_count=1e300),
        up.UpliftParams(epsilon=1.0, bins=(4,), adjustment_partition=True, min_count=1e300),
        up.UpliftParams(epsilon=0.0, bins=(4,)),
    ],
)
def test_invalid_parameters(params: up.UpliftParams) -> None:
    with pytest.raises(InvalidParameters):
        up.plan(domain(), params)


def test_partition_heuristic_grows_with_epsilon_and_n() -> None:
    small = up.suggested_bins(domain(), 0.1)["suggested_cells"]
    large = up.suggested_bins(domain(), 5.0)["suggested_cells"]
    bigger_n = up.suggested_bins(domain(200000), 5.0)["suggested_cells"]
    assert small <= large <= bigger_n
    quote = up.quote(domain(), up.UpliftParams(epsilon=1.0, bins=(10,)))
    assert quote["suggested_bins"]
    assert quote["approx_uplift_sd_per_cell"] > 0


@pytest.mark.parametrize(
    ("codes", "cap"),
    [((0, 1), 2), ((0, 1, 2, 3), 4), ((0, 2, 4), 3), ((0, 1, 5), 5), ((3, 7), 2)],
)
def test_partition_heuristic_caps_categorical_covariates(codes: tuple[int, ...], cap: int) -> None:
    """A categorical covariate gets at most the fewest regular bins that give each declared
    code a cell of its own; numeric covariates are unaffected."""
    base = domain(200000, q=2)
    lower = np.array([-1.0, float(min(codes))])
    upper = np.array([1.0, float(max(codes))])
    categorical = replace(base, x_lower=lower, x_upper=upper, x_codes=(None, codes))
    numeric = replace(base, x_lower=lower, x_upper=upper)
    with_codes = up.suggested_bins(categorical, 50.0)["suggested_bins"]
    without = up.suggested_bins(numeric, 50.0)["suggested_bins"]
    assert without[1] > cap  # the test is in the regime where the cap binds
    assert with_codes[1] == cap
    cells = up.cell_index(
        np.column_stack([np.zeros(len(codes)), codes]), lower, upper, tuple(with_codes)
    )
    assert np.unique(cells).size == len(codes)  # every code in its own cell


@pytest.mark.parametrize(("lipschitz", "noise_sd"), [(2.0, 0.1), (2.0, 1.0), (10.0, 2.5)])
def test_partition_heuristic_matches_its_closed_forms(lipschitz: float, noise_sd: float) -> None:
    """Without DP noise (huge epsilon) the rule's argmin is the bias-variance balance
    m^3 = L^2 n pi (1 - pi) / (6 s^2); with the sampling variance negligible (s -> 0) it is
    the bias-DP balance m^4 = L^2 / (24 c), c = 2 (b_s^2 + D_y^2 b_c^2) (2 / n)^2 per arm."""
    n = 10000
    rule = up.suggested_bins(domain(n), 1e6, lipschitz=lipschitz, noise_sd=noise_sd)
    m = rule["suggested_cells"]
    expected = (lipschitz**2 * n * 0.25 / (6 * noise_sd**2)) ** (1 / 3)
    assert abs(m - expected) <= 1.0
    epsilon, width = 1.0, 10.0
    c = 2 * ((width / 0.5) ** 2 + (width / 2) ** 2 * (2 / 0.5) ** 2) * (2 / n) ** 2
    m_dp = up.suggested_bins(domain(n), epsilon, lipschitz=lipschitz, noise_sd=1e-9)
    assert abs(m_dp["suggested_cells"] - (lipschitz**2 / (24 * c)) ** 0.25) <= 1.0


def _sin_data(n: int, seed: int) -> Arrays:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 1))
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(a * np.sin(x[:, 0]) + rng.normal(0, 0.1, n), -5, 5)
    return Arrays(x, a, y)


def test_seeded_run_near_the_truth_and_lookup() -> None:
    dom = domain()
    params = up.UpliftParams(epsilon=50.0, bins=(20,))
    result = up.run(
        _sin_data(20000, 0),
        dom,
        params,
        noise=SeededSampler(np.random.default_rng(1)),
        progress=lambda f, s: None,
    )
    centres = np.linspace(-1, 1, 41)[1::2]
    np.testing.assert_allclose(result["uplift"], np.sin(centres), atol=0.08)
    points = np.array([[-0.97], [0.0], [0.51]])
    np.testing.assert_array_equal(
        up.predict(result, points), np.asarray(result["uplift"])[[0, 10, 15]]
    )


def test_opendp_laplace_variance_matches_the_scale() -> None:
    """A4: the production sampler's noise on the counts has variance 2 b^2 (b = 4 / eps).

    With 2 x 10000 draws the sample variance is within 10% of 2 b^2 except with probability
    below 1e-6 (the Laplace fourth moment is 24 b^4: relative sd of the variance 0.017).
    """
    dom = domain(20000, q=2)
    rng = np.random.default_rng(0)
    data = Arrays(rng.uniform(-1, 1, (20000, 2)), np.zeros(20000), np.zeros(20000))
    params = up.UpliftParams(epsilon=2.0, bins=(100, 100), shrinkage="none")
    result = up.run(data, dom, params, noise=OpenDPSampler(), progress=lambda f, s: None)
    counts, _ = up.aggregates(data.x, data.a, data.y, dom, (100, 100))
    noisy = np.column_stack([result["counts_control"], result["counts_treated"]]).ravel()
    variance = float(np.var(noisy - counts))
    assert variance == pytest.approx(2 * (4.0 / 2.0) ** 2, rel=0.1)
    assert variance != pytest.approx(2 * (2.0 / 2.0) ** 2, rel=0.3)  # the add/remove scale


def test_kmeans_plan_composes_sequentially() -> None:
    params = up.UpliftParams(
        epsilon=2.0, partition="kmeans", clusters=8, kmeans_iterations=4, shrinkage="none"
    )
    record = up.plan(domain(q=2), params)
    assert len(record.events) == 2 * 4 + 2
    assert record.composition == Composition.SEQUENTIAL
    assert record.epsilon == pytest.approx(2.0)
    kmeans = [e for e in record.events if e.module == "kmeans"]
    # eps_km / (2T) per statistic: count scale 2 / (1 / 8) = 16, sum scale 2q / (1 / 8) = 32
    assert float(kmeans[0].params["scale"]) == pytest.approx(16.0, rel=1e-7)
    assert float(kmeans[1].params["scale"]) == pytest.approx(32.0, rel=1e-6)  # + lattice
    with pytest.raises(InvalidParameters):
        up.plan(domain(q=2), up.UpliftParams(epsilon=1.0, partition="kmeans", clusters=0))
    with pytest.raises(InvalidParameters):
        up.plan(
            domain(q=2), up.UpliftParams(epsilon=1.0, partition="kmeans", clusters=4, bins=(2, 2))
        )


def test_kmeans_cluster_statistics_sensitivity() -> None:
    rng = np.random.default_rng(4)
    u = rng.uniform(-1, 1, (200, 3))
    centroids = rng.uniform(-1, 1, (5, 3))
    counts, sums = up.cluster_statistics(u, up.nearest(u, centroids), 5)
    worst_c = worst_s = 0.0
    for vertex in (np.ones(3), -np.ones(3), np.array([1.0, -1.0, 1.0])):
        for row in range(5):
            u2 = u.copy()
            u2[row] = vertex
            c2, s2 = up.cluster_statistics(u2, up.nearest(u2, centroids), 5)
            worst_c = max(worst_c, float(np.abs(c2 - counts).sum()))
            worst_s = max(worst_s, float(np.abs(s2 - sums).sum()))
    assert worst_c <= 2.0
    assert worst_s <= up.sum_sensitivity(6.0, 200)


def test_kmeans_seeded_run_and_lookup() -> None:
    dom = domain(20000, q=1)
    params = up.UpliftParams(epsilon=50.0, partition="kmeans", clusters=10)
    result = up.run(
        _sin_data(20000, 0),
        dom,
        params,
        noise=SeededSampler(np.random.default_rng(1)),
        progress=lambda f, s: None,
        rng=np.random.default_rng(2),
    )
    test = np.linspace(-0.95, 0.95, 39)[:, None]
    pehe = float(np.mean((up.predict(result, test) - np.sin(test[:, 0])) ** 2))
    assert pehe < 0.05
    assert result["partition"]["type"] == "kmeans"


# ---- shrinkage "ate" (proof step 5) ------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 7.0])
def test_anchored_plan_spends_exactly_the_request(epsilon: float) -> None:
    """The second moments take SECOND_MOMENT_SHARE of the table's epsilon; the total is the
    request's epsilon exactly and delta stays 0. One cell: no second moments (nothing to
    shrink)."""
    record = up.plan(domain(q=2), up.UpliftParams(epsilon=epsilon, bins=(4, 4)))
    second, counts, sums = record.events
    assert second.params["statistic"] == "centred_second_moments"
    assert second.params["dim"] == 2
    assert float(second.params["sensitivity_l1_nominal"]) == 10.0**2 / 2  # W^2 / 2
    assert second.epsilon == pytest.approx(up.SECOND_MOMENT_SHARE * epsilon)
    assert math.fsum(e.epsilon for e in record.events) == epsilon == record.epsilon
    assert record.delta == 0.0
    assert float(counts.params["scale"]) == pytest.approx(4.0 / (0.9 * epsilon), rel=1e-6)
    one = up.plan(domain(q=2), up.UpliftParams(epsilon=epsilon, bins=(1, 1)))
    assert [e.params["statistic"] for e in one.events] == ["counts", "centred_sums"]
    assert one.epsilon == epsilon


def test_second_moment_sensitivity_covers_a_replaced_record() -> None:
    dom = domain(50)
    rng = np.random.default_rng(0)
    a = (rng.uniform(size=50) < 0.5).astype(float)
    y = rng.uniform(-5, 5, 50)
    base = up.second_moment_sums(a, y, dom)
    worst = 0.0
    for arm in (0.0, 1.0):
        for value in (-5.0, 0.0, 5.0):
            for row in range(50):
                a2, y2 = a.copy(), y.copy()
                a2[row], y2[row] = arm, value
                worst = max(worst, float(np.abs(up.second_moment_sums(a2, y2, dom) - base).sum()))
    assert worst <= up.second_moment_sensitivity(10.0, 50)


def test_deviation_traces_match_the_dense_covariance() -> None:
    rng = np.random.default_rng(3)
    for p in (2, 5, 40):
        w = rng.uniform(0.1, 1.0, p)
        w /= w.sum()
        v = rng.uniform(0.1, 3.0, p)
        centring = np.eye(p) - np.outer(np.ones(p), w)
        sigma = centring @ np.diag(v) @ centring.T
        m = np.sqrt(np.outer(w, w)) * sigma
        trace, trace_squared = _deviation_traces(w, v)
        assert trace == pytest.approx(float(np.trace(m)), rel=1e-10)
        assert trace_squared == pytest.approx(float(np.sum(m * m)), rel=1e-10)


def _rct(n: int, effect: Any, seed: int) -> Arrays:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 2))
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(0.5 * x[:, 1] + a * effect(x) + rng.normal(0, 1.0, n), -5, 5)
    return Arrays(x, a, y)


def test_no_heterogeneity_falls_back_to_the_anchor() -> None:
    """Constant effect on a 6 x 6 grid: the factor is 0 in at least 18 of 20 releases (about
    0.99 each) and every prediction is then the anchor, the count-weighted table ATE."""
    n = 20000
    dom = domain(n, q=2)
    params = up.UpliftParams(epsilon=2.0, bins=(6, 6))
    zeros = 0
    for seed in range(20):
        result = up.run(
            _rct(n, lambda x: np.full(x.shape[0], 1.0), seed),
            dom,
            params,
            noise=SeededSampler(np.random.default_rng(100 + seed)),
            progress=lambda f, s: None,
        )
        raw = np.asarray(result["uplift_unshrunk"])
        size = np.add(
            np.maximum(result["counts_control"], 0), np.maximum(result["counts_treated"], 0)
        )
        assert result["ate_anchor"] == pytest.approx(float(np.dot(size / size.sum(), raw)))
        assert result["ate_anchor"] == pytest.approx(1.0, abs=0.15)
        if result["shrinkage_factor"] == 0.0:
            zeros += 1
            points = np.random.default_rng(seed).uniform(-1, 1, (30, 2))
            np.testing.assert_array_equal(
                up.predict(result, points), np.full(30, result["ate_anchor"])
            )
    assert zeros >= 18


def test_strong_heterogeneity_keeps_the_table() -> None:
    """tau = 2 x_0 (sd 1.15) at n eps = 80000 on a 6 x 6 grid: the factor is near 1."""
    n = 20000
    result = up.run(
        _rct(n, lambda x: 2.0 * x[:, 0], 1),
        domain(n, q=2),
        up.UpliftParams(epsilon=4.0, bins=(6, 6)),
        noise=OpenDPSampler(),
        progress=lambda f, s: None,
    )
    assert result["shrinkage_factor"] > 0.8
    raw = np.asarray(result["uplift_unshrunk"])
    expected = result["ate_anchor"] + result["shrinkage_factor"] * (raw - result["ate_anchor"])
    np.testing.assert_allclose(result["uplift"], np.clip(expected, -10, 10), rtol=0, atol=1e-12)
    assert 0.0 < result["arm_variance"]["control"] < 3.0
    # the released values' noise sds (test_released_noise_sd_is_the_shrunk_values_...)
    assert len(result["released_noise_sd"]) == 36
    assert result["ate_anchor_noise_sd"] < min(result["uplift_noise_sd"])


# A 3 x 2 grid whose first column holds 1.5 % of the rows: two near-empty cells of about 45
SMALL_CELL_CUTS = ((-0.97, 0.0), (0.0,))


def _small_cell_factors(effect: Any, seeds: range, n: int = 6000) -> list[float]:
    params = up.UpliftParams(epsilon=1.5, cut_points=SMALL_CELL_CUTS)
    factors = []
    for seed in seeds:
        result = up.run(
            _rct(n, effect, seed),
            domain(n, q=2),
            params,
            noise=SeededSampler(np.random.default_rng(500 + seed)),
            progress=lambda f, s: None,
        )
        assert result["cells"] == 6
        factors.append(float(result["shrinkage_factor"]))
    return factors


def test_a_near_empty_cell_does_not_hide_a_clear_difference() -> None:
    """proof step 5: the factor weighs each cell at its own precision (Cochran's Q). An
    observational walkthrough's 6-cell table, cells of about 1 000 patients 3.5 apart at noise sd
    0.65, was released flat: a cell of 78 patients dominated the unweighted spread's noise trace
    and cut its Satterthwaite degrees of freedom to 2.2. Here tau = -0.4 where x_1 > 0 (sd 0.2,
    cells of about 1 500 at an error sd of about 0.06, the two near-empty ones about 1.4): kept
    in at least 9 of 10 releases (the unweighted test kept it in 1)."""
    factors = _small_cell_factors(lambda x: np.where(x[:, 1] > 0.0, -0.4, 0.0), range(10))
    assert sum(f > 0.0 for f in factors) >= 9, factors


def test_a_near_empty_cell_without_heterogeneity_keeps_the_anchor() -> None:
    """The same grid with a constant effect: the factor is 0 in at least 18 of 20 releases
    (about 0.99 each, the near-empty cells' noisy variances read at their upper level)."""
    factors = _small_cell_factors(lambda x: np.full(x.shape[0], 1.0), range(20))
    assert sum(f == 0.0 for f in factors) >= 18, factors


def test_the_heterogeneity_factor_is_cochrans_q() -> None:
    """anchor.heterogeneity_factor: Q about the precision-weighted centre against the chi-square
    0.99 quantile with k - 1 degrees of freedom; 0 for too few or unusable variances."""
    from scipy.stats import chi2

    from service.mechanisms.anchor import heterogeneity_factor

    u = np.array([0.0, -3.5, -1.0, 0.5])
    v = np.array([0.4, 0.4, 50.0, 0.5])
    centre = float(np.sum(u / v) / np.sum(1 / v))
    q = float(np.sum((u - centre) ** 2 / v))
    assert heterogeneity_factor(u, v) == pytest.approx(1.0 - chi2.ppf(0.99, 3) / q)
    assert heterogeneity_factor(np.array([1.0, 1.1, 0.9]), np.ones(3)) == 0.0
    assert heterogeneity_factor(u, np.array([0.4, 0.0, 1.0, 1.0])) == 0.0
    assert heterogeneity_factor(u[:1], v[:1]) == 0.0


def test_one_cell_reports_no_arm_variance_it_did_not_measure() -> None:
    """A one-cell table buys no second moments: its arm_variance is null, not the zeros a CDS
    walkthrough read as 'no variance'."""
    n = 2000
    result = up.run(
        _rct(n, lambda x: 0.0 * x[:, 0], 1),
        domain(n, q=2),
        up.UpliftParams(epsilon=1.0, bins=(1, 1)),
        noise=OpenDPSampler(),
        progress=lambda f, s: None,
    )
    assert result["cells"] == 1
    assert result["arm_variance"] is None
    assert result["shrinkage_factor"] == 0.0


def test_released_noise_sd_is_the_shrunk_values_not_the_raw_uplifts() -> None:
    """The released value a + lambda (u_k - a) carries (1 - lambda)^2 V_a + lambda^2 v_k +
    2 lambda (1 - lambda) w_k v_k of privacy-noise variance: the anchor's at factor 0, the raw
    uplift's at 1, capped at R_Y (a walkthrough saw sd 8.39 beside a shrunk -1.12, and 855 for
    a near-empty cell of a table bounded at +-60)."""
    sd = np.array([1.0, 2.0, 900.0])
    w = np.array([0.5, 0.49, 0.01])
    anchor_var = float(np.sum(w * w * sd * sd))
    anchor, at_zero = up.released_noise_sds(sd, w, 0.0, 60.0)
    assert anchor == pytest.approx(math.sqrt(anchor_var))
    np.testing.assert_allclose(at_zero, math.sqrt(anchor_var))
    _, at_one = up.released_noise_sds(sd, w, 1.0, 60.0)
    np.testing.assert_allclose(at_one, [1.0, 2.0, 60.0])
    _, half = up.released_noise_sds(sd, w, 0.5, 60.0)
    expected = np.sqrt(0.25 * anchor_var + 0.25 * sd**2 + 0.5 * w * sd**2)
    np.testing.assert_allclose(half, np.minimum(expected, 60.0))
    # a whole table's fields: test_strong_heterogeneity_keeps_the_table


def test_shrinkage_none_is_the_raw_table_and_the_quote_says_anchored() -> None:
    from service.releases.kinds.uplift_table import UpliftTableKind, UpliftTableRequest

    n = 4000
    result = up.run(
        _rct(n, lambda x: 2.0 * x[:, 0], 2),
        domain(n, q=2),
        up.UpliftParams(epsilon=1.0, bins=(3, 3), shrinkage="none"),
        noise=OpenDPSampler(),
        progress=lambda f, s: None,
    )
    assert result["shrinkage"] == "none"
    assert "uplift_unshrunk" not in result
    kind = UpliftTableKind()
    quote = kind.quote(UpliftTableRequest(epsilon=1.0, bins=[3, 3]), domain(n, q=2))
    assert quote["shrinkage"] == "ate"
    assert quote["versus_ate"]["anchored"] is True
    none = kind.quote(UpliftTableRequest(epsilon=1.0, shrinkage="none"), domain(n, q=2))
    assert none["versus_ate"]["anchored"] is False


# ---- one cell, observational: the adjusted DP ATE (proof step 6) -------------------------------


def _confounded(n: int, seed: int) -> tuple[Arrays, float]:
    """Treatment more likely at large x_0, which raises the outcome by 3 x_0: the difference in
    means is confounded by about +1.1; the true ATE is 1 (propensity in [0.18, 0.82], inside
    the default clip)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 2))
    a = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-1.5 * x[:, 0]))).astype(float)
    y = np.clip(3.0 * x[:, 0] + a * 1.0 + rng.normal(0, 0.5, n), -5, 5)
    return Arrays(x, a, y), 1.0


def test_one_cell_observational_default_is_the_adjusted_ate() -> None:
    """A one-cell grid adjusts for nothing: the default (shrinkage "ate") releases the strict
    DP AIPW ATE, close to the true ATE, where the raw table is the confounded difference in
    means (red before proof step 6: the default was that difference, about 2.1 here)."""
    n = 20000
    dom = domain(n, q=2, rct=False)
    arrays, truth = _confounded(n, 5)
    raw = up.run(
        arrays,
        dom,
        up.UpliftParams(epsilon=4.0, bins=(1, 1), adjustment_partition=True, shrinkage="none"),
        noise=OpenDPSampler(),
        progress=lambda f, s: None,
    )
    assert raw["uplift"][0] - truth > 0.8  # the confounded difference in means
    for params in (
        up.UpliftParams(epsilon=4.0, bins=(1, 1), adjustment_partition=True),  # as the bench
        up.UpliftParams(epsilon=4.0, bins=(1, 1)),  # no assertion needed: the ATE adjusts
    ):
        result = up.run(
            arrays,
            dom,
            params,
            noise=OpenDPSampler(),
            progress=lambda f, s: None,
            rng=np.random.default_rng(7),
        )
        assert abs(result["uplift"][0] - truth) < 0.4
        assert result["uplift"] == [result["ate_anchor"]] == [result["adjusted_ate"]["estimate"]]
        assert result["anchor"] == "adjusted_ate"
        assert result["anchor_share"] == 1.0
        points = np.random.default_rng(1).uniform(-1, 1, (10, 2))
        np.testing.assert_array_equal(up.predict(result, points), np.full(10, result["uplift"][0]))


def test_adjusted_record_is_the_ate_default() -> None:
    """The one-cell observational record is the ``ate`` kind's default record (events, folds,
    composition, epsilon, delta; in chunks where its chunks rule applies, else the single
    release's, ``ate_strict.default_params``) under uplift_table's name; RCTs and >= 2 cells
    keep the table; the observational refusal stands for them and for shrinkage "none"."""
    from service.mechanisms import ate_strict
    from service.mechanisms.records import Composition
    from service.releases.kinds.ate import AteKind, AteParams
    from service.releases.kinds.ate import to_mechanism_params as ate_params

    for rct in (False, True):
        for epsilon in (0.5, 1.0, 4.0):
            dom = domain(5000, q=2, rct=rct)
            single = AteParams(epsilon=epsilon, estimator="aipw", chunks=1)
            default = ate_params(single, dom)
            assert ate_strict.default_params(dom, epsilon) == default
    dom = domain(5000, q=2, rct=False)
    # n eps 2000 and 25000: one release; 2500 and 20000: the chunks rule's 4 chunks
    for epsilon, chunked in ((0.4, False), (0.5, True), (4.0, True), (5.0, False)):
        record = up.plan(dom, up.UpliftParams(epsilon=epsilon, bins=(1, 1)))
        ate = AteKind().record(AteParams(epsilon=epsilon), dom)
        assert (record.composition == Composition.CHUNKS) is chunked
        if not chunked:
            assert ate == ate_strict.plan(dom, ate_strict.default_params(dom, epsilon))
        assert (record.mechanism, record.version) == ("uplift_table", up.VERSION)
        assert record.events == ate.events
        assert record.composition == ate.composition
        assert (record.epsilon, record.delta) == (ate.epsilon, ate.delta) == (epsilon, ate.delta)
        assert record.fold_sizes == ate.fold_sizes
    rct_record = up.plan(domain(5000, q=2), up.UpliftParams(epsilon=1.0, bins=(1, 1)))
    assert [e.params["statistic"] for e in rct_record.events] == ["counts", "centred_sums"]
    for refused in (
        up.UpliftParams(epsilon=1.0, bins=(2, 1)),
        up.UpliftParams(epsilon=1.0, bins=(1, 1), shrinkage="none"),
    ):
        with pytest.raises(InvalidParameters):
            up.plan(dom, refused)
    # in chunks the cell's noise sd is the mean's: one chunk's over sqrt(4)
    quote = up.quote(dom, up.UpliftParams(epsilon=1.0, bins=(1, 1)))
    assert quote["delta"] == quote["adjusted_ate"]["delta"] > 0.0
    assert quote["adjusted_ate"]["chunks"] == 4
    assert quote["approx_uplift_sd_per_cell"] == quote["adjusted_ate"]["chunk_s_theta"] / 2.0
    assert quote["expected_cell_error_sd"] == pytest.approx(
        quote["adjusted_ate"]["expected_half_width"] / 1.959963984540054
    )
    single_quote = up.quote(dom, up.UpliftParams(epsilon=0.4, bins=(1, 1)))
    assert single_quote["approx_uplift_sd_per_cell"] == single_quote["adjusted_ate"]["s_theta"]


def test_a_one_cell_quote_says_the_table_cannot_beat_the_ate() -> None:
    """One cell is one number for every patient: not_expected at any epsilon, whatever the
    noise, with the constant's PEHE as the bound; a grid of >= 2 cells keeps the noise verdict."""
    from service.releases.kinds.uplift_table import UpliftTableKind, UpliftTableRequest

    kind = UpliftTableKind()
    dom = domain(5000, q=2, rct=False)
    h = dom.outcome_range / 24.0
    for epsilon in (1.0, 100.0):
        quote = kind.quote(UpliftTableRequest(epsilon=epsilon, bins=[1, 1]), dom)
        block = quote["versus_ate"]
        assert quote["anchor"] == "adjusted_ate"
        assert block["verdict"] == "not_expected"
        assert block["epsilon_worth_it"] is None
        assert block["expected_pehe_lower_bound"] == pytest.approx(h)
        assert "the strict DP ATE itself" in block["message"]
        assert "ebm_cate or cate_function" in block["message"]
    rct = kind.quote(UpliftTableRequest(epsilon=100.0, bins=[1, 1]), domain(5000, q=2))
    assert rct["anchor"] == "table"
    assert rct["versus_ate"]["verdict"] == "not_expected"
    assert "give bins over the covariates" in rct["versus_ate"]["message"]
    assert "the strict DP ATE itself" not in rct["versus_ate"]["message"]
    grid = kind.quote(UpliftTableRequest(epsilon=100.0, bins=[2, 2]), domain(5000, q=2))
    assert grid["cells"] == 4
    assert grid["versus_ate"]["verdict"] in ("marginal", "possible")
    assert grid["versus_ate"]["expected_pehe_lower_bound"] < h


def test_the_suggested_pehe_is_in_outcome_units() -> None:
    """The rule minimises a mean squared error; the quote states its root (a PEHE). With the
    default L = W the bias term alone at one bin is W^2 / 12, so the PEHE there is at least
    W / sqrt(12) and never above the whole of the terms' root."""
    d = domain()
    width = d.outcome_range
    out = up.suggested_bins(d, 1.0)
    assert out["approx_pehe_at_suggestion"] < width
    one_cell = up.suggested_bins(d, 1e-9)  # the noise forces a single cell
    assert one_cell["suggested_cells"] == 1
    assert one_cell["approx_pehe_at_suggestion"] >= width / math.sqrt(12.0)


def _skewed_step(n: int, seed: int) -> Arrays:
    """A skewed covariate on a wide declared box (most rows near -1, a long right tail) whose
    effect steps from 0 to 2 at x = -0.8: equal-width cells cannot see the step."""
    rng = np.random.default_rng(seed)
    x = np.clip(-1.0 + rng.exponential(0.2, (n, 1)), -1.0, 1.0)
    a = (rng.uniform(size=n) < 0.5).astype(float)
    tau = np.where(x[:, 0] >= -0.8, 2.0, 0.0)
    y = np.clip(a * tau + rng.normal(0, 0.5, n), -5, 5)
    return Arrays(x, a, y)


def test_cut_points_make_a_grid_at_the_declared_cuts_and_lookups_follow_them() -> None:
    """A request's public cut points: the cells run [c_k, c_{k+1}); the table finds an effect
    that steps at a cut (the regular grid of the same cell count averages it away); a lookup
    at exactly a cut reads the upper cell; the partition is free (same record as the regular
    grid of the same shape)."""
    dom = domain()
    cuts = up.UpliftParams(epsilon=50.0, cut_points=((-0.8, -0.5),), shrinkage="none")
    assert up.grid_shape(dom, cuts) == (3,)
    regular = up.UpliftParams(epsilon=50.0, bins=(3,), shrinkage="none")
    assert up.plan(dom, cuts) == up.plan(dom, regular)
    arrays = _skewed_step(20000, 0)
    result = up.run(
        arrays, dom, cuts, noise=SeededSampler(np.random.default_rng(1)), progress=lambda f, s: None
    )
    assert result["grid"]["edges"] == [[-1.0, -0.8, -0.5, 1.0]]
    assert result["grid"]["bins"] == [3]
    np.testing.assert_allclose(result["uplift"], [0.0, 2.0, 2.0], atol=0.15)
    points = np.array([[-0.9], [-0.8], [-0.5], [0.99]])
    np.testing.assert_array_equal(
        up.predict(result, points), np.asarray(result["uplift"])[[0, 1, 2, 2]]
    )
    even = up.run(
        arrays,
        dom,
        regular,
        noise=SeededSampler(np.random.default_rng(1)),
        progress=lambda f, s: None,
    )
    assert abs(even["uplift"][0] - 0.0) > 0.5  # the first third of the box mixes both sides


@pytest.mark.parametrize(
    ("cut_points", "message"),
    [
        ((), "one entry per covariate"),
        (((-1.0,),), "strictly inside"),
        (((1.0,),), "strictly inside"),
        (((0.5, 0.5),), "strictly increasing"),
        (((0.5, 0.2),), "strictly increasing"),
        (((math.nan,),), "strictly inside"),
        ((tuple(np.linspace(-0.99, 0.99, up.MAX_BINS_PER_FEATURE)),), "at most"),
    ],
)
def test_invalid_cut_points_are_refused_naming_the_covariate(
    cut_points: tuple[tuple[float, ...], ...], message: str
) -> None:
    dom = replace(domain(), x_names=("crp",))
    with pytest.raises(InvalidParameters, match=message) as raised:
        up.plan(dom, up.UpliftParams(epsilon=1.0, cut_points=cut_points))
    if cut_points:
        assert "'crp'" in str(raised.value)


def test_cut_points_exclude_bins_and_kmeans() -> None:
    dom = domain()
    with pytest.raises(InvalidParameters, match="bins or cut_points"):
        up.plan(dom, up.UpliftParams(epsilon=1.0, bins=(2,), cut_points=((0.0,),)))
    kmeans = up.UpliftParams(epsilon=1.0, partition="kmeans", clusters=2, cut_points=((0.0,),))
    with pytest.raises(InvalidParameters, match="partition='grid' only"):
        up.plan(dom, kmeans)


def test_a_quote_with_cut_points_shows_the_grid() -> None:
    dom = domain(q=2)
    params = up.UpliftParams(epsilon=1.0, cut_points=((0.0,), ()))
    quoted = up.quote(dom, params)
    assert quoted["bins"] == [2, 1]
    assert quoted["cells"] == 2
    assert quoted["edges"] == [[-1.0, 0.0, 1.0], [-1.0, 1.0]]


def test_a_quote_of_equal_widths_on_a_numeric_covariate_warns() -> None:
    """Equal-width cells on a numeric covariate assume n / cells records in each (a skewed lab
    breaks that): the quote says so and names the ways out; coded covariates, cut points and
    quantile cells get no such warning."""
    dom = PublicDomain(
        x_lower=np.array([0.0, 0.0]),
        x_upper=np.array([300.0, 1.0]),
        y_lower=0.0,
        y_upper=60.0,
        n=3000,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
        x_codes=(None, (0, 1)),
        x_names=("crp", "diabetes"),
    )
    warned = up.quote(dom, up.UpliftParams(epsilon=1.0, bins=(2, 2)))["warnings"]
    assert len(warned) == 1
    assert "'crp' is cut into 2 equal widths" in warned[0]
    assert "quantile_cuts" in warned[0]
    assert up.quote(dom, up.UpliftParams(epsilon=1.0, bins=(1, 2)))["warnings"] == []
    cuts = up.UpliftParams(epsilon=1.0, cut_points=((10.0,), (0.5,)))
    assert up.quote(dom, cuts)["warnings"] == []
    quantiles = up.UpliftParams(epsilon=1.0, quantile_cuts=(3, 0), cut_points=((), (0.5,)))
    assert up.quote(dom, quantiles)["warnings"] == []
    # at epsilon 0.02 each cut's selection noise (scale 2 / 0.001 = 2000 records of rank) is
    # most of n: said (a walkthrough's cuts spanned CRP's whole declared range, unannounced)
    tiny = up.UpliftParams(epsilon=0.02, quantile_cuts=(3, 0), cut_points=((), (0.5,)))
    (said,) = up.quote(dom, tiny)["warnings"]
    assert "about 2,000 records of rank (67% of n = 3000)" in said
    assert "fewer cuts, more epsilon" in said


def test_quantile_cuts_find_a_skewed_covariates_quartiles_and_pay_for_them() -> None:
    """proof step 8: 10 % of epsilon buys the DP quartiles of a skewed covariate; the table at
    the rest of epsilon is cut there (the regular grid of the same shape puts nearly every row
    in its first cell)."""
    dom = domain()
    params = up.UpliftParams(epsilon=2.0, quantile_cuts=(4,), shrinkage="none")
    state = up.make_plan(dom, params)
    assert state.record.composition == Composition.SEQUENTIAL
    assert state.record.epsilon == pytest.approx(2.0, rel=1e-12)
    cuts = state.record.events[0]
    assert cuts.params["statistic"] == "cut_point_quantiles"
    assert cuts.params["quantiles"] == 3
    assert cuts.epsilon == pytest.approx(0.2)
    assert state.quantile_epsilon is not None
    assert 3 * state.quantile_epsilon <= cuts.epsilon
    table_only = up.make_plan(dom, up.UpliftParams(epsilon=1.8, bins=(4,), shrinkage="none"))
    assert state.counts is not None
    assert table_only.counts is not None
    assert state.counts.scale == pytest.approx(table_only.counts.scale, rel=1e-9)
    arrays = _skewed_step(20000, 1)
    out = up.run(
        arrays,
        dom,
        params,
        noise=SeededSampler(np.random.default_rng(2)),
        progress=lambda f, s: None,
    )
    inner = np.asarray(out["grid"]["edges"][0][1:-1])
    truth = np.quantile(arrays.x[:, 0], [0.25, 0.5, 0.75])
    np.testing.assert_allclose(inner, truth, atol=0.01)
    assert out["grid"]["quantile_cuts"] == [4]
    np.testing.assert_allclose(out["uplift"][:2], [0.0, 0.0], atol=0.2)
    np.testing.assert_allclose(out["uplift"][3], 2.0, atol=0.2)


def test_equal_quantiles_leave_an_empty_cell_and_keep_the_shape() -> None:
    dom = domain()
    params = up.UpliftParams(epsilon=1.0, quantile_cuts=(4,))
    edges = up.measured_edges(dom, params, {0: [0.5, -0.2, 0.5]})
    assert edges == [[-1.0, -0.2, 0.5, 0.5, 1.0]]
    cells = up.edge_index(np.array([[-0.5], [0.5], [0.9]]), edges)
    np.testing.assert_array_equal(cells, [0, 3, 3])  # [0.5, 0.5) holds nothing


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (up.UpliftParams(epsilon=1.0, bins=(2, 1), quantile_cuts=(0, 3)), "bins or quantile_cuts"),
        (up.UpliftParams(epsilon=1.0, quantile_cuts=(3,)), "one entry per covariate"),
        (up.UpliftParams(epsilon=1.0, quantile_cuts=(0, 21)), "integer in"),
        (up.UpliftParams(epsilon=1.0, quantile_cuts=(2, 0), cut_points=((0.0,), ())), "both"),
        (
            up.UpliftParams(epsilon=1.0, partition="kmeans", clusters=2, quantile_cuts=(2, 0)),
            "grid' only",
        ),
    ],
)
def test_invalid_quantile_cuts_are_refused(params: up.UpliftParams, message: str) -> None:
    with pytest.raises(InvalidParameters, match=message):
        up.plan(domain(q=2), params)


def test_quantile_cuts_refuse_a_categorical_covariate() -> None:
    dom = replace(domain(q=2), x_codes=(None, (0, 1)), x_names=("crp", "sex"))
    with pytest.raises(InvalidParameters, match="'sex' is categorical"):
        up.plan(dom, up.UpliftParams(epsilon=1.0, quantile_cuts=(0, 2)))


def test_the_verdict_weighs_a_cells_privacy_noise_and_its_assumed_sampling_error() -> None:
    """versus_ate compares the heterogeneity with a cell's error: its Laplace noise and its
    sampling error at the assumed outcome sd (R / 12), labelled so (a trial walkthrough's 2 x 2
    table was quoted 'possible' on privacy noise alone, 0.017, beside a sampling error of about
    0.033). The worst-case cell sd (sampling at W / 2) stays apart, and the privacy part is
    shown by itself (an analyst had read 1.31 as privacy noise where the table's own was 0.17)."""
    from service.releases.kinds.uplift_table import UpliftTableKind, UpliftTableRequest

    dom = domain(20000, q=2)
    quoted = up.quote(dom, up.UpliftParams(epsilon=1.0, bins=(3, 3)))
    privacy = quoted["approx_privacy_noise_sd_per_cell"]
    error = quoted["expected_cell_error_sd"]
    assert 0.0 < privacy < error < quoted["approx_uplift_sd_per_cell"]
    per_arm = dom.n / 9 / 2  # an RCT at p = 1/2
    sampling = (dom.outcome_range / 12) * math.sqrt(2 / per_arm)
    assert error**2 == pytest.approx(privacy**2 + sampling**2)
    kind = UpliftTableKind().quote(UpliftTableRequest(epsilon=1.0, bins=[3, 3]), dom)
    block = kind["versus_ate"]
    assert block["prediction_noise_sd"] == pytest.approx(error)
    assert block["privacy_noise_sd"] == pytest.approx(privacy)
    assert "the error of a cell's uplift" in block["message"]


def test_regular_edges_are_short_decimals_with_the_bounds_exact() -> None:
    """An analyst's quote showed an edge of 15.000000000000002."""
    dom = PublicDomain(
        x_lower=np.array([0.2, 18.0]),
        x_upper=np.array([15.0, 90.0]),
        y_lower=0.0,
        y_upper=1.0,
        n=100,
    )
    assert up.regular_edges(dom, (4, 3)) == [[0.2, 3.9, 7.6, 11.3, 15.0], [18.0, 42.0, 66.0, 90.0]]


def test_a_one_cell_observational_table_states_what_its_interval_covers() -> None:
    """A re-test's one-cell table showed the adjusted ATE's interval without the `ate` kind's
    coverage block (the DP nuisance models' bias is not in it): quote and release carry it."""
    from service.releases.kinds import REGISTRY

    n = 4000
    dom = domain(n, q=2, rct=False)
    kind = REGISTRY["uplift_table"]
    # n eps 2000: one release, whose interval leaves the nuisance models' error out
    single = kind.quote({"epsilon": 0.5, "bins": [1, 1]}, dom)["adjusted_ate"]["coverage"]
    assert single["basis"] == "nuisance_models"
    assert single["nuisance_error_covered"] is False
    # n eps 4000: the ate default is 4 chunks, whose t interval covers their fit noise too
    quoted = kind.quote({"epsilon": 1.0, "bins": [1, 1]}, dom)
    coverage = quoted["adjusted_ate"]["coverage"]
    assert coverage["basis"] == "chunk_spread"
    assert coverage["nuisance_error_covered"] is False
    arrays, _ = _confounded(n, 3)
    released = kind.run(
        arrays,
        dom,
        {"epsilon": 1.0, "bins": [1, 1]},
        rng=np.random.default_rng(1),
        noise=OpenDPSampler(),
        progress=lambda f, s: None,
    )
    assert released["adjusted_ate"]["coverage"] == coverage
    assert released["adjusted_ate"]["chunks"] == 4
    assert len(released["adjusted_ate"]["chunk_estimates"]) == 4
    assert released["uplift"] == [pytest.approx(released["adjusted_ate"]["estimate"])]


def test_a_tables_verdict_names_its_own_anchor_and_two_cells_are_not_a_detection() -> None:
    """A trial re-test: the epsilon-ADUM table's message spoke of an anchor bought from part of
    the rows (its anchor is its cells' mean over all rows), and its 2-cell tables were quoted
    as falling back to the anchor though their factor is a fixed prior ratio (0.92-0.99)."""
    from service.releases.kinds.uplift_table import UpliftTableKind, UpliftTableRequest

    dom = domain(3000, q=2)
    four = UpliftTableKind().quote(UpliftTableRequest(epsilon=2.0, bins=[2, 2]), dom)
    assert four["versus_ate"]["anchored"] is True
    assert "anchor_source 'effect_fold'" not in four["versus_ate"]["message"]
    two = UpliftTableKind().quote(UpliftTableRequest(epsilon=2.0, bins=[2, 1]), dom)
    assert two["versus_ate"]["anchored"] is False
    assert "shrunk towards its own DP ATE" not in two["versus_ate"]["message"]
