"""The client distribution is versioned with the API: one version, in three declared places."""

from __future__ import annotations

import json
from pathlib import Path

import dpcurator
import service

ROOT = Path(__file__).resolve().parents[2]


def test_client_version_is_the_api_version() -> None:
    """dpcurator (clients/python) == service (the server) == the committed OpenAPI info.version.

    Bump them together: service/__init__.py, clients/python/src/dpcurator/__init__.py, then
    regenerate openapi/openapi.json (python -m service.openapi).
    """
    committed = json.loads((ROOT / "openapi" / "openapi.json").read_text())["info"]["version"]
    assert dpcurator.__version__ == service.__version__ == committed


def test_cli_reports_the_api_version() -> None:
    from click.testing import CliRunner

    from dpcurator.cli import cli

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == service.__version__
