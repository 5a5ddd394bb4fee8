"""The CLI's human view of long results: a table cut to its first rows and a count."""

from __future__ import annotations

from typing import Any

from dpcurator.cli import render
from dpcurator.results import AteResult, CateVectorResult, UpliftTable


def _uplift(cells: int) -> dict[str, Any]:
    return {
        "kind": "uplift_table",
        "estimator": "ebm",
        "guarantee": "strict",
        "epsilon": 1.0,
        "cells": cells,
        "uplift": [float(i) for i in range(cells)],
        "uplift_noise_sd": [0.5] * cells,
        "grid": {"edges": [[0.0, 1.0]]},
    }


def test_a_long_uplift_table_shows_its_first_rows_and_counts_the_rest() -> None:
    parsed = UpliftTable.from_result(_uplift(12_000))
    text = render.result(parsed)
    lines = text.splitlines()
    assert "cells" in lines[0]
    assert "12000" in lines[0]
    assert any("estimator" in line and "ebm" in line for line in lines)
    assert lines[-1].startswith(f"... {12_000 - render.MAX_ROWS} more rows of 12000")
    body = [line for line in lines if line.strip()[:1].isdigit()]
    assert len(body) == render.MAX_ROWS  # header block and footer aside, one line a row
    every = render.result(parsed, max_rows=None)
    assert "more rows" not in every
    assert len(every.splitlines()) > 12_000


def test_a_short_table_is_shown_whole() -> None:
    parsed = UpliftTable.from_result(_uplift(8))
    text = render.result(parsed)
    assert "more rows" not in text
    body = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in body] == [str(i) for i in range(8)]  # every cell, in order


def test_a_long_cate_vector_is_cut_too() -> None:
    result = {
        "kind": "cate_vector",
        "estimates": [0.1] * 100,
        "points": [[float(i)] for i in range(100)],
        "guarantee": "strict",
        "epsilon": 1.0,
    }
    parsed = CateVectorResult.from_result(result)
    text = render.result(parsed, max_rows=10)
    assert text.splitlines()[-1].startswith("... 90 more rows of 100")


def test_the_dataset_view_numbers_the_covariates_and_shows_their_declared_roles() -> None:
    """The positions are what effect_columns and adjustment_columns take; each covariate's
    public box (bounds or codes) is what a query point must lie in."""
    from dpcurator.models import Dataset

    schema = {
        "covariates": [
            {"name": "age", "lower": 18, "upper": 90, "adjust_for": True, "unit": "years"},
            {
                "name": "severity",
                "lower": 0.0,
                "upper": 1.5,
                "adjust_for": True,
                "effect_modifier": True,
            },
            {
                "name": "sex",
                "type": "categorical",
                "codes": [0, 1],
                "code_labels": {"0": "female", "1": "male"},
            },
        ],
        "treatment": {"name": "treated"},
        "outcome": {"name": "outcome", "lower": -5, "upper": 65, "unit": "days"},
    }
    zero = dict.fromkeys(("epsilon_total", "delta_total", "epsilon_spent", "delta_spent"), 0.0) | {
        "epsilon_remaining": 0.0,
        "delta_remaining": 0.0,
        "is_set": False,
    }
    dataset = Dataset.model_validate(
        {
            "id": "d1",
            "name": "study",
            "owner_id": "o1",
            "version": 1,
            "n": 10,
            "status": "ready",
            "created_at": "2026-11-27",
            "schema": schema,
            "schema_hash": "h",
            "budget": zero,
        }
    )
    line = next(x for x in render.dataset(dataset).splitlines() if x.startswith("covariates"))
    assert line.split(None, 1)[1] == (
        "0 age [18, 90] years (adjustment set), 1 severity [0, 1.5] (adjustment set, effect "
        "modifier), 2 sex {0 female, 1 male}"
    )
    outcome = next(x for x in render.dataset(dataset).splitlines() if x.startswith("outcome"))
    assert outcome.split(None, 1)[1] == "outcome [-5, 65] days"


def test_the_quote_view_shows_the_expected_width_and_the_verdict_against_the_ate() -> None:
    from dpcurator.models import Quote

    quote = Quote.model_validate(
        {
            "kind": "cate_function",
            "guarantee": "strict",
            "epsilon": 1.0,
            "delta": 1e-5,
            "fits_budget": True,
            "epsilon_remaining": 9.0,
            "delta_remaining": 1e-4,
            "accuracy": {
                "basis": "ebm",
                "expected_half_width": 4.42,
                "min_half_width": 4.24,
                "versus_ate": {"verdict": "not_expected", "message": "request the ATE instead"},
            },
            "mechanism": {},
        }
    )
    shown = {
        key.strip(): value.strip()
        for key, value in (line.split("  ", 1) for line in render.quote(quote).splitlines())
    }
    assert shown["basis"] == "ebm"
    assert shown["expected half width"] == "4.42"
    assert shown["min half width (privacy noise alone)"] == "4.24"
    assert shown["versus the ATE"] == "not_expected"
    assert shown["why"] == "request the ATE instead"
    # with the adaptive clip the floor is at the smallest clip the quantile can draw, a bound
    # no release comes near (walkthroughs read 0.0086 as the noise beside an expected 0.956, and
    # 9.57e-05 as meaningless): not shown; the declared bound's worst case is
    adaptive = quote.model_copy(
        update={
            "accuracy": {
                "expected_half_width": 0.956,
                "min_half_width": 0.0086,
                "max_noise_half_width": 2.4,
                "expected_clip": 3.1,
            }
        }
    )
    shown = {
        key.strip(): value.strip()
        for key, value in (line.split("  ", 1) for line in render.quote(adaptive).splitlines())
    }
    assert not [key for key in shown if key.startswith("min half width")]
    assert shown["expected half width"] == "0.956"
    assert shown["noise half width at the declared bound (the worst case)"] == "2.4"


def test_an_anchored_cate_at_factor_zero_says_every_estimate_is_the_anchor() -> None:
    result = {
        "estimates": [0.33, 0.33],
        "points": [[1.0], [2.0]],
        "ate_anchor": 0.33,
        "ate_anchor_interval": {"lower": 0.21, "upper": 0.45, "level": 0.95},
        "shrinkage_factor": 0.0,
        "guarantee": "strict",
    }
    text = render.result(CateVectorResult.from_result(result))
    assert "shrinkage factor" in text
    assert "every estimate is the anchor" in text
    assert "ate anchor 95% CI  [0.21, 0.45]" in " ".join(text.split(" ")).replace("   ", "  ")


def test_an_anchor_without_an_interval_says_so_and_a_one_cell_table_shows_its_ate_ci() -> None:
    """A statistician read 'ate +0.684' from an observational ebm release (its anchor is the
    effect fold's DP ATE, which carries no interval) with nothing saying how uncertain it
    was, and the one-cell uplift table's interval only in --json."""
    from dpcurator.results import EbmShapeResult, UpliftTable

    ebm = {
        "ate": 0.684,
        "ate_anchor": 0.684,
        "shrinkage_factor": 0.0,
        "anchor_source": "effect_fold",
        "learner": "dr",
        "guarantee": "strict",
        "epsilon": 0.5,
        "delta": 1e-7,
        "intercept": 0.684,
        "shape_functions": [],
    }
    text = render.result(EbmShapeResult.from_result(ebm))
    assert "ate anchor CI" in text
    assert "none given" in text
    assert "an `ate` release gives the ATE with its interval" in text
    table = {
        "cells": 1,
        "partition": {"type": "grid", "bins": [1], "lower": [0.0], "upper": [1.0]},
        "uplift": [-9.19],
        "uplift_noise_sd": [5.0],
        "low_count": [False],
        "ate_anchor": -9.19,
        "shrinkage_factor": 0.0,
        "guarantee": "strict",
        "epsilon": 0.25,
        "adjusted_ate": {
            "estimate": -9.19,
            "ci_lower": -32.2,
            "ci_upper": 13.8,
            "ci_level": 0.95,
            "coverage": {"message": "covers sampling and privacy noise, not the models' bias"},
        },
    }
    text = render.result(UpliftTable.from_result(table))
    assert "ate anchor 95% CI" in text
    assert "[-32.2, 13.8]" in text
    assert "not the models' bias" in text


def test_ebm_features_are_labelled_with_their_column_names() -> None:
    """The server names each covariate by its schema column (the S-learner's treatment term
    ``treatment``); releases stored before that say ``xj`` for covariate j, which the client
    labels with the column's name. A column literally named ``x1`` is shown as it is."""
    names = ["age", "bmi", "sex"]
    assert render.feature_label("bmi", names) == "bmi"
    assert render.feature_label("x1", ["x0", "x1"]) == "x1"
    assert render.feature_label("x1", ["x1", "x0"]) == "x1"
    assert render.feature_label("x0", names) == "x0 (age)"
    assert render.feature_label("x1", names) == "x1 (bmi)"
    assert render.feature_label("treatment", names) == "treatment"
    assert render.feature_label("x7", names) == "x7"  # not a column: as the server says
    assert render.feature_label("x1 & x2", names) == "x1 & x2"
    assert render.feature_label("x1", None) == "x1"


def test_an_ate_result_says_which_estimator_ran() -> None:
    """A trial re-test: release show gave no estimator, where a public rule now chooses it."""
    base = {
        "estimate": -0.08,
        "ci_lower": -0.11,
        "ci_upper": -0.05,
        "guarantee": "strict",
        "epsilon": 1.0,
        "delta": 0.0,
    }
    parsed = AteResult.from_result({**base, "estimator": "rct_difference"})
    assert parsed.estimator == "rct_difference"
    assert parsed.nuisance is None
    text = render.result(parsed)
    assert "rct_difference" in text
    assert "nuisance" not in text
    aipw = AteResult.from_result({**base, "estimator": "aipw", "nuisance": "dp_linear"})
    assert "dp_linear" in render.result(aipw)
    assert AteResult.from_result(base).estimator is None  # an older server's result


def test_a_chunked_ate_result_shows_its_chunks() -> None:
    parsed = AteResult.from_result(
        {
            "estimate": 2.1,
            "ci_lower": 0.4,
            "ci_upper": 3.8,
            "guarantee": "strict",
            "epsilon": 1.0,
            "delta": 1e-5,
            "estimator": "aipw",
            "chunks": 4,
            "chunk_size": 1250,
            "chunk_estimates": [1.5, 2.25, 3.0, 1.65],
        }
    )
    assert parsed.chunk_estimates == (1.5, 2.25, 3.0, 1.65)
    text = render.result(parsed)
    assert "4 of 1250 rows (t interval over their estimates: 1.5, 2.25, 3, 1.65)" in text
    single = AteResult.from_result({**parsed.raw, "chunks": None, "chunk_estimates": None})
    assert "chunks" not in render.result(single)
    assert single.chunk_estimates is None
