"""The whole-data anchor (anchor.plan_ate_anchor, ate_anchor_share): public rules only."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms import anchor, ate_rct, ate_strict
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import SeededSampler
from service.releases.kinds.ate import AteParams, to_mechanism_params
from tests.unit.trials import prognostic_rct


def _domain(n: int, design: StudyDesign) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(10),
        x_upper=np.ones(10),
        y_lower=0.0,
        y_upper=60.0,
        n=n,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )


@pytest.mark.parametrize("design", [StudyDesign.RCT, StudyDesign.OBSERVATIONAL])
@pytest.mark.parametrize("n", [1000, 20000, 100000])
@pytest.mark.parametrize("epsilon", [0.5, 4.0])
def test_the_share_is_the_smallest_whose_anchor_is_about_as_good_as_the_whole_budget(
    design: StudyDesign, n: int, epsilon: float
) -> None:
    domain = _domain(n, design)
    share = anchor.ate_anchor_share(domain, epsilon, 1e-6)
    assert share in anchor.ATE_ANCHOR_SHARES
    whole = anchor.ate_anchor_error_sd(domain, anchor.ate_default_params(domain, epsilon))

    def error(s: float) -> float:
        eps_a, delta_a = ate_strict.split_share(epsilon, s)[0], ate_strict.split_share(1e-6, s)[0]
        return anchor.ate_anchor_error_sd(domain, anchor.ate_anchor_params(domain, eps_a, delta_a))

    if n * epsilon < anchor.ANCHOR_ALL_IN_N_EPSILON or design == StudyDesign.OBSERVATIONAL:
        assert share == anchor.ATE_ANCHOR_SHARES[-1]  # the release is the anchor there
        return
    if share < anchor.ATE_ANCHOR_SHARES[-1]:
        assert error(share) <= anchor.ATE_ANCHOR_ACCURACY_RATIO * whole
    smaller = [s for s in anchor.ATE_ANCHOR_SHARES if s < share]
    assert all(error(s) > anchor.ATE_ANCHOR_ACCURACY_RATIO * whole for s in smaller)


def test_small_budgets_give_the_anchor_most_of_it_and_large_ones_leave_room() -> None:
    """Privacy noise dominates the ATE at n epsilon = 500: the anchor takes the largest share; a
    trial at n = 10^5, epsilon = 4 is sampling-dominated, so the CATE keeps most of the budget."""
    assert anchor.ate_anchor_share(_domain(1000, StudyDesign.RCT), 0.5, 1e-6) == 0.95
    assert anchor.ate_anchor_share(_domain(100000, StudyDesign.RCT), 4.0, 1e-6) <= 0.5
    assert anchor.ate_anchor_share(_domain(1000, StudyDesign.RCT), 0.01, 1e-6) is None


def test_the_anchor_plan_is_the_ate_default_and_reports_what_cannot_run() -> None:
    domain = _domain(100_000, StudyDesign.RCT)  # n epsilon 8 * 10^4: aipw, as the ate default
    plan = anchor.plan_ate_anchor(domain, 0.8, 8e-7)
    assert plan.params == anchor.ate_anchor_params(domain, 0.8, 8e-7)
    assert isinstance(plan.params, ate_strict.AteStrictParams)
    assert plan.params.mean_share == anchor.ANCHOR_MEAN_SHARE  # only the estimate is used
    assert (plan.epsilon, plan.delta) == (0.8, 8e-7)
    assert all(e.module.startswith("anchor/") for e in plan.events())
    assert sum(plan.fold_sizes().values()) == 100_000
    assert plan.public()["estimator"] == "aipw"
    with pytest.raises(InvalidParameters, match="anchor"):
        anchor.plan_ate_anchor(domain, 0.8, 0.5)  # delta far above 1 / n


@pytest.mark.parametrize(("n", "epsilon"), [(5000, 0.8), (20000, 2.4), (1000, 4.0)])
def test_a_trial_anchor_below_the_rule_is_the_difference_in_means_and_spends_no_delta(
    n: int, epsilon: float
) -> None:
    """Below n epsilon = 5 * 10^4 (the anchor's own epsilon) a trial's anchor is the ate
    default there, the DP difference in means: pure epsilon, so the CATE's own modules keep the
    whole delta and anchor plus rest is the request exactly."""
    domain = _domain(n, StudyDesign.RCT)
    share = anchor.ate_anchor_share(domain, epsilon, 1e-6)
    assert share is not None
    plan, epsilon_rest, delta_rest = anchor.split_for_anchor(domain, epsilon, 1e-6, share)
    assert isinstance(plan.params, ate_rct.AteRctParams)
    assert plan.params == anchor.ate_default_params(domain, plan.epsilon)
    assert plan.delta == 0.0
    assert delta_rest == 1e-6
    assert plan.epsilon + epsilon_rest == epsilon
    assert plan.epsilon == ate_strict.split_share(epsilon, share)[0]
    assert [e.type for e in plan.events()] == ["laplace"] * 3
    assert plan.n2 == n
    assert sum(plan.fold_sizes().values()) == n
    assert plan.public()["estimator"] == "rct_difference"
    # observational designs keep aipw at every size, and split delta with the anchor
    obs = _domain(n, StudyDesign.OBSERVATIONAL)
    plan, _, delta_rest = anchor.split_for_anchor(obs, epsilon, 1e-6, 0.95)
    assert isinstance(plan.params, ate_strict.AteStrictParams)
    assert plan.delta + delta_rest == 1e-6
    assert plan.delta > 0.0


def test_the_trial_anchor_runs_the_difference_in_means_and_releases_its_interval() -> None:
    """draw_ate_anchor on a trial below the rule: the ate_rct release's estimate and its own
    interval (both post-processing), on a sample with a known effect."""
    rng = np.random.default_rng(11)
    n = 4000
    x = rng.uniform(0.0, 1.0, size=(n, 10))
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(20.0 + 5.0 * a + rng.normal(0.0, 4.0, size=n), 0.0, 60.0)
    domain = _domain(n, StudyDesign.RCT)
    plan = anchor.plan_ate_anchor(domain, 4.0, 1e-6)
    estimate, interval = anchor.draw_ate_anchor(
        Arrays(x, a, y), domain, plan, rng=rng, noise=SeededSampler(rng), progress=lambda *_: None
    )
    assert abs(estimate - 5.0) < 0.6
    assert interval["lower"] < estimate < interval["upper"]
    assert interval["upper"] - interval["lower"] < 1.5
    assert interval["level"] == 0.95


def test_the_effect_fold_anchors_quantile_event_states_its_own_share_and_epsilon() -> None:
    """The observational anchor's quantile takes ANCHOR_QUANTILE_SHARE of the anchor's epsilon;
    its ledger event says so (not the ate module's adaptive-clip share) and charges exactly it."""
    plan, events = anchor.plan_anchor(
        "dr", 0.4, 1e-7, outcome_range=60.0, propensity_clip=0.05, dr_bound=18.0, n2=5000
    )
    quantile, _ = events
    assert quantile.type == "exponential_quantile"
    assert quantile.params["share_of_anchor_epsilon"] == anchor.ANCHOR_QUANTILE_SHARE
    assert "share_of_estimation_epsilon" not in quantile.params
    assert quantile.epsilon == pytest.approx(0.4 * anchor.ANCHOR_QUANTILE_SHARE)
    assert plan.quantile_epsilon == quantile.epsilon
    assert quantile.epsilon + plan.epsilon == pytest.approx(0.4)
    estimation = ate_strict.quantile_event(0.1, 18.0, 5000)
    assert estimation.params["share_of_estimation_epsilon"] == ate_strict.ADAPTIVE_CLIP_SHARE


def test_the_anchor_takes_the_nuisance_class_of_the_ate_release_at_the_whole_budget() -> None:
    """Observational, 10 covariates, n 2500 at eps 4 (n eps = 10 000, the DP-EBM switch for 10
    covariates): the anchor at 95 % of eps (n eps_a = 9500) gets DP-EBM models like the ``ate``
    release at the whole budget, not the DP linear ones of an ``ate`` request at eps_a;
    cross-fitting and folds follow its own budget. The CATE kinds' plans pass their whole
    epsilon."""
    from service.mechanisms import cate_vector as cv

    domain = _domain(2500, StudyDesign.OBSERVATIONAL)
    threshold = ate_strict.linear_nuisance_threshold(10)
    assert 0.95 * 2500 * 4.0 < threshold <= 2500 * 4.0
    share = anchor.ate_anchor_share(domain, 4.0, 1e-6)
    assert share == 0.95
    eps_a, delta_a = ate_strict.split_share(4.0, share)[0], ate_strict.split_share(1e-6, share)[0]
    assert ate_strict.default_params(domain, eps_a, delta_a).nuisance == "dp_linear"
    assert ate_strict.default_params(domain, 4.0).nuisance == "dp_ebm"
    plan = anchor.plan_ate_anchor(domain, eps_a, delta_a, 4.0)
    assert plan.params.nuisance == "dp_ebm"
    assert plan.params.cross_fit == ate_strict.default_cross_fit(domain, "dp_ebm", None, eps_a)
    assert plan.epsilon == pytest.approx(eps_a)
    state = cv.make_plan(
        domain,
        cv.CateVectorParams(points=[[0.5] * 10], epsilon=4.0, delta=1e-6, anchor=True),
    )
    assert state.anchor is not None
    assert state.anchor.params.nuisance == "dp_ebm"


def test_the_anchor_interval_inflates_the_noisy_variance_and_stays_in_the_public_range() -> None:
    """anchor_interval: ``estimate +- z sqrt((V_hat + z_0.95 s_2) / n2 + s_theta^2)`` from the
    release's DP outputs, ends clipped to [-bound, bound]."""
    out = {
        "estimate": 1.5,
        "variance_estimate": 9.0,
        "s_2": 4.0,
        "s_theta": 0.05,
        "n2": 1000,
        "ci_level": 0.95,
    }
    interval = anchor.anchor_interval(out, bound=10.0)
    plain = ate_strict.confidence_interval(
        1.5, 9.0 + 1.5**2 - 0.05**2, s_theta=0.05, s_2=4.0, n2=1000, alpha=0.05
    )
    inflated = 1.959964 * np.sqrt((9.0 + 1.644854 * 4.0) / 1000 + 0.05**2)
    assert interval["level"] == 0.95
    assert interval["upper"] - 1.5 == pytest.approx(inflated, rel=1e-5)
    assert 1.5 - interval["lower"] == pytest.approx(inflated, rel=1e-5)
    assert inflated > plain["half_width"]
    clipped = anchor.anchor_interval({**out, "estimate": 9.9}, bound=10.0)
    assert clipped["upper"] == 10.0
    assert clipped["lower"] == pytest.approx(9.9 - inflated, rel=1e-5)


def test_the_anchor_interval_covers_the_trial_effect() -> None:
    """The anchor release (mean share 0.98, so its second moment is noisy) on 40 seeded trials
    (n 2000, eps 0.5, true ATE 1.0): its inflated 95 % interval covers the truth in at least 36
    (binomial at 0.95: fewer than 36 with probability 0.05) and is on average at most 2.2x as
    wide as the interval of the ``ate`` release at the whole budget on the same data (1.84x
    here; 1.6-2.2x on the realistic trials, bench/README.md)."""
    covered, ratios = 0, []
    for seed in range(40):
        arrays, dom = prognostic_rct(2000, 5, seed)
        plan = anchor.plan_ate_anchor(dom, 0.5, 1e-6)
        estimate, interval = anchor.draw_ate_anchor(
            arrays,
            dom,
            plan,
            rng=np.random.default_rng(100 + seed),
            noise=SeededSampler(np.random.default_rng(200 + seed)),
            progress=lambda f, s: None,
        )
        assert interval["lower"] <= estimate <= interval["upper"]
        covered += interval["lower"] <= 1.0 <= interval["upper"]
        whole = ate_strict.run(
            arrays,
            dom,
            to_mechanism_params(AteParams(epsilon=0.5, delta=1e-6), dom),
            rng=np.random.default_rng(300 + seed),
            noise=SeededSampler(np.random.default_rng(400 + seed)),
            progress=lambda f, s: None,
        )
        ratios.append((interval["upper"] - interval["lower"]) / (2 * whole["half_width"]))
    assert covered >= 36, covered
    assert float(np.mean(ratios)) <= 2.2, ratios
