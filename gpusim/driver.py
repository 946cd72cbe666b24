"""Drives an :class:`~gpusim.engine.Engine` in real time, scaled by a speedup factor.

Engine time runs ``speedup`` times faster than the injected clock. The driver runs
forward passes back to back: it asks the engine for the next pass, sleeps until the
pass ends, then hands the produced tokens to the waiting HTTP handlers. Passes are
chained on *engine* time (the next one starts where the previous ended), so a late
wake-up of the event loop does not lose throughput: the following sleep is shorter.
A backlog larger than :data:`MAX_CATCH_UP_S` (wall time) is dropped rather than replayed
in a burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from gpusim.engine import Engine, EngineRequest, FinishedRequest, FinishReason, StepResult
from gpusim.metrics import EngineMetrics, ModelSnapshot
from gtm.clock import Clock

#: How far (wall seconds) the driver may run behind real time before it gives up
#: catching up; beyond this the worker is simply slower than its profile (CPU-bound).
#: Five times the 10 ms event-loop lag budget: ordinary hiccups are absorbed exactly.
MAX_CATCH_UP_S = 0.05

#: Smoothing of the generation-throughput gauge (per pass exponential moving average).
THROUGHPUT_SMOOTHING = 0.05

#: Tokens handed out between two yields to the event loop: a large pass delivered in one
#: go would hold the loop for longer than its lag budget, so it goes out in slices and
#: other connections and timers wait at most one slice (64: well under 1 ms when measured).
DELIVERY_SLICE = 64


class Notifier:
    """Wakes one waiting HTTP handler; shared by the engine requests of one HTTP request."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def notify(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self) -> None:
        """Wait for the next :meth:`notify` (check your streams before calling this)."""
        self._future = asyncio.get_running_loop().create_future()
        try:
            await self._future
        finally:
            self._future = None


class RequestStream:
    """What one engine request has produced so far (read by its HTTP handler)."""

    __slots__ = (
        "api_finish_reason",
        "finished",
        "notifier",
        "on_token",
        "produced",
        "request_id",
    )

    def __init__(self, request_id: str, notifier: Notifier, api_finish_reason: str) -> None:
        self.request_id = request_id
        self.notifier = notifier
        #: What the API reports when the engine finishes it normally ("stop"/"length").
        self.api_finish_reason = api_finish_reason
        self.produced = 0
        self.finished: FinishedRequest | None = None
        #: Optional fast path: called after each new token; True means "consumed", so
        #: the waiting handler need not be woken for it.
        self.on_token: Callable[[RequestStream], bool] | None = None

    @property
    def aborted(self) -> bool:
        return self.finished is not None and self.finished.reason is FinishReason.ABORTED


class EngineDriver:
    """Runs one engine against the injected clock; one per served model."""

    def __init__(
        self,
        model: str,
        engine: Engine,
        *,
        clock: Clock,
        speedup: float,
        metrics: EngineMetrics | None = None,
    ) -> None:
        if not speedup > 0:
            raise ValueError("speedup must be positive")
        self.model = model
        self.engine = engine
        self._clock = clock
        self._speedup = speedup
        self._metrics = metrics
        self._origin = clock.monotonic()
        self._streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._busy = False
        self._prev_end = 0.0
        self._throughput = 0.0

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """Engine time (seconds since the driver started, times the speedup)."""
        return (self._clock.monotonic() - self._origin) * self._speedup

    async def _sleep_until(self, engine_time: float) -> None:
        # Always yield once, so a CPU-bound backlog cannot starve the event loop.
        await self._clock.sleep(max(0.0, (engine_time - self.now()) / self._speedup))

    # ------------------------------------------------------------------ requests

    def submit(
        self, request: EngineRequest, notifier: Notifier, api_finish_reason: str
    ) -> RequestStream:
        """Queue a request (raises the engine's errors, e.g. RequestTooLong)."""
        self.engine.add(request, self.now())
        stream = RequestStream(request.request_id, notifier, api_finish_reason)
        self._streams[request.request_id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Drop a request (its client went away, or the worker is stopping)."""
        finished = self.engine.abort(request_id, self.now())
        stream = self._streams.pop(request_id, None)
        if finished is None:
            return
        if self._metrics is not None:
            self._metrics.observe_finished(self.model, finished, "abort")
        if stream is not None:
            stream.finished = finished
            stream.notifier.notify()

    def abort_all(self) -> None:
        for request_id in list(self._streams):
            self.abort(request_id)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def snapshot(self) -> ModelSnapshot:
        now = self.now()
        return ModelSnapshot(
            model=self.model,
            profile=self.engine.profile,
            stats=self.engine.stats(now),
            generation_throughput=self._throughput,
        )

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Run passes forever (cancel to stop)."""
        while True:
            now = self.now()
            at = self.engine.next_step_at(now)
            if at is None:
                await self._idle()
                continue
            if not self.engine.is_ready(now):
                self._busy = False  # cold start: nothing runs until the model is loaded
                await self._sleep_until(self.engine.ready_at)
                continue
            catch_up = MAX_CATCH_UP_S * self._speedup
            start = max(self._prev_end, now - catch_up) if self._busy else now
            result = self.engine.step(start)
            if result is None:
                await self._idle()
                continue
            self._busy = True
            self._prev_end = result.end
            await self._sleep_until(result.end)
            await self._deliver(result)

    async def _idle(self) -> None:
        self._busy = False
        self._throughput = 0.0
        self._wake.clear()
        await self._wake.wait()

    async def _deliver(self, result: StepResult) -> None:
        streams = self._streams
        for index, token in enumerate(result.tokens):
            if index and index % DELIVERY_SLICE == 0:
                await asyncio.sleep(0)
            stream = streams.get(token.request_id)
            if stream is None:
                continue
            stream.produced = token.position + 1
            sink = stream.on_token
            if (sink is None or not sink(stream)) and not token.finished:
                stream.notifier.notify()  # a finished one is notified by _finish
        if result.duration > 0:
            rate = len(result.tokens) / result.duration
            self._throughput += THROUGHPUT_SMOOTHING * (rate - self._throughput)
        if self._metrics is not None:
            self._metrics.observe_step(self.model, result)
        self._finish(result.finished)

    def _finish(self, finished: Iterable[FinishedRequest]) -> None:
        for done in finished:
            stream = self._streams.pop(done.request_id, None)
            if stream is None:
                continue
            stream.finished = done
            if self._metrics is not None:
                self._metrics.observe_finished(self.model, done, stream.api_finish_reason)
            stream.notifier.notify()
