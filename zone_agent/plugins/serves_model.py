"""``serves-model-filter``: GPUs that actually have the model loaded.

Candidates come indexed by model from the inventory (a GPU is a candidate only if its
record lists the model, or its metrics do), so a request never reaches a GPU of another
model. This filter adds the live check: when a fresh scrape of a worker names its
models (vLLM and SGLang label every sample with ``model_name``) and the requested one is
not among them — a worker restarted with another model, a LoRA adapter unloaded — the
GPU is removed. Without a fresh scrape the inventory is trusted.
"""

from __future__ import annotations

from gtm.models import Frozen
from zone_agent.pipeline import Batch, Removal
from zone_agent.view import ModelIndex

TYPE_NAME = "serves-model-filter"


class Params(Frozen):
    pass


class ServesModelFilter:
    fused_role = "serves-model"

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def removes(self, batch: Batch, /) -> Removal | None:
        return self.index_removal(batch.index)

    def index_removal(self, index: ModelIndex, /) -> Removal | None:
        """A function of the view alone (the index's model is the request's)."""
        if index.all_loaded:
            return None
        model = index.model
        return Removal(~index.loaded, lambda i: f"model {model!r} is not loaded on the worker")
