import asyncio

from prometheus_client import generate_latest

from gtm.loopstats import NAME, register_loop_tasks
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor


async def test_counts_the_running_loops_unfinished_tasks() -> None:
    registry = new_registry()
    register_loop_tasks(registry)
    register_loop_tasks(registry)  # a second app on the same registry: no error
    before = registry.get_sample_value(NAME)
    assert before is not None
    release = asyncio.Event()
    async with TaskSupervisor(registry=new_registry()) as supervisor:
        tasks = [supervisor.spawn(f"t{k}", release.wait()) for k in range(3)]
        await asyncio.sleep(0)
        assert registry.get_sample_value(NAME) == before + 3
        release.set()
        await asyncio.gather(*tasks)
    assert registry.get_sample_value(NAME) == before


def test_no_sample_outside_a_running_loop() -> None:
    registry = new_registry()
    register_loop_tasks(registry)
    assert registry.get_sample_value(NAME) is None
    assert NAME.encode() not in generate_latest(registry)
