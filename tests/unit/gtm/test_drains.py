"""What a drain may name: ids from records and summaries, and the refusal's one line."""

from __future__ import annotations

from gtm.clock import Clock
from gtm.drains import known_ids, unknown_message
from gtm.models import DrainTarget
from gtm.state import keys
from gtm.state.memory import MemoryStore


async def test_known_ids_come_from_records_and_summaries(fake_clock: Clock) -> None:
    store = MemoryStore(fake_clock)
    for key in (
        keys.region("eu-west"),
        keys.region_summary("us-east"),  # a deployment of your own: summaries only
        keys.zone("eu-west", "eu-west-a"),
        keys.zone_summary("us-east", "us-east-b"),
        keys.gpu("eu-west", "eu-west-a", "gpu-7"),
        keys.drain(DrainTarget.REGION, "ap-south"),  # a drain does not make an id known
    ):
        await store.put(key, b"{}")
    assert await known_ids(store, DrainTarget.REGION) == ("eu-west", "us-east")
    assert await known_ids(store, DrainTarget.ZONE) == ("eu-west-a", "us-east-b")
    assert await known_ids(store, DrainTarget.GPU) == ("gpu-7",)


def test_unknown_message_names_the_known_ones_on_one_line() -> None:
    line = unknown_message(DrainTarget.REGION, "planet-x", ("eu-west", "us-east"))
    assert line == (
        "unknown region 'planet-x'; known regions: eu-west, us-east (--force drains it anyway)"
    )
    assert "the store knows no GPUs" in unknown_message(DrainTarget.GPU, "g", ())
    many = tuple(f"z{i:02}" for i in range(25))
    assert unknown_message(DrainTarget.ZONE, "x", many).endswith(
        "z19 and 5 more (--force drains it anyway)"
    )
