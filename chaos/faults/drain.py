"""``drain``: drain a region, zone or GPU through gtm up's status API (its store);
rollback undrains."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import model_validator

from chaos.deployment import Deployment
from chaos.faults.base import Injected, Name, SpecBase


class DrainFault(SpecBase):
    """Drain exactly one of ``region``, ``zone``, ``gpu``."""

    kind: Literal["drain"] = "drain"
    region: Name | None = None
    zone: Name | None = None
    gpu: Name | None = None

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        given = [n for n in ("region", "zone", "gpu") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "drain needs exactly one of region, zone, gpu"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    @property
    def target(self) -> tuple[Literal["region", "zone", "gpu"], str]:
        if self.region is not None:
            return "region", self.region
        if self.zone is not None:
            return "zone", self.zone
        assert self.gpu is not None
        return "gpu", self.gpu

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        what, name = self.target
        {"region": deployment.region, "zone": deployment.zone, "gpu": deployment.gpu}[what](name)
        await deployment.drain(what, name)

        async def undo() -> None:
            await deployment.undrain(what, name)

        return Injected(f"drain {what} {name}", undo)
