"""Write the OpenAPI document: ``python -m service.openapi`` -> openapi/openapi.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.config import Settings


def document() -> dict[str, Any]:
    from service.main import create_app

    app = create_app(Settings(start_job_runner=False, run_migrations_on_start=False))
    return app.openapi()


def main() -> None:
    out = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"
    out.write_text(json.dumps(document(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")  # noqa: T201


if __name__ == "__main__":
    main()
