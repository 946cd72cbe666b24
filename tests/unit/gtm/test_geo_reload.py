"""ReloadingDatabase: a GeoIP file followed by mtime/inode, swapped atomically, a bad
version never replacing a good one. Over MaxMind's own test databases (data/geo)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import threading
from pathlib import Path

import pytest

from gtm.clock import FakeClock
from gtm.errors import ConfigError
from gtm.geo import (
    CachedLocator,
    ChainLocator,
    Location,
    ReloadingDatabase,
    ReloadOutcome,
    open_locator,
)
from tests.unit.global_lb.helpers import maxmind_test_db

LONDON = ipaddress.ip_address("81.2.69.142")  # GB in every MaxMind test database


def install(source: Path, path: Path) -> None:
    """What geoipupdate does: write beside, rename over (a new inode)."""
    partial = path.with_suffix(".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, path)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "GeoIP.mmdb"
    install(maxmind_test_db("GeoLite2-Country-Test"), path)
    return path


def test_a_changed_file_is_loaded_at_the_next_interval_not_before(db: Path) -> None:
    clock = FakeClock()
    database = ReloadingDatabase(db, clock=clock, interval=60.0)
    assert database.locate(LONDON).point is None  # a Country database: no coordinates
    install(maxmind_test_db("GeoIP2-City-Test"), db)
    assert database.poll() is None  # the interval bounds the stat() calls
    clock.advance_nowait(59.0)
    assert database.poll() is None
    assert database.generation == 0
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.RELOADED
    assert database.generation == 1
    assert database.current.database_type == "GeoIP2-City"
    found = database.locate(LONDON)
    assert found.country == "GB"
    assert found.point is not None
    clock.advance_nowait(60.0)
    assert database.poll() is None  # unchanged since


def test_a_file_rewritten_in_place_is_seen_by_its_mtime(db: Path) -> None:
    clock = FakeClock()
    database = ReloadingDatabase(db, clock=clock, interval=1.0)
    inode = db.stat().st_ino
    db.write_bytes(maxmind_test_db("GeoLite2-Country-Test").read_bytes())
    os.utime(db, ns=(db.stat().st_atime_ns, db.stat().st_mtime_ns + 1_000_000_000))
    assert db.stat().st_ino == inode
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.RELOADED


@pytest.mark.parametrize(
    "bad",
    [
        b"half a database",  # a truncated copy: no metadata section
        None,  # the ASN test database: opens, but has no countries
    ],
)
def test_a_bad_new_file_keeps_the_old_database_serving(
    db: Path, bad: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    database = ReloadingDatabase(db, clock=clock, interval=1.0)
    before = database.current
    if bad is None:
        install(maxmind_test_db("GeoLite2-ASN-Test"), db)
    else:
        partial = db.with_suffix(".partial")
        partial.write_bytes(bad)
        os.replace(partial, db)
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.FAILED
    assert "still serving the database loaded before" in caplog.text
    assert database.current is before
    assert database.locate(LONDON).country == "GB"
    clock.advance_nowait(1.0)
    assert database.poll() is None  # reported once, not every interval
    install(maxmind_test_db("GeoIP2-City-Test"), db)  # the fixed version
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.RELOADED


def test_a_vanished_file_keeps_the_old_database(db: Path) -> None:
    clock = FakeClock()
    database = ReloadingDatabase(db, clock=clock, interval=1.0)
    db.unlink()
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.FAILED
    assert database.locate(LONDON).country == "GB"


def test_a_bad_first_file_or_interval_is_a_config_error(tmp_path: Path, db: Path) -> None:
    (tmp_path / "bad.mmdb").write_bytes(b"nope")
    with pytest.raises(ConfigError, match="not a readable MaxMind database"):
        ReloadingDatabase(tmp_path / "bad.mmdb", clock=FakeClock())
    with pytest.raises(ConfigError, match="reload interval"):
        ReloadingDatabase(db, clock=FakeClock(), interval=0)


def test_lookups_during_reloads_see_one_whole_database(db: Path) -> None:
    """Readers on other threads while the file flips between two databases 40 times:
    every lookup answers from one of them, none fails."""
    clock = FakeClock()
    database = ReloadingDatabase(db, clock=clock, interval=1.0)
    locator = ChainLocator(database)
    versions = [maxmind_test_db("GeoIP2-City-Test"), maxmind_test_db("GeoLite2-Country-Test")]
    stop = threading.Event()
    seen: list[Location] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                seen.append(locator.locate(LONDON))
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for flip in range(40):
            install(versions[flip % 2], db)
            clock.advance_nowait(1.0)
            assert database.poll() is ReloadOutcome.RELOADED
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert errors == []
    assert database.generation == 40
    assert seen
    assert {(f.country, f.point is None) for f in seen} <= {("GB", True), ("GB", False)}


def test_open_locator_follows_only_a_given_file(db: Path) -> None:
    clock = FakeClock()
    following = open_locator(db, reload=(clock, 5.0))
    assert isinstance(following.database, ReloadingDatabase)
    assert not isinstance(open_locator(db).database, ReloadingDatabase)
    bundled = open_locator(None, reload=(clock, 5.0))  # the bundled file never changes
    assert not isinstance(bundled.database, ReloadingDatabase)


def test_cached_locator_clear_forgets_every_address(db: Path) -> None:
    clock = FakeClock()
    database = ReloadingDatabase(db, clock=clock, interval=1.0)
    cached = CachedLocator(ChainLocator(database))
    assert cached.locate(LONDON).point is None
    install(maxmind_test_db("GeoIP2-City-Test"), db)
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.RELOADED
    assert cached.locate(LONDON).point is None  # remembered from the old database
    cached.clear()
    assert len(cached) == 0
    assert cached.locate(LONDON).point is not None
