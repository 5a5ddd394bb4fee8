"""``python -m service.functions.rotate``: re-seal every released function's secret state under
the current ``CURATOR_STATE_KEY`` after a key rotation.

Rotation: set ``CURATOR_STATE_KEY`` to the new key and ``CURATOR_STATE_KEY_PREVIOUS`` to the old
one on every API and worker process (they open state sealed under either and seal new state
under the new one), run this once, then drop ``CURATOR_STATE_KEY_PREVIOUS``. Each function is
re-sealed in its own transaction under its row lock, so evaluations go on meanwhile (they wait
for that one function's transaction) and an interrupted run is simply run again: values already
under the current key are left as they are. Values no configured key opens are left too, and
counted; they make the exit status 1 where their function is open.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import CateFunction, CateFunctionBatch, CateFunctionSecret
from service.functions import keys
from service.functions.sealing import SealError, reseal


@dataclass
class RotationReport:
    functions: int = 0
    resealed: int = 0  # values now sealed under the current key
    current: int = 0  # values that already were
    unreadable: int = 0  # values no configured key opens (or whose digest does not match)
    unreadable_open: int = 0  # of those, in functions that are still open
    check_resealed: bool = False  # the state key check, re-sealed last (service.functions.keys)


def _reseal_row(row: CateFunctionSecret | CateFunctionBatch, context: str) -> str:
    if hashlib.sha256(row.payload).hexdigest() != row.digest:
        return "unreadable"
    try:
        new = reseal(row.payload, context=context)
    except SealError:
        return "unreadable"
    if new is None:
        return "current"
    row.payload = new
    row.digest = hashlib.sha256(new).hexdigest()
    return "resealed"


def reseal_function(session: Session, function_id: str, report: RotationReport) -> None:
    """Re-seal one function's fitted state and batches (one transaction, its row locked)."""
    header = session.execute(
        select(CateFunction).where(CateFunction.id == function_id).with_for_update()
    ).scalar_one()
    rows: list[tuple[CateFunctionSecret | CateFunctionBatch, str]] = []
    secret = session.get(CateFunctionSecret, function_id)
    if secret is not None:
        rows.append((secret, f"{function_id}:fitted"))
    batches = session.execute(
        select(CateFunctionBatch)
        .where(CateFunctionBatch.function_id == function_id)
        .order_by(CateFunctionBatch.seq)
    ).scalars()
    rows.extend((b, f"{function_id}:batch:{b.seq}") for b in batches)
    for row, context in rows:
        outcome = _reseal_row(row, context)
        setattr(report, outcome, getattr(report, outcome) + 1)
        if outcome == "unreadable" and header.status == "open":
            report.unreadable_open += 1
    report.functions += 1
    session.commit()


def reseal_all(
    sessions: Callable[[], Session], progress: Callable[[RotationReport], object] | None = None
) -> RotationReport:
    """Re-seal every function, one transaction each."""
    report = RotationReport()
    with sessions() as session:
        ids = list(session.execute(select(CateFunction.id).order_by(CateFunction.id)).scalars())
    for function_id in ids:
        with sessions() as session:
            try:
                reseal_function(session, function_id, report)
            except BaseException:
                session.rollback()
                raise
        if progress is not None and report.functions % 100 == 0:
            progress(report)
    with sessions() as session:
        report.check_resealed = keys.reseal_check(session)
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    from service import __version__
    from service.config import settings_or_exit
    from service.db.engine import get_sessionmaker

    parser = argparse.ArgumentParser(
        prog="python -m service.functions.rotate",
        description="Re-seal every released function's secret state under the current "
        "CURATOR_STATE_KEY (README.md, 'Rotating the state key'); prints the counts as JSON.",
    )
    parser.add_argument("--version", action="version", version=f"dp-curator {__version__}")
    parser.parse_args(argv)

    from service.db import preflight

    url = settings_or_exit().database_url
    problem = preflight.unreachable(url) or keys.state_key_problem(url)
    if problem is not None:
        sys.stderr.write(problem + "\n")
        return 1
    report = reseal_all(
        get_sessionmaker(),
        progress=lambda r: sys.stderr.write(f"{r.functions} functions re-sealed so far\n"),
    )
    sys.stdout.write(json.dumps(asdict(report)) + "\n")
    if report.unreadable_open:
        sys.stderr.write(
            f"{report.unreadable_open} values of open functions open under no configured key: "
            "keep CURATOR_STATE_KEY_PREVIOUS until they do (or those functions stay unreadable)\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
