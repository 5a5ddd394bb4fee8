"""Shared DP-EBM helpers for the CATE kinds (dp_ebm_learners.md §3, §4, §7).

What it provides:
    * the replace-one DP-EBM accounting (``DpEbmAccounting``, ``dp_ebm_accounting``,
      ``solve_dp_ebm_epsilon_p`` and the interpret hyperparameters), so that every kind
      charges DP-EBM fits by the same epsilon_p rule (README §1.2);
    * ``interpret_guard``: one process-wide lock around every interpret call
      (``warnings.catch_warnings`` is process-global); interpret's *privacy* warnings (fixed
      seed, data-derived bounds or feature types: set by configuration, never by data) become
      ``PrivacyConfigurationError``; every other warning is recorded and ignored, so whether a
      charged release succeeds cannot depend on a warning the data might trigger (issue 13.5);
    * ``fit_classifier`` / ``fit_regressor``: interpret 0.7.8 DP-EBMs with public bounds for
      every feature and the target, all features ``'continuous'``, ``random_state=None``,
      centred regression targets, and interpret's privacy warnings turned into errors; the
      fitted noise scales are checked against the planned mu (``PrivacyConfigurationError``);
    * ``propensity_scores`` / ``outcome_predictions``: the first-stage nuisances shared by
      ``ate_strict``, ``cate_function`` and ``ebm_cate`` (a DP model fitted on its own fold,
      predicted at another fold's rows: row-wise post-processing, clipped to public ranges);
      a fit that fails for any reason but a privacy check falls back to the public constant
      nuisance (0.5, the outcome midpoint), so the release still succeeds with its noise;
    * ``SafeEbm``: the safe fields of a fitted DP-EBM (dp_ebm_learners.md §7.3: cut points,
      term scores, intercept, public bounds) and a pure evaluator of the additive model from
      those fields alone, used for post-processing predictions of stored releases.

Neighbouring relation: replace-one with public n and public fold sizes. A fit at
``accounting.epsilon_p`` is ``accounting.mu_replace_one``-GDP, hence (epsilon, delta)-DP.
Proof: docs/proofs/ate_strict.md ("DP-EBM modules"); docs/proofs/ebm_cate.md.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.calibration import gdp_delta, round_down_significant
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.records import NoiseEvent

__all__ = [
    "DP_EBM_BIN_BUDGET_FRAC",
    "DP_EBM_LEARNING_RATE",
    "DP_EBM_MAX_BINS",
    "DP_EBM_MAX_LEAVES",
    "DP_EBM_MAX_ROUNDS",
    "DP_EBM_OUTER_BAGS",
    "DpEbmAccounting",
    "SafeEbm",
    "dp_ebm_accounting",
    "dp_ebm_event",
    "fit_classifier",
    "fit_regressor",
    "interpret_guard",
    "nuisance_event",
    "outcome_predictions",
    "propensity_scores",
    "solve_dp_ebm_epsilon_p",
]

# DP-EBM hyperparameters: interpret 0.7.8 defaults (dp_ebm_learners.md §8). Timed at
# q = 20 features: about 4 s per fit at 250,000 rows on one core, so n = 10^6 runs in well
# under a minute; no reduction of max_rounds is needed.
DP_EBM_MAX_BINS = 32
DP_EBM_MAX_ROUNDS = 300
# the default learning rate; a caller may pass another public one per fit (ate_strict's
# ``dp_ebm_learning_rates``): interpret scales each step's noise with it, mu is unchanged
DP_EBM_LEARNING_RATE = 0.01
DP_EBM_MAX_LEAVES = 3
DP_EBM_BIN_BUDGET_FRAC = 0.1
DP_EBM_OUTER_BAGS = 1
# Relative slack on GDP mu: the epsilon_p solve requires the check to hold at mu * (1 + slack),
# and the fitted models' noise scales are verified to imply a mu within it.
_MU_RTOL = 1e-9

# interpret's warnings are filtered inside this lock; ``warnings.catch_warnings`` is
# process-global, so concurrent fits in other threads must not interleave with it.
_INTERPRET_LOCK = threading.Lock()
# interpret's privacy warnings start with these words (interpret 0.7.8: a fixed random_state,
# target or feature bounds or feature types taken from the data). Our calls set all of them
# from public values, so these fire on every fit or on none: configuration, not data.
_PRIVACY_WARNING_PREFIXES = ("Privacy violation", "Possible privacy violation")


class PrivacyConfigurationError(ValueError):
    """interpret would compute something from the data, or a fitted noise scale is below the
    planned calibration: a configuration defect, never triggered by the data; always fatal."""


@dataclass(frozen=True)
class DpEbmAccounting:
    """The privacy of one interpret DP-EBM fit, with the mu values interpret actually uses.

    interpret splits (epsilon_p, delta_p) into binning (beta epsilon_p, delta_p / 2) and
    boosting ((1 - beta) epsilon_p, delta_p / 2) and calibrates each part to the mu returned by
    its own bisection (``calc_gdp_noise_multi``). Under add/remove the fit is
    ``hypot(mu_binning, mu_boosting)``-GDP; under replace-one at most twice that.
    """

    epsilon_p: float
    delta_p: float
    mu_binning: float
    mu_boosting: float

    @property
    def mu_add_remove(self) -> float:
        return math.hypot(self.mu_binning, self.mu_boosting)

    @property
    def mu_replace_one(self) -> float:
        return 2.0 * self.mu_add_remove


def dp_ebm_accounting(epsilon_p: float, delta_p: float) -> DpEbmAccounting:
    """The mu values interpret 0.7.8 uses for a DP-EBM fit at (epsilon_p, delta_p).

    Reproduces interpret's split exactly (``bin_eps = epsilon * bin_budget_frac``, ``training
    eps = epsilon - bin_eps``, ``delta / 2`` each) and calls its own bisection.

    Args:
        epsilon_p: the epsilon passed to interpret.
        delta_p: the delta passed to interpret.

    Returns:
        The accounting.
    """
    from interpret.utils._privacy import calc_gdp_noise_multi

    bin_epsilon = epsilon_p * DP_EBM_BIN_BUDGET_FRAC
    bin_delta = delta_p / 2
    training_epsilon = epsilon_p - bin_epsilon
    training_delta = delta_p - bin_delta
    try:
        mu_binning = 1.0 / float(calc_gdp_noise_multi(1, bin_epsilon, bin_delta))
        mu_boosting = 1.0 / float(calc_gdp_noise_multi(1, training_epsilon, training_delta))
    except (ValueError, ArithmeticError):
        raise InvalidParameters("(epsilon, delta) outside the DP-EBM accountant's range") from None
    return DpEbmAccounting(epsilon_p, delta_p, mu_binning, mu_boosting)


@functools.lru_cache(maxsize=512)  # pure in (epsilon, delta); ~60 ms of bisection per call
def solve_dp_ebm_epsilon_p(epsilon: float, delta: float) -> DpEbmAccounting:
    """Largest epsilon_p (rounded down) whose replace-one DP-EBM fit is (epsilon, delta)-DP.

    README §1.2: pass epsilon_p with ``gdp_delta(epsilon, 2 mu(epsilon_p, delta)) <= delta``,
    where mu is what interpret actually uses (``dp_ebm_accounting``), checked here with a
    relative slack of 1e-9 on mu.

    Args:
        epsilon: the module's target epsilon.
        delta: the module's delta (also passed to interpret).

    Returns:
        The accounting at the solved epsilon_p.
    """

    def is_valid(epsilon_p: float) -> bool:
        accounting = dp_ebm_accounting(epsilon_p, delta)
        return gdp_delta(epsilon, accounting.mu_replace_one * (1.0 + _MU_RTOL)) <= delta

    if is_valid(epsilon):
        return dp_ebm_accounting(epsilon, delta)
    lower, upper = epsilon / 8.0, epsilon
    while not is_valid(lower):
        upper = lower
        lower /= 2.0
        if lower < 1e-6:
            raise InvalidParameters("epsilon is too small for a DP-EBM fit")
    for _ in range(80):
        if upper - lower <= 1e-13 * upper:
            break
        middle = 0.5 * (lower + upper)
        if is_valid(middle):
            lower = middle
        else:
            upper = middle
    # Round down to 10 significant digits; re-check (the bracket's lower end is valid).
    rounded = round_down_significant(lower, 10)
    epsilon_p = rounded if is_valid(rounded) else lower
    return dp_ebm_accounting(epsilon_p, delta)


@contextmanager
def interpret_guard() -> Iterator[None]:
    """Serialise interpret calls; raise on interpret's privacy warnings, ignore the others.

    Raises:
        PrivacyConfigurationError: interpret warned that it would use data-derived bounds,
            feature types or a fixed seed (checked after the call returns or raises).
    """
    with _INTERPRET_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            if any(_is_privacy_warning(w.message) for w in caught):
                raise PrivacyConfigurationError("interpret reported a privacy violation")


def _is_privacy_warning(message: Warning | str) -> bool:
    return str(message).lstrip().startswith(_PRIVACY_WARNING_PREFIXES)


def _common(
    accounting: DpEbmAccounting,
    max_bins: int = DP_EBM_MAX_BINS,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> dict[str, Any]:
    return {
        "epsilon": accounting.epsilon_p,
        "delta": accounting.delta_p,
        "composition": "gdp",
        "bin_budget_frac": DP_EBM_BIN_BUDGET_FRAC,
        "max_bins": max_bins,
        "max_rounds": max_rounds,
        "learning_rate": learning_rate,
        "max_leaves": DP_EBM_MAX_LEAVES,
        "outer_bags": DP_EBM_OUTER_BAGS,
        "validation_size": 0,
        "n_jobs": 1,
        "random_state": None,  # never a fixed seed (threats.md §2)
    }


def _bounds(lower: NDArray[np.float64], upper: NDArray[np.float64]) -> list[tuple[float, float]]:
    return [(float(lo), float(hi)) for lo, hi in zip(lower, upper, strict=True)]


def check_fitted_noise(
    model: Any,
    accounting: DpEbmAccounting,
    n_features: int,
    target_range: float,
    *,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> None:
    """Verify from the fitted noise scales that the (unweighted) fit is within the planned mu.

    interpret calibrates each boosting step's noise to the learning-rate-scaled sensitivity
    (``learning_rate * target_range``), so the learning rate changes the noise, never mu."""
    mu_binning = math.sqrt(n_features) / float(model.noise_scale_binning_)
    queries = max_rounds * n_features * DP_EBM_OUTER_BAGS
    mu_boosting = (
        math.sqrt(queries) * learning_rate * target_range / float(model.noise_scale_boosting_)
    )
    if 2.0 * math.hypot(mu_binning, mu_boosting) > accounting.mu_replace_one * (1.0 + _MU_RTOL):
        raise PrivacyConfigurationError("DP-EBM noise scale below the planned calibration")


def fit_classifier(
    x: NDArray[np.float64],
    a: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    accounting: DpEbmAccounting,
    *,
    max_bins: int = DP_EBM_MAX_BINS,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> Any:
    """DP-EBM classifier for P(A = 1 | X) with public bounds (dp_ebm_learners.md §7.4).

    Two public anchor rows (A = 0 and A = 1 at the box centre) make both classes present in
    every fit, so interpret's data-derived ``classes_`` is constant (as in ``ate_strict``).
    ``max_bins`` and ``max_rounds`` are public hyperparameters: interpret spreads the same
    mu over ``max_rounds`` boosting rounds (so mu, the privacy, does not depend on them), and
    scales each step's noise with the public ``learning_rate``.
    """
    from interpret.privacy import DPExplainableBoostingClassifier

    q = int(lower.shape[0])
    centre = (lower + upper) / 2.0
    x_fit = np.vstack([np.clip(x, lower, upper), centre, centre])
    a_fit = np.concatenate([np.where(a >= 0.5, 1, 0), [0, 1]]).astype(np.int64)
    model = DPExplainableBoostingClassifier(
        **_common(accounting, max_bins, max_rounds, learning_rate),
        feature_types=["continuous"] * q,
        privacy_bounds=_bounds(lower, upper),
    )
    with interpret_guard():
        model.fit(x_fit, a_fit)
    if list(np.asarray(model.classes_).tolist()) != [0, 1]:
        raise ValueError("unexpected classes")
    check_fitted_noise(
        model, accounting, q, 1.0, max_rounds=max_rounds, learning_rate=learning_rate
    )
    return model


def fit_regressor(
    x: NDArray[np.float64],
    target: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    target_lower: float,
    target_upper: float,
    accounting: DpEbmAccounting,
    *,
    sample_weight: NDArray[np.float64] | None = None,
    max_bins: int = DP_EBM_MAX_BINS,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> tuple[Any, float]:
    """DP-EBM regressor with public feature and target bounds; the target is centred.

    The target is clipped to ``[target_lower, target_upper]`` and centred on the public
    midpoint ``m`` (dp_ebm_learners.md §3.2 open item: the first residuals are then bounded by
    the range). Returns ``(model, m)``; predictions are ``model.predict(x) + m``.

    ``sample_weight`` is only for the paper-label R-learner: interpret then scales the noise by
    the empirical ``max(sample_weight)`` and the fit is **not** strict (§6 item 6), so the noise
    check is skipped.
    """
    from interpret.privacy import DPExplainableBoostingRegressor

    q = int(lower.shape[0])
    midpoint = (target_lower + target_upper) / 2.0
    half = (target_upper - target_lower) / 2.0
    model = DPExplainableBoostingRegressor(
        **_common(accounting, max_bins, max_rounds, learning_rate),
        feature_types=["continuous"] * q,
        privacy_bounds=_bounds(lower, upper),
        privacy_target_min=-half,
        privacy_target_max=half,
    )
    centred = np.clip(target, target_lower, target_upper) - midpoint
    with interpret_guard():
        if sample_weight is None:
            model.fit(np.clip(x, lower, upper), centred)
        else:
            model.fit(np.clip(x, lower, upper), centred, sample_weight=sample_weight)
    if sample_weight is None:
        check_fitted_noise(
            model,
            accounting,
            q,
            2.0 * half,
            max_rounds=max_rounds,
            learning_rate=learning_rate,
        )
    return model, midpoint


def propensity_scores(
    x_fit: NDArray[np.float64],
    a_fit: NDArray[np.float64],
    x_predict: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    accounting: DpEbmAccounting,
    *,
    clip: float,
    max_bins: int = DP_EBM_MAX_BINS,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> NDArray[np.float64]:
    """``e_hat`` at ``x_predict`` from a DP classifier fitted on ``(x_fit, a_fit)`` only,
    clipped to the public ``[clip, 1 - clip]`` (a failed prediction, NaN, becomes 0.5; a fit
    that fails other than by a privacy check gives the public constant 0.5 everywhere)."""
    try:
        model = fit_classifier(
            x_fit,
            a_fit,
            lower,
            upper,
            accounting,
            max_bins=max_bins,
            max_rounds=max_rounds,
            learning_rate=learning_rate,
        )
        with interpret_guard():
            proba = np.asarray(model.predict_proba(x_predict), dtype=np.float64)[:, 1]
    except PrivacyConfigurationError:
        raise
    except Exception:
        proba = np.full(x_predict.shape[0], 0.5, dtype=np.float64)
    return np.asarray(np.clip(np.nan_to_num(proba, nan=0.5), clip, 1.0 - clip), np.float64)


def outcome_predictions(
    x_fit: NDArray[np.float64],
    a_fit: NDArray[np.float64],
    y_fit: NDArray[np.float64],
    x_predict: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    y_lower: float,
    y_upper: float,
    accounting: DpEbmAccounting,
    *,
    max_bins: int = DP_EBM_MAX_BINS,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(mu0_hat, mu1_hat)`` at ``x_predict`` from one DP regressor of Y on (A, X) fitted on
    its own fold, A a continuous feature on (0, 1) and Y centred on the public midpoint
    (dp_ebm_learners.md §7.4); clipped to the public outcome bounds (NaN: the midpoint). A fit
    that fails other than by a privacy check gives the public midpoint everywhere."""
    midpoint = (y_lower + y_upper) / 2.0
    ones = np.ones(x_predict.shape[0], dtype=np.float64)
    try:
        model, midpoint = fit_regressor(
            np.column_stack([a_fit, x_fit]),
            y_fit,
            np.concatenate([[0.0], lower]),
            np.concatenate([[1.0], upper]),
            y_lower,
            y_upper,
            accounting,
            max_bins=max_bins,
            max_rounds=max_rounds,
            learning_rate=learning_rate,
        )
        with interpret_guard():
            raw1 = np.asarray(model.predict(np.column_stack([ones, x_predict])), np.float64)
            raw0 = np.asarray(model.predict(np.column_stack([0.0 * ones, x_predict])), np.float64)
    except PrivacyConfigurationError:
        raise
    except Exception:
        raw1 = raw0 = np.zeros(x_predict.shape[0], dtype=np.float64)

    def finish(raw: NDArray[np.float64]) -> NDArray[np.float64]:
        values = np.clip(np.nan_to_num(raw + midpoint, nan=midpoint), y_lower, y_upper)
        return np.asarray(values, np.float64)

    return finish(raw0), finish(raw1)


def dp_ebm_event(
    module: str,
    epsilon: float,
    delta: float,
    accounting: DpEbmAccounting,
    *,
    n_features: int,
    target_range: float,
    learner: str,
    max_bins: int = DP_EBM_MAX_BINS,
    max_rounds: int = DP_EBM_MAX_ROUNDS,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> NoiseEvent:
    """The ledger event of one DP-EBM module (public parameters only)."""
    return NoiseEvent(
        type="gdp_module",
        module=module,
        epsilon=epsilon,
        delta=delta,
        params={
            "learner": f"interpret-core 0.7.8 DPExplainableBoosting{learner}",
            "epsilon_p": accounting.epsilon_p,
            "delta_p": accounting.delta_p,
            "mu_binning": accounting.mu_binning,
            "mu_boosting": accounting.mu_boosting,
            "mu_add_remove": accounting.mu_add_remove,
            "mu": accounting.mu_replace_one,
            "bin_budget_frac": DP_EBM_BIN_BUDGET_FRAC,
            "max_bins": max_bins,
            "max_rounds": max_rounds,
            "learning_rate": learning_rate,
            "max_leaves": DP_EBM_MAX_LEAVES,
            "outer_bags": DP_EBM_OUTER_BAGS,
            "n_features": n_features,
            "target_range": target_range,
        },
    )


def nuisance_event(
    module: str,
    epsilon: float,
    delta: float,
    accounting: DpEbmAccounting,
    n_features: int,
    target_range: float,
    *,
    learning_rate: float = DP_EBM_LEARNING_RATE,
) -> NoiseEvent:
    """The event of a first-stage nuisance at interpret's defaults (but the public learning
    rate): the classifier for the ``"propensity"`` module, a regressor otherwise."""
    learner = "Classifier" if module == "propensity" else "Regressor"
    return dp_ebm_event(
        module,
        epsilon,
        delta,
        accounting,
        n_features=n_features,
        target_range=target_range,
        learner=learner,
        learning_rate=learning_rate,
    )


@dataclass(frozen=True)
class SafeEbm:
    """The safe fields of a fitted main-effects DP-EBM and a pure evaluator (§7.3).

    ``cuts[j]`` are feature j's DP cut points; ``scores[j]`` has ``len(cuts[j]) + 3`` entries
    (index 0: missing, 1..len+1: bins, last: unknown), exactly interpret's ``term_scores_``;
    ``offset`` is the public centring midpoint added to every prediction (0 for a classifier,
    whose output is on the logit scale). Nothing here is a per-row or non-DP value.
    """

    intercept: float
    offset: float
    cuts: tuple[tuple[float, ...], ...]
    scores: tuple[tuple[float, ...], ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    names: tuple[str, ...]

    @classmethod
    def from_model(cls, model: Any, *, offset: float, names: list[str]) -> SafeEbm:
        """Copy the safe fields of a fitted interpret DP-EBM (mains only, continuous)."""
        q = len(names)
        if [tuple(t) for t in model.term_features_] != [(j,) for j in range(q)]:
            raise ValueError("expected main effects only")
        cuts: list[tuple[float, ...]] = []
        scores: list[tuple[float, ...]] = []
        for j in range(q):
            levels = model.bins_[j]
            if len(levels) != 1 or isinstance(levels[0], dict):
                raise ValueError("expected continuous binning")
            cut = np.asarray(levels[0], dtype=np.float64)
            score = np.asarray(model.term_scores_[j], dtype=np.float64)
            if score.shape != (cut.size + 3,):
                raise ValueError("unexpected term score layout")
            cuts.append(tuple(float(v) for v in cut))
            scores.append(tuple(float(v) for v in score))
        bounds = np.asarray(model.feature_bounds_, dtype=np.float64)
        return cls(
            intercept=float(model.intercept_),
            offset=float(offset),
            cuts=tuple(cuts),
            scores=tuple(scores),
            lower=tuple(float(v) for v in bounds[:, 0]),
            upper=tuple(float(v) for v in bounds[:, 1]),
            names=tuple(names),
        )

    def predict(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """``offset + intercept + sum_j score_j(bin_j(x_j))`` at public points."""
        points = np.atleast_2d(np.asarray(x, dtype=np.float64))
        out = np.full(points.shape[0], self.offset + self.intercept, dtype=np.float64)
        for j, (cut, score) in enumerate(zip(self.cuts, self.scores, strict=True)):
            index = np.searchsorted(np.asarray(cut), points[:, j], side="right") + 1
            out += np.asarray(score)[index]
        return out

    def shape_functions(
        self, codes: Sequence[Sequence[int] | None] | None = None
    ) -> list[dict[str, Any]]:
        """Per-feature piecewise-constant shape: edges (public bounds + DP cuts) and values.

        ``codes[j]``: feature j's declared integer codes (a categorical covariate, the
        treatment), None for a numeric one. A coded feature also lists its ``codes`` and each
        code's value (``code_values``: the value of the bin the code falls in), so a reader sees
        one value per category instead of bins between codes that no row can take. Public:
        the declared codes and the DP model only."""
        shapes = []
        for j, (cut, score) in enumerate(zip(self.cuts, self.scores, strict=True)):
            shape: dict[str, Any] = {
                "feature": self.names[j],
                "edges": [self.lower[j], *cut, self.upper[j]],
                "values": list(score[1 : len(cut) + 2]),
            }
            coded = None if codes is None else codes[j]
            if coded is not None:
                levels = sorted(int(c) for c in coded)
                index = np.searchsorted(np.asarray(cut), np.asarray(levels, float), side="right")
                shape["codes"] = levels
                shape["code_values"] = [float(score[int(k) + 1]) for k in index]
            shapes.append(shape)
        return shapes

    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept": self.intercept,
            "offset": self.offset,
            "cuts": [list(c) for c in self.cuts],
            "scores": [list(s) for s in self.scores],
            "lower": list(self.lower),
            "upper": list(self.upper),
            "names": list(self.names),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SafeEbm:
        return cls(
            intercept=float(data["intercept"]),
            offset=float(data["offset"]),
            cuts=tuple(tuple(float(v) for v in c) for c in data["cuts"]),
            scores=tuple(tuple(float(v) for v in s) for s in data["scores"]),
            lower=tuple(float(v) for v in data["lower"]),
            upper=tuple(float(v) for v in data["upper"]),
            names=tuple(str(v) for v in data["names"]),
        )
