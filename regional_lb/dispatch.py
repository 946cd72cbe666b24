"""The waiting room: requests the router queued wait here for a zone with room.

A request whose decision is :attr:`~regional_lb.router.Route.QUEUE` is offered to the
fair queue (:mod:`regional_lb.fairqueue`: priority bands, VTC order between tenants,
bounds and TTLs) and waits on a future. Whenever room may have appeared (a request
finished, a new view, the periodic tick) :meth:`Dispatcher.dispatch` hands queued
heads to zones, highest band and smallest VTC first, charging the zone as it places
each one; the handler then forwards to that zone.

Refusals are 503 + Retry-After: the band's queue is full, or its TTL passed. A client
that goes away while waiting takes its entry out of the queue, and gives back the zone
it had just been charged to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from gtm.clock import Clock
from gtm.models import RouteRequest
from regional_lb.admission import Admitted
from regional_lb.errors import Overloaded
from regional_lb.fairqueue import FairQueue, RefusalReason
from regional_lb.metrics import RegionalMetrics
from regional_lb.router import Inputs, RegionalDecision, RegionalRouter
from regional_lb.view import RegionalView, ZoneAccounting


@dataclass(slots=True)
class Waiter:
    """A request waiting in the fair queue for a zone."""

    request: RouteRequest
    inputs: Inputs
    future: asyncio.Future[RegionalDecision]
    decision: RegionalDecision | None = None


class Dispatcher:
    """The fair queue of one replica and the hand-out of its requests to zones."""

    def __init__(
        self,
        queue: FairQueue[Waiter],
        *,
        router: Callable[[], RegionalRouter | None],
        view: Callable[[], RegionalView],
        accounting: ZoneAccounting,
        metrics: RegionalMetrics,
        clock: Clock,
    ) -> None:
        self.queue = queue
        self._router = router
        self._view = view
        self._accounting = accounting
        self._metrics = metrics
        self._clock = clock

    async def tick(self) -> None:
        """Refuse what waited past its band's TTL, then dispatch."""
        now = self._clock.monotonic()
        for item in self.queue.expire(now):
            waiter = item.payload
            self._metrics.rejected.labels(item.tenant, RefusalReason.QUEUE_TIMEOUT.value).inc()
            if not waiter.future.done():
                ttl = self.queue.settings.band(item.band).ttl_s
                waiter.future.set_exception(
                    Overloaded(
                        f"the region is saturated; the request waited {ttl:g} s in the "
                        f"{item.band.value} queue without a zone",
                        reason=RefusalReason.QUEUE_TIMEOUT.value,
                        retry_after_s=max(1.0, ttl / 10),
                    )
                )
        self.dispatch()

    def dispatch(self) -> None:
        """Hand queued requests to zones with room, highest band and smallest VTC first."""
        router = self._router()
        if router is None or len(self.queue) == 0:
            return
        view = self._view()
        accounting = self._accounting
        now = self._clock.monotonic()

        # Models no zone can take more of now: their other queued heads are not tried
        # again in this pass (dispatching only ever makes zones fuller).
        full: set[str] = set()

        def placeable(waiter: Waiter) -> bool:
            # Places the head as a side effect: pop() takes exactly the first head this
            # accepts, so the stashed decision is the popped request's.
            if waiter.future.done():
                return True
            if waiter.request.model in full:
                return False
            waiter.decision = router.place(
                waiter.request, view, waiter.inputs, accounting=accounting
            )
            if waiter.decision is None:
                full.add(waiter.request.model)
            return waiter.decision is not None

        while (item := self.queue.pop(placeable)) is not None:
            waiter = item.payload
            decision = waiter.decision
            if waiter.future.done() or decision is None or decision.zone is None:
                continue
            accounting.start(decision.zone.id, waiter.request.model, waiter.request.input_tokens)
            self._metrics.queue_wait.labels(item.band.value).observe(item.waited(now))
            waiter.future.set_result(decision)

    async def wait(self, admitted: Admitted) -> RegionalDecision:
        """Queue ``admitted`` and wait for a zone (already charged when this returns)."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(admitted.route_request, admitted.inputs, loop.create_future())
        offered = self.queue.offer(
            admitted.tenant.id,
            admitted.band,
            waiter,
            input_tokens=admitted.cost.input_tokens,
            output_tokens=admitted.cost.output_tokens,
            now=self._clock.monotonic(),
        )
        if isinstance(offered, RefusalReason):
            raise Overloaded(
                f"the region is saturated and its {admitted.band.value} queue is full "
                f"({offered.value})",
                reason=offered.value,
                retry_after_s=max(1.0, self.queue.settings.band(admitted.band).ttl_s / 10),
            )
        self.dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away while waiting. Take the request out of the queue; if
            # a zone had just been charged for it, give that back.
            future = waiter.future
            if future.cancelled() or not future.done():
                self.queue.remove(offered)
            elif future.exception() is None:
                zone = future.result().zone
                if zone is not None:
                    request = admitted.route_request
                    self._accounting.finish(zone.id, request.model, request.input_tokens)
                    self.dispatch()
            raise

    def refuse_waiting(self) -> None:
        """Answer every queued request 503 (shutting down): they would not be served."""
        for item in list(self.queue.items()):
            self.queue.remove(item)
            if not item.payload.future.done():
                item.payload.future.set_exception(
                    Overloaded(
                        "the regional LB is shutting down", reason="shutdown", retry_after_s=1.0
                    )
                )
