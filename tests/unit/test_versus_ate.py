"""The CATE quotes' verdict against the constant ATE (service.mechanisms.versus_ate)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms import versus_ate
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.releases.kinds import REGISTRY


def _domain(n: int, design: StudyDesign = StudyDesign.OBSERVATIONAL) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(3),
        x_upper=np.ones(3),
        y_lower=0.0,
        y_upper=48.0,
        n=n,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )


def test_verdict_thresholds_and_default_assumption() -> None:
    domain = _domain(5000)
    h = versus_ate.default_heterogeneity_sd(domain)
    assert h == 48.0 / 24.0
    cases = (
        (h, "not_expected"),
        (0.99 * h, "marginal"),
        (0.5 * h, "marginal"),
        (0.49 * h, "possible"),
    )
    for noise, verdict in cases:
        out = versus_ate.versus_ate(noise, domain, 1.0, heterogeneity_sd=None, epsilon_worth_it=3.0)
        assert out["verdict"] == verdict
        assert out["heterogeneity_sd_assumed"] is True
        assert out["expected_pehe_lower_bound"] == noise
        assert out["prediction_noise_sd"] == noise
    stated = versus_ate.versus_ate(1.0, domain, 1.0, heterogeneity_sd=5.0, epsilon_worth_it=None)
    assert stated["verdict"] == "possible"
    assert stated["heterogeneity_sd"] == 5.0
    assert stated["heterogeneity_sd_assumed"] is False
    refused = versus_ate.versus_ate(9.0, domain, 1.0, heterogeneity_sd=None, epsilon_worth_it=4.2)
    assert "request the ATE instead, or epsilon >= 4.2" in refused["message"]


def test_epsilon_search_finds_the_smallest_epsilon_that_is_enough() -> None:
    def noise(epsilon: float) -> float:
        return 10.0 / epsilon

    found = versus_ate.epsilon_for_noise_sd(noise, 1.0, minimum=0.01, maximum=100.0)
    assert found is not None
    assert noise(found) <= 1.0
    assert 10.0 <= found <= 10.0 * 1.001
    assert versus_ate.epsilon_for_noise_sd(noise, 0.01, minimum=0.01, maximum=100.0) is None
    assert versus_ate.epsilon_for_noise_sd(noise, 5000.0, minimum=0.01, maximum=100.0) == 0.01


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        # the raw function: anchored, the default rule trades noise for regularisation bias
        ("cate_function", {"shrinkage": "none"}),
        ("cate_vector", {"points": [[0.2, 0.5, 0.9], [0.7, 0.1, 0.3], [0.5, 0.5, 0.5]]}),
        ("ebm_cate", {}),
        ("uplift_table", {}),
    ],
)
def test_every_cate_quote_states_its_verdict_and_worsens_as_epsilon_falls(
    kind: str, extra: dict[str, object]
) -> None:
    domain = _domain(20_000, StudyDesign.RCT)
    release_kind = REGISTRY[kind]
    quotes = {
        epsilon: release_kind.quote(
            release_kind.Params.model_validate({"epsilon": epsilon, **extra}), domain
        )["versus_ate"]
        for epsilon in (0.05, 50.0)
    }
    low, high = quotes[0.05], quotes[50.0]
    if kind != "cate_vector":
        assert low["verdict"] == "not_expected"
        assert low["expected_pehe_lower_bound"] >= low["heterogeneity_sd"]
    # cate_vector's public ridge rule caps the noise by shrinking harder (toward its ATE anchor),
    # so its noise stays small at tiny epsilon; the noise still falls as epsilon grows (an
    # anchored release's bound is capped at the constant's PEHE, so it may stay there)
    if low["anchored"] and high["expected_pehe_lower_bound"] == low["heterogeneity_sd"]:
        assert low["expected_pehe_lower_bound"] == low["heterogeneity_sd"]
    else:
        assert high["expected_pehe_lower_bound"] < low["expected_pehe_lower_bound"]
    if low["epsilon_worth_it"] is not None:
        worth = release_kind.quote(
            release_kind.Params.model_validate({"epsilon": low["epsilon_worth_it"], **extra}),
            domain,
        )["versus_ate"]
        assert worth["expected_pehe_lower_bound"] <= 0.5 * worth["heterogeneity_sd"] * (1 + 1e-9)
    # the largest heterogeneity there can be (sd(tau) <= R_Y): a verdict no worse than at the
    # default assumption
    stated = release_kind.quote(
        release_kind.Params.model_validate(
            {"epsilon": 0.05, "expected_heterogeneity_sd": domain.outcome_range, **extra}
        ),
        domain,
    )["versus_ate"]
    rank = {"not_expected": 0, "marginal": 1, "possible": 2}
    assert rank[stated["verdict"]] >= rank[low["verdict"]]
    assert stated["heterogeneity_sd"] == domain.outcome_range
    assert stated["heterogeneity_sd_assumed"] is False


def test_cate_vector_noise_is_the_expected_rms_over_the_feature_draw() -> None:
    """The quoted RMS noise matches a Monte Carlo over the public random-feature draw."""
    from service.mechanisms import cate_vector
    from service.releases.kinds.cate_vector import CateVectorRequest, to_mechanism_params

    domain = _domain(20_000, StudyDesign.RCT)
    points = [[0.2, 0.5, 0.9], [0.7, 0.1, 0.3], [0.0, 1.0, 0.5]]
    params = to_mechanism_params(CateVectorRequest(points=points, epsilon=1.0), domain)
    sigma = cate_vector.make_plan(domain, params).theta.sigma  # type: ignore[union-attr]
    rng = np.random.default_rng(4)
    squares = []
    for _ in range(400):
        feature_map = cate_vector.FeatureMap.draw(
            domain, params.n_features, params.lengthscale, rng
        )
        phi = feature_map(np.asarray(points))
        squares.append(np.mean(np.sum(phi * phi, axis=1)))
    expected = sigma * math.sqrt(float(np.mean(squares)))
    assert cate_vector.rms_noise_sd(domain, params) == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("cate_function", {}), ("cate_vector", {"points": [[0.2, 0.5, 0.9]]})],
)
def test_anchored_quotes_say_the_release_falls_back_to_its_ate(
    kind: str, extra: dict[str, object]
) -> None:
    domain = _domain(5_000, StudyDesign.RCT)
    release_kind = REGISTRY[kind]

    def block(shrinkage: str | None) -> dict[str, object]:
        params = {
            "epsilon": 1.0,
            **extra,
            **({} if shrinkage is None else {"shrinkage": shrinkage}),
        }
        return release_kind.quote(release_kind.Params.model_validate(params), domain)["versus_ate"]

    default, plain = block(None), block("none")
    assert default["anchored"] is True  # the strict default
    assert "shrunk towards its own DP ATE" in str(default["message"])
    assert plain["anchored"] is False
    assert "shrunk" not in str(plain["message"])


@pytest.mark.parametrize(("q", "regularization"), [(2, 0.1), (2, 3.0), (10, 0.1)])
def test_kernel_retention_is_what_the_ridge_keeps_of_a_linear_effect(
    q: int, regularization: float
) -> None:
    """The public retention equals the share of a noise-free linear effect that the second
    stage's exact kernel ridge keeps on uniform covariates (what the formula models)."""
    import importlib

    from service.mechanisms import gp
    from service.mechanisms.cate_function.function import fit_exact

    quote = importlib.import_module("service.mechanisms.cate_function.quote")
    bandwidth = math.sqrt(q / 6.0)
    rng = np.random.default_rng(q)
    x = rng.uniform(size=(2000, q))
    effect = x[:, 0] - 0.5
    alpha = fit_exact(x, effect, np.ones(x.shape[0]), bandwidth=bandwidth, lambda0=regularization)
    fitted = gp.gaussian_kernel(x, x, bandwidth) @ alpha
    kept = float(np.dot(fitted - fitted.mean(), effect) / np.dot(effect, effect))
    assert quote.kernel_retention(q, bandwidth, regularization) == pytest.approx(kept, rel=0.06)


def test_retention_lowers_the_verdict_and_raises_the_bound() -> None:
    domain = _domain(5000)
    h = versus_ate.default_heterogeneity_sd(domain)
    noise = 0.3 * h

    def block(retention: float | None) -> dict[str, object]:
        return versus_ate.versus_ate(
            noise, domain, 1.0, heterogeneity_sd=None, epsilon_worth_it=None, retention=retention
        )

    assert block(None)["verdict"] == "possible"
    assert block(None)["expected_pehe_lower_bound"] == noise
    assert block(0.5)["verdict"] == "marginal"
    weak = block(0.1)
    assert weak["verdict"] == "not_expected"
    assert weak["learner_retention"] == 0.1
    assert weak["expected_pehe_lower_bound"] == pytest.approx(math.hypot(noise, 0.9 * h))
    assert "its learner can show" in str(weak["message"])


def _many_covariates() -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(36),
        x_upper=np.ones(36),
        y_lower=0.0,
        y_upper=48.0,
        n=20_000,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def test_a_kernel_function_on_many_covariates_is_not_expected_to_beat_the_ate() -> None:
    """36 covariates, n epsilon / q below the ebm basis rule: the kernel function's privacy noise
    is below half the assumed heterogeneity (the old verdict: possible), but at its public
    regularisation the ridge keeps under 1 % of a smooth effect; on the realistic studies its
    shrinkage factor was 0 in every such cell."""
    domain = _many_covariates()
    kind = REGISTRY["cate_function"]
    quoted = kind.quote(kind.Params.model_validate({"epsilon": 1.0}), domain)
    block = quoted["versus_ate"]
    assert quoted["basis"] == "exact"
    assert quoted["pointwise_noise_sd"] < 0.5 * block["heterogeneity_sd"]
    assert quoted["learner_signal_retention"] == block["learner_retention"] < 0.01
    assert block["verdict"] == "not_expected"


@pytest.mark.parametrize(
    ("kind", "switched", "extra"),
    [("cate_function", "basis", {}), ("cate_vector", "estimator", {"points": [[0.5] * 36]})],
)
def test_the_epsilon_worth_it_follows_the_default_rule_to_the_ebm_release(
    kind: str, switched: str, extra: dict[str, object]
) -> None:
    """Below the rule's threshold the kernel / ridge release is not worth it at any epsilon; the
    epsilon the quote recommends is one where the same request resolves to the ebm release,
    whose own quote then meets the worth-it criterion."""
    domain = _many_covariates()
    release_kind = REGISTRY[kind]
    low = release_kind.quote(release_kind.Params.model_validate({"epsilon": 1.0, **extra}), domain)
    assert low[switched] != "ebm"
    worth = low["versus_ate"]["epsilon_worth_it"]
    assert worth is not None
    assert worth > 1.0
    high = release_kind.quote(
        release_kind.Params.model_validate({"epsilon": worth, **extra}), domain
    )
    assert high[switched] == "ebm"
    block = high["versus_ate"]
    assert block["expected_pehe_lower_bound"] <= 0.5 * block["heterogeneity_sd"] * (1 + 1e-9)


def test_an_anchored_release_is_bounded_by_the_constant_not_by_its_noise() -> None:
    """An anchored release (shrinkage "ate") falls back to its DP ATE where the noise hides the
    heterogeneity, so its bound is min(noise, h): the unanchored bound where the noise is
    small, the constant's PEHE where it is large; the verdict is the same either way."""
    from pydantic import BaseModel

    from service.releases.kinds.base import versus_ate_block

    class Request(BaseModel):
        epsilon: float
        expected_heterogeneity_sd: float | None = None

    domain = _domain(5000)
    h = versus_ate.default_heterogeneity_sd(domain)
    for noise in (0.2 * h, 70.0 * h):
        plain = versus_ate_block(Request(epsilon=1.0), domain, lambda r, s=noise: s)
        anchored = versus_ate_block(
            Request(epsilon=1.0), domain, lambda r, s=noise: s, anchored=True
        )
        assert plain["expected_pehe_lower_bound"] == noise
        assert anchored["expected_pehe_lower_bound"] == pytest.approx(min(noise, h))
        assert anchored["verdict"] == plain["verdict"]
    # through a kind: the default ebm_cate quote at small n eps on 36 covariates is anchored
    ebm = REGISTRY["ebm_cate"]
    quoted = ebm.quote(ebm.Params.model_validate({"epsilon": 1.0}), _many_covariates())
    block = quoted["versus_ate"]
    assert block["anchored"] is True
    assert block["verdict"] == "not_expected"
    assert block["expected_pehe_lower_bound"] == pytest.approx(block["heterogeneity_sd"])


@pytest.mark.parametrize("ratio", [0.7, 3.0])  # marginal, not_expected
def test_an_anchored_message_does_not_say_the_constant_is_more_accurate(ratio: float) -> None:
    """Where the noise hides the heterogeneity an anchored release answers about its DP ATE:
    its message says it will not resolve the heterogeneity and falls back, never that the
    constant ATE is more accurate (the unanchored message), and still names the epsilon that
    would make it worth it."""
    domain = _domain(5000)
    h = versus_ate.default_heterogeneity_sd(domain)
    common = {"heterogeneity_sd": None, "epsilon_worth_it": 7.5}
    plain = versus_ate.versus_ate(ratio * h, domain, 1.0, **common)
    anchored = versus_ate.versus_ate(ratio * h, domain, 1.0, anchored=True, **common)
    assert anchored["verdict"] == plain["verdict"] != "possible"
    assert "request the ATE instead" in plain["message"]
    assert "accurate for a typical patient" in plain["message"]
    message = anchored["message"]
    assert "accurate for a typical patient;" not in message
    assert "request the ATE instead" not in message
    assert "not expected to resolve it" in message
    assert "shrunk towards its own DP ATE" in message
    assert "epsilon >= 7.5" in message
    assert anchored["expected_pehe_lower_bound"] == pytest.approx(min(ratio * h, h))
    unreachable = versus_ate.versus_ate(
        ratio * h, domain, 1.0, anchored=True, heterogeneity_sd=None, epsilon_worth_it=None
    )
    assert "no epsilon up to the maximum" in unreachable["message"]


def test_an_anchored_quote_states_the_noise_beside_its_smaller_bound() -> None:
    domain = PublicDomain(
        x_lower=np.zeros(2), x_upper=np.ones(2), y_lower=0.0, y_upper=48.0, n=1000
    )
    out = versus_ate.versus_ate(
        5.0, domain, 1.0, heterogeneity_sd=None, epsilon_worth_it=None, anchored=True
    )
    assert out["prediction_noise_sd"] == 5.0
    assert out["expected_pehe_lower_bound"] == out["heterogeneity_sd"] == 2.0


def _ebm_quote(n: int, epsilon: float, columns: list[int] | None = None) -> dict[str, object]:
    domain = PublicDomain(x_lower=np.zeros(30), x_upper=np.ones(30), y_lower=0.0, y_upper=60.0, n=n)
    params: dict[str, object] = {"epsilon": epsilon}
    if columns is not None:
        params["effect_columns"] = columns
    return REGISTRY["ebm_cate"].quote(params, domain)


def test_the_detectable_heterogeneity_solves_the_calibration_test() -> None:
    """A walkthrough's statistician got `possible` three times and three constants: the
    calibration step (proof step 6.4) had no power at their heterogeneity. The quote names the
    smallest sd(tau) it detects with 80 % probability: plugged back into the test statistic's
    expectation it gives z(0.99) + z(0.8); it falls as epsilon and n grow."""
    from scipy.special import ndtri

    from service.mechanisms import ebm_cate
    from service.mechanisms.ate_strict.quote import assumed_pseudo_outcome_sd

    domain = PublicDomain(
        x_lower=np.zeros(30), x_upper=np.ones(30), y_lower=0.0, y_upper=60.0, n=20000
    )
    quoted = REGISTRY["ebm_cate"].quote({"epsilon": 1.0, "effect_columns": [0, 1, 2]}, domain)
    found = ebm_cate.detectable_heterogeneity_sd(domain, quoted)
    assert found is not None
    m, sigma = float(quoted["calibration_rows"]), float(quoted["calibration_noise_sd"])
    v = min(assumed_pseudo_outcome_sd(domain), float(quoted["pseudo_outcome_clip"])) ** 2
    s = ebm_cate.prediction_noise_sd(domain, quoted)
    t = m * found**2 / math.sqrt(m * (found**2 + s**2) * v + sigma**2)
    assert t == pytest.approx(float(ndtri(0.99) + ndtri(0.8)), rel=1e-9)
    d = {
        (n, eps): _ebm_quote(n, eps, [0, 1, 2])["versus_ate"]["detectable_heterogeneity_sd"]
        for n in (20000, 100000)
        for eps in (0.5, 1.0, 4.0)
    }
    assert d[20000, 0.5] > d[20000, 1.0] > d[20000, 4.0]
    assert d[100000, 0.5] > d[100000, 1.0] > d[100000, 4.0]
    assert all(d[100000, eps] < d[20000, eps] for eps in (0.5, 1.0, 4.0))


def test_an_undetectable_heterogeneity_is_not_expected_whatever_the_noise() -> None:
    """At n 20000, eps 1 with 3 named modifiers the noise (0.38) is well below a stated
    heterogeneity of 1.1, but the calibration step detects only about 1.3: the verdict is
    `not_expected`, the message says the release will answer its DP ATE, and the epsilon it
    names is one where the heterogeneity is detectable. At the default assumption (2.5) it
    stays `possible` and says where it stops varying."""
    domain = PublicDomain(
        x_lower=np.zeros(30), x_upper=np.ones(30), y_lower=0.0, y_upper=60.0, n=20000
    )
    kind = REGISTRY["ebm_cate"]
    params = {"epsilon": 1.0, "effect_columns": [0, 1, 2], "expected_heterogeneity_sd": 1.1}
    block = kind.quote(params, domain)["versus_ate"]
    assert block["prediction_noise_sd"] < 0.5 * 1.1
    assert block["detectable_heterogeneity_sd"] > 1.1
    assert block["verdict"] == "not_expected"
    assert "expected to answer its DP ATE for every patient" in block["message"]
    worth = block["epsilon_worth_it"]
    assert worth is not None
    assert worth > 1.0
    at_worth = kind.quote({**params, "epsilon": worth}, domain)["versus_ate"]
    assert at_worth["verdict"] == "possible"
    assert at_worth["detectable_heterogeneity_sd"] < 1.1
    default = kind.quote({"epsilon": 1.0, "effect_columns": [0, 1, 2]}, domain)["versus_ate"]
    assert default["verdict"] == "possible"
    assert "varies at all only where its calibration step detects" in default["message"]
    unanchored = kind.quote({"epsilon": 1.0, "shrinkage": "none"}, domain)["versus_ate"]
    assert unanchored["detectable_heterogeneity_sd"] is None


def test_a_stated_heterogeneity_beyond_the_outcome_range_is_refused() -> None:
    """tau lies in [-R_Y, R_Y]: a re-test's expected_heterogeneity_sd of 1e308 was quoted."""
    from service.mechanisms.errors import InvalidParameters

    domain = _domain(5000, StudyDesign.RCT)
    for kind in ("ebm_cate", "cate_function", "uplift_table"):
        with pytest.raises(InvalidParameters, match="at most the outcome range"):
            REGISTRY[kind].quote({"epsilon": 1.0, "expected_heterogeneity_sd": 1e308}, domain)
        REGISTRY[kind].quote({"epsilon": 1.0, "expected_heterogeneity_sd": 48.0}, domain)


def test_the_quote_says_when_strong_heterogeneity_meets_the_deviation_bound() -> None:
    """An anchored DP-EBM release predicts within anchor +- G (G = K / 4, K = 0.3 R_Y): a
    re-test's sd(tau) 4.0 on R_Y 60 had 30 % of patients beyond G = 4.5, shown at the bound,
    and nothing said so. The quote gives the cap and the share beyond it (normal tau) and
    says so from 10 %; at the default assumption it stays quiet."""
    domain = PublicDomain(
        x_lower=np.zeros(30), x_upper=np.ones(30), y_lower=0.0, y_upper=60.0, n=20000
    )
    kind = REGISTRY["ebm_cate"]
    strong = kind.quote(
        {"epsilon": 4.0, "effect_columns": [0, 1, 2], "expected_heterogeneity_sd": 4.0}, domain
    )["versus_ate"]
    assert strong["deviation_cap"] == pytest.approx(0.25 * 0.3 * 60.0)
    assert strong["capped_share"] == pytest.approx(math.erfc(4.5 / (4.0 * math.sqrt(2.0))))
    assert "lie beyond that and are shown at the bound" in strong["message"]
    default = kind.quote({"epsilon": 4.0, "effect_columns": [0, 1, 2]}, domain)["versus_ate"]
    assert default["capped_share"] < 0.10
    assert "shown at the bound" not in default["message"]


def test_the_effect_fold_sentence_only_where_the_anchor_may_be_the_effect_fold() -> None:
    """A trial walkthrough's quote said its anchor was bought from part of the rows and came
    without an interval, beside anchor_source 'ate_release' (all rows, with an interval)."""
    domain = _domain(20_000, StudyDesign.RCT)
    common = {"heterogeneity_sd": 4.0, "epsilon_worth_it": None, "anchored": True}
    for source, said in (("ate_release", False), ("given", False), ("effect_fold", True)):
        block = versus_ate.versus_ate(0.1, domain, 1.0, anchor_source=source, **common)
        assert ("anchor_source 'effect_fold'" in block["message"]) is said, source
        assert versus_ate.ANCHORED_NOTE in block["message"]
    unknown = versus_ate.versus_ate(0.1, domain, 1.0, **common)
    assert "anchor_source 'effect_fold'" in unknown["message"]
    # the kinds pass what they know: ebm_cate in a trial anchors at an ate release
    kind = REGISTRY["ebm_cate"]
    quoted = kind.quote(kind.Params.model_validate({"epsilon": 1.0}), domain)
    assert quoted["anchor_source"] == "ate_release"
    assert "anchor_source 'effect_fold'" not in quoted["versus_ate"]["message"]


def test_a_tables_anchor_is_described_as_the_tables_own_mean() -> None:
    from dpcurator.cli import render

    table = {"shrinkage_factor": 0.0, "ate_anchor": 1.2, "anchor": "table"}
    text = render._shrinkage(table)
    assert "count-weighted over all rows" in text
    assert "one fold" not in text
    assert "one fold" in render._shrinkage({"shrinkage_factor": 0.0, "ate_anchor": 1.2})
