"""What an ATE confidence interval covers: stated with every ATE quote and release (public).

Every ATE interval covers the sampling error of the rows it averages and the privacy noise
added to the estimate. What it does **not** always cover is the error left by nuisance models
fitted under privacy noise:

* In a **randomised design** the strict AIPW uses the declared assignment probability, so its
  pseudo-outcome has mean equal to the ATE whatever the (DP) outcome model: the outcome model
  only changes the variance, which the interval estimates. ``rct_difference`` has no model.
  There the nominal level is the design's.
* In an **observational design** (and for ``ipw`` in any design) the estimate is unbiased only
  when the DP propensity / outcome models remove the confounding. Fitted on part of the rows
  under privacy noise, with public regularisation, they leave part of it, and the interval,
  which treats the fitted models as fixed, is then too narrow and centred off the true effect.
  bench/README.md ("The observational default's nuisances by n*eps", "Which DP nuisance carries
  the observational bias") measures how often on the realistic studies (36 covariates):
  ``MEASURED_BANDS`` holds the coverage per nuisance preset and band of n * epsilon (``dp_linear``,
  the default below n * epsilon = 2 * 10^4, covered 0.855-0.99 up to 10^4, where its shrinkage
  leaves most of the confounding hidden inside a wide interval; DP-EBM, the default from there,
  0.74-0.93 from 2 * 10^4 since ate_strict version 10, where the interval is narrow), and each
  block quotes its request's band.

Pure: reads the public design and request fields only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.mechanisms.domain import PublicDomain, StudyDesign

DESIGN = "design"
NUISANCE_MODELS = "nuisance_models"

_DESIGN_MESSAGE = (
    "Randomised design with the declared assignment probability: the interval covers the "
    "sampling error and the privacy noise, whatever the outcome model."
)
CHUNK_SPREAD = "chunk_spread"
_CHUNKS_MESSAGE = (
    "Subsample and aggregate over {chunks} chunks: the interval is a t interval over the "
    "chunks' DP estimates, each from its own rows with its own DP propensity and outcome "
    "models, so it covers the sampling error, the privacy noise and the models' fit noise, "
    "which vary from chunk to chunk. It does not cover a bias every chunk shares: confounding "
    "all the DP models leave, or a pseudo-outcome clip narrower than the data's "
    "(docs/guide-analyst.md, 'Subsample and aggregate')."
)
_NUISANCE_MESSAGE = (
    "The interval covers the sampling error and the privacy noise of the estimate, not the "
    "error left by the DP propensity and outcome models: it assumes they remove the "
    "confounding. Fitted under privacy noise on part of the rows, they often leave some, and "
    "then the interval is too narrow and off-centre. Read it as a lower bound on the "
    "uncertainty (docs/guide-analyst.md, 'What the interval covers')."
)


# What the realistic studies measured (bench.realistic: 36 covariates, confounded, skewed
# outcome, honest declared bounds; bench/README.md, "The observational default's nuisances by
# n*eps"), per nuisance preset of the strict aipw default request and band of n * epsilon: the
# lowest and highest coverage of the nominal 95 % interval over the band's cells. Public
# constants (simulation results), never data.
@dataclass(frozen=True)
class CoverageBand:
    n_epsilon_low: float
    n_epsilon_high: float
    coverage_low: float
    coverage_high: float
    cells: int
    releases_per_cell: int

    def contains(self, n_epsilon: float) -> bool:
        return self.n_epsilon_low <= n_epsilon <= self.n_epsilon_high

    def log_distance(self, n_epsilon: float) -> float:
        if self.contains(n_epsilon):
            return 0.0
        edge = self.n_epsilon_low if n_epsilon < self.n_epsilon_low else self.n_epsilon_high
        return abs(math.log(n_epsilon / edge))


MEASURED_BANDS: dict[str, tuple[CoverageBand, ...]] = {
    # realistic-obs-200-dp-linear.json; 1.5 * 10^4: realistic-obs-switch-*.json (40 releases)
    "dp_linear": (
        CoverageBand(500.0, 2500.0, 0.93, 0.99, 10, 200),
        CoverageBand(4000.0, 8000.0, 0.905, 0.97, 6, 200),
        CoverageBand(10_000.0, 10_000.0, 0.855, 0.89, 2, 200),
        CoverageBand(15_000.0, 15_000.0, 0.70, 0.80, 4, 40),
        CoverageBand(20_000.0, 80_000.0, 0.00, 0.745, 6, 200),
    ),
    # below n * epsilon = 2 * 10^4 (the declared outcome range): realistic-obs-200-small.json;
    # 8000-15000: realistic-obs-switch-*.json (40 releases). From 2 * 10^4 (ate_strict version
    # 10, the outcome model's measured range): realistic-obs-range-5k.json, -20k.json, -100k.json
    # (200 releases) and -100k-eps.json (n 10^5 at eps 0.5 and 4, 100 releases).
    "dp_ebm": (
        CoverageBand(1000.0, 1000.0, 0.71, 0.72, 2, 200),
        CoverageBand(4000.0, 5000.0, 0.825, 0.89, 4, 200),
        CoverageBand(8000.0, 15_000.0, 0.675, 0.875, 8, 40),
        CoverageBand(20_000.0, 20_000.0, 0.86, 0.915, 4, 200),
        CoverageBand(50_000.0, 50_000.0, 0.92, 0.93, 2, 100),
        CoverageBand(80_000.0, 100_000.0, 0.805, 0.92, 4, 200),
        CoverageBand(400_000.0, 400_000.0, 0.74, 0.90, 2, 100),
    ),
    # subsample and aggregate at the chunk preset (``chunks``; 4 chunks; bench/README.md,
    # "Subsample and aggregate"): n 5000, eps 1: subsample-coverage-5000-*.json (200 releases);
    # n 5000 at eps 0.5 and 4: subsample-eps-5000.json (30); n 20000, eps 1: subsample-20000.json
    # (40, the probe's)
    "chunks": (
        CoverageBand(2500.0, 2500.0, 0.933, 1.0, 2, 30),
        CoverageBand(5000.0, 5000.0, 0.94, 0.965, 2, 200),
        CoverageBand(20_000.0, 20_000.0, 0.90, 0.95, 4, 30),
    ),
    # the strict ipw default (its DP logistic propensity): realistic-ipw-quote.json
    "ipw": (
        CoverageBand(500.0, 1000.0, 0.905, 0.96, 4, 200),
        CoverageBand(2500.0, 5000.0, 0.75, 0.855, 6, 200),
        CoverageBand(10_000.0, 20_000.0, 0.865, 0.955, 6, 200),
        CoverageBand(50_000.0, 400_000.0, 0.00, 0.60, 8, 200),
    ),
}


# The same on the realistic trials (declared assignment probability 0.5; bench/README.md,
# "Realistic trials, 200 releases per cell: the strict default"; realistic-rct-200*.json): the
# default (dp_linear outcome model, adaptive clip, cross-fitted above n * epsilon = 10^4).
MEASURED_BANDS_RCT: dict[str, tuple[CoverageBand, ...]] = {
    "dp_linear": (
        CoverageBand(500.0, 5000.0, 0.94, 0.97, 10, 200),
        CoverageBand(10_000.0, 400_000.0, 0.935, 0.975, 14, 200),
    ),
    # the DP difference in means (rct_difference, the trial default below n * epsilon
    # 5 * 10^4): realistic-rct-difference.json (mean 0.9425 over the 22 cells)
    "rct_difference": (CoverageBand(500.0, 20_000.0, 0.92, 0.97, 22, 200),),
    # the strict ipw default on the same trials: realistic-ipw-quote.json
    "ipw": (
        CoverageBand(500.0, 1000.0, 0.93, 0.955, 4, 200),
        CoverageBand(2500.0, 5000.0, 0.84, 0.92, 6, 200),
        CoverageBand(10_000.0, 400_000.0, 0.945, 0.985, 14, 200),
    ),
}


def measured_band(
    nuisance: str | None, n_epsilon: float, *, randomised: bool = False
) -> CoverageBand | None:
    """The measured band of ``nuisance`` (on trials with ``randomised``) that contains
    ``n_epsilon``, else the nearest one (in log n * epsilon; the earlier band on a tie); None for
    a preset without measurements."""
    table = MEASURED_BANDS_RCT if randomised else MEASURED_BANDS
    bands = table.get(nuisance or "")
    if not bands or not n_epsilon > 0.0:
        return None
    return min(bands, key=lambda band: band.log_distance(n_epsilon))


# bench/README.md, "A declared adjustment set" (nuisance_confounders*.json: the 12 confounders
# of the 36 covariates declared, the DP-EBM default at n 5000-10^5) and "The switch with a
# declared adjustment set" (from n * epsilon = 10^4 the declared set makes the default DP-EBM;
# below it both presets on the 12 covered no better than dp_linear on all 36, so no hint there).
_ADJUSTMENT_HINT_MIN_N_EPSILON = 10_000.0
_ADJUSTMENT_HINT = (
    " Declaring the confounders (the schema's adjust_for, or adjustment_columns) lets the "
    "models spend their budget on them: on those studies, with DP-EBM models (the default from "
    "n * epsilon = 10,000 on 12 declared confounders), it raised the coverage from 82 % to 91 % "
    "(224 releases, n = 5,000-100,000)."
)


# An observational request that narrows the pseudo-outcome clip (adaptive, or a given K) is not a
# measured preset; what an early benchmark saw of it (bench/README.md, "Observational studies
# after": the narrower interval leaves the DP nuisance models' bias out).
# The lowest and highest coverage of that early benchmark (``narrowed_clip_coverage``).
NARROWED_CLIP_COVERAGE = (0.0, 0.75)
_NARROWED_CLIP_NOTE = (
    " Not measured at this request's settings: with a narrower clip than the declared one "
    "(clip 'adaptive' or a pseudo_outcome_clip) the interval is narrower and the DP models' "
    "bias is not in it; on the realistic observational studies an early benchmark of the "
    "adaptive clip measured 0-42 % coverage with dp_linear models and 0-75 % with DP-EBM "
    "models from n = 5,000 (8-50 releases per cell; bench/README.md, 'Observational studies "
    "after')."
)


_PRESET_WORDS = {
    "dp_linear": "DP linear models",
    "dp_ebm": "DP-EBM models",
    "ipw": "the ipw estimator's DP logistic propensity",
    "rct_difference": "the DP difference in means",
    "chunks": "subsample and aggregate (the chunk preset)",
}


_SOURCES = {
    False: "bench/README.md, 'The observational default's nuisances by n*eps'",
    True: "bench/README.md, 'Realistic trials, 200 releases per cell: the strict default'",
}
_IPW_SOURCE = 'bench/README.md, "`ipw`\'s quote: the expected half-width at the assumed scale"'
_SPECIAL_SOURCES = {
    "ipw": _IPW_SOURCE,
    "rct_difference": "bench/README.md, 'The trial estimator rule'",
    "chunks": "bench/README.md, 'Subsample and aggregate'",
}


def _band_block(
    nuisance: str, band: CoverageBand, n_epsilon: float, randomised: bool
) -> dict[str, Any]:
    return {
        "nuisance": nuisance,
        "n_epsilon": n_epsilon,
        "within_measured_range": band.contains(n_epsilon),
        "n_epsilon_low": band.n_epsilon_low,
        "n_epsilon_high": band.n_epsilon_high,
        "coverage_low": band.coverage_low,
        "coverage_high": band.coverage_high,
        "cells": band.cells,
        "releases_per_cell": band.releases_per_cell,
        "source": _SPECIAL_SOURCES.get(nuisance, _SOURCES[randomised]),
    }


# With an adjustment set the bands (measured adjusting for every covariate) are not the
# request's; what the declared set gave (bench/README.md, "A declared adjustment set").
_ADJUSTED_NOTE = (
    " Those releases adjusted for all 36; with the 12 confounders among them declared, the "
    "DP-EBM default covered 91 % (224 releases, n = 5,000-100,000)."
)


def _band_sentence(
    nuisance: str,
    band: CoverageBand,
    n_epsilon: float,
    randomised: bool,
    q: int,
    adjusted: bool = False,
) -> str:
    where = (
        f"n * epsilon = {band.n_epsilon_low:,.0f}"
        if band.n_epsilon_low == band.n_epsilon_high
        else f"n * epsilon = {band.n_epsilon_low:,.0f}-{band.n_epsilon_high:,.0f}"
    )
    yours = (
        f"your n * epsilon is {n_epsilon:,.0f}"
        if band.contains(n_epsilon)
        else f"the nearest measured to your n * epsilon of {n_epsilon:,.0f}"
    )
    sentence = (
        f" On simulated {'trials' if randomised else 'clinical studies'} with 36 covariates "
        f"({'yours too' if q == 36 else f'yours has {q}'}) the default 95 % interval with "
        f"{_PRESET_WORDS[nuisance]} covered the true effect in "
        f"{100 * band.coverage_low:.1f}-{100 * band.coverage_high:.1f} % of releases at {where} "
        f"({band.cells} cells, {band.releases_per_cell} releases each; {yours})."
    )
    return sentence + (_ADJUSTED_NOTE if adjusted and not randomised else "")


def ate_coverage(
    domain: PublicDomain,
    *,
    mode: str,
    estimator: str,
    nuisance: str | None = None,
    epsilon: float | None = None,
    adjustment_set: bool = False,
    narrowed_clip: bool = False,
    chunks: int | None = None,
) -> dict[str, Any]:
    """The ``coverage`` block of an ATE quote or release.

    ``basis`` is ``"design"`` where the nominal level rests on the randomisation alone (strict
    ``aipw`` or ``rct_difference`` on an RCT), else ``"nuisance_models"``;
    ``nuisance_error_covered`` says whether the interval accounts for the nuisance models'
    error; ``message`` says it in words. ``nuisance`` is the measured preset of a strict
    request at that preset's defaults (the strict ``aipw`` release's resolved nuisance, or
    ``"ipw"`` for the ``ipw`` default), None for any other request, which nothing measured.
    With one, ``measured`` is the coverage the realistic studies (``MEASURED_BANDS``, on trials
    ``MEASURED_BANDS_RCT``) measured for it in the band of n * ``epsilon`` that contains the
    request's (or the nearest band, ``within_measured_range: false``), and the message quotes
    it; else None.
    Without a declared or requested adjustment set (``adjustment_set`` false) the message of
    such a release also says what declaring the confounders did on those studies.
    ``narrowed_clip``: an observational strict request with a clip narrower than the declared
    one (no measured band); the message says what an early benchmark saw of it, and
    ``narrowed_clip_coverage`` gives its range (else None).
    ``chunks``: a subsample-and-aggregate request (basis ``"chunk_spread"``); ``nuisance`` is
    then ``"chunks"`` for the chunk preset, whose coverage ``MEASURED_BANDS["chunks"]`` holds.
    """
    if chunks is not None:
        return _chunks_coverage(domain, nuisance, epsilon, chunks, adjustment_set)
    randomised = domain.design == StudyDesign.RCT
    by_design = randomised and mode == "strict" and estimator in ("aipw", "rct_difference")
    message = _DESIGN_MESSAGE
    measured: dict[str, Any] | None = None
    if not by_design:
        message = _NUISANCE_MESSAGE
    if nuisance and epsilon is not None:
        n_epsilon = float(domain.n) * float(epsilon)
        band = measured_band(nuisance, n_epsilon, randomised=randomised)
        if band is not None:
            measured = _band_block(nuisance, band, n_epsilon, randomised)
            message += _band_sentence(
                nuisance, band, n_epsilon, randomised, domain.q, adjustment_set
            )
        hinted = not (randomised or adjustment_set) and estimator == "aipw"
        if hinted and n_epsilon >= _ADJUSTMENT_HINT_MIN_N_EPSILON:
            message += _ADJUSTMENT_HINT
    narrowed: dict[str, Any] | None = None
    if narrowed_clip and not randomised and measured is None:
        message += _NARROWED_CLIP_NOTE
        low, high = NARROWED_CLIP_COVERAGE
        narrowed = {
            "coverage_low": low,
            "coverage_high": high,
            "source": "bench/README.md, 'Observational studies after'",
        }
    return {
        "basis": DESIGN if by_design else NUISANCE_MODELS,
        "nuisance_error_covered": by_design,
        "message": message,
        "measured": measured,
        "narrowed_clip_coverage": narrowed,
    }


_UNMEASURED_CHUNKS_NOTE = (
    " Not measured at this request's settings (only the chunk preset was: leave the chunk's "
    "fields out)."
)


def _chunks_coverage(
    domain: PublicDomain,
    nuisance: str | None,
    epsilon: float | None,
    chunks: int,
    adjusted: bool,
) -> dict[str, Any]:
    message = _CHUNKS_MESSAGE.format(chunks=chunks)
    measured: dict[str, Any] | None = None
    band = None
    if nuisance == "chunks" and epsilon is not None:
        n_epsilon = float(domain.n) * float(epsilon)
        band = measured_band(nuisance, n_epsilon)
        if band is not None:
            measured = _band_block(nuisance, band, n_epsilon, False)
            message += _band_sentence(nuisance, band, n_epsilon, False, domain.q, adjusted)
    if band is None:
        message += _UNMEASURED_CHUNKS_NOTE
    return {
        "basis": CHUNK_SPREAD,
        "nuisance_error_covered": False,
        "message": message,
        "measured": measured,
        "narrowed_clip_coverage": None,
    }
