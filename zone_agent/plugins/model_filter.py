"""``model-filter`` (old name ``serves-model-filter``): GPUs that actually have the model loaded.

Candidates come indexed by model from the inventory (a GPU is a candidate only if its
record lists the model, or its metrics do), so a request never reaches a GPU of another
model. This filter adds the live check: when a fresh scrape of a worker names its
models (vLLM and SGLang label every sample with ``model_name``) and the requested one is
not among them — a worker restarted with another model, a LoRA adapter unloaded — the
GPU is removed. Without a fresh scrape the inventory is trusted.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Plugin, Removal
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.view import ModelIndex

TYPE_NAME = "model-filter"


class Params(Frozen):
    pass


class ModelFilter(Plugin):
    capabilities = frozenset({ZoneCapability.MODEL})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        return self.index_removal(batch.index)

    def index_removal(self, index: ModelIndex, /) -> Removal | None:
        """A function of the view alone (the index's model is the request's)."""
        if index.all_loaded:
            return None
        model = index.model
        return Removal(~index.loaded, lambda i: f"model {model!r} is not loaded on the worker")


#: The class under its name before the vocabulary of issue 21.
ServesModelFilter = ModelFilter
