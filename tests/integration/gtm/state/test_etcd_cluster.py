"""EtcdCluster against real etcd processes: a leader kill elects a new leader, and a gtm
store opened on every member keeps working across it (failing over to a live member)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gtm.clock import SystemClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.state.etcd_cluster import EtcdCluster, NoLeader
from gtm.state.store import StateStore
from gtm.state.url import open_store

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(90)]

#: A write must succeed again within this long after the leader dies: etcd elects in
#: about one election timeout (500 ms here); each failed call moves the store to the
#: next endpoint, so a few retries suffice.
RECOVER_S = 10.0


async def put_eventually(store: StateStore, key: str, value: bytes) -> int:
    """Retry as a gtm caller does (the store raises, moves to the next endpoint)."""
    deadline = time.monotonic() + RECOVER_S
    while True:
        try:
            return await store.put(key, value)
        except StateUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_leader_kill_elects_a_new_leader_and_the_store_keeps_writing(
    tmp_path: Path,
) -> None:
    async with EtcdCluster(tmp_path, members=3) as cluster:
        assert cluster.etcd_url.count(",") == 2
        store = open_store(
            cluster.etcd_url, clock=SystemClock(), registry=new_registry(), timeout=1.0
        )
        try:
            first = await put_eventually(store, "/gtm/v1/test/before", b"1")
            old = await cluster.leader()
            old_pid = cluster.pids()[old]
            assert old_pid is not None
            await cluster.kill(old)
            assert cluster.pids()[old] is None
            new = await cluster.wait_leader(not_in={old})
            assert new != old
            assert new in cluster.names
            second = await put_eventually(store, "/gtm/v1/test/after", b"2")
            assert second > first
            kv = await store.get("/gtm/v1/test/before")
            assert kv is not None
            assert kv.value == b"1"

            # The killed member rejoins on its data and catches up.
            await cluster.restart(old)
            assert await cluster.leader() in cluster.names
            assert cluster.pids()[old] is not None
        finally:
            await store.aclose()


async def test_kill_all_then_start_all_keeps_the_data(tmp_path: Path) -> None:
    async with EtcdCluster(tmp_path, members=3) as cluster:
        store = open_store(
            cluster.etcd_url, clock=SystemClock(), registry=new_registry(), timeout=1.0
        )
        try:
            await put_eventually(store, "/gtm/v1/test/kept", b"yes")
            await cluster.kill_all()
            assert all(pid is None for pid in cluster.pids().values())
            with pytest.raises(NoLeader, match="no etcd member is running"):
                await cluster.leader()
            with pytest.raises(StateUnavailable):
                await store.get("/gtm/v1/test/kept")
            await cluster.start_all()
            deadline = time.monotonic() + RECOVER_S
            while True:
                try:
                    kv = await store.get("/gtm/v1/test/kept")
                    break
                except StateUnavailable:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            assert kv is not None
            assert kv.value == b"yes"
        finally:
            await store.aclose()


def test_unknown_member_is_named(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path, members=1)
    with pytest.raises(KeyError, match="no etcd member 'etcd-9'; members: etcd-1"):
        cluster.member("etcd-9")


async def test_leadership_moves_to_the_member_asked(tmp_path: Path) -> None:
    async with EtcdCluster(tmp_path, members=3) as cluster:
        first = cluster.names[0]
        leader = await cluster.leader()
        other = next(n for n in cluster.names if n != leader)
        await cluster.make_leader(other)
        assert await cluster.leader() == other
        await cluster.make_leader(first)
        assert await cluster.leader() == first
        await cluster.make_leader(first)  # already: nothing to do
        assert await cluster.leader() == first
