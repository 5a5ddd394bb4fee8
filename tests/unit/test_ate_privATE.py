"""PrivATE paper mode (ate_ci.md §2): the §2.12 unit constants, refusal, gamma, runs."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.special import ndtri

from service.mechanisms import ate_privATE
from service.mechanisms.ate_privATE import (
    Nuisances,
    PrivateParams,
    gamma_tau_optimizer,
    nrs_constant,
    plan,
    variance_term_coefficient,
)
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled
from service.mechanisms.noise import SeededSampler
from service.mechanisms.records import Guarantee

FORBIDDEN_KEYS = {
    "gamma_tau",
    "gamma_sigma",
    "r",
    "tau_hat",
    "sigma2_hat",
    "sigma2_dp",
    "variance_estimate",
    "noise_scale",
}


def make_domain(n: int = 1000, *, allow: bool = True, q: int = 2) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.ones(q),
        y_lower=-1.0,
        y_upper=4.0,
        n=n,
        allow_paper_mode=allow,
    )


def synthetic(n: int, rng: np.random.Generator, q: int = 2) -> Arrays:
    """Dataset-1-like: pi = clip((1 + x'beta) / 2), Y = A + x'gamma + U[-1, 1]."""
    x = rng.uniform(size=(n, q))
    pi = np.clip((1 + x @ np.full(q, 0.15)) / 2, 0.1, 0.9)
    a = (rng.uniform(size=n) < pi).astype(np.float64)
    y = a + x @ np.full(q, 0.5) + rng.uniform(-1, 1, n)
    return Arrays(x=x, a=a, y=y)


@pytest.mark.parametrize(
    ("n", "epsilon", "delta", "printed_c", "printed_coefficient"),
    [
        (3000, 0.45, 9e-6, 0.05200, 8.1127),
        (3000, 0.05, 1e-6, 0.50807, 774.41),
        (3000, 0.25, 5e-6, 0.09581, 27.540),
        (5735, 0.05, 5e-6, 0.26054, 389.31),
        (5735, 0.125, 5e-6, 0.10422, 62.289),
        (5735, 0.25, 5e-6, 0.05211, 15.572),
        (1000, 0.25, 5e-6, 0.26699, 71.284),
    ],
)
def test_unit_constants_of_section_2_12(
    n: int, epsilon: float, delta: float, printed_c: float, printed_coefficient: float
) -> None:
    c = nrs_constant(n, epsilon, delta)
    decimals = len(repr(printed_c).split(".")[1])
    assert abs(c - printed_c) <= 0.5 * 10.0**-decimals * (1 + 1e-9)
    coefficient = variance_term_coefficient(n, epsilon, delta)
    decimals = len(repr(printed_coefficient).split(".")[1])
    assert abs(coefficient - printed_coefficient) <= 0.5 * 10.0**-decimals * (1 + 1e-9)
    assert coefficient == pytest.approx(n * c * c, rel=1e-12)


def test_normal_quantiles() -> None:
    assert float(ndtri(0.90)) == pytest.approx(1.2815516, abs=5e-8)
    assert float(ndtri(0.95)) == pytest.approx(1.6448536, abs=5e-8)
    assert float(ndtri(0.975)) == pytest.approx(1.9599640, abs=5e-8)


def test_paper_mode_is_refused_unless_enabled() -> None:
    params = PrivateParams(epsilon=1.0, delta=1e-5)
    with pytest.raises(PaperModeDisabled):
        plan(make_domain(allow=False), params)
    with pytest.raises(PaperModeDisabled):
        ate_privATE.quote(make_domain(allow=False), params)
    with pytest.raises(PaperModeDisabled):
        ate_privATE.run(
            synthetic(1000, np.random.default_rng(0)),
            make_domain(allow=False),
            params,
            rng=np.random.default_rng(0),
            noise=SeededSampler(np.random.default_rng(0)),
            progress=lambda f, s: None,
        )


@pytest.mark.parametrize("share", [0.5, 0.9, 0.1, 0.3, 0.77])
def test_budget_split_adds_up_exactly(share: float) -> None:
    for epsilon in (0.1, 0.25, 0.5, 1.0, 3.3):
        record = plan(make_domain(), PrivateParams(epsilon=epsilon, delta=1e-5, ate_share=share))
        first, second = record.events
        assert first.epsilon + second.epsilon == epsilon
        assert first.delta + second.delta == 1e-5
        assert first.epsilon == pytest.approx(share * epsilon, rel=1e-12)
        assert record.guarantee == Guarantee.PAPER
        # only public values in the record (no data-dependent gamma)
        for event in record.events:
            assert set(event.params) == {
                "statistic",
                "noise_constant",
                "noise_scale",
                "gamma_mode",
                "sampler",
            }
        json.dumps(record.to_dict())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epsilon": -1.0}, "epsilon"),
        ({"delta": 0.01}, "delta"),
        ({"ate_share": 1.0}, "ate_share"),
        ({"propensity_clip": 0.001}, "propensity_clip"),
        ({"nuisance": "nn"}, "nuisance"),
        ({"gamma_mode": "exact"}, "gamma_mode"),
    ],
)
def test_invalid_parameters(changes: dict[str, object], message: str) -> None:
    params = replace(PrivateParams(epsilon=1.0, delta=1e-5), **changes)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameters, match=message):
        plan(make_domain(), params)


def test_kernel_preset_has_a_public_size_guard() -> None:
    with pytest.raises(InvalidParameters, match="kernel"):
        plan(make_domain(n=50_000), PrivateParams(epsilon=1.0, delta=1e-6))
    plan(make_domain(n=50_000), PrivateParams(epsilon=1.0, delta=1e-6, nuisance="linear"))


def test_gamma_optimizer_finds_the_supremum_of_a_known_function() -> None:
    """pi = 0.5, mu_a(x) = a + x_0 + x_1: Gamma = 2 (y - mu_a) (+-) + 1, sup at a vertex."""

    def propensity(points: np.ndarray) -> np.ndarray:
        return np.full(points.shape[0], 0.5)

    def outcome(points: np.ndarray, arm: int) -> np.ndarray:
        return np.asarray(np.clip(arm + points[:, 0] + points[:, 1], -1.0, 4.0))

    nuisances = Nuisances(propensity, outcome)
    tau_hat = 1.0
    found = gamma_tau_optimizer(
        nuisances, tau_hat, 2, y_lower=-1.0, y_upper=4.0, rng=np.random.default_rng(0)
    )
    # a = 1, y = -1, x = (1, 1): mu1 = 3, mu0 = 2: Gamma = 1 + 2 (-1 - 3) = -7; |Gamma - 1| = 8
    assert found == pytest.approx(8.0, rel=1e-6)
    assert found <= 2 * 5.0 / 0.1


def test_quote_is_public_and_inverts() -> None:
    domain = make_domain(3000)
    params = PrivateParams(epsilon=0.5, delta=1e-5)
    preview = ate_privATE.quote(domain, params, target_half_width=2.0)
    z = float(ndtri(0.975))
    expected = z * (2 * 5.0 / 0.1) * nrs_constant(3000, 0.25, 5e-6)
    assert preview["expected_half_width"] == pytest.approx(expected, rel=1e-12)
    assert preview["half_width_basis"].startswith("noise_only")
    eps = preview["epsilon_for_target_half_width"]
    assert ate_privATE.quote(domain, replace(params, epsilon=eps))["expected_half_width"] <= 2.0
    assert not FORBIDDEN_KEYS & set(preview)


@pytest.mark.parametrize(
    ("nuisance", "gamma_mode"), [("linear", "optimizer"), ("kernel", "analytic")]
)
def test_seeded_runs(nuisance: str, gamma_mode: str) -> None:
    n = 600
    domain = make_domain(n)
    params = PrivateParams(
        epsilon=4.0,
        delta=1e-5,
        nuisance=nuisance,  # type: ignore[arg-type]
        gamma_mode=gamma_mode,  # type: ignore[arg-type]
    )
    result = ate_privATE.run(
        synthetic(n, np.random.default_rng(1)),
        domain,
        params,
        rng=np.random.default_rng(2),
        noise=SeededSampler(np.random.default_rng(3)),
        progress=lambda f, s: None,
    )
    assert result["guarantee"] == "paper"
    assert result["mode"] == "paper"
    # symmetric around the estimate with the released half-width (paper mode makes no coverage
    # claim: at n = 600 both seeded intervals lie above the true effect 1)
    assert result["ci_upper"] - result["estimate"] == pytest.approx(result["half_width"])
    assert result["estimate"] - result["ci_lower"] == pytest.approx(result["half_width"])
    assert result["half_width"] > 0.0
    assert not FORBIDDEN_KEYS & set(result)
    json.dumps(result)
    if gamma_mode == "analytic":
        z = float(ndtri(0.975))
        r = 2 * 5.0 / 0.1 * nrs_constant(n, 2.0, 5e-6)
        assert result["half_width"] >= z * r * (1 - 1e-12)


def test_optimizer_run_is_near_the_truth_at_large_epsilon() -> None:
    n = 3000
    domain = make_domain(n)
    params = PrivateParams(epsilon=50.0, delta=1e-5, nuisance="linear")
    hits = 0
    for seed in range(4):
        result = ate_privATE.run(
            synthetic(n, np.random.default_rng(10 + seed)),
            domain,
            params,
            rng=np.random.default_rng(seed),
            noise=SeededSampler(np.random.default_rng(20 + seed)),
            progress=lambda f, s: None,
        )
        hits += result["ci_lower"] <= 1.0 <= result["ci_upper"]
        assert abs(result["estimate"] - 1.0) < 0.3
    assert hits >= 3
    assert math.isfinite(result["half_width"])
