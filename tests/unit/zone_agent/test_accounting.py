from __future__ import annotations

import asyncio
import math

import pytest

from zone_agent.accounting import Accounting, SlotLoad


def test_a_ticket_charges_and_releases_everything_once() -> None:
    acc = Accounting(capacity=1)
    ticket = acc.start("g", prefill_tokens=100, sequences=2, kv_blocks=8)
    assert acc.at("g") == SlotLoad(streams=2, prefilling=1, pending=100, kv_blocks=8)
    ticket.prefill_done()
    ticket.prefill_done()
    done = SlotLoad(streams=2, kv_blocks=8, prefilled=1, prefilled_tokens=100)
    assert acc.at("g") == done
    ticket.close()
    ticket.close()
    ticket.prefill_done()
    assert acc.totals() == SlotLoad()
    assert acc.open_tickets == 0


def test_close_without_first_byte_releases_the_prefill_too() -> None:
    acc = Accounting()
    acc.start("g", prefill_tokens=50).close()
    assert acc.totals() == SlotLoad()
    assert acc.at("g") == SlotLoad()  # not answered: not counted as a finished prefill


def test_fractional_charges_leave_nothing_pending_once_released() -> None:
    """Cache credits make charges fractional, and their float sum less each of them
    keeps a residue (what a real agent left after 50k- and 70k-token prompts: 6e-12)."""
    acc = Accounting()
    charges = [50_000.0, 70_000.0, 948.8, 0.1, 0.2]
    tickets = [acc.start("g", prefill_tokens=t) for t in charges]
    for ticket in tickets[:-1]:
        ticket.prefill_done()
    assert acc.at("g").pending == pytest.approx(0.2)
    tickets[-1].close()
    assert acc.at("g").pending == 0.0
    for ticket in tickets:
        ticket.close()
    assert acc.totals() == SlotLoad()


def test_answered_prefills_add_up_per_gpu_and_survive_growth() -> None:
    """What the throughput check prices a scrape window's prefills by (cumulative)."""
    acc = Accounting(capacity=1)
    for tokens in (100, 250):
        ticket = acc.start("a", prefill_tokens=tokens)
        ticket.prefill_done()
        ticket.close()
    acc.start("b", prefill_tokens=7).prefill_done()  # grows the arrays
    assert (acc.at("a").prefilled, acc.at("a").prefilled_tokens) == (2, 350)
    assert (acc.at("b").prefilled, acc.at("b").prefilled_tokens) == (1, 7)


def test_slots_are_stable_and_arrays_grow() -> None:
    acc = Accounting(capacity=2)
    slots = [acc.slot(f"g{i}") for i in range(10)]
    assert slots == list(range(10))
    assert acc.slot("g3") == 3
    tickets = [acc.start(f"g{i}", prefill_tokens=i) for i in range(10)]
    assert acc.at("g9").pending == 9
    for t in tickets:
        t.close()
    assert acc.totals() == SlotLoad()
    assert acc.at("unknown") == SlotLoad()


def test_charges_across_a_growth_land_in_the_arrays_decisions_read() -> None:
    acc = Accounting(capacity=1)
    before = acc.start("g0", prefill_tokens=5, sequences=1, kv_blocks=2)
    after = [acc.start(f"g{i}", prefill_tokens=i, kv_blocks=1) for i in range(1, 6)]  # grows
    assert acc.pending.tolist()[:6] == [5.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert acc.streams.tolist()[:6] == [1.0] * 6
    assert acc.kv_blocks.tolist()[:6] == [2.0] + [1.0] * 5
    before.prefill_done()  # released from the grown arrays
    assert (acc.pending[0], acc.prefilling[0]) == (0.0, 0.0)
    for ticket in [before, *after]:
        ticket.close()
    assert acc.totals() == SlotLoad()
    assert acc.streams_total == 0.0


def test_held_tickets_expire_in_order() -> None:
    acc = Accounting()
    acc.hold(acc.start("a", prefill_tokens=1), until=10.0)
    acc.hold(acc.start("b", prefill_tokens=1), until=20.0)
    acc.expire(15.0)
    assert acc.at("a") == SlotLoad()
    assert acc.at("b").streams == 1
    acc.expire(20.0)
    assert acc.totals() == SlotLoad()


def test_prefix_blocks_go_to_the_index_and_the_hot_sketch() -> None:
    acc = Accounting()
    acc.start("g", prefill_tokens=1, prefix_hashes=(11, 12, 13), prefix_capacity=100).close()
    assert acc.prefix.match((11, 12, 13)) == {acc.slot("g"): 3}
    assert set(acc.hot.top(5)) == {11, 12}
    acc.forget_prefixes(["g", "unknown"])
    assert acc.prefix.match((11,)) == {}


async def test_wait_idle_returns_when_the_last_ticket_closes() -> None:
    acc = Accounting()
    await acc.wait_idle()  # nothing open
    ticket = acc.start("g", prefill_tokens=1)
    async with asyncio.TaskGroup() as group:
        waiter = group.create_task(acc.wait_idle())
        await asyncio.sleep(0)
        assert not waiter.done()
        ticket.close()
    assert waiter.done()
    assert acc.open_tickets == 0


def test_the_running_streams_total_is_the_sum_of_the_slots() -> None:
    acc = Accounting(capacity=2)
    tickets = [acc.start(f"g{i % 3}", prefill_tokens=1, sequences=1 + i % 4) for i in range(9)]
    assert acc.streams_total == float(acc.streams.sum()) == sum(1 + i % 4 for i in range(9))
    for ticket in tickets[::2]:
        ticket.close()
        ticket.close()  # released once
    assert acc.streams_total == float(acc.streams.sum())
    for ticket in tickets:
        ticket.close()
    assert acc.streams_total == 0.0
    assert acc.slot_count == 3


@pytest.mark.parametrize("kv", [-1.0, 0.5, math.inf, math.nan])
def test_kv_charges_are_whole_blocks(kv: float) -> None:
    acc = Accounting()
    with pytest.raises(ValueError, match="whole number"):
        acc.start("g", prefill_tokens=1, kv_blocks=kv)
    assert acc.totals() == SlotLoad()
    assert acc.open_tickets == 0
