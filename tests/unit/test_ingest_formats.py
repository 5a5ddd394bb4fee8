"""CSV ingest of real-world exports (a hospital data manager's walkthrough): the delimiter
found from the header, decimal commas, cp1252 files, extra missing-value markers, and errors
that name the cell that is actually wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.datasets.ingest import CsvError, ingest
from service.datasets.schemas import CsvFormat, PublicSchema

SCHEMA = PublicSchema.model_validate(
    {
        "covariates": [
            {"name": "age", "lower": 18, "upper": 100},
            {"name": "bmi", "lower": 12, "upper": 70},
            {"name": "sex", "type": "categorical", "codes": [0, 1]},
        ],
        "treatment": {"name": "treated"},
        "outcome": {"name": "los", "lower": 0, "upper": 60},
        "drop_columns": ["name"],
        "missing": "reject_row",
    }
)
ROWS = [
    (64, 30.5, 1, 1, 4.25, "Müller"),
    (71, 22.0, 0, 0, 7.5, "Ørsted"),
    (55, 27.75, 1, 0, 3.0, "Dupont"),
    (80, 35.25, 0, 1, 12.0, "García"),
]
EXPECTED = np.array([r[:5] for r in ROWS], dtype=np.float64)


def write(tmp_path: Path, text: str, encoding: str = "utf-8") -> Path:
    path = tmp_path / "rows.csv"
    path.write_bytes(text.encode(encoding))
    return path


def comma_file() -> str:
    lines = ["age,bmi,sex,treated,los,name"]
    lines += [",".join(str(v) for v in row) for row in ROWS]
    return "\n".join(lines) + "\n"


def european_file() -> str:
    """Excel's 'CSV' on a German or French Windows: semicolons, decimal commas, CRLF."""
    lines = ["age;bmi;sex;treated;los;name"]
    lines += [";".join(str(v).replace(".", ",") for v in row) for row in ROWS]
    return "\r\n".join(lines) + "\r\n"


def test_the_delimiter_is_found_from_the_header(tmp_path: Path) -> None:
    for delimiter in (";", "\t", "|"):
        text = comma_file().replace(",", delimiter)
        got = ingest(write(tmp_path, text), SCHEMA)
        np.testing.assert_array_equal(got.matrix, EXPECTED)
        assert got.report.csv_format is not None
        assert got.report.csv_format.delimiter == delimiter


def test_a_european_excel_export_reads_with_its_decimal_mark_and_encoding(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, european_file(), encoding="cp1252")
    fmt = CsvFormat(decimal=",", encoding="cp1252")
    got = ingest(path, SCHEMA, fmt)
    np.testing.assert_array_equal(got.matrix, EXPECTED)
    assert got.report.csv_format == CsvFormat(delimiter=";", decimal=",", encoding="cp1252")
    # without the decimal mark the first decimal comma is named, cell and hint
    with pytest.raises(CsvError) as refused:
        ingest(path, SCHEMA, CsvFormat(encoding="cp1252"))
    assert "not a number (column 'bmi', data row 1)" in str(refused.value)
    assert refused.value.pointer == "#/rows/1/bmi"


def test_a_file_not_in_its_declared_encoding_is_named_as_such(tmp_path: Path) -> None:
    """The header was read through an 8 KiB text buffer: a Latin-1 byte in row 4 was reported
    as an unparsable header, while the same byte at row 5000 was accepted."""
    rows = comma_file().splitlines()
    header = rows[0].encode()
    path = tmp_path / "rows.csv"
    path.write_bytes(header + b"\n" + "\n".join(rows[1:]).encode("latin-1") + b"\n")
    got = ingest(path, SCHEMA)  # the bad bytes sit in a dropped column only: not read
    np.testing.assert_array_equal(got.matrix, EXPECTED)
    path.write_bytes(rows[0].replace("name", "naïve").encode("latin-1") + b"\n")
    with pytest.raises(CsvError) as refused:
        ingest(path, SCHEMA)
    assert "the header line is not utf-8 text" in str(refused.value)
    assert "cp1252" in str(refused.value)


def test_extra_missing_markers_count_as_missing(tmp_path: Path) -> None:
    text = comma_file().replace("22.0", ".")
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, text), SCHEMA)
    assert "(column 'bmi', data row 2)" in str(refused.value)
    got = ingest(write(tmp_path, text), SCHEMA, CsvFormat(missing_values=["."]))
    assert got.report.n == 3
    assert got.report.rows_rejected_by_column == {"bmi": 1}


def test_the_first_bad_cell_is_named_in_file_order(tmp_path: Path) -> None:
    """arrow names a column and a row of different cells: the walkthrough's 'column bmi, data
    row 10' pointed at a row whose bad value was in crp. The scan names the first bad cell,
    row by row and left to right."""
    rows = comma_file().splitlines()
    rows[3] = rows[3].replace("27.75", "n.a.")  # data row 3, bmi
    rows[2] = rows[2].replace(",0,0,", ",F,0,")  # data row 2, sex: the first one
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, "\n".join(rows) + "\n"), SCHEMA)
    assert "(column 'sex', data row 2)" in str(refused.value)
    assert refused.value.pointer == "#/rows/2/sex"


def test_an_infinity_is_a_data_error_not_a_missing_value(tmp_path: Path) -> None:
    for value in ("inf", "-Infinity", "1e400"):
        text = comma_file().replace("7.5", value)
        with pytest.raises(CsvError) as refused:
            ingest(write(tmp_path, text), SCHEMA)  # reject_row would have dropped the row
        assert "not a finite number (column 'los', data row 2)" in str(refused.value)


def test_header_problems_name_their_place(tmp_path: Path) -> None:
    trailing = comma_file().replace("\n", ",\n")  # Excel's trailing delimiter: ignored
    got = ingest(write(tmp_path, trailing), SCHEMA)
    np.testing.assert_array_equal(got.matrix, EXPECTED)
    assert got.report.warnings[-1].startswith("the header ends with 1 unnamed column(s)")
    inner = comma_file().replace("bmi,", "bmi,,", 1)
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, inner), SCHEMA)
    assert "column 3 of 7 has an empty name" in str(refused.value)
    renamed = comma_file().replace("bmi,", "BMI (kg/m2),", 1)
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, renamed), SCHEMA)
    assert "missing column(s): bmi" in str(refused.value)
    assert "does not name: 'BMI (kg/m2)'" in str(refused.value)
    one_column = comma_file().replace(",", ";")
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, one_column), SCHEMA, CsvFormat(delimiter=","))
    assert "give the file's delimiter (csv_format delimiter, CLI --delimiter)" in str(refused.value)


def test_a_constant_covariate_is_named_in_the_owners_report(tmp_path: Path) -> None:
    text = comma_file()
    for old in ("30.5", "22.0", "27.75", "35.25"):
        text = text.replace(old, "25")
    (warning,) = ingest(write(tmp_path, text), SCHEMA).report.warnings
    assert warning.startswith("covariate 'bmi' takes one value (25) in every row")


def test_a_decimal_comma_needs_another_delimiter() -> None:
    with pytest.raises(ValueError, match="decimal comma needs another delimiter"):
        CsvFormat(delimiter=",", decimal=",")


def test_text_categories_and_arms_read_through_declared_labels(tmp_path: Path) -> None:
    """A hospital export codes the arm 'treated' / 'control' and sex 'F' / 'M': the owner
    declares the labels instead of recoding the file."""
    lines = ["age,bmi,sex,treated,los,name"]
    for row in ROWS:
        sex = {0: " F", 1: "M "}[row[2]]
        arm = {0: "control", 1: "treated"}[row[3]]
        lines.append(f"{row[0]},{row[1]},{sex},{arm},{row[4]},{row[5]}")
    text = "\n".join(lines) + "\n"
    labels = {"sex": {"F": 0, "M": 1}, "treated": {"control": 0, "treated": 1}}
    got = ingest(write(tmp_path, text), SCHEMA, CsvFormat(labels=labels))
    np.testing.assert_array_equal(got.matrix, EXPECTED)
    # without labels the first text cell is named; with one label missing, its cell is
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, text), SCHEMA)
    assert "(column 'sex', data row 1)" in str(refused.value)
    partial = {"sex": {"F": 0}, "treated": {"control": 0, "treated": 1}}
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, text), SCHEMA, CsvFormat(labels=partial))
    assert "labelled column 'sex' that is neither one of its labels" in str(refused.value)
    assert "(data row 1)" in str(refused.value)
    assert refused.value.pointer == "#/rows/1/sex"
    # a missing marker in a labelled column is missing (reject_row drops the row)
    holed = text.replace("M ,", "NA,", 1)
    got = ingest(write(tmp_path, holed), SCHEMA, CsvFormat(labels=labels))
    assert got.report.n == 3
    assert got.report.rows_rejected_by_column == {"sex": 1}
    with pytest.raises(CsvError, match="labels name column"):
        ingest(write(tmp_path, text), SCHEMA, CsvFormat(labels={"nope": {"a": 1}}))


def test_quoted_line_breaks_read_past_the_parsers_block_size(tmp_path: Path) -> None:
    """Free-text notes with line breaks (a dropped column) read in a 20 MB file, past the
    parser's 16 MB blocks, and in the last row (it was 'malformed CSV', 'the wrong number of
    fields' with no row, or 'the file looks truncated')."""
    note = '"first line of a free-text note\nsecond line, with a comma, and more words to fill it"'
    rows = [
        f"{64 + i % 30},{20 + i % 7}.5,{i % 2},{(i // 2) % 2},{i % 9}.25,{note}"
        for i in range(200_000)
    ]
    text = "age,bmi,sex,treated,los,name\n" + "\n".join(rows) + "\n"
    assert len(text) > 20_000_000
    got = ingest(write(tmp_path, text), SCHEMA)
    assert got.report.n == 200_000
    np.testing.assert_array_equal(
        got.matrix[-1], [64 + 199_999 % 30, 20 + 199_999 % 7 + 0.5, 1, 1, 199_999 % 9 + 0.25]
    )


def test_labels_win_over_missing_markers_and_numbers_pass_through(tmp_path: Path) -> None:
    """A category written 'NA' (declared a label) is that category, not missing; a top-coded
    age '90+' is labelled while the other ages are read as written."""
    text = comma_file().replace("71,", "90+,", 1).replace(",Dupont", ",NA")
    schema = SCHEMA.model_copy(update={"drop_columns": []})
    schema = PublicSchema.model_validate(
        {
            **SCHEMA.model_dump(),
            "drop_columns": [],
            "covariates": [
                {"name": "age", "lower": 18, "upper": 100},
                {"name": "bmi", "lower": 12, "upper": 70},
                {"name": "sex", "type": "categorical", "codes": [0, 1]},
                {"name": "name", "type": "categorical", "codes": [0, 1, 2, 3]},
            ],
        }
    )
    names = {"Müller": 0, "Ørsted": 1, "NA": 2, "García": 3}
    got = ingest(
        write(tmp_path, text), schema, CsvFormat(labels={"age": {"90+": 90}, "name": names})
    )
    assert got.report.n == 4
    np.testing.assert_array_equal(got.matrix[:, 0], [64, 90, 55, 80])
    np.testing.assert_array_equal(got.matrix[:, 3], [0, 1, 2, 3])


def test_numbers_are_plain_ascii_numbers(tmp_path: Path) -> None:
    """Python's float() takes '1_000' and other scripts' digits, arrow does not: the cell was
    not named ('a value that is not a number' with no place)."""
    for odd in ("1_000", "\u0663\u0665", "1,5"):
        with pytest.raises(CsvError) as refused:
            ingest(write(tmp_path, comma_file().replace("7.5", f'"{odd}"')), SCHEMA)
        assert "(column 'los', data row 2)" in str(refused.value), odd
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, comma_file().replace("7.5", "\u0663")), SCHEMA)
    assert "outside ASCII" in str(refused.value)


def test_utf16_and_a_byte_order_mark_against_the_declared_encoding_are_named(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes(comma_file().encode("utf-16"))
    with pytest.raises(CsvError, match="the file is UTF-16 text"):
        ingest(path, SCHEMA)
    path.write_bytes(b"\xef\xbb\xbf" + comma_file().encode("utf-8"))
    with pytest.raises(CsvError, match="so it is UTF-8, not cp1252"):
        ingest(path, SCHEMA, CsvFormat(encoding="cp1252"))
    assert ingest(path, SCHEMA).report.n == 4


def test_a_file_without_a_header_is_said_so_without_echoing_its_first_row(
    tmp_path: Path,
) -> None:
    """The first row of a headerless file was listed as 'the CSV's columns the schema does not
    name' (a person's values), or as duplicated columns."""
    rows = "64,30.5,1,1,4.25,Mueller\n71,22.0,0,0,7.5,Orsted\n"
    with pytest.raises(CsvError, match="looks like data, not a header") as info:
        ingest(write(tmp_path, rows), SCHEMA)
    for value in ("64", "30.5", "Mueller"):
        assert value not in str(info.value)
    with pytest.raises(CsvError, match="looks like data") as twice:
        ingest(write(tmp_path, "0,1,0,1,no\n1,0,1,0,yes\n"), SCHEMA)
    assert "duplicated" not in str(twice.value)


def test_a_parquet_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1\x15\x04\x15\x00" + bytes(64))
    with pytest.raises(CsvError, match="Parquet"):
        ingest(path, SCHEMA)


@pytest.mark.parametrize(
    "first",
    [
        "64;30,5;1;1;4,25;Mueller",  # another delimiter: the fallback split is one field
        "64\t30.5\t1\t1\t4.25\tMueller",
        "MRN-0042,Jane Smith,1980-03-02,F,yes,high",  # no bare number at all
    ],
)
def test_a_first_line_with_none_of_the_schemas_names_is_never_echoed(
    tmp_path: Path, first: str
) -> None:
    with pytest.raises(CsvError, match="none of the schema's column") as info:
        ingest(write(tmp_path, first + "\n" + first + "\n"), SCHEMA)
    for value in ("Mueller", "Jane", "1980", "MRN"):
        assert value not in str(info.value)


def test_formatted_amounts_are_refused_with_what_to_write_instead(tmp_path: Path) -> None:
    """A health economist's costs exported as formatted amounts: the refusal named the file's
    encoding for a euro sign and said nothing of thousands separators. It now says which it
    is (naming the cell, never the value)."""
    for odd, expected in (
        ("€7.50", "a currency sign"),
        ("7.50 $", "a currency sign"),
        ("1,250.5", "thousands separators"),
        ("1 250", "thousands separators"),
    ):
        with pytest.raises(CsvError) as refused:
            ingest(write(tmp_path, comma_file().replace("7.5", f'"{odd}"')), SCHEMA)
        text = str(refused.value)
        assert "(column 'los', data row 2)" in text, odd
        assert expected in text, odd
        assert "outside ASCII" not in text
        assert odd not in text
    decimal_comma = european_file().replace("7,5", "1.250,5")
    with pytest.raises(CsvError) as refused:
        ingest(write(tmp_path, decimal_comma), SCHEMA, CsvFormat(decimal=","))
    assert "thousands separators" in str(refused.value)


def test_values_spanning_a_sliver_of_the_declared_range_are_flagged(tmp_path: Path) -> None:
    """Costs written 3.959 (a '.' thousands separator) read as 3.959 pass every check; the one
    sign is that they fill 0.1 % of the declared 0-120,000: the report says so."""
    schema = PublicSchema.model_validate(
        {**SCHEMA.model_dump(mode="json"), "outcome": {"name": "los", "lower": 0, "upper": 6000}}
    )
    got = ingest(write(tmp_path, comma_file()), schema)
    flagged = [w for w in got.report.warnings if w.startswith("the values of 'los'")]
    assert len(flagged) == 1
    assert "span 0.15% of its declared bounds [0, 6000]" in flagged[0]
    assert "thousands separators" in flagged[0]
    # honest bounds, and categorical columns, are not flagged
    assert ingest(write(tmp_path, comma_file()), SCHEMA).report.warnings == []
