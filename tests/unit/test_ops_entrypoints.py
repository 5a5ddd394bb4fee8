"""Operators' entry points: --help and --version answer without touching the database (an ops
walkthrough's `python -m service --help` migrated the database and started serving, and the
rotation tool's re-sealed every function), and no secret of DATABASE_URL reaches a message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service import __main__ as serve
from service import __version__, worker
from service.db.preflight import safe_url
from service.functions import close, rotate


@pytest.mark.parametrize("main", [serve.main, worker.main, rotate.main, close.main])
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


def test_an_api_that_does_not_migrate_refuses_an_unmigrated_database(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CURATOR_RUN_MIGRATIONS_ON_START=false (migrations as their own step) an empty
    database is refused at start with what to run, not served with a 500 per request."""
    from service.config import get_settings

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    monkeypatch.setenv("CURATOR_RUN_MIGRATIONS_ON_START", "false")
    monkeypatch.setattr(serve.uvicorn, "run", lambda *a, **k: pytest.fail("it served"))
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as refused:
            serve.main([])
    finally:
        get_settings.cache_clear()
    assert "not at the current migration" in str(refused.value)
    assert "alembic upgrade head" in str(refused.value)
