"""``python -m service.functions.close``: close released functions by hand, an operator's step.

    python -m service.functions.close FUNCTION_ID [FUNCTION_ID ...]
    python -m service.functions.close --all-exact

A closed function answers no point again (``409 function-closed``); its release, the ledger and
the answers clients kept stay. What it is for: after restoring a database backup, an exact-basis
function has forgotten the answers it gave since the dump, and would answer such a point again
with a new, independent draw (two draws of one point can be averaged: README, "Backups").
Finite-basis and ``ebm`` functions answer from their state alone and need no closing. Each
function is closed under its row lock, as an evaluation takes it. Prints the counts as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import CateFunction


def close_functions(
    factory: sessionmaker[Session], *, ids: list[str] | None = None, all_exact: bool = False
) -> dict[str, int]:
    """Close the named functions (or every open exact-basis one); each in its own transaction.
    Returns ``closed``, ``already_closed`` and ``unknown`` counts."""
    counts = {"closed": 0, "already_closed": 0, "unknown": 0}
    with factory() as session:
        if all_exact:
            query = select(CateFunction.id).where(
                CateFunction.basis == "exact", CateFunction.status == "open"
            )
            ids = list(session.execute(query).scalars())
        session.rollback()
    for function_id in ids or []:
        with factory() as session:
            header = session.get(CateFunction, function_id, with_for_update=True)
            if header is None:
                counts["unknown"] += 1
            elif header.status != "open":
                counts["already_closed"] += 1
            else:
                header.status = "closed"
                header.closed_at = datetime.now(UTC).isoformat(timespec="microseconds")
                counts["closed"] += 1
            session.commit()
    return counts


def main(argv: list[str] | None = None) -> int:
    from service import __version__
    from service.config import settings_or_exit
    from service.db.engine import get_sessionmaker

    parser = argparse.ArgumentParser(
        prog="python -m service.functions.close",
        description="Close released functions: they answer no point again (after restoring "
        "a backup: README.md, 'Backups').",
    )
    parser.add_argument("function_ids", nargs="*", metavar="FUNCTION_ID")
    parser.add_argument("--all-exact", action="store_true", help="every open exact-basis function")
    parser.add_argument("--version", action="version", version=f"dp-curator {__version__}")
    args = parser.parse_args(argv)
    if bool(args.function_ids) == bool(args.all_exact):
        parser.error("name function ids, or --all-exact")
    from service.db import preflight

    problem = preflight.unreachable(settings_or_exit().database_url)
    if problem is not None:
        sys.stderr.write(problem + "\n")
        return 1
    counts = close_functions(get_sessionmaker(), ids=args.function_ids, all_exact=args.all_exact)
    sys.stdout.write(json.dumps(counts) + "\n")
    return 1 if counts["unknown"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
