"""Privacy- and accuracy-shaping numbers are strictly typed in every request model (issue 13).

Booleans and numeric strings are refused for every numeric field (``true`` is not 1.0 and
``"0.5"`` is not 0.5); a boolean field refuses ``1`` and ``"true"``. Every field of every model
is enumerated, so a field added later without strict typing fails here.
"""

from __future__ import annotations

import json
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from service.datasets.schemas import (
    BudgetUpdate,
    Covariate,
    DatasetUpdate,
    GrantUpdate,
    Outcome,
    PublicSchema,
)
from service.functions.schemas import EvaluateRequest
from service.releases.kinds import REGISTRY
from service.releases.predict import PredictRequest
from service.releases.schemas import ReleaseCreate
from tests.conftest import SCHEMA

BAD_NUMBERS: tuple[Any, ...] = (True, False, "0.5", "1e0", "1")
BAD_FLAGS: tuple[Any, ...] = (1, 0, "true", "false", "1")

# A valid request of each model; a field is then replaced by a wrongly typed value.
VALID: dict[type[BaseModel], dict[str, Any]] = {
    **{
        kind.Params: {"epsilon": 1.0}
        | ({"points": [[50.0, 0.5, 1.0]]} if name == "cate_vector" else {})
        for name, kind in REGISTRY.items()
    },
    BudgetUpdate: {"epsilon_total": 1.0, "delta_total": 1e-5},
    GrantUpdate: {"epsilon_cap": 1.0, "delta_cap": 1e-6},
    DatasetUpdate: {"allow_paper_mode": True},
    Covariate: {"name": "x", "lower": 0.0, "upper": 1.0},
    Outcome: {"name": "y", "lower": -1.0, "upper": 1.0},
    PublicSchema: SCHEMA,
    EvaluateRequest: {"points": [[50.0, 0.5, 1.0]]},
    PredictRequest: {"points": [[50.0, 0.5, 1.0]]},
    ReleaseCreate: {"kind": "ate", "params": {"epsilon": 1.0}},
}


def _strip_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return inner
    return annotation


def _typed_fields(model: type[BaseModel]) -> list[tuple[str, str, str]]:
    """(field, "number" | "flag", shape) for every numeric or boolean field of ``model``."""
    out = []
    for name, field in model.model_fields.items():
        annotation = _strip_optional(field.annotation)
        depth = 0
        while get_origin(annotation) in (list, tuple, Annotated):
            # a list type may itself be annotated (service.points.Point: a length check)
            if get_origin(annotation) is not Annotated:
                depth += 1
            annotation = get_args(annotation)[0]
        if annotation is bool:
            kind = "flag"
        elif annotation in (int, float):
            kind = "number"
        else:
            continue
        out.append((name, kind, ("scalar", "sequence", "matrix")[depth]))
    return out


def _shaped(value: Any, shape: str) -> Any:
    return [[value]] if shape == "matrix" else [value] if shape == "sequence" else value


CASES = [
    pytest.param(model, field, shape, bad, id=f"{model.__name__}.{field}={bad!r}")
    for model in VALID
    for field, kind, shape in _typed_fields(model)
    for bad in (BAD_FLAGS if kind == "flag" else BAD_NUMBERS)
]


def test_every_model_has_typed_fields_enumerated() -> None:
    for model in VALID:
        model.model_validate(VALID[model])  # the base requests are valid
    fields = {(m.__name__, f) for m in VALID for f, _, _ in _typed_fields(m)}
    # Spot checks that the enumeration sees what matters (kinds, caps, schema bounds).
    for expected in [
        ("AteParams", "epsilon"),
        ("AteParams", "fold_fractions"),
        ("AteParams", "cross_fit"),
        ("UpliftTableRequest", "bins"),
        ("CateFunctionParams", "t_max"),
        ("EbmCateRequest", "max_rounds"),
        ("CateVectorRequest", "points"),
        ("BudgetUpdate", "delta_total"),
        ("GrantUpdate", "epsilon_cap"),
        ("Covariate", "codes"),
        ("Outcome", "lower"),
        ("PublicSchema", "treatment_probability"),
        ("EvaluateRequest", "points"),
    ]:
        assert expected in fields


@pytest.mark.parametrize(("model", "field", "shape", "bad"), CASES)
def test_wrongly_typed_value_is_refused(
    model: type[BaseModel], field: str, shape: str, bad: Any
) -> None:
    raw = {**VALID[model], field: _shaped(bad, shape)}
    with pytest.raises(ValidationError) as caught:
        model.model_validate(raw)
    locs = [e["loc"] for e in caught.value.errors()]
    assert any(loc and loc[0] == field for loc in locs), locs
    # Same through JSON (the schema and every HTTP body arrive as JSON).
    with pytest.raises(ValidationError):
        model.model_validate_json(json.dumps(raw))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_stored_requests_still_revalidate(name: str) -> None:
    """A validated request dumped to JSON (as releases store it) validates again."""
    params = REGISTRY[name].Params.model_validate(VALID[REGISTRY[name].Params])
    dumped = json.loads(json.dumps(params.model_dump(mode="json")))
    assert REGISTRY[name].Params.model_validate(dumped) == params


def test_integers_still_count_as_numbers() -> None:
    """JSON has one number type: 1 is a valid epsilon, bound or cap."""
    for name, kind in REGISTRY.items():
        base = VALID[kind.Params]
        assert kind.Params.model_validate({**base, "epsilon": 2}).epsilon == 2.0, name  # type: ignore[attr-defined]
    assert BudgetUpdate.model_validate({"epsilon_total": 3, "delta_total": 0}).epsilon_total == 3
    ate = REGISTRY["ate"].Params.model_validate({"epsilon": 1, "fold_fractions": [1, 1, 2]})
    assert ate.fold_fractions == (1.0, 1.0, 2.0)  # type: ignore[attr-defined]
