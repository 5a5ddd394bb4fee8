"""Request and response models of the datasets resource, the public schema included."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from service.ledger import amounts
from service.points import MAX_COVARIATES

NAME_PATTERN = r"^[^\x00-\x1f]{1,200}$"
# A unit or a code's label: short, printable text shown beside values (no control characters).
LABEL_PATTERN = r"^[^\x00-\x1f]{1,80}$"
UNIT_DESCRIPTION = (
    "The unit of the values (e.g. 'years', 'mg/dL', 'EUR', 'days'): shown to analysts and "
    "decision-support clients beside bounds, points and effects. Public, declared; not checked "
    "against the data, so it must be the unit the column's values are in."
)
CODE_LABELS_DESCRIPTION = (
    'What each code means, by code (JSON keys are the codes as text), e.g. {"0": "female", '
    '"1": "male"}; a code may be left out. Public, declared; shown beside the codes.'
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OutOfBoundsPolicy(StrEnum):
    CLIP = "clip"
    REJECT_ROW = "reject_row"
    REJECT_UPLOAD = "reject_upload"


class MissingPolicy(StrEnum):
    IMPUTE = "impute"
    REJECT_ROW = "reject_row"
    REJECT_UPLOAD = "reject_upload"


def _finite(value: float | None, what: str) -> None:
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{what} must be finite")


class Covariate(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    type: Literal["numeric", "categorical"] = "numeric"
    lower: StrictFloat | None = None
    upper: StrictFloat | None = None
    codes: list[StrictInt] | None = Field(default=None, min_length=2, max_length=1000)
    impute: StrictFloat | None = None
    # A pre-specified effect modifier (e.g. from the trial's analysis plan): the CATE kinds'
    # DP-EBM effect model varies with the declared modifiers only unless a request names its
    # own effect_columns (docs/proofs/ebm_cate.md step 7). Public, declared, never derived.
    effect_modifier: StrictBool = False
    # In the analysis plan's pre-specified adjustment set (the confounders of an observational
    # study, a trial's baseline covariates): the strict ate's nuisance models adjust for the
    # declared set only unless a request names its own adjustment_columns (ate_strict proof
    # §15). Public, declared, never derived.
    adjust_for: StrictBool = False
    unit: str | None = Field(default=None, pattern=LABEL_PATTERN, description=UNIT_DESCRIPTION)
    code_labels: dict[int, Annotated[str, Field(pattern=LABEL_PATTERN)]] | None = Field(
        default=None, max_length=1000, description=CODE_LABELS_DESCRIPTION
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.type == "numeric":
            if self.lower is None or self.upper is None:
                raise ValueError(f"numeric covariate '{self.name}' needs lower and upper bounds")
            if self.codes is not None:
                raise ValueError(f"numeric covariate '{self.name}' cannot have codes")
            if self.code_labels is not None:
                raise ValueError(
                    f"numeric covariate '{self.name}' cannot have code_labels (they name a "
                    "categorical covariate's codes)"
                )
        else:
            if not self.codes:
                raise ValueError(f"categorical covariate '{self.name}' needs its codes")
            if len(set(self.codes)) != len(self.codes):
                raise ValueError(f"categorical covariate '{self.name}' lists a code twice")
            if self.lower is not None or self.upper is not None:
                raise ValueError(f"categorical covariate '{self.name}' takes codes, not bounds")
            unknown = sorted(set(self.code_labels or {}) - set(self.codes))
            if unknown:
                raise ValueError(
                    f"categorical covariate '{self.name}': code_labels names "
                    f"{', '.join(str(c) for c in unknown)}, not among its codes"
                )
        _finite(self.lower, "lower")
        _finite(self.upper, "upper")
        _finite(self.impute, "impute")
        if self.type == "numeric":
            assert self.lower is not None
            assert self.upper is not None
            if not self.lower < self.upper:
                raise ValueError(f"covariate '{self.name}': lower must be below upper")
            if self.impute is not None and not self.lower <= self.impute <= self.upper:
                raise ValueError(f"covariate '{self.name}': impute lies outside its bounds")
        elif self.impute is not None and self.codes and int(self.impute) not in self.codes:
            raise ValueError(f"covariate '{self.name}': impute is not one of its codes")
        return self

    @property
    def bounds(self) -> tuple[float, float]:
        if self.type == "categorical":
            assert self.codes
            return float(min(self.codes)), float(max(self.codes))
        assert self.lower is not None
        assert self.upper is not None
        return self.lower, self.upper


class Treatment(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    code_labels: dict[int, Annotated[str, Field(pattern=LABEL_PATTERN)]] | None = Field(
        default=None,
        description='What the treatment\'s codes 0 and 1 mean, e.g. {"0": "usual care", '
        '"1": "new pathway"}: an effect is (outcome under 1) minus (outcome under 0).',
    )

    @model_validator(mode="after")
    def _codes(self) -> Self:
        if not set(self.code_labels or {}) <= {0, 1}:
            raise ValueError("treatment: code_labels names the codes 0 and 1 only")
        return self


class Outcome(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    # "binary": a yes/no outcome coded 0 and 1 (bounds 0 and 1; any other value counts as
    # missing, as a categorical covariate's non-code). Its variance is at most 1/4, which the
    # quotes use instead of the general assumption sd(Y) = R_Y / 12. Public, declared.
    type: Literal["numeric", "binary"] = "numeric"
    lower: StrictFloat
    upper: StrictFloat
    impute: StrictFloat | None = None
    unit: str | None = Field(default=None, pattern=LABEL_PATTERN, description=UNIT_DESCRIPTION)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        _finite(self.lower, "lower")
        _finite(self.upper, "upper")
        _finite(self.impute, "impute")
        if not self.lower < self.upper:
            raise ValueError("outcome: lower must be below upper")
        if self.impute is not None and not self.lower <= self.impute <= self.upper:
            raise ValueError("outcome: impute lies outside its bounds")
        if self.type == "binary":
            if (self.lower, self.upper) != (0.0, 1.0):
                raise ValueError("a binary outcome is coded 0 and 1: lower 0, upper 1")
            if self.impute is not None and self.impute not in (0.0, 1.0):
                raise ValueError("a binary outcome's impute value is 0 or 1")
        return self


class PublicSchema(Strict):
    """Declared by the owner; public; never derived from the data."""

    covariates: list[Covariate] = Field(min_length=1, max_length=MAX_COVARIATES)
    treatment: Treatment
    outcome: Outcome
    drop_columns: list[str] = Field(default_factory=list, max_length=1000)
    out_of_bounds: OutOfBoundsPolicy = OutOfBoundsPolicy.CLIP
    missing: MissingPolicy = MissingPolicy.REJECT_UPLOAD
    design: Literal["observational", "rct"] = "observational"
    treatment_probability: StrictFloat | None = Field(default=None, gt=0, lt=1)
    min_propensity_clip: StrictFloat = Field(default=0.01, gt=0, le=0.5)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [c.name for c in self.covariates] + [self.treatment.name, self.outcome.name]
        names += self.drop_columns
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ValueError(f"column '{name}' is named twice in the schema")
            seen.add(name)
        if self.design == "rct" and self.treatment_probability is None:
            raise ValueError("an RCT schema must declare treatment_probability")
        if self.design == "observational" and self.treatment_probability is not None:
            raise ValueError("treatment_probability is only declared for an RCT")
        if self.missing == MissingPolicy.IMPUTE and not (
            any(c.impute is not None for c in self.covariates) or self.outcome.impute is not None
        ):
            # per column: a declared impute value fills that column's holes; a row with a hole
            # in a column without one is dropped (as under reject_row)
            raise ValueError(
                "missing='impute' needs an impute value on at least one column (the columns "
                "without one drop the rows missing them); or use missing='reject_row'"
            )
        return self


class CovariateInfo(BaseModel):
    """What a covariate's values mean, from the public schema (for showing and entering points)."""

    name: str
    type: Literal["numeric", "categorical"]
    unit: str | None = None
    lower: float
    upper: float
    codes: list[int] | None = None
    code_labels: dict[int, str] | None = None


class OutcomeInfo(BaseModel):
    """The outcome an effect is measured on, from the public schema: an effect is in its unit."""

    name: str
    type: Literal["numeric", "binary"]
    unit: str | None = None
    lower: float
    upper: float


class TreatmentInfo(BaseModel):
    """The treatment column: an effect is (outcome under code 1) minus (outcome under code 0)."""

    name: str
    code_labels: dict[int, str] | None = None


def variable_info(schema: PublicSchema) -> dict[str, Any]:
    """The schema's names, units, bounds and code labels as the ``covariate_info``,
    ``outcome`` and ``treatment`` fields of a function's metadata (public, declared)."""
    covariates = [
        CovariateInfo(
            name=c.name,
            type=c.type,
            unit=c.unit,
            lower=c.bounds[0],
            upper=c.bounds[1],
            codes=c.codes,
            code_labels=c.code_labels,
        )
        for c in schema.covariates
    ]
    outcome = schema.outcome
    return {
        "covariate_info": covariates,
        "outcome": OutcomeInfo(
            name=outcome.name,
            type=outcome.type,
            unit=outcome.unit,
            lower=outcome.lower,
            upper=outcome.upper,
        ),
        "treatment": TreatmentInfo(
            name=schema.treatment.name, code_labels=schema.treatment.code_labels
        ),
    }


# Largest magnitude of a declared bound, code or impute value accepted at upload. Mechanisms
# square and multiply ranges (sensitivities, R_Y^2, regression designs); with |bound| <= 1e15
# every range is at most 2e15 and its powers used downstream stay far from float overflow.
MAX_ABS_BOUND = 1e15
# A declared range narrower than this share of its magnitude (at least 1) is refused at upload:
# the noise scales it implies fall outside the samplers' range (a security auditor's outcome
# bounds [0, 1e-300] made every quote fail); rescaling the column's units fixes it.
MIN_RELATIVE_RANGE = 1e-12
# A randomised design's declared probability lies in [this, 1 - this]: inverse-probability
# weights of 1 / 1e-300 overflowed uplift_table's calibration (a 500).
MIN_TREATMENT_PROBABILITY = 1e-3


class UploadSchema(PublicSchema):
    """The schema as checked at upload: ``PublicSchema`` plus the magnitude limit
    ``MAX_ABS_BOUND`` on bounds, codes and impute values (a stored schema is read back as
    ``PublicSchema``, so one stored before the limit stays readable)."""

    @model_validator(mode="after")
    def _magnitudes(self) -> Self:
        places: list[tuple[str, float | int | None]] = []
        for i, c in enumerate(self.covariates):
            places += [
                (f"covariates/{i}/lower", c.lower),
                (f"covariates/{i}/upper", c.upper),
                (f"covariates/{i}/impute", c.impute),
            ]
            places += [(f"covariates/{i}/codes", k) for k in c.codes or ()]
        places += [
            ("outcome/lower", self.outcome.lower),
            ("outcome/upper", self.outcome.upper),
            ("outcome/impute", self.outcome.impute),
        ]
        for where, value in places:
            if value is not None and not abs(value) <= MAX_ABS_BOUND:
                raise ValueError(
                    f"{where}: declared bounds, codes and impute values must lie within "
                    f"[-{MAX_ABS_BOUND:g}, {MAX_ABS_BOUND:g}]"
                )
        ranges = [(f"covariates/{i}", c.lower, c.upper) for i, c in enumerate(self.covariates)]
        ranges.append(("outcome", self.outcome.lower, self.outcome.upper))
        for where, lower, upper in ranges:
            if lower is not None and upper is not None:
                scale = max(1.0, abs(lower), abs(upper))
                if upper - lower < MIN_RELATIVE_RANGE * scale:
                    raise ValueError(
                        f"{where}: the declared range is narrower than {MIN_RELATIVE_RANGE:g} "
                        "of its magnitude (at least 1); rescale the column (e.g. to other units)"
                    )
        p = self.treatment_probability
        if p is not None and not MIN_TREATMENT_PROBABILITY <= p <= 1 - MIN_TREATMENT_PROBABILITY:
            raise ValueError(
                f"treatment_probability must lie in [{MIN_TREATMENT_PROBABILITY:g}, "
                f"{1 - MIN_TREATMENT_PROBABILITY:g}]"
            )
        return self


CSV_DELIMITERS = (",", ";", "\t", "|")


class CsvFormat(Strict):
    """How the uploaded file is written: a property of the file, not of the dataset (used to
    read it, shown in the owner's ingest report, not stored)."""

    delimiter: Literal[",", ";", "\t", "|"] | None = Field(
        default=None,
        description="The field separator. Omitted: the one of , ; tab | that splits the header "
        "line into the schema's columns (the header holds column names only).",
    )
    decimal: Literal[".", ","] = Field(
        default=".", description="The decimal mark of numbers ('30,5' with ',')."
    )
    encoding: Literal["utf-8", "cp1252", "latin-1"] = Field(
        default="utf-8",
        description="The file's text encoding: utf-8 (a byte-order mark is allowed), or cp1252 "
        "/ latin-1 for files saved by Excel's plain 'CSV' on Western-European Windows.",
    )
    missing_values: list[Annotated[str, Field(max_length=32)]] = Field(
        default_factory=list,
        max_length=100,
        description="Markers of a missing value besides the built-in ones (an empty field, NA, "
        "N/A, NULL, null, NaN, nan, #N/A and their variants), e.g. '.' (SAS, Stata) or '-99'.",
    )

    labels: dict[
        Annotated[str, Field(max_length=200)],
        Annotated[dict[Annotated[str, Field(max_length=100)], StrictFloat], Field(max_length=1000)],
    ] = Field(
        default_factory=dict,
        max_length=500,
        description='Text values to read as numbers, by column: e.g. {"arm": {"treated": 1, '
        '"control": 0}, "sex": {"F": 0, "M": 1}}. A labelled column holds its labels '
        "(surrounding spaces ignored) and missing-value markers only; the numbers are then "
        "checked like any others (the treatment 0 or 1, a categorical covariate's codes).",
    )

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if self.decimal == "," and self.delimiter == ",":
            raise ValueError("a decimal comma needs another delimiter (e.g. ';')")
        for column, mapping in self.labels.items():
            for label, code in mapping.items():
                if not math.isfinite(code):
                    raise ValueError(f"labels/{column}/{label}: the code must be finite")
        return self


class IngestReport(BaseModel):
    """Shown once, to the uploading owner only; never stored, logged or shown to others."""

    rows_received: int
    n: int
    rows_rejected: int
    cells_clipped: dict[str, int]
    cells_imputed: dict[str, int]
    rows_rejected_by_column: dict[str, int] = Field(
        default_factory=dict,
        description="Rows rejected under a reject_row policy, by the column that caused it (a "
        "row with several bad values counts in each of its columns).",
    )
    cells_not_a_code: dict[str, int] = Field(
        default_factory=dict,
        description="Per categorical column (and a binary outcome): the values that were none "
        "of its declared codes. They count as missing, so they are also in cells_imputed or "
        "rows_rejected_by_column: an undeclared code shows here, not as a missing value.",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="Columns clipped (or rows rejected) in more than 1 % of the rows: the "
        "declared bounds are probably not the column's honest range; a covariate with one "
        "value; an arm or an outcome no estimate can be made from.",
    )
    csv_format: CsvFormat | None = Field(
        default=None, description="How the file was read (the delimiter as found in the header)."
    )


class UploadCheck(BaseModel):
    """``POST /v1/datasets/check``: what an upload of the file would store and report; nothing
    is stored. The report is the uploading owner's, as at an upload."""

    n: int = Field(description="The rows an upload would keep")
    ingest_report: IngestReport


class BudgetRead(BaseModel):
    is_set: bool
    epsilon_total: float
    delta_total: float
    epsilon_spent: float
    delta_spent: float
    epsilon_remaining: float
    delta_remaining: float
    epsilon_spent_paper: float = Field(
        description="Part of epsilon_spent charged by paper-mode (heuristic) releases."
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="A total that gives little protection: delta_total not below 1/n (a "
        "release may then reveal a record outright with probability about delta).",
    )


class DatasetRead(BaseModel):
    id: str
    name: str
    description: str
    owner_id: str
    version: int
    n: int
    status: Literal["ready", "deleted"] = Field(
        description="ready; deleted: the rows were deleted (no release can run; the ledger stays)"
    )
    allow_paper_mode: bool
    created_at: str
    schema_: PublicSchema = Field(alias="schema", serialization_alias="schema")
    schema_hash: str
    budget: BudgetRead

    model_config = ConfigDict(populate_by_name=True)


class DatasetCreated(DatasetRead):
    ingest_report: IngestReport


class DatasetUpdate(Strict):
    description: str | None = Field(default=None, max_length=10_000)
    allow_paper_mode: StrictBool | None = None


def _ledger_amount(value: float | None, field: str) -> float | None:
    """Refuse (422) an amount the ledger cannot hold (subnormal, too large), before the ledger
    raises ``InvalidAmount`` on it. ``field`` starting with ``epsilon`` or ``delta`` picks the
    ledger's unit."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise ValueError("must be finite")
    to_units = (
        amounts.epsilon_total_units if field.startswith("epsilon") else amounts.delta_total_units
    )
    try:
        to_units(value)
    except amounts.InvalidAmount as exc:
        raise ValueError(str(exc)) from None
    return value


class BudgetUpdate(Strict):
    epsilon_total: StrictFloat = Field(gt=0, le=1e6)
    delta_total: StrictFloat = Field(ge=0, lt=1)

    @field_validator("epsilon_total", "delta_total")
    @classmethod
    def _amount(cls, v: float, info: ValidationInfo) -> float:
        checked = _ledger_amount(v, str(info.field_name))
        assert checked is not None
        return checked


class GrantUpdate(Strict):
    epsilon_cap: StrictFloat | None = Field(default=None, gt=0, le=1e6)
    delta_cap: StrictFloat | None = Field(default=None, ge=0, lt=1)

    @field_validator("epsilon_cap", "delta_cap")
    @classmethod
    def _amount(cls, v: float | None, info: ValidationInfo) -> float | None:
        return _ledger_amount(v, str(info.field_name))


class GrantRead(BaseModel):
    principal_id: str
    epsilon_cap: float | None
    delta_cap: float | None
    epsilon_spent: float
    delta_spent: float
    revoked: bool
    created_at: str


class VerificationRead(BaseModel):
    valid: bool
    entries: int
    head_hash: str
    first_invalid_seq: int | None
    reason: str | None


class LedgerEntryRead(BaseModel):
    """One ledger entry in the owner's audit view; amounts are exact decimal strings."""

    seq: int
    entry_type: str = Field(description="create, budget, grant, charge or rows_deleted")
    created_at: str
    principal_id: str = Field(description="Who caused the entry (the analyst charged, the owner)")
    release_id: str | None
    guarantee: str | None = Field(description="strict or paper, for charges")
    epsilon: str
    delta: str
    epsilon_spent: str
    delta_spent: str
    epsilon_total: str
    delta_total: str
    idempotency_key: str | None
    request_hash: str | None
    details_json: str
    prev_hash: str
    row_hash: str
    release_kind: str | None = Field(
        default=None, description="The charged release's kind (charges only; not hashed)"
    )
    release_status: str | None = Field(
        default=None,
        description="The charged release's status now, as GET /v1/releases/{id} shows it "
        "(charges only; not hashed)",
    )


class LedgerPage(BaseModel):
    dataset_id: str
    total: int = Field(description="Entries matching the filters, over all pages")
    offset: int
    limit: int | None = Field(description="The page size asked for; null: every entry")
    entries: list[LedgerEntryRead]
