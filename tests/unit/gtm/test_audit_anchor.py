"""Audit anchoring (gtm.audit_anchor) and ``gtm audit verify`` against the anchors.

The issue's scenario: truncate an audit file and delete its ``.head`` file. The chain
alone verifies (a shorter valid chain); the anchor in the store shows the cut.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gtm.audit_anchor import ANCHOR_PREFIX, AuditAnchorer, chain_id, read_anchors
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.state import keys
from gtm.state.memory import MemoryStore
from gtm.tasks import TaskSupervisor
from gtm.testing.outage import OutageStore
from gtmctl.cli import cli
from policies import cli as policies_cli
from policies.audit import Anchor, AuditWriter, FsyncPolicy, StoredAnchor, chain_files
from tests.unit.policies.test_audit import record

#: Two records a file: rotation every second record.
SMALL = 1000


def resolved(path: Path) -> str:
    return str(path.resolve())


def writer(directory: Path, prefix: str = "global") -> AuditWriter:
    return AuditWriter(directory, prefix=prefix, max_bytes=SMALL, fsync=FsyncPolicy.NEVER)


def anchorer(
    audit: AuditWriter,
    store: MemoryStore | OutageStore[MemoryStore],
    clock: FakeClock,
    interval: float = 15.0,
) -> AuditAnchorer:
    return AuditAnchorer(
        audit, store, clock=clock, registry=new_registry(), host="test-host", interval=interval
    )


async def anchored_chain(
    directory: Path, store: MemoryStore, clock: FakeClock, count: int, prefix: str = "global"
) -> StoredAnchor:
    """A closed chain of ``count`` records, anchored once at its end."""
    with writer(directory, prefix) as audit:
        anchoring = anchorer(audit, store, clock)
        for i in range(1, count + 1):
            audit.append(record(i))
        assert await anchoring.step()
    assert anchoring.anchored is not None
    return anchoring.anchored


async def stored(store: MemoryStore, key: str) -> Anchor:
    kv = await store.get(key)
    assert kv is not None
    return Anchor.decode(kv.value)


def verify_cli(anchors: Sequence[StoredAnchor] | None, *args: str) -> tuple[int, str, str]:
    """``gtm audit verify`` with the store's anchors handed over as gtm hands them."""

    @click.pass_context
    def with_anchors(ctx: click.Context) -> None:
        if anchors is not None:
            ctx.meta[policies_cli.ANCHORS_KEY] = lambda state: anchors

    group = click.Group("audit", commands=dict(policies_cli.audit.commands), callback=with_anchors)
    state = ("--state", "etcd://127.0.0.1:2379") if anchors is not None else ()
    result = CliRunner().invoke(group, ["verify", *args, *state])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock, new_registry())


async def test_the_key_names_the_chain_by_prefix_host_and_directory(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    with writer(tmp_path / "global") as audit:
        anchoring = anchorer(audit, store, clock)
        expected = chain_id("test-host", Path(resolved(tmp_path / "global")), "global")
        assert anchoring.key == keys.audit_anchor(expected) == ANCHOR_PREFIX + expected
        assert expected.startswith("global-")
        assert len(expected) == len("global-") + 16
        assert chain_id("other-host", tmp_path / "global", "global") != expected


async def test_anchors_at_every_rotation_and_at_the_interval(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    with writer(tmp_path) as audit:
        anchoring = anchorer(audit, store, clock, interval=15.0)
        assert not await anchoring.step()  # nothing written yet: nothing to anchor
        assert await store.get(anchoring.key) is None
        first = audit.append(record(1))
        assert await anchoring.step()  # the first anchor is due at once
        anchor = await stored(store, anchoring.key)
        assert (anchor.seq, anchor.hash, anchor.file) == (
            1,
            first.hash,
            "global-000000000001.jsonl",
        )
        assert anchor.directory == resolved(tmp_path)
        assert (anchor.prefix, anchor.host, anchor.time) == ("global", "test-host", clock.wall())
        second = audit.append(record(2))
        clock.advance_nowait(5.0)
        assert not await anchoring.step()  # within the interval, no rotation: no write
        audit.append(record(3))  # starts global-000000000003.jsonl: a rotation
        assert await anchoring.step()
        anchor = await stored(store, anchoring.key)
        # The rotation's anchor is the exact end of the file left.
        assert (anchor.seq, anchor.hash, anchor.file) == (
            2,
            second.hash,
            "global-000000000001.jsonl",
        )
        assert anchor.position.file_records == 2
        clock.advance_nowait(14.0)
        assert not await anchoring.step()
        clock.advance_nowait(1.0)
        assert await anchoring.step()  # the interval passed and the head moved
        assert (await stored(store, anchoring.key)).seq == 3
        clock.advance_nowait(60.0)
        assert not await anchoring.step()  # the head did not move: no rewrite
        kv = await store.get(anchoring.key)
        assert kv is not None
        assert anchoring.anchored == StoredAnchor(
            Anchor.decode(kv.value), kv.mod_revision, anchoring.key
        )


async def test_a_cut_tail_with_its_head_file_deleted_fails_verify_naming_the_cut(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    audit = writer(tmp_path)
    anchoring = anchorer(audit, store, clock)
    heads = [audit.append(record(i)) for i in range(1, 6)]  # files of 2, 2 and 1
    await anchoring.step()
    audit.close()
    # The cut: the newest file goes, the one before loses its last record, .head goes.
    files = chain_files(tmp_path, "global")
    files[-1].unlink()
    lines = files[-2].read_bytes().splitlines(keepends=True)
    files[-2].write_bytes(lines[0])
    (tmp_path / "global.head").unlink()
    # Today's check, the files alone: a valid chain of 3 records.
    code, out, err = verify_cli(None, str(tmp_path))
    assert code == 0
    assert out.startswith("OK: 3 records in 2 file(s)")
    assert "no state store given" in err
    assert "cannot be seen" in err
    # Against the anchor: exit 1, and the line says what is missing.
    anchors = await read_anchors(store)
    kv = await store.get(anchoring.key)
    assert kv is not None
    code, out, err = verify_cli(anchors, str(tmp_path))
    assert code == 1, out + err
    when = "2023-11-14T22:30:00Z"  # FakeClock's wall clock at 1000 s
    assert out.splitlines() == [
        f"{tmp_path / 'global.head'}: missing, but the anchor at revision {kv.mod_revision} "
        f"({when}) records 5 records: the head file was deleted or emptied",
        f"{files[-2]}: tail may be missing: the anchor at revision {kv.mod_revision} ({when}) "
        f"records 5 records (last seq 5, hash {heads[-1].hash}, in global-000000000005.jsonl) "
        "but the chain ends at seq 3: 2 record(s) cut",
    ]
    assert "FAILED: 2 problem(s) in 3 records" in err


async def test_a_deleted_head_file_alone_is_detected(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    await anchored_chain(tmp_path, store, clock, 1)
    (tmp_path / "global.head").unlink()
    code, out, _ = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 1
    assert "global.head: missing, but the anchor at revision" in out


async def test_records_after_the_anchor_are_counted_as_not_yet_anchored(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    with writer(tmp_path) as audit:
        anchoring = anchorer(audit, store, clock)
        anchored = audit.append(record(1))
        await anchoring.step()
        for i in range(2, 5):
            audit.append(record(i))
    kv = await store.get(anchoring.key)
    assert kv is not None
    code, out, err = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 0, out + err
    assert out.strip().endswith(
        f"; OK up to the anchor at revision {kv.mod_revision} (2023-11-14T22:30:00Z): seq 1"
    )
    assert (
        "warning: 3 record(s) after seq 1 not yet anchored (written after the anchor at "
        f"revision {kv.mod_revision}" in err
    )
    # A record rewritten in place with a valid chain after it (the chain re-hashed from
    # the anchor on) does not match the anchor.
    assert anchored.seq == 1


async def test_a_rehashed_chain_does_not_match_its_anchor(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    await anchored_chain(tmp_path, store, clock, 1)
    for path in chain_files(tmp_path, "global"):
        path.unlink()
    (tmp_path / "global.head").unlink()
    with writer(tmp_path) as forged:  # a new chain of the same length
        forged.append(record(1, tenant="acme-health"))
    code, out, _ = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 1
    assert "record seq 1 does not match the anchor at revision" in out
    assert out.strip().endswith(": rewritten")


async def test_an_anchor_whose_chain_is_gone_fails_the_run(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    for name in ("global", "regional-eu-west"):
        await anchored_chain(tmp_path / "audit" / name, store, clock, 1, name.split("-")[0])
    gone = tmp_path / "audit" / "regional-eu-west"
    for path in gone.iterdir():
        path.unlink()
    gone.rmdir()
    code, out, err = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 1
    assert f"{resolved(gone)}: the anchor at revision" in out
    assert "and no chain files are there (deleted?)" in out
    assert out.splitlines()[-1] == "verified 2 chain(s): 1 OK, 1 FAILED"
    assert f"FAILED: {resolved(gone)} (regional chain): chain missing" in err


async def test_a_chain_copied_elsewhere_is_checked_against_its_anchor(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    await anchored_chain(tmp_path / "live" / "global", store, clock, 3)
    copy = tmp_path / "copy" / "global"
    copy.mkdir(parents=True)
    for path in (tmp_path / "live" / "global").iterdir():
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    chain_files(copy, "global")[-1].unlink()
    code, out, _ = verify_cli(await read_anchors(store), str(copy))
    assert code == 1
    assert "tail may be missing" in out
    assert "but the chain ends at seq 2" in out


async def test_a_store_outage_blocks_no_append_and_anchoring_resumes(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    inner = MemoryStore(clock, new_registry())
    store = OutageStore(inner)
    registry = new_registry()
    with writer(tmp_path) as audit:
        anchoring = AuditAnchorer(
            audit, store, clock=clock, registry=registry, host="h", interval=10.0
        )
        supervisor = TaskSupervisor(registry=new_registry(), clock=clock)
        supervisor.spawn("audit-anchor", anchoring.run())
        try:
            audit.append(record(1))
            await clock.advance_until(lambda: anchoring.anchored is not None)
            store.down = True
            caplog.set_level(logging.WARNING, logger="gtm.audit_anchor")
            # Appends during the outage never touch the store: they return at once.
            calls = store.calls
            heads = [audit.append(record(i)) for i in range(2, 12)]
            assert store.calls == calls
            await clock.advance(120.0)
            assert store.calls > calls  # it kept trying (with backoff)
            started = [r for r in caplog.records if "failed: simulated outage" in r.message]
            assert len(started) == 1, caplog.text  # logged once, not per attempt
            assert "requests are served and audited" in started[0].message
            failures = registry.get_sample_value(
                "gtm_audit_anchor_failures_total", {"chain": "global"}
            )
            assert failures is not None
            assert failures >= 2
            unanchored = registry.get_sample_value(
                "gtm_audit_unanchored_records", {"chain": "global"}
            )
            age = registry.get_sample_value("gtm_audit_anchor_age_seconds", {"chain": "global"})
            assert unanchored == 10
            assert age is not None
            assert age >= 100
            store.down = False
            await clock.advance_until(
                lambda: anchoring.anchored is not None and anchoring.anchored.anchor.seq == 11,
                limit=60.0,
            )
            assert anchoring.anchored is not None
            assert anchoring.anchored.anchor.hash == heads[-1].hash
            assert any("back after" in r.message for r in caplog.records)
            assert (
                registry.get_sample_value("gtm_audit_unanchored_records", {"chain": "global"}) == 0
            )
        finally:
            await supervisor.aclose()
    assert (await stored(inner, anchoring.key)).seq == 11


async def test_a_writer_restarted_below_its_anchor_records_the_cut(
    tmp_path: Path, clock: FakeClock, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    revision = (await anchored_chain(tmp_path, store, clock, 5)).revision
    # Cut while the writer is down: the newest file goes; the writer continues at seq 4.
    chain_files(tmp_path, "global")[-1].unlink()
    (tmp_path / "global.head").unlink()
    caplog.set_level(logging.ERROR, logger="gtm.audit_anchor")
    with writer(tmp_path) as audit:
        anchoring = anchorer(audit, store, clock)
        audit.append(record(6))  # seq 5 again, with another hash
        assert await anchoring.step()
        assert "ended at seq 4 when its writer started, without the record its anchor at " in (
            caplog.text
        )
        clock.advance_nowait(20.0)
        audit.append(record(7))
        assert await anchoring.step()
    anchor = await stored(store, anchoring.key)
    assert anchor.seq == 6
    assert anchor.cut is not None
    assert (anchor.cut.seq, anchor.cut.found_seq, anchor.cut.revision) == (5, 4, revision)
    # The restart did not launder the cut: verify still fails, and says so.
    code, out, _ = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 1
    assert "tail was cut before a restart" in out
    assert "1 record(s) lost" in out


async def test_close_writes_a_last_anchor_and_never_waits_long_on_a_dead_store(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    with writer(tmp_path) as audit:
        anchoring = anchorer(audit, store, clock)
        audit.append(record(1))
        await anchoring.step()
        last = audit.append(record(2))
        await anchoring.close()
        assert (await stored(store, anchoring.key)).hash == last.hash
        down = OutageStore(store)
        down.down = True
        dead = anchorer(audit, down, clock)
        audit.append(record(3))
        await dead.close()  # logs and returns


def test_gtm_audit_verify_refuses_a_store_that_cannot_hold_anchors(tmp_path: Path) -> None:
    with writer(tmp_path) as audit:
        audit.append(record(1))
    runner = CliRunner()
    memory = runner.invoke(cli, ["audit", "verify", str(tmp_path), "--state", "memory"])
    assert memory.exit_code == 2
    assert "holds no anchors afterwards" in memory.stderr
    typo = runner.invoke(cli, ["audit", "verify", str(tmp_path), "--state", "etcd:/x"])
    assert typo.exit_code == 2
    assert "--state" in typo.stderr


async def test_a_chain_cut_and_regrown_past_its_anchor_does_not_launder_the_cut(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    anchor = (await anchored_chain(tmp_path, store, clock, 3)).anchor
    # While the writer is down: the chain is replaced by a longer forged one.
    for path in chain_files(tmp_path, "global"):
        path.unlink()
    (tmp_path / "global.head").unlink()
    with writer(tmp_path) as forged:
        for i in range(1, 6):
            forged.append(record(i, tenant="acme-health"))
    with writer(tmp_path) as audit:
        anchoring = anchorer(audit, store, clock)
        assert await anchoring.step()
    again = await stored(store, anchoring.key)
    assert again.cut is not None
    assert (again.cut.seq, again.cut.hash, again.cut.found_seq) == (3, anchor.hash, 5)
    code, out, _ = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 1
    assert "tail was cut before a restart" in out
    assert "the anchored record was replaced" in out


async def test_a_writer_that_continues_its_chain_keeps_a_clean_anchor(
    tmp_path: Path, clock: FakeClock, store: MemoryStore
) -> None:
    await anchored_chain(tmp_path, store, clock, 3)  # seq 3 in the second file
    with writer(tmp_path) as audit:
        for i in range(4, 8):
            audit.append(record(i))
        anchoring = anchorer(audit, store, clock)
        assert await anchoring.step()
    assert (await stored(store, anchoring.key)).cut is None
    code, out, err = verify_cli(await read_anchors(store), str(tmp_path))
    assert code == 0, out + err
    assert err == ""


async def test_read_anchors_leaves_out_what_is_not_an_anchor(
    tmp_path: Path, clock: FakeClock, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    good = await anchored_chain(tmp_path, store, clock, 1)
    await store.put(keys.audit_anchor("junk"), b"{}")
    caplog.set_level(logging.WARNING, logger="gtm.audit_anchor")
    assert await read_anchors(store) == [good]
    assert f"skipping {keys.audit_anchor('junk')}: not an audit anchor" in caplog.text
