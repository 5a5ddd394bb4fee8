"""Release kinds: one module per kind, registered here by name."""

from __future__ import annotations

from service.releases.kinds.ate import AteKind
from service.releases.kinds.base import ReleaseKind
from service.releases.kinds.cate_function import CateFunctionKind
from service.releases.kinds.cate_vector import CateVectorKind
from service.releases.kinds.ebm_cate import EbmCateKind
from service.releases.kinds.uplift_table import UpliftTableKind

REGISTRY: dict[str, ReleaseKind] = {"ate": AteKind()}
REGISTRY["cate_function"] = CateFunctionKind()
REGISTRY["cate_vector"] = CateVectorKind()
REGISTRY["ebm_cate"] = EbmCateKind()
REGISTRY["uplift_table"] = UpliftTableKind()

__all__ = ["REGISTRY"]
