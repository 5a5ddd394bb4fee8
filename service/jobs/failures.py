"""Public reasons of a failed release (``release.failure``), shown in its problem+json error.

None of them depends on the data: each names a step of the job, never what the rows held.
"""

from __future__ import annotations

DEFAULT = "run-failed"

FAILURES: dict[str, str] = {
    "run-failed": "the release failed after its charge; the charge is kept",
    "invalid-job": (
        "the stored request did not validate when its job ran, or resolved to another "
        "mechanism plan than the one charged (e.g. after an upgrade changed the kind's "
        "parameters or default rules); nothing was computed; the charge is kept"
    ),
    "rows-deleted": "the dataset's rows were deleted before the job ran; the charge is kept",
    "worker-lost": (
        "the worker running this release stopped, or lost its database connection, after it "
        "may have drawn noise; the charge is kept"
    ),
    "store-failed": "the result could not be stored; nothing was released; the charge is kept",
}


def detail(code: str | None) -> str:
    return FAILURES.get(code or DEFAULT, FAILURES[DEFAULT])
