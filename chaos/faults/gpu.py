"""``gpu-fault``: the emulated GPU's own fault API (``/admin/faults``, gpusim.faults).

Modes, as a client sees them:

==============  ==================================================================
``crash``       the worker process exits (status 70) and stays down until rollback
                (gtm up holds it; in-flight streams are cut mid-way)
``slow``        forward passes ``slowdown`` times slower (a throttled GPU)
``throttle``    the profile's thermal throttling (−20 % throughput)
``black-hole``  every request is accepted and never answered: inference, ``/metrics``
                and ``/health`` alike (the emulator's ``black_hole``)
``errors``      ``error_rate`` of requests fail at once with ``error_status``
``latency``     every request waits ``latency_ms`` before it is processed
``cut-stream``  streams are cut after ``after_tokens`` tokens (no ``[DONE]``)
==============  ==================================================================

Rollback clears the worker's faults (``DELETE``); for a crash it releases the hold,
which restarts the worker.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

import aiohttp
from pydantic import Field

from chaos.deployment import Deployment
from chaos.faults.base import FaultError, Injected, Name, SpecBase
from chaos.faults.process import wait_down


class GpuFaultMode(StrEnum):
    CRASH = "crash"
    SLOW = "slow"
    THROTTLE = "throttle"
    BLACK_HOLE = "black-hole"
    ERRORS = "errors"
    LATENCY = "latency"
    CUT_STREAM = "cut-stream"


class GpuFault(SpecBase):
    """A fault inside one emulated GPU worker."""

    kind: Literal["gpu-fault"] = "gpu-fault"
    gpu: Name
    mode: GpuFaultMode
    slowdown: Annotated[float, Field(ge=1.0, le=1000.0, allow_inf_nan=False)] = 4.0
    error_rate: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    error_status: Literal[429, 500, 502, 503, 504] = 500
    latency_ms: Annotated[float, Field(gt=0.0, le=600_000.0, allow_inf_nan=False)] = 1000.0
    after_tokens: Annotated[int, Field(ge=0)] = 8

    def body(self) -> dict[str, Any]:
        """The ``POST /admin/faults`` body for this mode."""
        match self.mode:
            case GpuFaultMode.CRASH:
                return {"crash": True}
            case GpuFaultMode.SLOW:
                return {"slowdown": self.slowdown}
            case GpuFaultMode.THROTTLE:
                return {"thermal_throttle": True}
            case GpuFaultMode.BLACK_HOLE:
                return {"black_hole": True}
            case GpuFaultMode.ERRORS:
                return {"error_rate": self.error_rate, "error_status": self.error_status}
            case GpuFaultMode.LATENCY:
                return {"added_latency_ms": self.latency_ms}
            case GpuFaultMode.CUT_STREAM:
                return {"stop_stream_after": self.after_tokens}

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        gpu = deployment.gpu(self.gpu)
        if gpu.url is None:
            raise FaultError(f"GPU {self.gpu} has not registered its address yet")
        url = f"{gpu.url.rstrip('/')}/admin/faults"
        tier = f"gpu/{self.gpu}"
        if self.mode is GpuFaultMode.CRASH:
            pid = deployment.child(tier).pid
            await deployment.hold(tier)
            try:
                await _call(deployment.session, "POST", url, self.body(), crash=True)
                if pid is not None:
                    await wait_down(deployment, tier, pid)
            except BaseException:
                await deployment.release(tier)
                raise

            async def release() -> None:
                await deployment.release(tier)

            return Injected(f"gpu-fault crash {self.gpu} (held down)", release)
        await _call(deployment.session, "POST", url, self.body())

        async def clear() -> None:
            await _call(deployment.session, "DELETE", url, None)

        return Injected(f"gpu-fault {self.mode.value} {self.gpu} {self.body()}", clear)


async def _call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: dict[str, Any] | None,
    *,
    crash: bool = False,
) -> None:
    try:
        async with session.request(method, url, json=body) as response:
            if response.status >= 400:
                text = await response.text()
                raise FaultError(f"{method} {url}: HTTP {response.status}: {text[:300]}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        # A crash may close the connection before (or instead of) answering.
        if not crash:
            raise FaultError(f"{method} {url}: {type(exc).__name__}: {exc}") from None
