"""The zone's flow control (zone_agent.flow): the TPOT ledger, when a request goes or
waits, the order the waiting go in, the longest wait, a full queue and a client gone."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.errors import ConfigError
from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view, zone_profile
from zone_agent.accounting import Accounting, Ticket
from zone_agent.errors import NoCapacity
from zone_agent.flow import (
    GO,
    Admission,
    AdmissionMode,
    AdmissionSettings,
    FlowControl,
    Plan,
    QueueOrder,
    ReleaseReason,
    TpotLedger,
    others_queued,
)
from zone_agent.plugins.health_filter import HealthFilter
from zone_agent.plugins.round_robin_picker import RoundRobinPicker
from zone_agent.profiles import builtin_profile
from zone_agent.router import ADMISSION_STEP, ZoneProfile
from zone_agent.view import ZoneView

# ---------------------------------------------------------------------- the ledger


def test_a_prompt_sent_after_a_request_eats_into_its_slack() -> None:
    ledger = TpotLedger()
    first = ledger.dispatch("a", prefill_ms=100.0, slack_ms=500.0)
    assert ledger.slack_ms(("a", "b")).tolist() == [500.0, math.inf]
    ledger.dispatch("a", prefill_ms=200.0, slack_ms=math.inf)  # not protected itself
    assert ledger.slack_ms(("a",)).tolist() == [300.0]
    assert ledger.protected == 1
    first.close()
    first.close()  # idempotent
    assert ledger.slack_ms(("a",)).tolist() == [math.inf]
    assert ledger.protected == 0


def test_the_least_slack_of_the_open_requests_counts() -> None:
    ledger = TpotLedger()
    tight = ledger.dispatch("a", prefill_ms=0.0, slack_ms=100.0)
    ledger.dispatch("a", prefill_ms=0.0, slack_ms=900.0)
    assert ledger.slack_ms(("a",)).tolist() == [100.0]
    tight.close()
    assert ledger.slack_ms(("a",)).tolist() == [900.0]


# ---------------------------------------------------------------------- the rule


def zone(queued: dict[str, float] | None = None) -> tuple[Accounting, ZoneView]:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    for gpu_id, tokens in (queued or {}).items():
        acc.start(gpu_id, prefill_tokens=tokens)
    return acc, view


def tokens_for_ms(view: ZoneView, ms: float) -> float:
    """Prompt tokens an H100 of the view takes ``ms`` to prefill."""
    b = batch(view, make_request(tokens=1))
    return ms / float(b.index.ms_per_token[0])


def flow_over(
    view: ZoneView,
    *,
    profile: ZoneProfile | None = None,
    clock: FakeClock | None = None,
    registry: CollectorRegistry | None = None,
    **settings: object,
) -> FlowControl:
    chosen = profile or builtin_profile("default")
    return FlowControl(
        AdmissionSettings.model_validate({"mode": AdmissionMode.SLO, **settings}),
        view=lambda: view,
        profile=lambda: chosen,
        clock=clock or FakeClock(),
        registry=registry or CollectorRegistry(),
    )


def test_an_idle_zone_admits_at_once_with_the_decision_to_send() -> None:
    _, view = zone()
    plan = flow_over(view).plan(make_request())
    assert plan is not None
    assert plan.exclude == frozenset()
    # The decision made to judge it is the one sent: the profile's on this view.
    assert plan.decision is not None
    again = builtin_profile("default").decide(make_request(), view)
    assert (plan.decision.gpu_id, plan.decision.predicted_ttft_ms) == (
        again.gpu_id,
        again.predicted_ttft_ms,
    )


def test_queues_over_the_budget_everywhere_hold_the_request() -> None:
    _, view = zone()
    deep = tokens_for_ms(view, 800.0)
    view.accounting.start("a", prefill_tokens=deep)
    view.accounting.start("b", prefill_tokens=deep)
    assert flow_over(view, queue_budget_ms=500.0).plan(make_request()) is None
    plan = flow_over(view, queue_budget_ms=1_000.0).plan(make_request())
    assert plan is not None
    assert plan.exclude == frozenset()


def test_a_gpu_whose_decoders_would_miss_their_tpot_is_excluded() -> None:
    _, view = zone()
    flow = flow_over(view)
    # A request decoding on "a" with 50 ms of slack left: a 1,000-token prompt (~50 ms
    # on an H100 and more) would break it; "b" has nobody to protect.
    flow.ledger.dispatch("a", prefill_ms=0.0, slack_ms=1.0)
    request = make_request(tokens=1_000)
    # Excluded GPUs: the request is decided again without them (no decision comes along).
    assert flow.plan(request) == Plan(frozenset({"a"}), None)
    decision = builtin_profile("default").decide(request, view, not_admitted=frozenset({"a"}))
    assert decision.gpu_id == "b"
    first = decision.to_decision().trace.filters[0]
    assert first.plugin == ADMISSION_STEP
    assert first.removed == ("a",)


def test_dispatch_protects_an_on_time_request_and_not_a_late_one() -> None:
    acc, view = zone()
    flow = flow_over(view)
    profile = builtin_profile("default")
    on_time = profile.decide(make_request(tokens=500, max_output=50), view)
    guard = flow.dispatched(on_time)
    assert math.isfinite(guard.limit_ms)
    assert flow.ledger.protected == 1
    # A queue of ~5 s there: predicted past the 2 s TTFT bound, nothing to protect.
    acc.start(on_time.gpu_id, prefill_tokens=tokens_for_ms(view, 5_000.0))
    acc.start("b" if on_time.gpu_id == "a" else "a", prefill_tokens=tokens_for_ms(view, 5_000.0))
    late = profile.decide(make_request(tokens=500, max_output=50), view)
    assert (late.predicted_ttft_ms or 0.0) > 2_000.0
    assert flow.dispatched(late).limit_ms == math.inf
    assert flow.ledger.protected == 1
    guard.close()
    assert flow.ledger.protected == 0


def test_a_profile_without_a_ttft_prediction_is_refused() -> None:
    _, view = zone()
    bare = zone_profile("bare", [HealthFilter()], [], RoundRobinPicker())
    with pytest.raises(ConfigError, match="'bare' has none"):
        flow_over(view, profile=bare)
    # Every built-in profile predicts TTFT (a baseline's picker does not read it).
    plan = flow_over(view, profile=builtin_profile("round-robin")).plan(make_request())
    assert plan is not None
    assert plan.exclude == frozenset()


# ---------------------------------------------------------------------- waiting


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def hold_everything(view: ZoneView) -> list[Ticket]:
    """Queues of 1 s on both GPUs (over the 500 ms budget); their tickets."""
    deep = tokens_for_ms(view, 1_000.0)
    return [view.accounting.start(g, prefill_tokens=deep) for g in ("a", "b")]


async def test_a_held_request_goes_when_room_appears() -> None:
    _, view = zone()
    flow = flow_over(view)
    tickets = hold_everything(view)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(flow.admit(make_request()))
        await settle()
        assert not task.done()
        assert flow.waiting == 1
        flow.poke()
        await settle()
        assert not task.done()  # nothing changed
        tickets[1].prefill_done()
        flow.poke()
    # A request that waited is decided afresh when it resumes: no decision comes along.
    assert task.result() == GO
    assert flow.waiting == 0


@pytest.mark.parametrize("others", [0.0, 30.0], ids=["own-queue", "others-queue"])
async def test_a_request_held_on_other_clients_queue_asks_for_a_scrape(others: float) -> None:
    # The last scrape saw 30 requests waiting at each GPU that are not the agent's
    # (~30,000 tokens, over the budget): they may be gone by now. Held on the agent's
    # own queue, there is nothing a scrape would tell.
    acc = Accounting()

    def scraped() -> ZoneView:
        return make_view(
            [Gpu("a", running=0.0, waiting=others), Gpu("b", running=0.0, waiting=others)], acc
        )

    pictures = [scraped()]
    assert others_queued(pictures[0]) == (frozenset({"a", "b"}) if others else frozenset())
    if not others:
        hold_everything(pictures[0])
    asked: list[frozenset[str]] = []
    flow = FlowControl(
        AdmissionSettings(mode=AdmissionMode.SLO),
        view=lambda: pictures[-1],
        profile=lambda: builtin_profile("default"),
        clock=FakeClock(),
        registry=CollectorRegistry(),
        rescrape=asked.append,
    )
    async with asyncio.TaskGroup() as group:
        task = group.create_task(flow.admit(make_request()))
        await settle()
        assert not task.done()
        assert asked == ([frozenset({"a", "b"})] if others else [])
        flow.poke()  # (a data path event on the same picture: asked already)
        assert asked == ([frozenset({"a", "b"})] if others else [])
        pictures.append(scraped())  # a new picture, the same others' work: asked again
        flow.poke()
        assert asked == ([frozenset({"a", "b"})] * 2 if others else [])
        task.cancel()


async def test_the_shortest_waiting_prompt_goes_first() -> None:
    _, view = zone()
    flow = flow_over(view)
    tickets = hold_everything(view)
    order: list[int] = []

    async def one(tokens: int) -> None:
        await flow.admit(make_request(tokens=tokens))
        order.append(tokens)
        # Dispatched at once, as the relay does after admit returns.
        flow.dispatched(builtin_profile("default").decide(make_request(tokens=tokens), view))

    async with asyncio.TaskGroup() as group:
        for tokens in (4_000, 3_000, 200):
            group.create_task(one(tokens))
        await settle()
        assert flow.waiting == 3
        for ticket in tickets:
            ticket.prefill_done()
        flow.poke()
        await settle()
        assert order[0] == 200
        # The others go as the view's queues (our charges) drain.
        for _ in range(10):
            for slot_ticket in list(view.accounting._open):
                slot_ticket.prefill_done()
            flow.poke()
            await settle()
    assert order == [200, 3_000, 4_000]


async def test_fcfs_sends_the_oldest_first() -> None:
    _, view = zone()
    flow = flow_over(view, order=QueueOrder.FCFS)
    tickets = hold_everything(view)
    order: list[int] = []

    async def one(tokens: int) -> None:
        await flow.admit(make_request(tokens=tokens))
        order.append(tokens)

    async with asyncio.TaskGroup() as group:
        for tokens in (4_000, 200):
            group.create_task(one(tokens))
        await settle()
        for ticket in tickets:
            ticket.prefill_done()
        for _ in range(4):
            flow.poke()
            await settle()
    assert order == [4_000, 200]


async def test_a_request_that_waited_the_longest_allowed_goes_anyway() -> None:
    _, view = zone()
    clock = FakeClock()
    registry = CollectorRegistry()
    flow = flow_over(view, clock=clock, registry=registry, max_wait_s=8.0)
    hold_everything(view)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(flow.admit(make_request()))
        await settle()
        clock.advance_nowait(7.9)
        flow.poke()
        await settle()
        assert not task.done()
        clock.advance_nowait(0.2)
        flow.poke()
    assert task.result() == GO
    released = registry.get_sample_value(
        "gtm_zone_admission_released_total", {"reason": "max_wait"}
    )
    assert released == 1.0
    assert registry.get_sample_value("gtm_zone_admission_wait_seconds_count") == 1.0


async def test_a_full_queue_is_a_503_with_retry_after() -> None:
    _, view = zone()
    registry = CollectorRegistry()
    flow = flow_over(view, registry=registry, max_waiting=1)
    hold_everything(view)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(flow.admit(make_request()))
        await settle()
        with pytest.raises(NoCapacity) as refused:
            await flow.admit(make_request(request_id="second"))
        assert refused.value.retry_after_s == 1.0
        assert registry.get_sample_value("gtm_zone_admission_refused_total") == 1.0
        assert registry.get_sample_value("gtm_zone_admission_waiting") == 1.0
        task.cancel()
    assert task.cancelled()
    assert registry.get_sample_value("gtm_zone_admission_waiting") == 0.0


async def test_a_client_gone_while_waiting_leaves_nothing_behind() -> None:
    _, view = zone()
    flow = flow_over(view)
    tickets = hold_everything(view)
    async with asyncio.TaskGroup() as group:
        gone = group.create_task(flow.admit(make_request(tokens=100)))
        stays = group.create_task(flow.admit(make_request(tokens=5_000)))
        await settle()
        gone.cancel()
        await settle()
        assert flow.waiting == 1
        for ticket in tickets:
            ticket.prefill_done()
        flow.poke()
    assert gone.cancelled()
    assert stays.result() == GO
    assert flow.waiting == 0


# ---------------------------------------------------------------------- the core


def test_the_core_sends_the_expired_first_and_for_room_only_when_asked() -> None:
    _, view = zone()
    profile = builtin_profile("default")
    core: Admission[str] = Admission(AdmissionSettings(mode=AdmissionMode.SLO, max_wait_s=8.0))
    core.hold("old-long", make_request(tokens=9_000), now=0.0)
    core.hold("new-short", make_request(tokens=100), now=5.0)
    assert core.next_deadline() == 8.0
    # Nothing expired, no room asked for: nobody.
    assert core.release(6.0, view, profile, room=False) is None
    # Room (an idle zone): the shortest.
    went = core.release(6.0, view, profile)
    assert went is not None
    assert (went[0].item, went[1].exclude, went[2]) == (
        "new-short",
        frozenset(),
        ReleaseReason.ROOM,
    )
    # The core's caller sends at once (the simulator): the plan's decision with it.
    assert went[1].decision is not None
    # Past its longest wait, the long one goes even without room.
    went = core.release(8.5, view, profile, room=False)
    assert went is not None
    assert (went[0].item, went[2]) == ("old-long", ReleaseReason.MAX_WAIT)
    assert core.waiting == 0
    assert core.next_deadline() is None


def test_the_core_drops_everyone_at_the_horizon_oldest_first() -> None:
    core: Admission[int] = Admission(AdmissionSettings(mode=AdmissionMode.SLO))
    first = core.hold(1, make_request(tokens=5_000), now=0.0)
    core.hold(2, make_request(tokens=100), now=1.0)
    core.hold(3, make_request(tokens=200), now=2.0)
    core.cancel(first)
    assert core.waiting == 2
    assert core.drop_waiting() == [2, 3]
    assert core.waiting == 0
