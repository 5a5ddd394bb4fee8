"""Python client of the DP causal curator: typed, retrying, problem+json as exceptions.

    from dpcurator import CuratorClient

    with CuratorClient("http://127.0.0.1:8000", api_key) as curator:
        release = curator.release(dataset_id, "ate", {"epsilon": 1.0}, on_progress=print)
        ate = curator.result(release)   # AteResult(estimate=..., ci_lower=..., ci_upper=...)

Plots live in ``dpcurator.plots`` (matplotlib: ``pip install "dpcurator[plots]"``). The
command line is ``dpcurator`` (``dpcurator.cli``). The distribution needs none of the server's
packages; its version is the version of the HTTP API it speaks (the server's ``info.version``).
"""

from __future__ import annotations

# The API version this client speaks: equal to the server's ``service.__version__`` (and so to
# ``info.version`` of openapi/openapi.json); tests/unit/test_versions.py checks that they match.
__version__ = "0.1.0"

from dpcurator.chain import Checkpoint
from dpcurator.client import DEFAULT_URL, CuratorClient, Retry
from dpcurator.errors import (
    PROBLEM_CLASSES,
    BudgetBelowSpent,
    BudgetExhausted,
    BudgetNotSet,
    Conflict,
    CuratorError,
    DatabaseUnavailable,
    DatasetUnavailable,
    DevelopmentSecretsExposed,
    Forbidden,
    FunctionBatchRejected,
    FunctionBusy,
    FunctionCapacityReached,
    FunctionClosed,
    HttpError,
    IdempotencyKeyInFlight,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    InternalError,
    InvalidCsv,
    InvalidSchema,
    NotFound,
    PaperModeDisabled,
    PayloadTooLarge,
    PrincipalCapExceeded,
    ProblemError,
    ReleaseFailed,
    TransportError,
    Unauthenticated,
    UnknownReleaseKind,
    ValidationFailed,
    WaitTimeout,
)
from dpcurator.models import (
    Budget,
    Dataset,
    DatasetCreated,
    Grant,
    IngestReport,
    LedgerEntry,
    Principal,
    PrincipalCreated,
    PrincipalEvent,
    Quote,
    Release,
    UploadCheck,
    Verification,
)
from dpcurator.results import (
    AteResult,
    CateVectorResult,
    EbmShapeResult,
    FunctionEvaluation,
    FunctionHandle,
    FunctionInfo,
    GenericResult,
    Prediction,
    ShapeFunction,
    TypedResult,
    UpliftTable,
    parse_result,
)

__all__ = [
    "__version__",
    "DEFAULT_URL",
    "PROBLEM_CLASSES",
    "AteResult",
    "Budget",
    "Checkpoint",
    "BudgetBelowSpent",
    "BudgetExhausted",
    "BudgetNotSet",
    "CateVectorResult",
    "Conflict",
    "CuratorClient",
    "CuratorError",
    "Dataset",
    "DatasetCreated",
    "UploadCheck",
    "DatabaseUnavailable",
    "DatasetUnavailable",
    "EbmShapeResult",
    "Forbidden",
    "FunctionBatchRejected",
    "FunctionBusy",
    "FunctionCapacityReached",
    "FunctionClosed",
    "FunctionEvaluation",
    "FunctionHandle",
    "FunctionInfo",
    "GenericResult",
    "Grant",
    "DevelopmentSecretsExposed",
    "HttpError",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "IngestReport",
    "InternalError",
    "InvalidCsv",
    "InvalidSchema",
    "LedgerEntry",
    "NotFound",
    "PaperModeDisabled",
    "PayloadTooLarge",
    "Principal",
    "PrincipalCapExceeded",
    "Prediction",
    "PrincipalCreated",
    "PrincipalEvent",
    "ProblemError",
    "Quote",
    "Release",
    "ReleaseFailed",
    "Retry",
    "ShapeFunction",
    "TransportError",
    "TypedResult",
    "Unauthenticated",
    "UnknownReleaseKind",
    "UpliftTable",
    "ValidationFailed",
    "Verification",
    "WaitTimeout",
    "parse_result",
]
