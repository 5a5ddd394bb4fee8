"""The effect-modifier screen (docs/proofs/ebm_cate.md step 9): the scores and their
sensitivity, the samplers' top-k and OpenDP's map, the CDF scaling of continuous covariates,
ebm_cate's rule, its record (the effect fold's budget adds up exactly) and the release."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms import ebm_cate, effect_screen
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.effect_screen import EffectScreen
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import OpenDPSampler, SeededSampler
from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest, to_mechanism_params


def _domain(n: int = 20_000, q: int = 12, codes: bool = True) -> PublicDomain:
    """Covariates 0..q-3 binary (declared codes), the last two continuous on [0, 100]."""
    lower = np.zeros(q)
    upper = np.concatenate([np.ones(q - 2), [100.0, 100.0]])
    x_codes = tuple([(0, 1)] * (q - 2) + [None, None]) if codes else None
    return PublicDomain(
        x_lower=lower,
        x_upper=upper,
        y_lower=-10.0,
        y_upper=30.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
        x_codes=x_codes,
    )


def test_scores_are_the_absolute_covariances_with_bound_scaled_covariates() -> None:
    x = np.array([[0.0, 10.0], [1.0, 0.0], [1.0, 5.0]])
    targets = np.array([2.0, -1.0, 3.0])
    z = effect_screen.scaled_covariates(x, np.array([0.0, 0.0]), np.array([1.0, 10.0]))
    assert np.array_equal(z, [[-1.0, 1.0], [1.0, -1.0], [1.0, 0.0]])
    scores = effect_screen.scores(targets, x, np.array([0.0, 0.0]), np.array([1.0, 10.0]))
    assert np.allclose(scores, [abs(-2 - 1 + 3), abs(2 + 1 + 0)])
    # a covariate with a degenerate public range scores 0
    flat = effect_screen.scaled_covariates(x[:, :1], np.array([1.0]), np.array([1.0]))
    assert np.array_equal(flat, np.zeros((3, 1)))


def test_replacing_one_row_moves_every_score_by_at_most_two_k() -> None:
    rng = np.random.default_rng(3)
    bound = 4.0
    lower, upper = np.zeros(5), np.ones(5)
    worst = 0.0
    for _ in range(200):
        x = rng.uniform(0, 1, (50, 5))
        targets = rng.uniform(-bound, bound, 50)
        base = effect_screen.scores(targets, x, lower, upper)
        x2, t2 = x.copy(), targets.copy()
        x2[7] = rng.choice([0.0, 1.0], 5)
        t2[7] = rng.choice([-bound, bound])
        worst = max(worst, float(np.max(np.abs(effect_screen.scores(t2, x2, lower, upper) - base))))
    assert worst <= 2 * bound
    assert worst > 1.5 * bound  # the bound is nearly reached: not a loose claim
    assert effect_screen.sensitivity(bound, 50) >= 2 * bound


def test_opendp_top_k_charges_at_most_the_planned_epsilon_and_finds_clear_winners() -> None:
    screen = EffectScreen(epsilon=0.5, columns=3, bound=2.0, rows=1000)
    assert math.isclose(screen.scale, 2 * 3 * screen.sensitivity / 0.5)
    scores = np.zeros(10)
    scores[[2, 5, 7]] = 1e6  # far above the noise scale
    chosen = OpenDPSampler().top_k(
        scores, k=3, scale=screen.scale, sensitivity_linf=screen.sensitivity, epsilon=0.5
    )
    assert sorted(chosen) == [2, 5, 7]
    # a scale calibrated for half the sensitivity is refused: OpenDP charges 2 x epsilon
    with pytest.raises(ValueError, match="charges more"):
        OpenDPSampler().top_k(
            scores,
            k=3,
            scale=screen.scale / 2,
            sensitivity_linf=screen.sensitivity,
            epsilon=0.5,
        )
    with pytest.raises(ValueError, match="k must be"):
        OpenDPSampler().top_k(scores, k=11, scale=1.0, sensitivity_linf=1.0, epsilon=1.0)


def test_seeded_top_k_is_random_at_equal_scores_and_sure_at_distant_ones() -> None:
    sampler = SeededSampler(np.random.default_rng(0))
    picks = [
        sampler.top_k(np.zeros(4), k=1, scale=1.0, sensitivity_linf=1.0, epsilon=2.0)[0]
        for _ in range(400)
    ]
    counts = np.bincount(picks, minlength=4)
    assert counts.min() > 60  # about 100 each
    far = sampler.top_k(
        np.array([0.0, 100.0, 0.0, 90.0]), k=2, scale=1.0, sensitivity_linf=1.0, epsilon=2.0
    )
    assert sorted(far) == [1, 3]


def _study(n: int, seed: int, q: int = 12) -> Arrays:
    """tau = 1 + 3 (x0 - 1/2) + 0.1 * (x_{q-1} - 20): binary x0 and the skewed continuous last
    covariate (most values in 0-20 of its declared 0-100) modify the effect; x1 confounds."""
    rng = np.random.default_rng(seed)
    binary = rng.binomial(1, 0.5, (n, q - 2)).astype(float)
    skewed = np.clip(rng.lognormal(2.0, 0.6, (n, 2)), 0, 100)
    x = np.column_stack([binary, skewed])
    e = 1 / (1 + np.exp(-(x[:, 1] - 0.5)))
    a = rng.binomial(1, e).astype(float)
    tau = 1 + 3 * (x[:, 0] - 0.5) + 0.1 * (x[:, -1] - 8.0)
    y = np.clip(5 + 2 * x[:, 1] + a * tau + rng.normal(0, 1, n), -10, 30)
    return Arrays(x=x, a=a, y=y)


def test_cdf_scaling_lets_a_skewed_continuous_modifier_outscore_noise_columns() -> None:
    """Scaled by its declared bounds the skewed modifier (x11) has a spread of about 0.1 and
    scores below a column that modifies nothing; by its DP CDF it spreads over [-1, 1] and the
    screen keeps it with the two binary modifiers."""
    dom = _domain()
    x = _study(20_000, 1).x
    tau = 1 + 3 * (x[:, 0] - 0.5) + (x[:, 2] - 0.5) + 0.05 * (x[:, -1] - 8.0)
    noise = np.random.default_rng(2).normal(0, 2, tau.size)
    targets = np.clip(tau - tau.mean() + noise, -10, 10)
    lower, upper = np.asarray(dom.x_lower), np.asarray(dom.x_upper)
    assert effect_screen.scaled_covariates(x, lower, upper)[:, -1].std() < 0.15
    plan = ebm_cate.make_plan(dom, to_mechanism_params(EbmCateRequest(epsilon=4.0), dom))
    screen = plan.screen
    assert screen is not None
    assert screen.bins is not None
    assert screen.bins.columns == (10, 11)
    sampler = SeededSampler(np.random.default_rng(4))
    # a huge top-k epsilon: the scores' own order (the histograms keep their planned noise)
    scaled = EffectScreen(1e6, 3, 10.0, tau.size, screen.bins)
    assert scaled.select(targets, x, lower, upper, sampler) == (0, 2, 11)
    unscaled = EffectScreen(1e6, 3, 10.0, tau.size)
    chosen = unscaled.select(targets, x, lower, upper, sampler)
    assert 11 not in chosen
    assert {0, 2} <= set(chosen)


def test_rule_runs_the_screen_for_the_anchored_dr_learner_without_effect_columns() -> None:
    rule = ebm_cate.screen_rule
    assert rule(12, "dr", None, None, None) is True
    assert rule(12, "dr", "ate", None, None) is True
    assert rule(8, "dr", None, None, None) is False  # nothing to screen at q <= 8
    assert rule(12, "dr", None, (0, 1), None) is False
    assert rule(12, "dr", "none", None, None) is False
    assert rule(12, "s", None, None, None) is False
    assert rule(12, "dr", None, None, False) is False
    for args in ((8, "dr", None, None), (12, "dr", None, (0,)), (12, "dr", "none", None)):
        with pytest.raises(InvalidParameters, match="effect_screen needs"):
            rule(*args, True)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameters, match="boolean"):
        rule(12, "dr", None, None, "yes")  # type: ignore[arg-type]


def test_record_spends_the_effect_folds_budget_exactly_with_the_screen() -> None:
    dom = _domain(n=100_000)
    plan = ebm_cate.make_plan(dom, to_mechanism_params(EbmCateRequest(epsilon=1.0), dom))
    record = plan.record
    assert (record.epsilon, record.delta) == (
        1.0,
        to_mechanism_params(EbmCateRequest(epsilon=1.0), dom).delta,
    )
    effect = [e for e in record.events if e.module == "effect"]
    kinds = [e.type for e in effect]
    assert kinds[-3:] == ["gaussian", "noisy_top_k", "gdp_module"]
    assert math.fsum(e.epsilon for e in effect) == 1.0
    assert math.fsum(e.delta for e in effect) == record.delta
    top_k = effect[-2]
    assert top_k.delta == 0.0
    assert top_k.params["k"] == effect_screen.COLUMNS
    assert top_k.params["candidates"] == 12
    assert math.isclose(
        top_k.params["scale"], 2 * 8 * top_k.params["sensitivity_linf"] / top_k.epsilon
    )
    # the screen's share of the effect model's budget, and the model's own
    model = effect[-1]
    screen_total = top_k.epsilon + effect[-3].epsilon
    assert math.isclose(screen_total / (screen_total + model.epsilon), effect_screen.SHARE)
    assert model.params["n_features"] == effect_screen.COLUMNS
    # the calibration rows keep the whole effect budget (disjoint rows)
    calibration = [e for e in record.events if e.module == "calibration"][0]
    assert math.isclose(calibration.epsilon, screen_total + model.epsilon)
    # off: the version 5 record on every covariate
    off = ebm_cate.make_plan(
        dom, to_mechanism_params(EbmCateRequest(epsilon=1.0, effect_screen=False), dom)
    ).record
    assert "noisy_top_k" not in [e.type for e in off.events]
    assert [e for e in off.events if e.module == "effect"][-1].params["n_features"] == 12
    assert (off.epsilon, off.delta) == (record.epsilon, record.delta)


def test_without_continuous_covariates_the_whole_share_buys_the_top_k() -> None:
    dom = PublicDomain(
        x_lower=np.zeros(10),
        x_upper=np.ones(10),
        y_lower=0.0,
        y_upper=1.0,
        n=50_000,
        x_codes=tuple([(0, 1)] * 10),
    )
    plan = ebm_cate.make_plan(dom, to_mechanism_params(EbmCateRequest(epsilon=1.0), dom))
    assert plan.screen is not None
    assert plan.screen.bins is None
    effect = [e for e in plan.record.events if e.module == "effect"]
    assert [e.type for e in effect][-2:] == ["noisy_top_k", "gdp_module"]
    assert math.fsum(e.epsilon for e in effect) == 1.0


def test_rct_record_screens_at_the_pipelines_budget() -> None:
    dom = PublicDomain(
        x_lower=np.zeros(12),
        x_upper=np.ones(12),
        y_lower=0.0,
        y_upper=10.0,
        n=40_000,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    plan = ebm_cate.make_plan(dom, to_mechanism_params(EbmCateRequest(epsilon=1.0), dom))
    assert plan.screen is not None
    record = plan.record
    assert record.epsilon == 1.0
    outcome = [e for e in record.events if e.module == "outcome"]
    effect = [e for e in record.events if e.module == "effect"]
    # the outcome module (its range and model) keeps the DR pipeline's whole rest; the effect
    # module adds up to it
    assert math.fsum(e.epsilon for e in effect) == math.fsum(e.epsilon for e in outcome)


def test_release_fits_the_effect_model_on_the_chosen_columns() -> None:
    dom = _domain(n=20_000)
    data = _study(20_000, 5)
    out = EbmCateKind().run(
        data,
        dom,
        EbmCateRequest(epsilon=8.0),
        rng=np.random.default_rng(6),
        noise=SeededSampler(np.random.default_rng(7)),
        progress=lambda fraction, stage: None,
    )
    chosen = out["screened_columns"]
    assert out["effect_screen"] is True
    assert out["effect_columns"] is None
    assert len(chosen) == effect_screen.COLUMNS
    assert chosen == sorted(set(chosen))
    assert out["model"]["columns"] == chosen
    assert 0 in chosen
    assert 11 in chosen
    # predictions read the stored columns: x0 moves the CATE, a column left out does not
    left_out = next(j for j in range(12) if j not in chosen)
    base = np.tile((np.asarray(dom.x_lower) + np.asarray(dom.x_upper)) / 2, (2, 1))
    base[:, 11] = 8.0
    moved = base.copy()
    moved[1, left_out] = dom.x_upper[left_out]
    pred = ebm_cate.predict(out, moved)
    assert pred[0] == pred[1]


def test_request_field_validates() -> None:
    dom = _domain()
    with pytest.raises(InvalidParameters, match="effect_screen needs"):
        EbmCateKind().record(
            EbmCateRequest(epsilon=1.0, effect_screen=True, effect_columns=[0]), dom
        )
    record = EbmCateKind().record(EbmCateRequest(epsilon=1.0, effect_screen=True), dom)
    assert "noisy_top_k" in [e.type for e in record.events]
    assert record.version == ebm_cate.VERSION == "10"


def _wide_plans(n: int, design: StudyDesign) -> tuple[ebm_cate.Plan, ebm_cate.Plan, PublicDomain]:
    """The default (screened) and the unscreened plan at eps 1 on 36 covariates."""
    dom = PublicDomain(
        x_lower=np.zeros(36),
        x_upper=np.ones(36),
        y_lower=0.0,
        y_upper=10.0,
        n=n,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )
    screened = ebm_cate.make_plan(dom, to_mechanism_params(EbmCateRequest(epsilon=1.0), dom))
    plain = ebm_cate.make_plan(
        dom, to_mechanism_params(EbmCateRequest(epsilon=1.0, effect_screen=False), dom)
    )
    return screened, plain, dom


def test_the_screen_leaves_the_anchor_shares_as_for_every_covariate() -> None:
    """n eps = 2 * 10^4 on 36 covariates: 556 per covariate (the noisy anchor share), 2500 per
    screened column. The anchor keeps the share of the 36, observationally and in a trial."""
    for design in (StudyDesign.OBSERVATIONAL, StudyDesign.RCT):
        screened, plain, dom = _wide_plans(20_000, design)
        assert screened.screen is not None
        assert plain.screen is None
        assert screened.anchor_share == plain.anchor_share
        named = ebm_cate.make_plan(
            dom,
            to_mechanism_params(EbmCateRequest(epsilon=1.0, effect_columns=list(range(8))), dom),
        )
        assert named.anchor_share != plain.anchor_share  # named columns do move it


def test_screened_anchor_share_switches_at_its_own_threshold() -> None:
    """n eps per schema covariate 1111 (n 40 000, eps 1, q 36): below the unscreened 1500, above
    the screened 900. The screened release gives the anchor the useful share, observationally
    and in a trial; unscreened keeps the noisy share."""
    assert (
        ebm_cate.SCREENED_USEFUL_N_EPSILON_PER_COVARIATE
        < ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE
    )
    for design in (StudyDesign.OBSERVATIONAL, StudyDesign.RCT):
        screened, plain, _ = _wide_plans(40_000, design)
        assert screened.anchor_share < plain.anchor_share
        if design == StudyDesign.OBSERVATIONAL:
            assert screened.anchor_share == ebm_cate.ebm_anchor_share(40_000, 1.0, 8)
        else:
            assert screened.anchor_share == ebm_cate.RCT_USEFUL_ANCHOR_SHARE
