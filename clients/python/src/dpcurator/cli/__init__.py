"""The ``dpcurator`` command line (entry point ``dpcurator.cli:main``)."""

from __future__ import annotations

from dpcurator.cli.app import cli, main

__all__ = ["cli", "main"]
