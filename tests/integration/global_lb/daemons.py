"""Real daemons on loopback for the GeoDNS process-level tests (global_lb's
test_delegation and test_geoip_reload, users_paths' test_delegation): a ``gtm global``
child, a health endpoint that says every region is up, Debian's ``unbound`` as the
clients' recursive resolver, and each child's output read line by line, so a test waits
for what the daemon says (it listens; it reloaded) instead of sleeping."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

import dns.edns
import dns.flags
import dns.message
import dns.query
import pytest
import yaml

from tests.unit.global_lb.helpers import topology

#: How long a process may take to start listening, or to say what a test waits for.
START_TIMEOUT_S = 30.0
#: Each query's deadline (a recursive answer is two loopback round trips).
QUERY_TIMEOUT_S = 5.0


class Running:
    """A child process whose stdout and stderr lines are collected as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(pipe,), daemon=True)
            for pipe in (self.process.stdout, self.process.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, marker: str, *, after: int = 0) -> int:
        """Until a line (from index ``after`` on) contains ``marker``: its index. Fails
        when the process exits or START_TIMEOUT_S passes first, with what it said."""

        def seen() -> int | None:
            for index in range(after, len(self.lines)):
                if marker in self.lines[index]:
                    return index
            return None

        with self._changed:
            found = self._changed.wait_for(
                lambda: seen() is not None or self.process.poll() is not None, START_TIMEOUT_S
            )
            index = seen()
        if not found or index is None:
            self.stop()
            pytest.fail(
                f"no {marker!r} from {self.argv[0]} (exit {self.process.poll()}):\n"
                + "".join(self.lines)
            )
        return index

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join()
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.process.stdout.close()
        self.process.stderr.close()


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], marker: str) -> Iterator[Running]:
    """``argv`` running until the block ends, from its first line containing ``marker``."""
    child = Running(argv, env)
    try:
        child.wait_for(marker)
        yield child
    finally:
        if child.process.returncode is None:
            child.stop()


def free_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port


class _Healthy(BaseHTTPRequestHandler):
    """The regional LBs' health endpoint: every region up."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def health_endpoint() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def write_topology(path: Path, health_port: int) -> Path:
    """The example regions (answers: 127.0.1.N and fd00::N), each health-checked at the
    one endpoint on ``health_port``."""
    regions = [
        r.model_copy(
            update={
                "endpoints": (
                    r.endpoints[0].model_copy(update={"url": f"http://127.0.0.1:{health_port}"}),
                    r.endpoints[1],
                )
            }
        )
        for r in topology()
    ]
    path.write_text(
        yaml.safe_dump({"regions": [r.model_dump(mode="json", by_alias=True) for r in regions]})
    )
    return path


def gtm_global(*flags: str) -> list[str]:
    """The command line of a ``gtm global`` child of this interpreter."""
    return [sys.executable, "-m", "gtmctl", "global", *flags]


#: What ``gtm global`` says when its DNS server listens.
DNS_LISTENING = "gtm global: DNS (UDP+TCP) on"


def unbound_binary() -> str:
    found = shutil.which("unbound") or next(
        (p for p in ("/usr/sbin/unbound", "/usr/local/sbin/unbound") if os.access(p, os.X_OK)),
        None,
    )
    if found is None:
        pytest.fail(
            "unbound is not installed: this test needs the real resolver; run "
            "scripts/install-system-deps (Debian package unbound)"
        )
    return found


def unbound_conf(directory: Path, port: int, gtm_port: int, zone: str) -> Path:
    """unbound on 127.0.0.1:``port`` in ``directory``: ECS through its subnet cache, and
    ``zone`` by a stub to gtm on 127.0.0.1:``gtm_port``."""
    conf = directory / "unbound.conf"
    conf.write_text(
        f"""server:
    interface: 127.0.0.1
    port: {port}
    do-ip6: no
    access-control: 127.0.0.0/8 allow
    username: ""
    chroot: ""
    directory: "{directory}"
    pidfile: "{directory}/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 1
    num-threads: 1
    so-reuseport: no
    # gtm listens on loopback, which unbound does not query by default.
    do-not-query-localhost: no
    # The subnet cache module: ECS to the authorities allowed below, answers cached
    # per the scope they return.
    module-config: "subnetcache validator iterator"
    send-client-subnet: 127.0.0.1
    client-subnet-zone: "{zone}"
    # Pass on the ECS option a client sent (a forwarder in front of unbound, or the
    # test's client) instead of the client's own loopback address.
    client-subnet-always-forward: yes
    max-client-subnet-ipv4: 24
    max-client-subnet-ipv6: 56
    domain-insecure: "{zone}"
    qname-minimisation: no

stub-zone:
    name: "{zone}"
    stub-addr: 127.0.0.1@{gtm_port}
    stub-prime: no
"""
    )
    return conf


@dataclass(frozen=True)
class Resolver:
    port: int

    def ask(
        self, name: str, rdtype: str = "A", subnet: tuple[str, int] | None = None
    ) -> dns.message.Message:
        options: list[dns.edns.Option] = [dns.edns.ECSOption(*subnet)] if subnet else []
        query = dns.message.make_query(name, rdtype, use_edns=0, options=options)
        query.flags |= dns.flags.RD
        return dns.query.udp(query, "127.0.0.1", port=self.port, timeout=QUERY_TIMEOUT_S)
