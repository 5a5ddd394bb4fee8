"""Is a CATE release expected to beat the constant ATE? A verdict from public quantities only.

A CATE release answers with ``tau_hat(x) = (learned effect) + (privacy noise)``, the noise
independent of the data given its public scale ``s`` (per point). Whatever the learner, its
PEHE satisfies ``PEHE^2 >= s^2``; predicting one constant (the ATE) for everyone has PEHE
``sd(tau)`` (plus the ATE's own error). So a CATE can only be more accurate than the ATE where
``s < sd(tau)``, and is worth its budget only where ``s`` is well below it.

``sd(tau)`` is unknown before the data is read; the quote uses the analyst's
``expected_heterogeneity_sd`` or the public default ``R_Y / 24`` (half an outcome sd when, as
with honest declared bounds, ``R_Y`` is about 12 sd(Y); the "strong heterogeneity" of issue 12).

Verdicts (``s`` against ``h``, the assumed sd(tau)):

* ``not_expected`` (``s >= h``): the noise alone is at least the heterogeneity; the constant ATE
  is expected to be more accurate for a typical patient. Recommend the ATE, or the epsilon at
  which ``s = h / 2``.
* ``marginal`` (``h / 2 <= s < h``): at best a small gain (PEHE >= s >= h / 2).
* ``possible`` (``s < h / 2``): the noise leaves room; the learner's own error (not included:
  it depends on the data) decides.

A learner that keeps only a share ``rho`` of the heterogeneity in its mean (a kernel ridge
shrinks a smooth effect by its public regularisation, ``cate_function.quote.kernel_retention``)
can show at most ``rho h``: the verdict then compares ``s`` with ``rho h`` instead of ``h``, and
``expected_pehe_lower_bound`` is ``hypot(s, (1 - rho) h)`` (its noise and the signal it drops).

A release anchored at its own DP ATE (shrinkage ``ate``) is shrunk towards that ATE unless its
deviations are detectable above the noise, so its noise floor does not bound its PEHE: where
``s >= h`` it answers about the constant (PEHE about ``h``). Its ``expected_pehe_lower_bound`` is
``min(bound, h)``; the verdict is unchanged (it says whether the release can resolve the
heterogeneity, not whether it is worse than the constant), and where it is not ``possible`` the
message says that the release is expected to answer about its DP ATE, not that the constant is
more accurate (the plain message's "request the ATE instead").

An anchored release varies at all only where its calibration step detects the heterogeneity
(ebm_cate proof step 6.4); ``detectable`` is the smallest sd(tau) it detects with 80 %
probability at best (``ebm_cate.detectable_heterogeneity_sd``). Where that is at least ``h``
the verdict is ``not_expected`` whatever the noise: the release is expected to answer its DP ATE
for every patient. The block reports it as ``detectable_heterogeneity_sd`` so that an analyst
can compare it with the heterogeneity they believe in.

A release that is one number for every patient by construction (an uplift table of one cell)
is ``not_expected`` whatever its noise: its PEHE is at least ``sd(tau)``, the constant's, so
``expected_pehe_lower_bound`` is ``h`` and no epsilon makes it worth it (``constant_block``).

Pure: no I/O, no data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from service.mechanisms.domain import PublicDomain

DEFAULT_HETEROGENEITY_RANGE_RATIO = 24.0
ANCHORED_NOTE = (
    "With shrinkage 'ate' the release is shrunk towards its own DP ATE and equals it wherever "
    "the heterogeneity is not detectable above the noise, so it is expected to be about as "
    "accurate as that constant, not much worse; its variation is kept only above the noise."
)
# Said where the anchor is (or may be) the effect fold's own DP ATE, not where the quote knows
# it is an ate release on all rows or a given value (a trial walkthrough's quote said it beside
# anchor_source 'ate_release').
# It claims no ranking: on observational data the effect fold's anchor was the more accurate ATE
# at n epsilon 5000-20 000 (bench/README.md "A given anchor"; an observational walkthrough: RMSE
# 0.82 against the ate default's 1.58), where the note had called it the less accurate one.
EFFECT_FOLD_NOTE = (
    " An anchor the release buys from part of its rows (anchor_source 'effect_fold') comes "
    "without an interval: for the ATE with its interval, request the ate kind."
)
WORTH_IT_RATIO = 0.5  # s <= WORTH_IT_RATIO * h: the noise leaves room for a real gain
# the detection probability of ``detectable`` (ebm_cate.DETECTION_POWER)
DETECTION_PROBABILITY = 0.8
# the share of patients beyond an anchored release's deviation bound from which the message says
# so (a re-test's strong heterogeneity had 30 % beyond it, shown at the bound, unannounced)
CAPPED_SHARE_NOTE = 0.10


def default_heterogeneity_sd(domain: PublicDomain) -> float:
    """The public default assumption ``sd(tau) = R_Y / 24``."""
    return domain.outcome_range / DEFAULT_HETEROGENEITY_RANGE_RATIO


def epsilon_for_noise_sd(
    noise_sd_at: Callable[[float], float],
    target: float,
    *,
    minimum: float,
    maximum: float,
) -> float | None:
    """Smallest epsilon in [minimum, maximum] with ``noise_sd_at(epsilon) <= target`` (the noise
    sd is non-increasing in epsilon), to 3 significant digits rounded up; None if unreachable.
    """
    if noise_sd_at(maximum) > target:
        return None
    if noise_sd_at(minimum) <= target:
        return minimum
    low, high = minimum, maximum
    for _ in range(60):
        if high / low <= 1.0 + 1e-4:
            break
        middle = math.sqrt(low * high)
        if noise_sd_at(middle) <= target:
            high = middle
        else:
            low = middle
    digits = 2 - math.floor(math.log10(high))
    rounded = min(math.ceil(high * 10.0**digits) / 10.0**digits, maximum)
    return rounded if noise_sd_at(rounded) <= target else high


def versus_ate(
    noise_sd: float,
    domain: PublicDomain,
    epsilon: float,
    *,
    heterogeneity_sd: float | None,
    epsilon_worth_it: float | None,
    retention: float | None = None,
    anchored: bool = False,
    detectable: float | None = None,
    cap: float | None = None,
    anchor_source: str | None = None,
    noise_label: str | None = None,
) -> dict[str, Any]:
    """The quote's ``versus_ate`` block (module docstring); ``noise_label``: what ``noise_sd``
    is, in the message (default: the privacy noise per prediction); ``anchor_source``: where an
    anchored release's anchor comes from, where the quote knows (``effect_fold``,
    ``ate_release``, ``given``); ``cap``: the public bound G of an
    anchored release's deviations from its anchor (its predictions lie within anchor +- G);
    ``retention``: the share of the
    heterogeneity the learner's mean keeps (None: all of it); ``anchored``: the release is shrunk
    towards its own DP ATE (its bound is ``min(bound, h)`` and the message says that it
    falls back to that ATE rather than that it is worse than it); ``detectable``: the smallest
    sd(tau) an anchored release's calibration step detects (None: not computed)."""
    note = ANCHORED_NOTE + (EFFECT_FOLD_NOTE if anchor_source in (None, "effect_fold") else "")
    label = noise_label or "the privacy noise per prediction"
    alone = label if noise_label else f"{label} alone"
    assumed = heterogeneity_sd is None
    h = default_heterogeneity_sd(domain) if heterogeneity_sd is None else float(heterogeneity_sd)
    shown = h if retention is None else retention * h
    undetectable = anchored and detectable is not None and detectable >= shown
    if noise_sd >= shown or undetectable:
        verdict = "not_expected"
    elif noise_sd >= WORTH_IT_RATIO * shown:
        verdict = "marginal"
    else:
        verdict = "possible"
    # The default is a large variation of the effect (an observational walkthrough's clinically
    # large one, diabetics gaining 4x, was 0.31 outcome sds): its verdicts read hopeful unless
    # the analyst states theirs, which then decided every one of its releases right.
    basis = (
        f"the default assumption sd(tau) = R_Y / {DEFAULT_HETEROGENEITY_RANGE_RATIO:g}, about "
        "half an outcome sd under honest bounds, a large variation of the effect: state "
        "expected_heterogeneity_sd for a verdict on yours"
        if assumed
        else "your expected_heterogeneity_sd"
    )
    where = f"at n = {domain.n}, epsilon = {epsilon:g}"
    if retention is None:
        target = f"the heterogeneity it would resolve ({h:.3g}, {basis})"
    else:
        target = (
            f"the heterogeneity its learner can show ({shown:.3g}: at its public regularisation "
            f"the learner keeps about {retention:.1%} of a smooth heterogeneity of {h:.3g}, "
            f"{basis})"
        )
    gate = (
        ""
        if detectable is None or not anchored
        else f" It varies at all only where its calibration step detects the heterogeneity: "
        f"with {DETECTION_PROBABILITY:.0%} probability an sd(tau) of at least about "
        f"{detectable:.3g} if the learner found it exactly (more otherwise); below that it "
        "answers its DP ATE for every patient."
    )
    if verdict == "possible":
        message = (
            f"{where} {label} (sd {noise_sd:.3g}) is well below "
            f"{target}; whether this CATE beats the ATE then depends on how well the learner "
            "fits, which the quote cannot know."
        )
        if anchored:
            message += f" {note}{gate}"
    elif undetectable and noise_sd < shown:
        fix = (
            f"epsilon >= {epsilon_worth_it:g} would let it resolve the heterogeneity"
            if epsilon_worth_it is not None
            else "no epsilon up to the maximum lets it resolve the heterogeneity"
        )
        message = (
            f"{where} the step that decides whether this release varies at all (its "
            "calibration on held-out rows) detects, with "
            f"{DETECTION_PROBABILITY:.0%} probability, only a heterogeneity of sd at least "
            f"about {detectable:.3g}, not below {target}, so this CATE is expected to answer its "
            f"DP ATE for every patient. {note} The ATE kind spends the same budget on "
            f"one number with a confidence interval; {fix}."
        )
    elif anchored:
        fix = (
            f"epsilon >= {epsilon_worth_it:g} would let it resolve the heterogeneity"
            if epsilon_worth_it is not None
            else "no epsilon up to the maximum makes the noise small enough for it to resolve "
            "the heterogeneity"
        )
        lead = "is at least" if verdict == "not_expected" else "is more than half of"
        message = (
            f"{where} {alone} (sd {noise_sd:.3g}) {lead} "
            f"{target}, so this CATE is not expected to resolve it. {note} Expect "
            "about the accuracy of a constant ATE for a typical patient, not better: the ATE "
            f"kind spends the same budget on one number with a confidence interval; {fix}."
            f"{gate}"
        )
    else:
        fix = (
            f"request the ATE instead, or epsilon >= {epsilon_worth_it:g} for this CATE"
            if epsilon_worth_it is not None
            else "request the ATE instead (no epsilon up to the maximum makes the noise small "
            "enough)"
        )
        lead = "is at least" if verdict == "not_expected" else "is more than half of"
        message = (
            f"{where} {alone} (sd {noise_sd:.3g}) {lead} "
            f"{target}: a constant ATE is expected to be "
            f"{'more' if verdict == 'not_expected' else 'about as'} accurate for a typical "
            f"patient; {fix}."
        )
    capped = None
    if anchored and cap is not None and cap > 0.0:
        # the share of a normal tau's patients whose effect lies beyond anchor +- G
        capped = math.erfc(cap / (h * math.sqrt(2.0)))
        if capped >= CAPPED_SHARE_NOTE:
            message += (
                f" Its predictions lie within its anchor +- {cap:.3g} (the public bound of its "
                f"deviations, a quarter of its pseudo-outcome clip): at sd(tau) {h:.3g} about "
                f"{capped:.0%} of patients' effects lie beyond that and are shown at the bound, "
                "the largest effects understated."
            )
    bound = noise_sd if retention is None else math.hypot(noise_sd, (1.0 - retention) * h)
    if anchored:
        bound = min(bound, h)
    return {
        "verdict": verdict,
        "prediction_noise_sd": noise_sd,
        "expected_pehe_lower_bound": bound,
        "heterogeneity_sd": h,
        "heterogeneity_sd_assumed": assumed,
        "constant_ate_pehe_approx": h,
        "learner_retention": retention,
        "detectable_heterogeneity_sd": detectable if anchored else None,
        "deviation_cap": cap if anchored else None,
        "capped_share": capped,
        "epsilon_worth_it": epsilon_worth_it,
        "message": message,
    }


# The epsilon range searched for ``epsilon_worth_it`` (the strict kinds' usual limits).
SEARCH_MIN_EPSILON = 0.01
SEARCH_MAX_EPSILON = 100.0


def quote_block(
    noise_sd_at: Callable[[float], float],
    domain: PublicDomain,
    epsilon: float,
    heterogeneity_sd: float | None,
    retention_at: Callable[[float], float] | None = None,
    *,
    anchored: bool = False,
    detectable_at: Callable[[float], float | None] | None = None,
    cap: float | None = None,
    anchor_source: str | None = None,
    noise_label: str | None = None,
) -> dict[str, Any]:
    """``versus_ate`` for a kind whose public per-prediction noise sd at epsilon is
    ``noise_sd_at(epsilon)`` and whose learner keeps ``retention_at(epsilon)`` of the
    heterogeneity (None: all); epsilons the kind refuses count as unreachable. With a retention
    the epsilon search asks for ``noise <= WORTH_IT_RATIO * retention * h``; a retention that
    steps with a public rule (cate_function's regularisation grid) makes that ratio only roughly
    monotone, so the epsilon found is one that meets it, not always the smallest."""

    def keep(value: float) -> float:
        return 1.0 if retention_at is None else float(retention_at(value))

    h = default_heterogeneity_sd(domain) if heterogeneity_sd is None else float(heterogeneity_sd)

    def detect(value: float) -> float | None:
        return None if detectable_at is None or not anchored else detectable_at(value)

    def safe(value: float) -> float:
        try:
            found = detect(value)
            if found is not None and found >= h * keep(value):
                return math.inf  # the calibration step would not detect it there
            return float(noise_sd_at(value)) / keep(value)
        except Exception:  # an epsilon outside the kind's limits: not a candidate
            return math.inf

    noise_sd = float(noise_sd_at(epsilon))
    kept = keep(epsilon)
    detectable = detect(epsilon)
    worth_it = None
    if noise_sd >= WORTH_IT_RATIO * h * kept or (detectable is not None and detectable >= h * kept):
        worth_it = epsilon_for_noise_sd(
            safe, WORTH_IT_RATIO * h, minimum=SEARCH_MIN_EPSILON, maximum=SEARCH_MAX_EPSILON
        )
    return versus_ate(
        noise_sd,
        domain,
        epsilon,
        heterogeneity_sd=heterogeneity_sd,
        epsilon_worth_it=worth_it,
        retention=None if retention_at is None else kept,
        anchored=anchored,
        detectable=detectable,
        cap=cap,
        anchor_source=anchor_source,
        noise_label=noise_label,
    )


def constant_block(
    domain: PublicDomain,
    epsilon: float,
    heterogeneity_sd: float | None,
    *,
    reason: str,
    fix: str,
) -> dict[str, Any]:
    """``versus_ate`` for a release that answers one number for every patient by construction
    (module docstring): ``not_expected`` at any epsilon; ``reason`` says why it cannot vary,
    ``fix`` what to request instead."""
    assumed = heterogeneity_sd is None
    h = default_heterogeneity_sd(domain) if heterogeneity_sd is None else float(heterogeneity_sd)
    return {
        "verdict": "not_expected",
        "expected_pehe_lower_bound": h,
        "heterogeneity_sd": h,
        "heterogeneity_sd_assumed": assumed,
        "constant_ate_pehe_approx": h,
        "learner_retention": 0.0,
        "detectable_heterogeneity_sd": None,
        "deviation_cap": None,
        "capped_share": None,
        "epsilon_worth_it": None,
        "message": (
            f"at n = {domain.n}, epsilon = {epsilon:g} this release gives every patient the same "
            f"effect ({reason}), so it cannot be more accurate than the constant ATE at any "
            f"epsilon; {fix}."
        ),
    }
