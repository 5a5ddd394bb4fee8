"""The ``dpcurator`` command line (entry point ``service.cli:main``)."""

from __future__ import annotations

from service.cli.app import cli, main

__all__ = ["cli", "main"]
