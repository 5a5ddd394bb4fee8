"""Release kinds: one module per kind, registered here by name."""

from __future__ import annotations

from service.releases.kinds.ate import AteKind
from service.releases.kinds.base import ReleaseKind

REGISTRY: dict[str, ReleaseKind] = {"ate": AteKind()}

__all__ = ["REGISTRY"]
