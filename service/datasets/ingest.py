"""CSV ingest: parse, check against the public schema, apply the declared policies.

Returns the float64 matrix ``[X | A | Y]`` and an owner-only report. Error messages name the
column and the row (the owner holds the file) but never quote a value.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from numpy.typing import NDArray

from service.datasets.schemas import (
    CSV_DELIMITERS,
    CsvFormat,
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


# A column clipped (or rows rejected) in more than this share of the rows gets a warning: the
# declared bounds are then probably not the column's honest range.
WARN_SHARE = 0.01


# What arrow's reader takes as a missing value (strings_can_be_null): not a conversion error.
_ARROW_NULLS = frozenset(pacsv.ConvertOptions().null_values)


def _word(delimiter: str | None) -> str:
    return "tab" if delimiter == "\t" else f"'{delimiter}'"


def _python_encoding(fmt: CsvFormat) -> str:
    return "utf-8-sig" if fmt.encoding == "utf-8" else fmt.encoding


# What arrow reads as a number: ASCII digits with an optional sign, decimal mark and exponent,
# or an infinity (Python's float() also takes '1_000' and other scripts' digits; arrow does not).
_NUMBER = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity)", re.I | re.A
)


def _is_number(value: str, decimal: str) -> bool:
    if decimal == ",":
        if "." in value:
            return False
        value = value.replace(",", ".")
    return _NUMBER.fullmatch(value) is not None


# A currency sign, or digits grouped in threes by a thousands separator (',' or '.' unlike the
# decimal mark, an apostrophe, a space or a no-break space): what a spreadsheet's formatted
# amounts look like ("€3,959.27", "3 959,27", "1'250").
_CURRENCY = frozenset("€$£¥₹₩₽¢")
_GROUPED = {
    ".": re.compile(r"[+-]?\d{1,3}(?:([,' \u00a0\u202f])\d{3})(?:\1\d{3})*(?:\.\d+)?"),
    ",": re.compile(r"[+-]?\d{1,3}(?:([.' \u00a0\u202f])\d{3})(?:\1\d{3})*(?:,\d+)?"),
}


def _shape(value: str, decimal: str) -> str:
    """What a refused value looks like, in words that name no part of it: ``currency``,
    ``grouped`` (thousands separators), ``non_ascii`` or ``other``."""
    if any(ch in _CURRENCY for ch in value):
        return "currency"
    if _GROUPED[decimal].fullmatch(value) is not None:
        return "grouped"
    return "other" if value.isascii() else "non_ascii"


def _first_bad_cell(
    path: Path, header: list[str], wanted: list[str], fmt: CsvFormat, nulls: frozenset[str]
) -> tuple[int, str, str] | None:
    """The 1-based data row and the column of the first value (in file order: row by row, left
    to right) in a ``wanted`` column that is neither a number (nor, in a labelled column, a
    label) nor missing, and the value's shape (``_shape``: a currency sign, thousands
    separators, text outside ASCII, a hint at the file's encoding); None if none is found.
    Error path only; names a place and a kind of text, never a value."""
    columns = [(header.index(c), c, fmt.labels.get(c)) for c in wanted]
    for i, fields in _data_rows(path, fmt):
        for j, name, labels in columns:
            value = fields[j].strip() if j < len(fields) else ""
            if value in nulls:
                continue
            if labels is not None and value in labels:
                continue
            if not _is_number(value, fmt.decimal):
                return i, name, _shape(value, fmt.decimal)
    return None


def _chunk_offsets(column: pa.ChunkedArray) -> Iterator[tuple[int, pa.Array]]:
    """The column's chunks with their first row (copied one at a time, not concatenated)."""
    start = 0
    for chunk in column.chunks:
        yield start, chunk
        start += len(chunk)


def _labelled(
    column: pa.ChunkedArray, labels: dict[str, float], nulls: frozenset[str], decimal: str
) -> NDArray[np.float64]:
    """A labelled column's text as numbers: a label as its declared number (labels win over
    missing-value markers: the owner declared them for this column), else a missing-value
    marker as NaN, else the value as a number (a top-coded age's '90+' labelled, the other ages
    as written); -inf marks a value that is none of these (the caller names its cell)."""
    trimmed = pc.utf8_trim_whitespace(column)
    keys = list(labels)
    index = pc.index_in(trimmed, value_set=pa.array(keys, type=pa.string()))
    positions = index.fill_null(-1).to_numpy(zero_copy_only=False)
    out = np.full(len(positions), np.nan)
    matched = positions >= 0
    codes = np.asarray([labels[k] for k in keys], dtype=np.float64)
    out[matched] = codes[positions[matched]]
    rest = np.flatnonzero(~matched)
    if rest.size:
        texts = trimmed.take(pa.array(rest)).to_pylist()
        for k, text in zip(rest, texts, strict=True):
            if text is None or text in nulls:
                continue
            number = text.replace(",", ".") if decimal == "," and "." not in text else text
            out[k] = float(number) if _is_number(text, decimal) else -np.inf
    return out


def _first_ragged_row(path: Path, header: list[str], fmt: CsvFormat) -> int | None:
    """The 1-based data row of the first field count other than the header's; None if none."""
    for i, fields in _data_rows(path, fmt):
        if len(fields) != len(header):
            return i
    return None


def _data_rows(path: Path, fmt: CsvFormat) -> Iterator[tuple[int, list[str]]]:
    """The file's data rows with their 1-based numbers, read as the format says (error paths
    only: undecodable bytes are replaced, so a row is always named)."""
    with path.open(newline="", encoding=_python_encoding(fmt), errors="replace") as handle:
        reader = csv.reader(handle, delimiter=fmt.delimiter or ",")
        next(reader, None)
        yield from enumerate(reader, start=1)


def bound_warnings(
    clipped: dict[str, int],
    rejected: int,
    received: int,
    bounds: dict[str, tuple[float, float]],
) -> list[str]:
    """The ingest report's warnings: columns clipped to their declared bounds in more than
    ``WARN_SHARE`` of the rows kept (clipping applies to those), and rows rejected for values
    outside them or missing ones (of the rows received)."""
    warnings = []
    kept = max(received - rejected, 1)
    for name, count in clipped.items():
        if count > WARN_SHARE * kept:
            lo, hi = bounds[name]
            warnings.append(
                f"{count} of {kept} values of '{name}' ({count / kept:.0%}) were outside "
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


# The header line is read as bytes up to its first newline, at most this long.
MAX_HEADER_BYTES = 1 << 20


# A numeric column whose values span less than this share of its declared range gets a
# warning: the noise is sized to the declared range, so either the bounds are far from honest
# or the values were misread (a health economist's costs written "3.959" with '.' as a
# thousands separator were read 1,000 times too small, with no other sign).
RANGE_USE_WARN = 0.02


def range_warnings(
    matrix: NDArray[np.float64],
    names: list[str],
    bounds: list[tuple[float, float]],
    numeric: list[bool],
) -> list[str]:
    """The ingest report's warnings on numeric columns (``numeric``) whose kept values span
    less than ``RANGE_USE_WARN`` of their declared bounds. Owner-only, like the report."""
    warnings = []
    for j, name in enumerate(names):
        if not numeric[j] or matrix.shape[0] == 0:
            continue
        lo, hi = bounds[j]
        column = matrix[:, j]
        used = float(np.max(column) - np.min(column)) / (hi - lo)
        if 0.0 < used < RANGE_USE_WARN:
            warnings.append(
                f"the values of '{name}' span {used:.2%} of its declared bounds [{lo:g}, "
                f"{hi:g}]: every release's noise is sized to those bounds. If they are the "
                "column's honest range, check the values were read right (thousands "
                "separators such as 3.959 for 3959 are read as decimals; a unit other than the "
                "schema's); if not, upload again with honest bounds"
            )
    return warnings


def constant_warnings(covariates: NDArray[np.float64], names: list[str]) -> list[str]:
    """The ingest report's warnings on covariates with one value in every row kept: they
    adjust for nothing and explain no effect, yet DP-EBM and linear models spend budget on
    them (a walkthrough's site code was 3 in every row). Owner-only, like the report."""
    warnings = []
    for j, name in enumerate(names):
        column = covariates[:, j]
        if column.size and np.all(column == column[0]):
            warnings.append(
                f"covariate '{name}' takes one value ({column[0]:g}) in every row: it adjusts "
                "for nothing and explains no effect, yet the models spend budget on it; "
                "declare it in drop_columns and upload again"
            )
    return warnings


def _header_line(path: Path, fmt: CsvFormat) -> str:
    with path.open("rb") as f:
        raw = f.readline(MAX_HEADER_BYTES)
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise CsvError(
            "the file is UTF-16 text (it starts with a UTF-16 byte-order mark): save it as UTF-8 "
            "(Excel: 'CSV UTF-8')",
            "#/header",
        )
    if raw.startswith(b"\xef\xbb\xbf") and fmt.encoding != "utf-8":
        raise CsvError(
            f"the file starts with a UTF-8 byte-order mark, so it is UTF-8, not {fmt.encoding}: "
            "upload it without an encoding (CLI: without --encoding)",
            "#/header",
        )
    if not raw.strip():
        raise CsvError("the file is empty" if not raw else "the header line is empty", "#/header")
    if raw.startswith(b"PAR1"):
        raise CsvError(
            "this looks like a Parquet file: uploads are CSV text (export the table as CSV)",
            "#/header",
        )
    try:
        return raw.decode(_python_encoding(fmt)).rstrip("\r\n")
    except UnicodeDecodeError:
        raise CsvError(
            f"the header line is not {fmt.encoding} text: save the file as UTF-8 (Excel: "
            "'CSV UTF-8'), or give its encoding in csv_format (e.g. cp1252)",
            "#/header",
        ) from None


def _split(line: str, delimiter: str) -> list[str]:
    try:
        return [c.strip() for c in next(csv.reader([line], delimiter=delimiter))]
    except (StopIteration, csv.Error):
        raise CsvError("the header line cannot be parsed as CSV", "#/header") from None


def _header(path: Path, fmt: CsvFormat, expected: list[str]) -> tuple[list[str], CsvFormat]:
    """The header's column names and the format with its delimiter: the given one, else the
    candidate whose split holds the most of the schema's ``expected`` names (',' on a tie;
    never ',' with a decimal comma). Reads the header line only."""
    line = _header_line(path, fmt)
    if fmt.delimiter is not None:
        return _split(line, fmt.delimiter), fmt
    candidates = [d for d in CSV_DELIMITERS if not (d == "," and fmt.decimal == ",")]
    wanted = set(expected)
    best = max(candidates, key=lambda d: (len(wanted & set(_split(line, d))), d == ","))
    return _split(line, best), fmt.model_copy(update={"delimiter": best})


def _last_line_complete(path: Path, width: int, fmt: CsvFormat) -> bool:
    """A file cut mid-row ends with a short last line; a ragged row is caught by the parser."""
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 65536))
        tail = f.read().rstrip(b"\r\n")
    last = tail.rsplit(b"\n", 1)[-1].decode(_python_encoding(fmt), errors="replace")
    if '"' in last:
        return True  # a quoted field may span lines: the parser decides
    try:
        fields = next(csv.reader([last], delimiter=fmt.delimiter or ","))
    except (StopIteration, csv.Error):
        return False
    return len(fields) == width


def ingest(path: Path, schema: PublicSchema, fmt: CsvFormat | None = None) -> Ingested:
    fmt = fmt or CsvFormat()
    wanted = [c.name for c in schema.covariates] + [schema.treatment.name, schema.outcome.name]
    header, fmt = _header(path, fmt, wanted + list(schema.drop_columns))
    if not set(wanted + list(schema.drop_columns)) & set(header):
        # None of the schema's names: a file without a header line (its first row would be
        # echoed as column names: an owner walkthrough's error listed a person's id, date and
        # earnings, under any delimiter), or another file or delimiter. Never list its fields.
        numbers = any(_is_number(c, fmt.decimal) for c in header)
        one_column = (
            f"the first line names none of the schema's columns and is one column with the "
            f"delimiter {_word(fmt.delimiter)}: give the file's delimiter (csv_format "
            "delimiter, CLI --delimiter), or add a header line if it has none"
        )
        raise CsvError(
            one_column
            if len(header) == 1
            else (
                "the first line looks like data, not a header (it has numbers and none of the "
                "schema's column names): the file needs a header line naming its columns"
            )
            if numbers
            else (
                "the first line names none of the schema's columns: the file needs a header "
                "line naming them (a file without one starts with a data row), or give its "
                "delimiter (csv_format delimiter, CLI --delimiter) if it is not found"
            ),
            "#/header",
        )
    # Unnamed columns at the end of the header (Excel's delimiter at the end of every line) are
    # ignored, never read: they get names no schema can hold (control characters).
    trailing = 0
    while trailing < len(header) and header[len(header) - 1 - trailing] == "":
        trailing += 1
    if 0 < trailing < len(header):
        header = header[: len(header) - trailing] + [f"\x00unnamed{k}" for k in range(trailing)]
    dupes = sorted(name for name, k in Counter(header).items() if k > 1)
    if dupes:
        raise CsvError(f"duplicated column(s): {', '.join(repr(d) for d in dupes)}", "#/header")
    empty = [i + 1 for i, c in enumerate(header) if c == ""]
    if empty:
        raise CsvError(
            f"column {empty[0]} of {len(header)} has an empty name: name it and declare it in "
            "drop_columns, or remove it",
            "#/header",
        )
    missing = [c for c in wanted if c not in header]
    if missing:
        near = {h.strip().casefold(): h for h in header}
        hints = [
            f"the CSV has '{near[m.strip().casefold()]}' (names must match exactly)"
            for m in missing
            if m.strip().casefold() in near
        ]
        unnamed = [
            c
            for c in header
            if c not in wanted and c not in schema.drop_columns and not c.startswith("\x00")
        ]
        if unnamed and not hints:
            shown = ", ".join(repr(c) for c in unnamed[:10]) + (" ..." if len(unnamed) > 10 else "")
            hints.append(f"the CSV's columns the schema does not name: {shown}")
        if len(header) == 1:
            hints.append(
                f"the header line is one column with the delimiter {_word(fmt.delimiter)}: give "
                "the file's delimiter (csv_format delimiter, CLI --delimiter)"
            )
        raise CsvError(
            f"missing column(s): {', '.join(missing)}" + (f"; {'; '.join(hints)}" if hints else ""),
            "#/header",
        )
    extra = [
        c
        for c in header
        if c not in wanted and c not in schema.drop_columns and not c.startswith("\x00")
    ]
    if extra:
        raise CsvError(
            f"column(s) not in the schema: {', '.join(extra)} (declare them in drop_columns)",
            "#/header",
        )
    if not _last_line_complete(path, len(header), fmt):
        raise CsvError("the last line has the wrong number of fields: the file looks truncated")

    nulls = _ARROW_NULLS | frozenset(fmt.missing_values)
    unknown = [c for c in fmt.labels if c not in wanted]
    if unknown:
        raise CsvError(
            f"csv_format labels name column(s) the schema does not use: {', '.join(unknown)}",
            "#/csv_format/labels",
        )
    types = {c: pa.string() if c in fmt.labels else pa.float64() for c in wanted}
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(
                column_names=header,
                skip_rows=1,
                block_size=1 << 24,
                encoding="utf8" if fmt.encoding == "utf-8" else fmt.encoding,
            ),
            parse_options=pacsv.ParseOptions(
                delimiter=fmt.delimiter or ",", newlines_in_values=True
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=wanted,
                # only labelled columns are read as text: they resolve missing markers
                # themselves, after their labels (``_labelled``)
                strings_can_be_null=False,
                null_values=sorted(nulls),
                decimal_point=fmt.decimal,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError) as exc:
        text = str(exc).lower()
        if "conversion error" in text:
            # arrow's parallel reader names a column and a row of different cells: find the
            # first bad cell in file order (error path only)
            found = _first_bad_cell(path, header, wanted, fmt, nulls)
            if found is None:
                raise CsvError("a value that is not a number") from None
            row, column, shape = found
            hint = " (the decimal mark is ',' here)" if fmt.decimal == "," else ""
            if shape == "currency":
                hint += (
                    "; it holds a currency sign: write amounts as plain numbers (3959.27), "
                    "the currency in the schema's unit"
                )
            elif shape == "grouped":
                hint += (
                    "; it looks like a number with thousands separators: write it without "
                    "them (3959.27)"
                )
            elif shape == "non_ascii":
                hint += (
                    f"; it holds text outside ASCII: if the file is not {fmt.encoding}, give its "
                    "encoding (csv_format encoding, CLI --encoding)"
                )
            raise CsvError(
                f"a value that is not a number (column '{column}', data row {row}){hint}; a "
                "numeric column holds plain numbers and missing-value markers only: declare "
                "text values as labels (csv_format labels, CLI --labels), other missing markers "
                "(missing_values, --missing-value), a decimal comma (decimal, --decimal-comma)",
                f"#/rows/{row}/{column}",
            ) from None
        if "expected" in text and "columns" in text:
            ragged = _first_ragged_row(path, header, fmt)
            where = f" (data row {ragged})" if ragged is not None else ""
            raise CsvError(
                f"a row with the wrong number of fields{where}",
                f"#/rows/{ragged}" if ragged is not None else None,
            ) from None
        raise CsvError("malformed CSV") from None

    rows_received = table.num_rows
    if rows_received == 0:
        raise CsvError("the file has no data rows")
    matrix = np.empty((rows_received, len(wanted)), dtype=np.float64)
    for j, name in enumerate(wanted):
        labels = fmt.labels.get(name)
        column = table.column(name)
        # each column leaves the table once copied: the parsed table and the matrix are not
        # both held whole (a security re-test put 5.2 GB on a 528 MB file)
        table = table.drop_columns([name])
        if labels is None:
            for start, chunk in _chunk_offsets(column):
                matrix[start : start + len(chunk), j] = chunk.to_numpy(zero_copy_only=False)
            del column
            continue
        matrix[:, j] = _labelled(column, labels, nulls, fmt.decimal)
        del column
        unlabelled = np.isneginf(matrix[:, j])
        if unlabelled.any():
            row = int(np.argmax(unlabelled)) + 1
            raise CsvError(
                f"a value of labelled column '{name}' that is neither one of its labels nor a "
                f"number nor missing (data row {row}); add it to the labels (csv_format labels, "
                "CLI --labels), or check the file's encoding if the labels have accents",
                f"#/rows/{row}/{name}",
            )
    del table
    pa.default_memory_pool().release_unused()
    infinite = np.isinf(matrix)
    if infinite.any():
        r, c = np.argwhere(infinite)[0]
        row, column = int(r) + 1, wanted[int(c)]
        raise CsvError(
            f"a value that is not a finite number (column '{column}', data row {row}): "
            "infinities and numbers beyond the float range are data errors, not missing values",
            f"#/rows/{row}/{column}",
        )
    ingested = _apply_policies(matrix, schema, wanted, rows_received, fmt)
    if 0 < trailing < len(header):
        ingested.report.warnings.append(
            f"the header ends with {trailing} unnamed column(s) (a delimiter at the end of each "
            "line, as Excel writes it): ignored"
        )
    return ingested


def _apply_policies(
    matrix: NDArray[np.float64],
    schema: PublicSchema,
    names: list[str],
    rows_received: int,
    fmt: CsvFormat | None = None,
) -> Ingested:
    q = len(schema.covariates)
    t_col = q
    keep = np.ones(matrix.shape[0], dtype=bool)
    imputed: dict[str, int] = {}
    clipped: dict[str, int] = {}
    rejected_by: dict[str, int] = {}

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
    if schema.outcome.type == "binary":  # likewise a binary outcome's values other than 0, 1
        col = matrix[:, q + 1]
        bad = ~np.isin(col, (0.0, 1.0)) & np.isfinite(col)
        wrong_code[:, q + 1] = bad
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
                    f"a value in {'the binary outcome' if c == q + 1 else 'categorical'} "
                    f"column '{names[c]}' is not one of the column's declared codes (data row "
                    f"{row}); such a value counts as missing and the schema's missing policy "
                    "is reject_upload"
                )
            else:
                detail = (
                    f"missing or non-finite value in column '{names[c]}' (data row {row}); "
                    "the schema's missing policy is reject_upload"
                )
            raise CsvError(detail, f"#/rows/{row}/{names[c]}")
        if schema.missing == MissingPolicy.REJECT_ROW:
            keep &= ~missing.any(axis=1)
            for j, name in enumerate(names):
                if missing[:, j].any():
                    rejected_by[name] = rejected_by.get(name, 0) + int(missing[:, j].sum())
        else:
            fills = [c.impute for c in schema.covariates] + [np.nan, schema.outcome.impute]
            for j, name in enumerate(names):
                hole = missing[:, j]
                if hole.any() and j != t_col:
                    fill = fills[j]
                    if fill is None:
                        keep &= ~hole  # no impute value declared for this column: drop the rows
                        rejected_by[name] = rejected_by.get(name, 0) + int(hole.sum())
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
        outside = (col < lo) | (col > hi)
        out = keep & outside
        if schema.out_of_bounds == OutOfBoundsPolicy.REJECT_ROW and outside.any():
            # by column: a row outside in several columns counts in each
            rejected_by[names[j]] = rejected_by.get(names[j], 0) + int(outside.sum())
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
        rows_rejected_by_column=rejected_by,
        cells_not_a_code={
            names[j]: int(count) for j, count in enumerate(wrong_code.sum(axis=0)) if count
        },
        warnings=bound_warnings(
            clipped, rows_received - n, rows_received, dict(zip(names, bounds, strict=True))
        )
        + constant_warnings(matrix[:, :q], names[:q])
        + range_warnings(
            matrix,
            names,
            bounds,
            [c.type == "numeric" for c in schema.covariates]
            + [False, schema.outcome.type == "numeric"],
        )
        + design_warnings(matrix[:, t_col], matrix[:, q + 1]),
        csv_format=fmt,
    )
    return Ingested(matrix=np.ascontiguousarray(matrix), report=report)
