"""Operators' entry points: --help and --version answer without touching the database (an ops
walkthrough's `python -m service --help` migrated the database and started serving, and the
rotation tool's re-sealed every function), and no secret of DATABASE_URL reaches a message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service import __main__ as serve
from service import __version__, worker
from service.db import migrate as migrate_step
from service.db.preflight import safe_url
from service.functions import close, rotate


@pytest.mark.parametrize(
    "main", [serve.main, worker.main, rotate.main, close.main, migrate_step.main]
)
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_touch_nothing(
    main: Callable[..., Any],
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the settings were read: the command ran")

    monkeypatch.setattr("service.config.settings_or_exit", refuse)
    monkeypatch.setattr(serve, "settings_or_exit", refuse)
    monkeypatch.setattr(worker, "settings_or_exit", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main([flag])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    if flag == "--version":
        assert out.strip() == f"dp-curator {__version__}"
    else:
        assert out.startswith("usage: python -m service")


def test_a_password_in_the_query_string_is_hidden() -> None:
    url = "postgresql+psycopg://curator:S3cretPW@db:5432/curator?password=Other1&sslmode=require"
    shown = safe_url(url)
    assert "S3cretPW" not in shown
    assert "Other1" not in shown
    assert "sslmode=require" in shown
    assert "db:5432/curator" in shown


def test_a_refused_setting_is_named_by_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.config import get_settings, settings_or_exit

    monkeypatch.setenv("CURATOR_PORT", "eighty")
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as refused:
            settings_or_exit()
    finally:
        get_settings.cache_clear()
    message = str(refused.value)
    assert message.startswith("configuration refused: CURATOR_PORT: ")
    assert "eighty" not in message


def _refused_at_start(monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``serve.main`` exits with before serving (serving fails the test), under the
    environment the caller set, with the settings cache cleared around it."""
    from service.config import get_settings

    monkeypatch.setattr(serve.uvicorn, "run", lambda *a, **k: pytest.fail("it served"))
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as refused:
            serve.main([])
    finally:
        get_settings.cache_clear()
    return str(refused.value)


def test_an_api_that_does_not_migrate_refuses_an_unmigrated_database(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CURATOR_RUN_MIGRATIONS_ON_START=false (migrations as their own step) an empty
    database is refused at start with what to run, not served with a 500 per request."""
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    monkeypatch.setenv("CURATOR_RUN_MIGRATIONS_ON_START", "false")
    refused = _refused_at_start(monkeypatch)
    assert "not at the current migration" in refused
    assert "python -m service.db.migrate" in refused


def test_a_schema_from_a_newer_version_is_refused_in_one_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migrating a database a newer version migrated raised alembic's traceback; waiting for it
    advised to migrate. Both now say what it is, in one line."""
    from sqlalchemy import create_engine, text

    from service.db import migrate

    url = f"sqlite:///{tmp_path / 'newer.sqlite3'}"
    migrate.upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
    engine.dispose()
    monkeypatch.setenv("DATABASE_URL", url)
    for migrating in ("true", "false"):
        monkeypatch.setenv("CURATOR_RUN_MIGRATIONS_ON_START", migrating)
        assert "a newer version of the service migrated it" in _refused_at_start(monkeypatch)
    assert migrate.main([]) == 1


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('[1, "x"]', "CURATOR_LATENCY_BUCKETS[1]: "),
        ("notjson", "CURATOR_LATENCY_BUCKETS: not valid JSON"),
    ],
)
def test_a_list_setting_is_refused_in_one_line(
    value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.config import get_settings, settings_or_exit

    monkeypatch.setenv("CURATOR_LATENCY_BUCKETS", value)
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as refused:
            settings_or_exit()
    finally:
        get_settings.cache_clear()
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("main", [rotate.main, close.main])
def test_the_function_tools_say_an_unreachable_database_in_one_line(
    main: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.config import get_settings

    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://u:pw@127.0.0.1:1/nowhere")
    get_settings.cache_clear()
    try:
        args = [] if main is rotate.main else ["--all-exact"]
        assert main(args) == 1
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the database")
    assert "Traceback" not in err
    assert "pw@" not in err
