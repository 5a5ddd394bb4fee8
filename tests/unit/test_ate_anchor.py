"""The whole-data anchor (anchor.plan_ate_anchor, ate_anchor_share): public rules only."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms import anchor, ate_strict
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters


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
    whole = anchor.ate_anchor_error_sd(domain, ate_strict.default_params(domain, epsilon))

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
    domain = _domain(5000, StudyDesign.RCT)
    plan = anchor.plan_ate_anchor(domain, 0.8, 8e-7)
    assert plan.params == anchor.ate_anchor_params(domain, 0.8, 8e-7)
    assert plan.params.mean_share == anchor.ANCHOR_MEAN_SHARE  # only the estimate is used
    assert (plan.epsilon, plan.delta) == (0.8, 8e-7)
    assert all(e.module.startswith("anchor/") for e in plan.events())
    assert sum(plan.fold_sizes().values()) == 5000
    with pytest.raises(InvalidParameters, match="anchor"):
        anchor.plan_ate_anchor(domain, 0.8, 0.5)  # delta far above 1 / n


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
