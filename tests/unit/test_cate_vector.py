"""cate_vector: the paper constant, the strict sensitivity, validation, seeded runs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from service.mechanisms import cate_vector as cv
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled
from service.mechanisms.noise import SeededSampler
from service.mechanisms.records import Composition, Guarantee


def domain(n: int = 2000, *, rct: bool = False, paper: bool = False, q: int = 2) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.ones(q),
        y_lower=-2.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.RCT if rct else StudyDesign.OBSERVATIONAL,
        treatment_probability=0.5 if rct else None,
        allow_paper_mode=paper,
    )


POINTS = tuple((float(t), 0.5) for t in np.linspace(0, 1, 11))


@pytest.mark.parametrize(
    ("delta", "epsilon", "expected"),
    [
        (1e-5, 0.1, 0.2572),
        (1e-5, 1.0, 0.02572),
        (1e-5, 10.0, 0.002572),
        (1e-6, 0.5, 0.05608),
        (1e-6, 2.0, 0.01402),
        (1e-6, 5.0, 0.005608),
    ],
)
def test_paper_constant_matches_spec_table(delta: float, epsilon: float, expected: float) -> None:
    assert cv.c_constant(epsilon, delta, 2700) == pytest.approx(expected, rel=5e-4)


def test_paper_constant_mimic() -> None:
    assert cv.c_constant(1.0, 1e-5, 13247) == pytest.approx(0.005745, rel=5e-4)


def test_theta_sensitivity_closed_form() -> None:
    c = 2.0
    assert cv.theta_sensitivity(7.0, 0.1, 2000, c) == pytest.approx(
        2 * c * 7.0 * (1 + c / math.sqrt(0.1)) / (0.1 * 2000)
    )


def test_feature_norm_is_bounded() -> None:
    fmap = cv.FeatureMap.draw(domain(q=3), 200, 0.1, np.random.default_rng(0))
    phi = fmap(np.random.default_rng(1).uniform(-1, 2, (5000, 3)))  # clipped to the box
    assert np.max(np.linalg.norm(phi, axis=1)) <= cv.FEATURE_NORM + 1e-12


@pytest.mark.parametrize("learner", ["r", "dr"])
def test_ridge_replace_one_never_exceeds_the_bound(learner: cv.Learner) -> None:
    """Replace one row by adversarial box vertices: ||theta - theta'|| <= Delta_theta."""
    rng = np.random.default_rng(3)
    n, ridge, q = 150, 0.05, 1
    dom = domain(n, q=q)
    fmap = cv.FeatureMap.draw(dom, 10, 0.3, rng)
    bound_r = 7.0 if learner == "r" else 7.0 / 0.05
    # C_v: R's inputs (a - pi) phi have norm <= (1 - c) C with pi in [c, 1 - c], c = 0.05
    input_norm = (1 - 0.05) * cv.FEATURE_NORM if learner == "r" else cv.FEATURE_NORM
    limit = cv.theta_sensitivity(bound_r, ridge, n, input_norm)
    worst = 0.0
    for _ in range(20):
        x = rng.uniform(0, 1, (n, q))
        a = (rng.uniform(size=n) < 0.5).astype(float)
        y = rng.uniform(-2, 5, n)
        pi = rng.uniform(0.05, 0.95, n)
        mu0, mu1 = rng.uniform(-2, 5, n), rng.uniform(-2, 5, n)
        v, r = cv.second_stage_data(learner, fmap(x), a, y, pi, mu0, mu1, bound_r)
        theta = cv.ridge_fit(v, r, ridge, bound_r)
        for xv in (0.0, 0.37, 1.0):
            for av, yv, piv, m0, m1 in [
                (1, 5, 0.05, -2, -2),
                (0, -2, 0.95, 5, 5),
                (1, -2, 0.05, 5, 5),
            ]:
                x2, a2, y2 = x.copy(), a.copy(), y.copy()
                pi2, mu02, mu12 = pi.copy(), mu0.copy(), mu1.copy()
                x2[0], a2[0], y2[0], pi2[0], mu02[0], mu12[0] = xv, av, yv, piv, m0, m1
                v2, r2 = cv.second_stage_data(learner, fmap(x2), a2, y2, pi2, mu02, mu12, bound_r)
                worst = max(
                    worst, float(np.linalg.norm(cv.ridge_fit(v2, r2, ridge, bound_r) - theta))
                )
    assert 0 < worst <= limit


def test_points_outside_the_box_are_reported_with_paths() -> None:
    errors = cv.point_errors([[0.5, 0.5], [1.5, 0.5], [0.1], [0.2, -0.1]], domain())
    assert [path for path, _ in errors] == [(1, 0), (2,), (3, 1)]


def test_a_categorical_coordinate_must_be_one_of_its_codes() -> None:
    coded = replace(domain(), x_codes=(None, (0, 1)))
    errors = cv.point_errors([[0.5, 1.0], [0.5, 0.5], [0.25, 0.0]], coded)
    assert errors == [((1, 1), "a categorical covariate: one of its codes {0, 1}")]
    with pytest.raises(InvalidParameters, match=r"invalid query point: a categorical covariate"):
        cv.plan(coded, cv.CateVectorParams(points=[[0.5, 0.5]], epsilon=1.0, delta=1e-5))


def test_plan_strict_record() -> None:
    params = cv.CateVectorParams(points=POINTS, epsilon=1.0, delta=1e-5)
    record = cv.plan(domain(), params)
    assert record.guarantee == Guarantee.STRICT
    assert record.composition == Composition.THEOREM6_MAX
    assert (record.epsilon, record.delta) == (1.0, 1e-5)
    assert [e.module for e in record.events] == ["propensity", "outcome", "estimation"]
    theta_event = record.events[-1]
    assert theta_event.params["dim"] == params.n_features + 1 + 2
    quote = cv.quote(domain(), params)
    assert quote["noise_sd_upper_bound"] == pytest.approx(2.0 * float(theta_event.params["sigma"]))


@pytest.mark.parametrize(
    ("learner", "rct", "input_norm"),
    [("r", False, 0.95 * 2.0), ("r", True, 1.0), ("dr", False, 2.0), ("dr", True, 2.0)],
)
def test_plan_uses_the_input_norm_of_the_learner(
    learner: cv.Learner, rct: bool, input_norm: float
) -> None:
    """R: ||(a - pi) phi|| <= (1 - c) C (RCT p = 1/2: C / 2); DR: C."""
    params = cv.CateVectorParams(points=POINTS, epsilon=1.0, delta=1e-5, learner=learner)
    state = cv.make_plan(domain(rct=rct), params)
    event = state.record.events[-1]
    assert event.params["input_norm"] == pytest.approx(input_norm)
    assert event.params["sensitivity_l2_nominal"] == pytest.approx(
        cv.theta_sensitivity(state.bound_r, params.ridge, state.n2, input_norm)
    )


def test_paper_mode_needs_the_owner_flag() -> None:
    params = cv.CateVectorParams(points=POINTS, epsilon=1.0, delta=1e-5, mode="paper")
    with pytest.raises(PaperModeDisabled):
        cv.plan(domain(), params)
    record = cv.plan(domain(paper=True), params)
    assert record.guarantee == Guarantee.PAPER
    assert record.events[0].type == "smooth_sensitivity_gaussian"
    quote = cv.quote(domain(paper=True), params)
    assert 0 < quote["noise_sd_lower_bound"] < quote["noise_sd_upper_bound"]


@pytest.mark.parametrize(
    "change",
    [
        {"points": ((0.5, 2.0),)},
        {"epsilon": 0.0},
        {"delta": 0.1},
        {"ridge": 1e-6},
        {"n_features": 0},
        {"fold_fractions": (0.5, 0.5)},
        {"propensity_clip": 0.001},
    ],
)
def test_invalid_parameters(change: dict[str, object]) -> None:
    base: dict[str, object] = {"points": POINTS, "epsilon": 1.0, "delta": 1e-5}
    with pytest.raises(InvalidParameters):
        cv.plan(domain(), cv.CateVectorParams(**{**base, **change}))  # type: ignore[arg-type]


def test_influence_sup_matches_a_brute_force_grid() -> None:
    """DR with constant nuisances: the sup is found exactly (closed form on a grid)."""
    dom = domain(q=1)

    def nuisance(x: np.ndarray) -> tuple[np.ndarray, ...]:
        k = x.shape[0]
        return np.full(k, 0.3), np.full(k, 1.0), np.full(k, 2.0)

    def g(x: np.ndarray) -> np.ndarray:
        return np.asarray(3 * np.sin(6 * x[:, 0]))

    found = cv.influence_sup("dr", nuisance, g, dom, overlap=1.0, rng=np.random.default_rng(0))
    grid = np.linspace(0, 1, 200001)
    best = 0.0
    for a, mu_a in ((0.0, 1.0), (1.0, 2.0)):
        for y in (-2.0, 5.0):
            value = (a - 0.3) / 0.21 * (y - mu_a) + 1.0 - 3 * np.sin(6 * grid)
            best = max(best, float(np.max(np.abs(value))))
    assert found == pytest.approx(best, rel=1e-6)


def _data(n: int, seed: int, *, rct: bool) -> Arrays:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 2))
    pi = np.full(n, 0.5) if rct else 0.3 + 0.4 * x[:, 1]
    a = (rng.uniform(size=n) < pi).astype(float)
    tau = 1 + 2 * x[:, 0]
    y = np.clip(x[:, 1] + a * tau + rng.normal(0, 0.3, n), -2, 5)
    return Arrays(x, a, y)


@pytest.mark.parametrize(("learner", "mode"), [("r", "strict"), ("dr", "strict"), ("r", "paper")])
def test_seeded_run_is_near_the_truth(learner: cv.Learner, mode: cv.Mode) -> None:
    n = 20000 if mode == "strict" else 4000
    dom = domain(n, rct=True, paper=True)
    params = cv.CateVectorParams(
        points=POINTS,
        epsilon=50.0,
        delta=1e-5,
        learner=learner,
        mode=mode,
        ridge=0.05 if mode == "strict" else 1e-3,
    )
    result = cv.run(
        _data(n, 0, rct=True),
        dom,
        params,
        rng=np.random.default_rng(1),
        noise=SeededSampler(np.random.default_rng(2)),
        progress=lambda f, s: None,
    )
    truth = 1 + 2 * np.linspace(0, 1, 11)
    estimates = np.asarray(result["estimates"])
    assert estimates.shape == (11,)
    assert float(np.sqrt(np.mean((estimates - truth) ** 2))) < 0.6
    assert result["guarantee"] == ("strict" if mode == "strict" else "paper")
    for forbidden in ("sigma", "gamma", "noise_scale", "theta"):
        assert not any(forbidden in key for key in result if key != "target_bound")


# ---- paper-mode quote: public bracket on the data-dependent noise sd ------------------------


@pytest.mark.parametrize(("learner", "rct"), [("r", False), ("dr", False), ("r", True)])
def test_paper_quote_is_public_and_matches_the_formula(
    learner: cv.Learner, rct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter's quote touches no data path and equals c * [R_Y, Gamma_max]."""
    from service.releases.kinds.cate_vector import CateVectorKind

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the quote must not touch data")

    for name in ("prepare_arrays", "random_folds", "fit", "_paper_nuisance", "influence_sup"):
        monkeypatch.setattr(cv.estimation, name, forbidden)
    dom = domain(3000, rct=rct, paper=True)
    body = {
        "points": [[0.1, 0.2], [0.9, 0.4]],
        "epsilon": 2.0,
        "delta": 1e-6,
        "learner": learner,
        "mode": "paper",
        "propensity_clip": 0.1,
    }
    quote = CateVectorKind().quote(body, dom)
    n2 = 1500  # paper folds (1/2, 1/2)
    c = 5 * math.sqrt(2 * math.log(n2) * math.log(2 / 1e-6)) / (2.0 * n2)
    r_y = 7.0
    clip = 0.5 if rct else 0.1  # RCT: min(p, 1 - p) with p = 0.5
    upper = (2 - clip) * r_y / clip if learner == "r" else r_y * (1 / clip + 1)
    assert quote["c"] == pytest.approx(c, rel=1e-12)
    assert quote["noise_sd_lower_bound"] == pytest.approx(c * r_y, rel=1e-12)
    assert quote["noise_sd_upper_bound"] == pytest.approx(c * upper, rel=1e-12)
    assert quote["guarantee"] == "paper"


@pytest.mark.parametrize("learner", ["r", "dr"])
def test_paper_upper_bound_is_attained_by_worst_case_nuisances(learner: cv.Learner) -> None:
    """pi_hat at the clip, mu_hat at y_lo, g at -R_Y, Lambda_hat = c (1 - c): sup = Gamma_max."""
    dom = domain(q=1)
    clip, r_y = 0.05, 7.0

    def nuisance(x: np.ndarray) -> tuple[np.ndarray, ...]:
        k = x.shape[0]
        return np.full(k, clip), np.full(k, -2.0), np.full(k, -2.0)

    def g(x: np.ndarray) -> np.ndarray:
        return np.full(x.shape[0], -r_y)

    overlap = clip * (1 - clip) if learner == "r" else 1.0
    found = cv.influence_sup(
        learner, nuisance, g, dom, overlap=overlap, rng=np.random.default_rng(0)
    )
    lower, upper = cv.paper_gamma_bounds(learner, r_y, clip)
    assert found == pytest.approx(upper, rel=1e-12)
    assert lower == r_y


def _paper_data(n: int, seed: int, kind: str) -> Arrays:
    """Small observational datasets: good overlap, poor overlap, extreme outcomes."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 2))
    if kind == "poor":
        pi = 0.02 + 0.96 * (x[:, 0] > 0.5)
    else:
        pi = 0.3 + 0.4 * x[:, 1]
    a = (rng.uniform(size=n) < pi).astype(float)
    if kind == "extreme":
        y = np.where(rng.uniform(size=n) < 0.5, -2.0, 5.0) * np.where(a == 1, 1.0, -1.0)
        y = np.clip(y, -2, 5)
    else:
        y = np.clip(x[:, 1] + a * (1 + 2 * x[:, 0]) + rng.normal(0, 0.3, n), -2, 5)
    return Arrays(x, a, y)


@pytest.mark.parametrize("learner", ["r", "dr"])
@pytest.mark.parametrize("kind", ["good", "poor", "extreme"])
def test_paper_realised_noise_lies_in_the_quoted_bracket(learner: cv.Learner, kind: str) -> None:
    """Small-n simulation: r = gamma_hat c and the realised noise sd lie in the quote's bracket."""
    n, epsilon = 400, 20.0
    dom = domain(n, paper=True)
    params = cv.CateVectorParams(
        points=POINTS, epsilon=epsilon, delta=1e-5, learner=learner, mode="paper", ridge=1e-3
    )
    quote = cv.quote(dom, params)
    low, high = quote["noise_sd_lower_bound"], quote["noise_sd_upper_bound"]
    state = cv.make_plan(dom, params)
    for seed in range(3):
        fitted = cv.fit(
            _paper_data(n, seed, kind),
            dom,
            state,
            rng=np.random.default_rng(seed),
            progress=lambda f, s: None,
        )
        r = cv.paper_noise_sd(fitted, state)
        assert low <= r <= high
        sampler = SeededSampler(np.random.default_rng(100 + seed))
        draws = np.array(
            [cv.release(fitted, state, noise=sampler)["estimates"] for _ in range(400)]
        )
        realised = float(np.std(draws - fitted.estimates))
        # clipping to [-R_Y, R_Y] can only shrink the realised spread
        assert realised <= 1.05 * r
        assert low <= realised <= high


def test_released_values_are_clipped_to_the_public_cate_range() -> None:
    """Post-processing: every released coordinate lies in [-R_Y, R_Y] (R_Y = 7 here)."""
    params = cv.CateVectorParams(points=POINTS, epsilon=0.02, delta=1e-5, ridge=1e-3)
    state = cv.make_plan(domain(), params)
    k = 1 + 2 + params.n_features
    fitted = cv.VectorFit(
        estimates=np.zeros(len(POINTS)),
        theta=np.zeros(k),
        phi_points=np.ones((len(POINTS), k)) / math.sqrt(k),
        gamma_hat=None,
    )
    values = cv.release(fitted, state, noise=SeededSampler(np.random.default_rng(0)))["estimates"]
    assert max(abs(v) for v in values) <= 7.0
    assert max(abs(v) for v in values) == 7.0  # the noise is far larger than R_Y here


# ---- strict default ridge: a public rule ---------------------------------------------------


def _bench_domain() -> PublicDomain:
    """The benchmark's DS1 public schema: n = 2700, X in [0, 1]^2, Y in [-1, 9.45]."""
    return PublicDomain(x_lower=np.zeros(2), x_upper=np.ones(2), y_lower=-1.0, y_upper=9.45, n=2700)


@pytest.mark.parametrize(
    ("epsilon", "ridge_r", "ridge_dr"),
    [
        (0.5, 1.0, 1.0),
        (1.0, 1.0, 1.0),
        (2.0, 0.3, 0.3),
        (5.0, 0.3, 0.3),
        (10.0, 0.1, 0.3),
        (50.0, 0.1, 0.1),
    ],
)
def test_suggested_ridge_on_the_benchmark_schema(
    epsilon: float, ridge_r: float, ridge_dr: float
) -> None:
    for learner, expected in (("r", ridge_r), ("dr", ridge_dr)):
        params = cv.CateVectorParams(
            points=POINTS,
            epsilon=epsilon,
            delta=1e-5,
            learner=learner,  # type: ignore[arg-type]
        )
        assert cv.suggested_ridge(_bench_domain(), params) == expected


def test_suggested_ridge_is_public_and_the_adapter_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule reads no data, keeps the quoted bound <= 0.2 R_Y, and the kind applies it."""
    from service.releases.kinds.cate_vector import CateVectorKind

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the rule must not touch data")

    for name in ("prepare_arrays", "random_folds", "fit", "_strict_nuisance"):
        monkeypatch.setattr(cv.estimation, name, forbidden)
    dom = _bench_domain()
    kind = CateVectorKind()
    previous = math.inf
    for epsilon in (0.3, 1.0, 3.0, 30.0):
        body = {"points": [[0.5, 0.5]], "epsilon": epsilon, "delta": 1e-5, "estimator": "ridge"}
        quote = kind.quote(body, dom)
        ridge = quote["ridge"]
        assert ridge in cv.STRICT_RIDGE_GRID
        assert ridge <= previous  # less ridge as epsilon grows
        previous = ridge
        if ridge != cv.STRICT_RIDGE_GRID[-1]:
            assert quote["noise_sd_upper_bound"] <= cv.RIDGE_RULE_FRACTION * 10.45
        assert kind.record(body, dom).events[-1].params["ridge"] == ridge
        explicit = kind.quote({**body, "ridge": 0.05}, dom)
        assert explicit["ridge"] == 0.05
    paper = {"points": [[0.5, 0.5]], "epsilon": 1.0, "delta": 1e-5, "mode": "paper"}
    paper_domain = PublicDomain(
        x_lower=np.zeros(2),
        x_upper=np.ones(2),
        y_lower=-1.0,
        y_upper=9.45,
        n=2700,
        allow_paper_mode=True,
    )
    assert kind.quote(paper, paper_domain)["ridge"] == cv.PAPER_RIDGE


# ---- ATE anchor and James–Stein shrinkage (proof step 7) -------------------------------------


def test_anchor_is_the_ate_default_on_all_rows_and_splits_the_budget_exactly() -> None:
    """proof step 7: the anchor is the strict ate default at the public share of (epsilon,
    delta) on all n rows; each of the vector's modules (nuisances included: the anchor read their
    rows) spends exactly the rest; the record's cost is (epsilon, delta)."""
    from service.mechanisms import anchor as anchor_lib
    from service.mechanisms import ate_strict
    from service.mechanisms.records import Composition

    params = cv.CateVectorParams(points=POINTS, epsilon=1.0, delta=1e-6, ridge=0.3, anchor=True)
    dom = domain()
    state = cv.make_plan(dom, params)
    record = state.record
    assert state.anchor is not None
    share = anchor_lib.ate_anchor_share(dom, 1.0, 1e-6)
    assert share is not None
    eps_a, eps_rest = ate_strict.split_share(1.0, share)
    delta_a, delta_rest = ate_strict.split_share(1e-6, share)
    assert state.anchor.params == anchor_lib.ate_anchor_params(dom, eps_a, delta_a)
    assert record.composition == Composition.ANCHOR_THEN_THEOREM6_MAX
    assert (record.epsilon, record.delta) == (1.0, 1e-6)
    rest: dict[str, list[tuple[float, float]]] = {}
    for event in record.events:
        if not event.module.startswith("anchor/"):
            rest.setdefault(event.module, []).append((event.epsilon, event.delta))
    assert set(rest) == {"propensity", "outcome", "estimation"}
    for spent in rest.values():
        assert math.fsum(e for e, _ in spent) == pytest.approx(eps_rest, rel=1e-12)
        assert math.fsum(d for _, d in spent) == pytest.approx(delta_rest, rel=1e-12)
    assert sum(v for k, v in record.fold_sizes.items() if k.startswith("anchor/")) == dom.n
    with pytest.raises(InvalidParameters, match="strict mode only"):
        cv.plan(domain(paper=True), replace(params, mode="paper"))
    with pytest.raises(InvalidParameters, match="anchor"):
        cv.plan(dom, replace(params, epsilon=0.01))


def test_james_stein_factor_falls_back_to_the_anchor_on_noise_and_keeps_signal() -> None:
    rng = np.random.default_rng(0)
    trace, trace_squared = 200 * 4.0, 200 * 16.0  # independent noise, variance 4 per point
    for seed in range(20):  # pure noise: lambda is 0 unless the spread beats the 2-sd margin
        noise_only = np.random.default_rng(seed).normal(0.0, 2.0, 200)
        assert cv.james_stein_factor(noise_only, trace, trace_squared, prior_sd=1.0) < 0.05
    signal = np.linspace(-20.0, 20.0, 200) + rng.normal(0.0, 2.0, 200)
    assert cv.james_stein_factor(signal, trace, trace_squared, prior_sd=1.0) > 0.95
    # fewer than 3 points: the prior-based factor prior^2 / (prior^2 + tr / d)
    assert cv.james_stein_factor(np.array([5.0]), 3.0, 9.0, prior_sd=1.0) == 0.25


def test_anchored_release_is_never_far_from_the_ate_on_a_constant_effect() -> None:
    """True CATE = 1 everywhere (RCT): the anchored vector sits near 1; the raw one does not."""
    n = 4000
    dom = domain(n, rct=True)
    truth = 1.0
    errors: dict[bool, list[float]] = {True: [], False: []}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = rng.uniform(0.0, 1.0, size=(n, 2))
        a = (rng.uniform(size=n) < 0.5).astype(np.float64)
        y = np.clip(x[:, 0] + truth * a + rng.normal(0.0, 0.5, n), -2.0, 5.0)
        for anchor in (True, False):
            params = cv.CateVectorParams(
                points=POINTS, epsilon=1.0, delta=1e-6, ridge=0.3, anchor=anchor
            )
            out = cv.run(
                Arrays(x=x, a=a, y=y),
                dom,
                params,
                rng=np.random.default_rng(100 + seed),
                noise=SeededSampler(np.random.default_rng(200 + seed)),
                progress=lambda f, s: None,
            )
            values = np.asarray(out["estimates"])
            errors[anchor].append(float(np.sqrt(np.mean((values - truth) ** 2))))
            if anchor:
                assert 0.0 <= out["shrinkage_factor"] <= 1.0
                assert abs(out["ate_anchor"] - truth) < 0.5
                interval = out["ate_anchor_interval"]
                assert interval["lower"] < out["ate_anchor"] < interval["upper"]
    assert max(errors[True]) < 0.5
    assert np.mean(errors[True]) < np.mean(errors[False])


def test_estimator_rule_is_public_and_reads_values_only() -> None:
    """Every ridge field at its default: ``ebm`` on an observational design wherever the
    anchored ebm_cate default can run, in an RCT where n eps / q >= 1500 (DS1's schema as a
    trial: n 2700, q 2, so from eps 1.12); a stored request (every field dumped) resolves
    alike."""
    from service.problems import ValidationFailed
    from service.releases.kinds.cate_vector import CateVectorRequest, estimator_for

    observational = _bench_domain()
    dom = replace(observational, design=StudyDesign.RCT, treatment_probability=0.5)
    points = [[0.5, 0.5]]

    def rule(**fields: Any) -> str:
        return estimator_for(CateVectorRequest(points=points, **fields), dom)

    assert estimator_for(CateVectorRequest(points=points, epsilon=0.1), observational) == "ebm"
    tiny = replace(observational, n=300)  # no anchored ebm release: the ridge
    assert estimator_for(CateVectorRequest(points=points, epsilon=4.0), tiny) == "ridge"
    assert rule(epsilon=1.1) == "ridge"
    assert rule(epsilon=1.2) == "ebm"
    assert rule(epsilon=1.2, learner="r") == "ebm"  # the default value is no choice
    assert rule(epsilon=1.2, learner="dr") == "ridge"
    assert rule(epsilon=1.2, ridge=0.3) == "ridge"
    assert rule(epsilon=1.2, shrinkage="none") == "ridge"
    assert rule(epsilon=1.2, estimator="ridge") == "ridge"
    assert rule(epsilon=0.1, estimator="ebm") == "ebm"
    stored = CateVectorRequest(points=points, epsilon=1.2).model_dump(mode="json")
    assert estimator_for(CateVectorRequest.model_validate(stored), dom) == "ebm"
    with pytest.raises(ValidationFailed):
        rule(epsilon=1.2, estimator="ebm", lengthscale=0.5)
