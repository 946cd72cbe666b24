"""``residency-filter`` at the regional tier: a zone is in this region, so every zone is
allowed exactly when residency allows the region for this request — all or nothing.

Normally the service refuses a request whose residency excludes this region before zone
choice (451); the filter keeps the profile honest on its own: a profile that runs it can
never place a request in a region its verdict excludes (it fails closed).
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from gtm.routing import Plugin, Removal
from regional_lb.view import ZoneBatch

TYPE_NAME = "residency-filter"


class Params(Frozen):
    """No parameters."""


class ResidencyFilter(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        ctx = batch.ctx
        if ctx.allowed is None or ctx.region in ctx.allowed:
            return None
        reason = f"residency does not allow region {ctx.region}"
        return Removal(np.ones(len(batch), dtype=np.bool_), lambda _: reason)
