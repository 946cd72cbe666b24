"""``model-filter``: keeps zones whose summary lists GPUs for the request's model."""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing import Plugin, Removal, removal_where
from regional_lb.view import ZoneBatch

TYPE_NAME = "model-filter"


class Params(Frozen):
    """No parameters."""


class ModelFilter(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        zones, why = batch.zones, f"does not serve {batch.request.model}"
        return removal_where(batch, lambda k: None if zones[k].serves_model else why)
