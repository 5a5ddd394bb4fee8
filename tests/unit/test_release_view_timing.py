"""What a reader sees of a release's timing: nothing beyond the public latency bucket.

A job's own progress and stage would reveal how long its steps take on these data, and its real
finish time how long it ran (docs/privacy.md, "Side channels"); the view shows neither.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from service.db.models import Release
from service.releases.service import PROGRESS_HALF_SECONDS, public_progress, shown_status, view

START = 1_800_000_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds")


def _release(**fields: object) -> Release:
    base: dict[str, object] = {
        "id": "r1",
        "dataset_id": "d1",
        "principal_id": "p1",
        "kind": "ate",
        "params_json": json.dumps({"params": {"epsilon": 1.0}}),
        "request_hash": "h",
        "idempotency_key": "k",
        "guarantee": "strict",
        "epsilon": 10**12,
        "delta": 0,
        "record_json": "{}",
        "created_at": _iso(START - 1.0),
        "started_at": _iso(START),
        "ledger_seq": 1,
    }
    base.update(fields)
    return Release(**base)


def _running(stage: str, progress: float) -> Release:
    return _release(status="running", stage=stage, progress=progress)


def _padded_done(real_seconds: float, bucket: float) -> Release:
    return _release(
        status="done",
        stage="done",
        progress=1.0,
        result_json=json.dumps({"estimate": 1.0}),
        finished_at=_iso(START + real_seconds),
        visible_at=START + bucket,
    )


@pytest.mark.parametrize("at", [0.5, 3.0, 4.9])
def test_a_finished_job_is_indistinguishable_from_a_running_one_until_its_bucket(
    at: float,
) -> None:
    """Before its padded completion time, a job that finished after 0.2 s reads exactly like
    one still in its first stage, and like one in its last: same status, stage and progress."""
    now = START + at
    shown = [
        view(_padded_done(0.2, 5.0), now=now),
        view(_running("loading rows", 0.05), now=now),
        view(_running("estimation", 0.93), now=now),
    ]
    fields = [(r.status, r.stage, r.progress, r.finished_at, r.result) for r in shown]
    assert fields[0] == fields[1] == fields[2]
    status, stage, progress, finished_at, result = fields[0]
    assert (status, stage, finished_at, result) == ("running", "running", None, None)
    assert progress == pytest.approx(public_progress(at), abs=1e-6)  # ISO times: microseconds


def test_the_shown_finish_time_is_the_padded_one_not_the_real_one() -> None:
    release = _padded_done(0.2, 5.0)
    assert view(release, now=START + 4.99).finished_at is None
    shown = view(release, now=START + 5.0)
    assert (shown.status, shown.stage, shown.progress) == ("done", "done", 1.0)
    assert shown.finished_at == _iso(START + 5.0)
    assert shown.finished_at != release.finished_at
    assert shown_status(release, now=START + 5.0) == "done"


def test_public_progress_rises_with_time_only_and_stays_below_the_end() -> None:
    values = [public_progress(t) for t in (0.0, 1.0, PROGRESS_HALF_SECONDS, 60.0, 3600.0)]
    assert values[0] == 0.0
    assert values[2] == pytest.approx(0.495)
    assert values == sorted(values)
    assert values[-1] < 0.99


def test_a_queued_release_shows_no_progress() -> None:
    shown = view(_release(status="queued", stage="queued", started_at=None), now=START)
    assert (shown.status, shown.stage, shown.progress) == ("queued", "queued", 0.0)
