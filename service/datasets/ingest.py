"""CSV ingest: parse, check against the public schema, apply the declared policies.

Returns the float64 matrix ``[X | A | Y]`` and an owner-only report. Error messages name the
column and the row (the owner holds the file) but never quote a value.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from numpy.typing import NDArray

from service.datasets.schemas import (
    IngestReport,
    MissingPolicy,
    OutOfBoundsPolicy,
    PublicSchema,
)


class CsvError(ValueError):
    """The file does not match the schema. ``pointer`` names the place, never a value."""

    def __init__(self, detail: str, pointer: str | None = None) -> None:
        super().__init__(detail)
        self.pointer = pointer


@dataclass(frozen=True)
class Ingested:
    matrix: NDArray[np.float64]  # (n, q + 2): covariates, treatment, outcome
    report: IngestReport


_ROW_RE = re.compile(r"Row #(\d+)")
_COL_RE = re.compile(r"column #(\d+)")


# A column clipped (or rows rejected) in more than this share of the rows gets a warning: the
# declared bounds are then probably not the column's honest range.
WARN_SHARE = 0.01


# What arrow's reader takes as a missing value (strings_can_be_null): not a conversion error.
_ARROW_NULLS = frozenset(pacsv.ConvertOptions().null_values)


def _first_bad_row(
    path: Path, header: list[str], wanted: list[str], *, numbers: bool
) -> int | None:
    """The 1-based data row of the first field count other than the header's (``numbers``
    false) or of the first value in a ``wanted`` column that is neither a number nor missing
    (``numbers`` true); None if none is found. Names a row, never a value."""
    columns = [header.index(c) for c in wanted]
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle)
        next(reader, None)
        for i, fields in enumerate(reader, start=1):
            if not numbers:
                if len(fields) != len(header):
                    return i
                continue
            for j in columns:
                value = fields[j].strip() if j < len(fields) else ""
                if value in _ARROW_NULLS:
                    continue
                try:
                    float(value)
                except ValueError:
                    return i
    return None


def bound_warnings(
    clipped: dict[str, int],
    rejected: int,
    received: int,
    bounds: dict[str, tuple[float, float]],
) -> list[str]:
    """The ingest report's warnings: columns clipped to their declared bounds in more than
    ``WARN_SHARE`` of the rows, and rows rejected for values outside them."""
    warnings = []
    for name, count in clipped.items():
        if count > WARN_SHARE * received:
            lo, hi = bounds[name]
            warnings.append(
                f"{count} of {received} values of '{name}' ({count / received:.0%}) were outside "
                f"its declared bounds [{lo:g}, {hi:g}] and were clipped to them: if those are "
                "not the column's honest range, every estimate on this dataset is biased; "
                "upload again with the bounds corrected"
            )
    if rejected > WARN_SHARE * received:
        warnings.append(
            f"{rejected} of {received} rows ({rejected / received:.0%}) were rejected under "
            "the schema's policies (values outside the declared bounds or codes, missing "
            "values): check the schema, as the rows left may no longer represent the study"
        )
    return warnings


# An arm holding fewer than this many rows (none or one) gets a warning: no estimator can
# contrast the arms, yet a release would still be charged and answered (the arm sizes are
# private, so the mechanisms cannot refuse on them without revealing them).
MIN_ARM_ROWS = 2


def design_warnings(treatment: NDArray[np.float64], outcome: NDArray[np.float64]) -> list[str]:
    """The ingest report's warnings on what no release can estimate from: an arm with fewer
    than ``MIN_ARM_ROWS`` rows (a single-arm dataset included) and an outcome with one value.
    The report is the owner's, who holds the data, so it may say so exactly."""
    warnings = []
    treated = int(np.count_nonzero(treatment == 1.0))
    for arm, count in (("treated (1)", treated), ("untreated (0)", treatment.size - treated)):
        if count < MIN_ARM_ROWS:
            warnings.append(
                f"only {count} of {treatment.size} rows are {arm}: no causal estimate can be "
                "made from this dataset, yet every release on it would still be charged and "
                "answered with DP noise (its arm sizes are private, so the service cannot refuse "
                "it for analysts); check the treatment column, or delete the rows"
            )
    if outcome.size and np.all(outcome == outcome[0]):
        warnings.append(
            f"the outcome takes one value ({outcome[0]:g}) in every row: every effect is 0, and "
            "releases would answer with DP noise only; check the outcome column"
        )
    return warnings


def _header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        try:
            row = next(csv.reader(f))
        except StopIteration:
            raise CsvError("the file is empty") from None
        except (csv.Error, UnicodeDecodeError):
            raise CsvError("the header line cannot be parsed as UTF-8 CSV") from None
    return [c.strip() for c in row]


def _last_line_complete(path: Path, width: int) -> bool:
    """A file cut mid-row ends with a short last line; a ragged row is caught by the parser."""
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 65536))
        tail = f.read().rstrip(b"\r\n")
    last = tail.rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace")
    try:
        fields = next(csv.reader([last]))
    except (StopIteration, csv.Error):
        return False
    return len(fields) == width


def ingest(path: Path, schema: PublicSchema) -> Ingested:
    header = _header(path)
    dupes = sorted(name for name, k in Counter(header).items() if k > 1)
    if dupes:
        raise CsvError(f"duplicated column(s): {', '.join(dupes)}", "#/header")
    if any(c == "" for c in header):
        raise CsvError("a column has an empty name", "#/header")
    wanted = [c.name for c in schema.covariates] + [schema.treatment.name, schema.outcome.name]
    missing = [c for c in wanted if c not in header]
    if missing:
        near = {h.strip().casefold(): h for h in header}
        hints = [
            f"the CSV has '{near[m.strip().casefold()]}' (names must match exactly)"
            for m in missing
            if m.strip().casefold() in near
        ]
        raise CsvError(
            f"missing column(s): {', '.join(missing)}" + (f"; {'; '.join(hints)}" if hints else ""),
            "#/header",
        )
    extra = [c for c in header if c not in wanted and c not in schema.drop_columns]
    if extra:
        raise CsvError(
            f"column(s) not in the schema: {', '.join(extra)} (declare them in drop_columns)",
            "#/header",
        )
    if not _last_line_complete(path, len(header)):
        raise CsvError("the last line has the wrong number of fields: the file looks truncated")

    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1, block_size=1 << 24),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.float64() for c in wanted},
                include_columns=wanted,
                strings_can_be_null=True,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError) as exc:
        text = str(exc)
        row = _ROW_RE.search(text)
        col = _COL_RE.search(text)
        where = []
        if col:
            idx = int(col.group(1))
            where.append(f"column '{header[idx]}'" if idx < len(header) else "a column")
        if row:
            where.append(f"data row {int(row.group(1))}")
        if "conversion error" in text.lower():
            what = "a value that is not a number"
        elif "expected" in text.lower() and "columns" in text.lower():
            what = "a row with the wrong number of fields"
        else:
            what = "malformed CSV"
        if not row and what != "malformed CSV":
            # arrow's parallel reader often names no row: find the first one (error path only)
            found = _first_bad_row(path, header, wanted, numbers=what.startswith("a value"))
            if found is not None:
                where.append(f"data row {found}")
        raise CsvError(f"{what}" + (f" ({', '.join(where)})" if where else "")) from None

    rows_received = table.num_rows
    if rows_received == 0:
        raise CsvError("the file has no data rows")
    matrix = np.empty((rows_received, len(wanted)), dtype=np.float64)
    for j, name in enumerate(wanted):
        matrix[:, j] = table.column(name).to_numpy(zero_copy_only=False)
    del table
    return _apply_policies(matrix, schema, wanted, rows_received)


def _apply_policies(
    matrix: NDArray[np.float64], schema: PublicSchema, names: list[str], rows_received: int
) -> Ingested:
    q = len(schema.covariates)
    t_col = q
    keep = np.ones(matrix.shape[0], dtype=bool)
    imputed: dict[str, int] = {}
    clipped: dict[str, int] = {}

    # Categorical values outside the declared codes count as missing (the missing policy
    # applies), but a refused upload says which it was.
    wrong_code = np.zeros(matrix.shape, dtype=bool)
    for j, cov in enumerate(schema.covariates):
        if cov.type == "categorical":
            assert cov.codes is not None
            col = matrix[:, j]
            bad = ~np.isin(col, np.asarray(cov.codes, dtype=np.float64)) & np.isfinite(col)
            wrong_code[:, j] = bad
            col[bad] = np.nan

    # Missing values (NaN, empty, ±inf).
    missing = ~np.isfinite(matrix)
    if missing[:, t_col].any() and schema.missing != MissingPolicy.REJECT_ROW:
        first = int(np.argmax(missing[:, t_col])) + 1
        raise CsvError(
            f"the treatment column '{names[t_col]}' has a missing value (data row {first}); "
            "treatment cannot be imputed",
            f"#/rows/{first}/{names[t_col]}",
        )
    if missing.any():
        if schema.missing == MissingPolicy.REJECT_UPLOAD:
            r, c = np.argwhere(missing)[0]
            row = int(r) + 1
            if wrong_code[r, c]:
                detail = (
                    f"a value in categorical column '{names[c]}' is not one of the column's "
                    f"declared codes (data row {row}); such a value counts as missing and the "
                    "schema's missing policy is reject_upload"
                )
            else:
                detail = (
                    f"missing or non-finite value in column '{names[c]}' (data row {row}); "
                    "the schema's missing policy is reject_upload"
                )
            raise CsvError(detail, f"#/rows/{row}/{names[c]}")
        if schema.missing == MissingPolicy.REJECT_ROW:
            keep &= ~missing.any(axis=1)
        else:
            fills = [c.impute for c in schema.covariates] + [np.nan, schema.outcome.impute]
            for j, name in enumerate(names):
                hole = missing[:, j]
                if hole.any() and j != t_col:
                    fill = fills[j]
                    if fill is None:
                        keep &= ~hole  # no impute value declared for this column: drop the rows
                        continue
                    matrix[hole, j] = fill
                    imputed[name] = int(hole.sum())

    # Treatment must be binary.
    t = matrix[keep, t_col]
    if not np.isin(t, (0.0, 1.0)).all():
        rows = np.flatnonzero(keep)
        first = int(rows[np.argmax(~np.isin(t, (0.0, 1.0)))]) + 1
        raise CsvError(
            f"the treatment column '{names[t_col]}' must be 0 or 1 (data row {first})",
            f"#/rows/{first}/{names[t_col]}",
        )

    # Bounds.
    bounds = [c.bounds for c in schema.covariates] + [
        (0.0, 1.0),
        (schema.outcome.lower, schema.outcome.upper),
    ]
    for j, (lo, hi) in enumerate(bounds):
        if j == t_col:
            continue
        col = matrix[:, j]
        out = keep & ((col < lo) | (col > hi))
        if not out.any():
            continue
        if schema.out_of_bounds == OutOfBoundsPolicy.REJECT_UPLOAD:
            first = int(np.argmax(out)) + 1
            raise CsvError(
                f"value outside the declared bounds in column '{names[j]}' (data row {first}); "
                "the schema's out_of_bounds policy is reject_upload",
                f"#/rows/{first}/{names[j]}",
            )
        if schema.out_of_bounds == OutOfBoundsPolicy.REJECT_ROW:
            keep &= ~out
        else:
            np.clip(col, lo, hi, out=col)
            clipped[names[j]] = int(out.sum())

    if not keep.all():
        matrix = matrix[keep]
    n = int(matrix.shape[0])
    if n < 2:
        raise CsvError("fewer than two rows remain after the schema's policies")
    report = IngestReport(
        rows_received=rows_received,
        n=n,
        rows_rejected=rows_received - n,
        cells_clipped=clipped,
        cells_imputed=imputed,
        warnings=bound_warnings(
            clipped, rows_received - n, rows_received, dict(zip(names, bounds, strict=True))
        )
        + design_warnings(matrix[:, t_col], matrix[:, q + 1]),
    )
    return Ingested(matrix=np.ascontiguousarray(matrix), report=report)
