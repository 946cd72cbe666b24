"""An operator installs a new GeoIP database under a running ``gtm global`` (renamed over
the old file, as geoipupdate does): answers follow it, no query in flight or after goes
unanswered, and a broken file that follows keeps the last good database serving."""

from __future__ import annotations

import os
import threading
import urllib.request
from pathlib import Path

import dns.edns
import dns.message
import dns.query
import dns.rcode
import pytest

from tests.integration.global_lb.daemons import (
    DNS_LISTENING,
    free_port,
    gtm_global,
    health_endpoint,
    running,
    write_topology,
)
from tests.unit.global_lb.helpers import CITY_NETWORKS, address_of, write_city_db

pytestmark = pytest.mark.integration

#: The next version of the database: the London /24 moved to Tokyo.
MOVED = tuple(
    ("81.2.69.0/24", "JP", 35.6762, 139.6503) if n[0] == "81.2.69.0/24" else n
    for n in CITY_NETWORKS
)
LONDON = address_of("eu-west")
TOKYO = address_of("ap-northeast")


class Asker:
    """Asks for ``api`` from the London /24 without pause on a thread of its own,
    keeping every answer (or the error instead of one)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[str] = []
        self._more = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = dns.message.make_query(
            "api.inference.example.", "A", use_edns=0, options=[dns.edns.ECSOption("81.2.69.0")]
        )
        while not self._stop.is_set():
            try:
                reply = dns.query.udp(query, "127.0.0.1", port=self.port, timeout=2.0)
            except Exception as exc:  # a lost or unanswerable query is the failure
                self._add(f"error: {exc!r}")
                continue
            found = [rd.to_text() for rrset in reply.answer for rd in rrset]
            rcode = dns.rcode.to_text(reply.rcode())
            self._add(found[0] if rcode == "NOERROR" and len(found) == 1 else rcode)

    def _add(self, answer: str) -> None:
        with self._more:
            self.answers.append(answer)
            self._more.notify_all()

    def wait_for_count(self, count: int) -> None:
        """Until ``count`` answers are in (each query's own deadline bounds the wait)."""
        with self._more:
            assert self._more.wait_for(lambda: len(self.answers) >= count, timeout=30.0)

    def __enter__(self) -> Asker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def metric(http_port: int, outcome: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    line = f'gtm_global_geoip_reloads_total{{outcome="{outcome}"}} '
    (value,) = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
    return float(value)


def test_a_new_database_is_followed_without_dropping_a_query(tmp_path: Path) -> None:
    database = write_city_db(tmp_path / "city.mmdb")
    dns_port, http_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GTM_")}
    env["GTM_LOG_LEVEL"] = "info"
    with health_endpoint() as health_port:
        argv = gtm_global(
            "--dns-listen", f"127.0.0.1:{dns_port}", "--http-listen", f"127.0.0.1:{http_port}",
            "--state", "memory", "--rrl-rate", "0", "--geoip-db", str(database),
            "--geoip-reload-interval", "0.2",
            "--topology", str(write_topology(tmp_path / "topology.yaml", health_port)),
        )  # fmt: skip
        with running(argv, env, DNS_LISTENING) as gtm, Asker(dns_port) as asker:
            before = len(gtm.lines)
            write_city_db(tmp_path / "city.new", MOVED)
            os.replace(tmp_path / "city.new", database)
            reloaded = gtm.wait_for("geo: reloaded", after=before)
            (tmp_path / "half.mmdb").write_bytes(database.read_bytes()[:1000])
            os.replace(tmp_path / "half.mmdb", database)  # a broken copy
            gtm.wait_for("still serving the database loaded before", after=reloaded)
            assert metric(http_port, "reloaded") == 1.0
            assert metric(http_port, "failed") == 1.0
            after_failure = len(asker.answers)
            asker.wait_for_count(after_failure + 20)  # answers after the broken file
            assert gtm.process.poll() is None
        answers = list(asker.answers)
    assert [a for a in answers if a not in (LONDON, TOKYO)] == []  # none lost or failed
    assert answers[0] == LONDON
    switch = answers.index(TOKYO)  # the asker kept going across the swap
    assert set(answers[:switch]) == {LONDON}
    assert set(answers[switch:]) == {TOKYO}  # never back, not after the broken file either
    assert switch < after_failure
