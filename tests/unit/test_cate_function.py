"""The CATE function mechanism: spec §5 vector, noise constants, KRR closed forms, sensitivity."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from service.mechanisms import cate_function as mech
from service.mechanisms import gp
from service.mechanisms.calibration import hall_constant
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled
from service.mechanisms.noise import SeededSampler


def _scale(mode: str, *, q: int = 2, h: float = 0.5, eps: float = 1.0) -> mech.NoiseScale:
    return mech.noise_scale(
        mode=mode,  # type: ignore[arg-type]
        learner="r",
        q=q,
        bandwidth=h,
        lambda0=mech.lambda0_of(1.0, q, h, "normalised"),
        n2=1350,
        epsilon=eps,
        delta=1e-5,
        outcome_range=10.0,
        propensity_bound=0.1,
    )


def test_spec_worked_example() -> None:
    paper = _scale("paper")
    strict = _scale("strict")
    c_q = math.exp(paper.log_cq)
    assert c_q == pytest.approx(0.636620, abs=1e-6)
    assert paper.lambda0 == pytest.approx(1.570796, abs=1e-6)
    assert paper.function_bound == pytest.approx(7.9788, abs=1e-4)
    assert paper.lipschitz == pytest.approx(35.9577, abs=1e-4)
    assert paper.sensitivity_k0 == pytest.approx(0.016957, abs=1e-6)
    # Delta in K terms (L kappa / (lambda n)) = Delta_k0 / sqrt(c_q).
    assert paper.sensitivity_k0 / math.sqrt(c_q) == pytest.approx(0.021252, abs=1e-6)
    assert paper.r_hall == pytest.approx(0.08378, abs=1e-5)
    assert paper.r_paper == pytest.approx(0.26739, abs=1e-5)
    assert paper.r0 == paper.r_paper
    assert strict.r0 == pytest.approx(0.06326, abs=1e-5)
    assert strict.r0 / math.sqrt(c_q) == pytest.approx(0.079283, abs=1e-6)


@pytest.mark.parametrize(("q", "h"), [(1, 0.408), (2, 0.577), (8, 1.155), (30, 2.236)])
def test_paper_over_hall_ratio(q: int, h: float) -> None:
    s = _scale("paper", q=q, h=h)
    assert s.r_paper is not None
    assert s.r_paper / s.r_hall == pytest.approx(4 * (math.sqrt(2 * math.pi) * h) ** (-q / 2))
    assert s.r0 == max(s.r_paper, s.r_hall)
    conservative = h <= 16 ** (1 / q) / math.sqrt(2 * math.pi)
    assert (s.r_paper >= s.r_hall) == conservative
    assert (q >= 8) == (not conservative)  # the spec's table: too small at q = 8 and 30


def test_conservative_bandwidth_table_and_constants() -> None:
    table = {1: 6.38, 2: 1.60, 8: 0.564, 30: 0.438}
    for q, value in table.items():
        assert 16 ** (1 / q) / math.sqrt(2 * math.pi) == pytest.approx(value, abs=5e-3)
    assert hall_constant(1e-5) == pytest.approx(4.9409, abs=1e-4)
    assert hall_constant(1e-6) == pytest.approx(5.3868, abs=1e-4)
    assert mech.default_bandwidth(30) == pytest.approx(2.236, abs=1e-3)


def test_paper_mode_uses_analytic_multiplier_at_large_epsilon() -> None:
    s = _scale("paper", eps=10.0)
    assert s.multiplier > hall_constant(1e-5) / 10.0  # c(delta)/eps is invalid at eps = 10


def _data(n: int, q: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, q))
    w = rng.choice([-0.7, 0.3], size=n) + rng.uniform(-0.1, 0.1, size=n)
    r = rng.uniform(-1, 1, size=n)
    return x, r, w


def _objective_gradient(
    alpha: np.ndarray, k: np.ndarray, r: np.ndarray, w: np.ndarray, lam0: float
) -> np.ndarray:
    n = r.size
    g = k @ alpha
    return np.asarray(-(2 / n) * k @ (w * (r - w * g)) + 2 * lam0 * k @ alpha)


def test_krr_closed_form_gradient_vanishes_and_sklearn_mapping() -> None:
    x, r, w = _data(200, 2, 0)
    h, lam0 = 0.5, 0.3
    k = gp.gaussian_kernel(x, x, h)
    alpha = mech.fit_exact(x, r, w, bandwidth=h, lambda0=lam0)
    assert np.max(np.abs(_objective_gradient(alpha, k, r, w, lam0))) < 1e-9
    alpha_dr = mech.fit_exact(x, r, np.ones_like(r), bandwidth=h, lambda0=lam0)
    from sklearn.kernel_ridge import KernelRidge

    model = KernelRidge(kernel="rbf", gamma=1 / (2 * h * h), alpha=r.size * lam0).fit(x, r)
    assert np.allclose(model.dual_coef_, alpha_dr, atol=1e-8)


def test_rkhs_sensitivity_bound_on_vertex_neighbours() -> None:
    n, q, h, lam0 = 150, 2, 0.5, 0.2
    bound_r = 1.0
    big_l = 2 * (bound_r + bound_r / math.sqrt(lam0))
    delta_bound = big_l / (lam0 * n)
    rng = np.random.default_rng(2)
    worst = 0.0
    for trial in range(20):
        x, r, w = _data(n, q, 100 + trial)
        w = np.clip(np.abs(w), 0.1, 1.0) * np.sign(w)
        x2, r2, w2 = x.copy(), r.copy(), w.copy()
        i = int(rng.integers(n))
        x2[i] = rng.integers(0, 2, size=q).astype(float)  # a box vertex
        r2[i], w2[i] = rng.choice([-1.0, 1.0]), rng.choice([-1.0, 1.0])
        a1 = mech.fit_exact(x, r, w, bandwidth=h, lambda0=lam0)
        a2 = mech.fit_exact(x2, r2, w2, bandwidth=h, lambda0=lam0)
        support = np.vstack([x, x2[i : i + 1]])
        diff = np.concatenate([a1, [0.0]])
        diff[:n] -= np.where(np.arange(n) == i, 0.0, a2)
        diff[n] -= a2[i]
        norm = math.sqrt(max(diff @ gp.gaussian_kernel(support, support, h) @ diff, 0.0))
        worst = max(worst, norm)
    assert worst <= delta_bound


def _domain(n: int = 1200, *, paper: bool = False) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(2),
        x_upper=np.array([1.0, 2.0]),
        y_lower=-1.0,
        y_upper=1.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
        allow_paper_mode=paper,
    )


def test_plan_refuses_paper_mode_and_bad_params() -> None:
    with pytest.raises(PaperModeDisabled):
        mech.plan(
            _domain(), mech.CateFunctionParams(epsilon=1, delta=1e-5, mode="paper", nuisance="none")
        )
    with pytest.raises(InvalidParameters):
        mech.plan(_domain(), mech.CateFunctionParams(epsilon=1, delta=0.5, nuisance="none"))
    record = mech.plan(
        _domain(paper=True),
        mech.CateFunctionParams(epsilon=1, delta=1e-5, mode="paper", nuisance="none"),
    ).record
    assert str(record.guarantee) == "paper"


def _rct_rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An RCT on the test domain's box with CATE 0.5 x0 and outcomes in [-1, 1]."""
    x = np.column_stack([rng.uniform(0, 1, n), rng.uniform(0, 2, n)])
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(0.5 * a * x[:, 0] + rng.normal(0, 0.1, n), -1, 1)
    return x, a, y


@pytest.mark.parametrize("basis", ["exact", "nystrom", "rff"])
def test_run_end_to_end_learns_the_cate(basis: str) -> None:
    """A strict run at a large epsilon learns the known CATE 0.5 x0 better than the best constant
    (RMSE at most 0.9 of the constant's; GP noise drawn at fresh points for the exact basis),
    releases no coefficients in its public result, and survives a storage round trip."""
    rng = np.random.default_rng(0)
    n = 3000
    x, a, y = _rct_rows(rng, n)
    params = mech.CateFunctionParams(
        epsilon=100.0,
        delta=1e-5,
        nuisance="none",
        basis=basis,  # type: ignore[arg-type]
        learner="r",
        n_centres=64,
        n_features=64,
        regularization=0.1,
        lambda_convention="unnormalised",
    )
    result, fitted = mech.run(
        Arrays(x, a, y),
        _domain(n),
        params,
        rng=rng,
        noise=SeededSampler(rng),
        progress=lambda *_: None,
    )
    assert result["guarantee"] == "strict"
    assert "coef" not in result
    assert "support" not in result
    pts = rng.uniform(size=(300, 2))
    if fitted.kind == "gp":
        path = mech.start_path(fitted, 2, 1000)
        values = fitted.released(
            fitted.mean(pts), path.draw(pts, normals=rng.standard_normal).values
        )
    else:
        values = fitted.released(fitted.mean(pts))
    truth = 0.5 * pts[:, 0]
    assert result["shrinkage"] == "ate"
    assert abs(result["ate_anchor"] - 0.25) < 0.05  # the DP ATE anchor (true ATE 0.25)
    assert result["shrinkage_factor"] > 0.5  # strong, detectable heterogeneity kept
    rmse = float(np.sqrt(np.mean((values - truth) ** 2)))
    constant = float(np.std(truth))
    assert rmse <= 0.9 * constant, (rmse, constant)
    again = mech.FittedFunction.from_bytes(fitted.to_bytes())
    assert np.array_equal(again.mean(pts), fitted.mean(pts))


@pytest.mark.parametrize("basis", ["nystrom", "rff"])
def test_released_values_are_clipped_to_the_public_cate_range(basis: str) -> None:
    """At a tiny epsilon the noise dwarfs R_Y = 2; every released value stays in [-2, 2], the
    bound survives storage, and a function stored before the bound existed is not clipped."""
    rng = np.random.default_rng(1)
    n = 1200
    x, a, y = _rct_rows(rng, n)
    params = mech.CateFunctionParams(
        epsilon=0.01,
        delta=1e-5,
        nuisance="none",
        basis=basis,  # type: ignore[arg-type]
        n_centres=64,
        n_features=64,
        regularization=0.01,  # explicit and small: noise far beyond R_Y
        lambda_convention="unnormalised",
    )
    result, fitted = mech.run(
        Arrays(x, a, y),
        _domain(n),
        params,
        rng=rng,
        noise=SeededSampler(rng),
        progress=lambda *_: None,
    )
    assert result["value_bound"] == 2.0
    pts = rng.uniform(size=(2000, 2)) * np.array([1.0, 2.0])
    raw = fitted.mean(pts)
    assert np.max(np.abs(raw)) > 2.0  # the noise really exceeds the range
    released = fitted.round_output(raw)
    assert np.max(np.abs(released)) <= 2.0
    inside = np.abs(raw) < 1.9
    assert np.allclose(released[inside], raw[inside], atol=2.0**fitted.output_lattice_exponent)
    again = mech.FittedFunction.from_bytes(fitted.to_bytes())
    assert np.array_equal(again.round_output(raw), released)
    legacy = mech.FittedFunction.from_bytes(
        mech.FittedFunction(
            fitted.kind,
            fitted.bandwidth,
            fitted.r0,
            fitted.support,
            fitted.coef,
            fitted.output_lattice_exponent,
        )
        .to_bytes()
        .replace(b"value_bound", b"unused_key_")
    )
    assert legacy.value_bound == math.inf


@pytest.mark.parametrize("epsilon", [0.5, 4.0, 50.0])
def test_anchored_default_regularization_targets_half_the_default_heterogeneity(
    epsilon: float,
) -> None:
    """shrinkage "ate": the smallest grid lambda0 whose pointwise noise sd is at most
    0.5 R_Y / 24, else the largest; more epsilon never means more regularisation."""
    domain = PublicDomain(
        x_lower=np.zeros(3),
        x_upper=np.ones(3),
        y_lower=0.0,
        y_upper=48.0,
        n=20000,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    state = mech.plan(domain, mech.CateFunctionParams(epsilon=epsilon, delta=1e-6, nuisance="none"))
    target = 0.5 * 48.0 / 24.0
    chosen = state.scale.lambda0
    assert state.anchor is not None
    if state.scale.r0 > target:
        assert chosen == max(mech.DEFAULT_LAMBDA0_GRID)
    for lam in [lam for lam in mech.DEFAULT_LAMBDA0_GRID if lam < chosen]:
        explicit = mech.plan(
            domain,
            mech.CateFunctionParams(
                epsilon=epsilon,
                delta=1e-6,
                nuisance="none",
                regularization=lam,
                lambda_convention="unnormalised",
            ),
        )
        assert explicit.scale.r0 > target
    # more budget never buys more regularisation (the old rule held the noise at its cap)
    larger = mech.plan(
        domain, mech.CateFunctionParams(epsilon=2 * epsilon, delta=1e-6, nuisance="none")
    )
    assert larger.scale.lambda0 <= chosen


@pytest.mark.parametrize("q", [2, 30])
def test_default_regularization_is_a_public_rule(q: int) -> None:
    """Omitted regularization: the smallest grid lambda0 whose public pointwise noise sd is at
    most 0.2 R_Y (never the paper's normalised lambda = 1, which is lambda0 = 2.9e22 at q = 30)."""
    domain = PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.ones(q),
        y_lower=-2.0,
        y_upper=3.0,
        n=4000,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    base = mech.CateFunctionParams(epsilon=1.0, delta=1e-5, nuisance="none", shrinkage="none")
    state = mech.plan(domain, base)
    chosen = state.scale.lambda0
    assert chosen in mech.DEFAULT_LAMBDA0_GRID
    limit = mech.DEFAULT_NOISE_SD_FRACTION * domain.outcome_range
    assert state.scale.r0 <= limit
    smaller = [lam for lam in mech.DEFAULT_LAMBDA0_GRID if lam < chosen]
    for lam in smaller:  # every smaller candidate is noisier than the limit
        explicit = mech.plan(
            domain, replace(base, regularization=lam, lambda_convention="unnormalised")
        )
        assert explicit.scale.r0 > limit
    assert chosen == 0.1  # n = 4000, eps = 1, R_Y = 5 (the bench.functions setting)
    public = mech.public_parameters(state)
    assert public["lambda0"] == chosen
    assert public["lambda_convention"] == "unnormalised"
    # An explicit value is honoured in its convention.
    paper = mech.plan(domain, replace(base, regularization=1.0))
    assert paper.scale.lambda0 == pytest.approx(
        1.0 / math.exp(mech.log_cq(q, mech.default_bandwidth(q))), rel=1e-9
    )


def test_a_given_anchor_costs_nothing_and_is_the_released_anchor() -> None:
    """shrinkage "ate" with a public anchor (e.g. an ATE release's estimate): no anchor events,
    the GP at the whole (epsilon, delta), and the answers shrink towards the given value."""
    rng = np.random.default_rng(4)
    n = 1200
    x, a, y = _rct_rows(rng, n)
    base = mech.CateFunctionParams(
        epsilon=1.0, delta=1e-5, nuisance="none", basis="nystrom", n_centres=32
    )
    given = replace(base, anchor=0.3)
    state = mech.plan(_domain(n), given)
    assert [e.type for e in state.record.events] == ["gaussian_process"]
    assert state.record.events[0].epsilon == 1.0
    bought = mech.plan(_domain(n), base)
    # the bought anchor: the trial's DP difference in means (n epsilon 1200), pure epsilon
    assert [e.type for e in bought.record.events] == ["laplace"] * 3 + ["gaussian_process"]
    assert all(e.module.startswith("anchor/") for e in bought.record.events[:-1])
    assert bought.record.events[-1].delta == 1e-5
    assert state.scale.r0 < bought.scale.r0 or state.scale.lambda0 < bought.scale.lambda0
    result, fitted = mech.run(
        Arrays(x, a, y),
        _domain(n),
        given,
        rng=rng,
        noise=SeededSampler(rng),
        progress=lambda *_: None,
    )
    assert result["anchor_given"] is True
    assert result["ate_anchor"] == fitted.anchor == 0.3
    assert 0.0 <= result["shrinkage_factor"] <= 1.0
    for bad in (
        replace(base, anchor=5.0),  # outside [-R_Y, R_Y] = [-2, 2]
        replace(base, anchor=float("nan")),
        replace(base, anchor=0.3, shrinkage="none"),
    ):
        with pytest.raises(InvalidParameters, match="anchor"):
            mech.plan(_domain(n), bad)


@pytest.mark.parametrize("design", [StudyDesign.RCT, StudyDesign.OBSERVATIONAL])
@pytest.mark.parametrize("epsilon", [0.5, 4.0])
def test_the_bought_anchor_is_the_strict_ate_default_on_all_rows(
    design: StudyDesign, epsilon: float
) -> None:
    """proof §7 step 1: the anchor is the ``ate`` kind's default release at the anchor's share of
    (epsilon, delta) on all n rows; it composes sequentially with the function's folds, whose
    own events compose by the Theorem 6 max, so the record's cost is exactly (epsilon, delta)."""
    from service.mechanisms import anchor as anchor_lib
    from service.mechanisms import ate_rct, ate_strict
    from service.mechanisms.records import Composition

    n = 6000
    domain = replace(
        _domain(n),
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )
    state = mech.plan(domain, mech.CateFunctionParams(epsilon=epsilon, delta=1e-6))
    assert state.anchor is not None
    share = state.anchor_share
    eps_a, eps_g = ate_strict.split_share(epsilon, share)
    delta_a = ate_strict.split_share(1e-6, share)[0]
    assert state.anchor.params == anchor_lib.ate_anchor_params(domain, eps_a, delta_a)
    if design == StudyDesign.RCT:
        # n epsilon 3000 / 24 000: the ate default there, the DP difference in means (pure
        # epsilon: the function keeps the whole delta)
        assert isinstance(state.anchor.params, ate_rct.AteRctParams)
        assert (state.anchor.epsilon, state.anchor.delta) == (eps_a, 0.0)
    else:
        assert (state.anchor.epsilon, state.anchor.delta) == (eps_a, delta_a)
    record = state.record
    assert record.composition == Composition.ANCHOR_THEN_THEOREM6_MAX
    anchor_events = [e for e in record.events if e.module.startswith("anchor/")]
    assert anchor_events
    assert all(
        e.params["anchor_composition"] == str(state.anchor.record.composition)
        for e in anchor_events
    )
    rest: dict[str, list[float]] = {}
    for event in record.events:
        if not event.module.startswith("anchor/"):
            rest.setdefault(event.module, []).append(event.epsilon)
    # every function module (nuisance folds included: the anchor read their rows too) spends
    # exactly the rest
    for spent in rest.values():
        assert math.fsum(spent) == pytest.approx(eps_g, rel=1e-12)
    assert state.anchor.epsilon + eps_g == pytest.approx(record.epsilon, rel=1e-12)
    assert (record.epsilon, record.delta) == (epsilon, 1e-6)
    # each function module spends the rest of delta (all of it after a pure-epsilon anchor)
    spent_delta: dict[str, float] = {}
    for event in record.events:
        if not event.module.startswith("anchor/"):
            spent_delta[event.module] = spent_delta.get(event.module, 0.0) + event.delta
    for value in spent_delta.values():
        assert state.anchor.delta + value == pytest.approx(1e-6, rel=1e-12)
    # the anchor's rows are all n: its folds are listed beside the function's
    anchor_rows = sum(v for k, v in record.fold_sizes.items() if k.startswith("anchor/"))
    assert anchor_rows == n
    public = mech.public_parameters(state)["anchor_release"]
    assert public["kind"] == "ate"
    assert public["epsilon"] == eps_a


def test_the_default_without_room_for_an_anchor_does_not_shrink() -> None:
    """At the smallest epsilon the anchor's share is below the ate minimum: the default falls
    back to no shrinkage (public epsilon only); an explicit shrinkage 'ate' is refused."""
    domain = _domain(1200)
    state = mech.plan(domain, mech.CateFunctionParams(epsilon=0.01, delta=1e-5))
    assert state.anchor is None
    assert not state.shrinks
    assert not any(e.module.startswith("anchor/") for e in state.record.events)
    assert state.record.events[-1].epsilon == 0.01  # the GP has the whole budget
    with pytest.raises(InvalidParameters, match="anchor"):
        mech.plan(domain, mech.CateFunctionParams(epsilon=0.01, delta=1e-5, shrinkage="ate"))
