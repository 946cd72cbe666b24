"""A small internet in network namespaces, with real BGP routers, for the anycast tests.

Topology (every box a network namespace, every line a veth pair, every router BIRD 2)::

        site s1 (AS 65101) ── region r1 (AS 65001)
        site s2 (AS 65102) ── region r2 (AS 65002)        each site and each region also
        site s3 (AS 65103) ── region r3 (AS 65003)        links to the transit t (AS 65000)

A site reaches its own region in one AS hop and the others through the transit in two,
so BGP's shortest AS path makes each site's nearest region its best. Regions announce
only what their anycast include file says (``<dir>/<region>-anycast.conf``, written by
:class:`global_lb.anycast.speaker.BirdSpeaker`); sites and the transit put their best
routes in their namespace's kernel table. Each region holds the anycast addresses on its
loopback and runs a tiny HTTP server that answers its own name, standing in for its front
door. Sessions run BFD (fast failure detection) under a 3 s hold time.

Every link and session is dual-stack (a BGP session per address family; IPv4 only with
an ExaBGP region). Addresses exist only inside the namespaces (10.64.0.0/16 and
fd64::/16 links, the documentation prefixes as anycast space): nothing is routed outside.
Each region also runs a DNS stand-in on an anycast address (a TXT answer naming it).
Needs root, ``ip`` and ``bird``; a missing one raises, it is never skipped.

The module is I/O only and test-support: product code never imports it (import-linter).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dns.exception
import dns.message

from gtm.testing.processes import descendants

TRANSIT = "t"
TRANSIT_AS = 65000
#: The BFD timers: a silent neighbour is declared down after three missed intervals.
BFD_INTERVAL_MS = 100
HOLD_TIME_S = 3
#: Longest a lab process may take to start, or the lab's sessions to come up: generous,
#: since the condition is polled and a loaded machine starts processes slowly.
STARTUP_S = 60.0
HTTP_PORT = 8080
#: The front door's IPv6 anycast address (in 2001:db8:100::/48).
FRONT_ADDRESS6 = "2001:db8:100::1"
#: The anycast address of the regions' DNS servers (held by each region; announced in
#: 192.0.2.0/24 when the DNS service is).
DNS_ADDRESS = "192.0.2.53"
#: A region's DNS stand-in: answers every question with a TXT record naming the region,
#: from the anycast address (a UDP answer must come from the address asked).
_DNS_STANDIN = """
import socket, sys
import dns.message, dns.rrset
region, address = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((address, 53))
while True:
    data, peer = sock.recvfrom(4096)
    query = dns.message.from_wire(data)
    answer = dns.message.make_response(query)
    answer.answer.append(dns.rrset.from_text(query.question[0].name, 0, "IN", "TXT", region))
    sock.sendto(answer.to_wire(), peer)
"""
_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    asn: int
    router_id: str


@dataclass(slots=True)
class _Link:
    a: str
    b: str
    a_addr: str
    b_addr: str
    a_addr6: str
    b_addr6: str

    def addresses(self, node: str, version: int) -> tuple[str, str]:
        """(``node``'s address, its peer's) on this link."""
        a, b = (self.a_addr, self.b_addr) if version == 4 else (self.a_addr6, self.b_addr6)
        return (a, b) if node == self.a else (b, a)


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def require_tools() -> None:
    """Raise naming what is missing (``ip``, ``bird``, ``birdc``, root)."""
    missing = [t for t in ("ip", "bird", "birdc") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(
            f"the anycast lab needs {', '.join(missing)} (scripts/install-system-deps)"
        )
    if os.geteuid() != 0:
        raise RuntimeError("the anycast lab needs root (network namespaces)")


@dataclass
class AnycastLab:
    """The topology above under ``directory``; :meth:`start`, then :meth:`close`."""

    directory: Path
    regions: int = 3
    #: Regions whose speaker is ExaBGP (started by the test, :meth:`start_exabgp`), not BIRD.
    exabgp_regions: frozenset[str] = frozenset()
    #: BFD on the sessions between BIRD routers; off: a silent router is found by the
    #: hold timer alone.
    bfd: bool = True
    tag: str = field(default_factory=lambda: f"gtmac{os.getpid() % 100000}")
    _links: list[_Link] = field(default_factory=list)
    _birds: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _http: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _dns: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    #: Addresses each region holds on its loopback (the anycast front doors).
    anycast_addresses: tuple[str, ...] = (
        "198.51.100.1/32",
        "203.0.113.1/32",
        f"{DNS_ADDRESS}/32",
        f"{FRONT_ADDRESS6}/128",
    )

    # ------------------------------------------------------------------ naming

    def ns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def region_names(self) -> tuple[str, ...]:
        return tuple(f"r{i}" for i in range(1, self.regions + 1))

    def site_names(self) -> tuple[str, ...]:
        return tuple(f"s{i}" for i in range(1, self.regions + 1))

    def node(self, name: str) -> Node:
        if name == TRANSIT:
            return Node(TRANSIT, TRANSIT_AS, "10.255.0.100")
        index = int(name[1:])
        if name.startswith("r"):
            return Node(name, 65000 + index, f"10.255.0.{index}")
        return Node(name, 65100 + index, f"10.255.1.{index}")

    def control_socket(self, node: str) -> Path:
        return self.directory / f"{node}.ctl"

    def include_file(self, region: str) -> Path:
        return self.directory / f"{region}-anycast.conf"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        require_tools()
        self.directory.mkdir(parents=True, exist_ok=True)
        nodes = [TRANSIT, *self.region_names(), *self.site_names()]
        for name in nodes:
            self._add_namespace(name)
        for index, (region, site) in enumerate(
            zip(self.region_names(), self.site_names(), strict=True)
        ):
            self._link(region, TRANSIT, 3 * index)
            self._link(site, TRANSIT, 3 * index + 1)
            self._link(site, region, 3 * index + 2)
        for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
            _run("ip", "netns", "exec", self.ns(TRANSIT), "sysctl", "-qw", key)
        for region in self.region_names():
            ns = self.ns(region)
            for address in self.anycast_addresses:
                _run("ip", "-n", ns, "addr", "add", address, "dev", "lo", "nodad")
            to_transit = next(x for x in self._links if x.a == region and x.b == TRANSIT)
            _run("ip", "-n", ns, "route", "add", "default", "via", to_transit.b_addr)
            _run("ip", "-6", "-n", ns, "route", "add", "default", "via", to_transit.b_addr6)
            if not self.include_file(region).exists():
                self.include_file(region).write_text("")
        # Everything starts at once, then is awaited (each start is a process start-up).
        birds = [name for name in nodes if name not in self.exabgp_regions]
        for name in birds:
            self.start_router(name, wait=False)
        for region in self.region_names():
            self.start_front_door(region, wait=False)
            self.start_dns(region, wait=False)
        for name in birds:
            self.wait_router(name)
        for region in self.region_names():
            self.wait_front_door(region)
            self.wait_dns(region)

    def close(self) -> None:
        for process in (*self._http.values(), *self._dns.values(), *self._birds.values()):
            # Their children too: ExaBGP's `gtm anycast` (and a respawned one) would
            # outlive a killed ExaBGP.
            children = descendants(process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.kill()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()
        self._http.clear()
        self._dns.clear()
        self._birds.clear()
        for name in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        self._namespaces.clear()

    def __enter__(self) -> AnycastLab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_namespace(self, name: str) -> None:
        ns = self.ns(name)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
        _run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "dev", "lo", "up")
        for key in ("net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"):
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", key)

    def _link(self, a: str, b: str, index: int) -> None:
        link = _Link(
            a, b, f"10.64.{index}.1", f"10.64.{index}.2", f"fd64:{index}::1", f"fd64:{index}::2"
        )
        _run(
            "ip", "link", "add", "name", b, "netns", self.ns(a), "type", "veth",
            "peer", "name", a, "netns", self.ns(b),
        )  # fmt: skip
        for node, peer in ((a, b), (b, a)):
            ns = self.ns(node)
            _run("ip", "-n", ns, "addr", "add", f"{link.addresses(node, 4)[0]}/30", "dev", peer)
            _run(
                "ip", "-n", ns, "addr", "add", f"{link.addresses(node, 6)[0]}/64",
                "dev", peer, "nodad",
            )  # fmt: skip
            _run("ip", "-n", ns, "link", "set", "dev", peer, "up")
        self._links.append(link)

    # ------------------------------------------------------------------ routers

    def _config(self, name: str) -> str:
        me = self.node(name)
        lines = [
            f"router id {me.router_id};",
            f'log "{self.directory / (name + ".log")}" {{ warning, error, fatal, bug }};',
            "protocol device { scan time 1; }",
            "protocol bfd {",
            f'  interface "*" {{ min rx interval {BFD_INTERVAL_MS} ms;'
            f" min tx interval {BFD_INTERVAL_MS} ms; multiplier 3; }};",
            "}",
        ]
        if name.startswith("r"):
            lines.append(f'include "{self.include_file(name)}";')
            imports, exports = "none", 'where proto ~ "gtm_anycast*"'
        else:
            lines.append("protocol kernel { ipv4 { export all; }; }")
            lines.append("protocol kernel { ipv6 { export all; }; }")
            imports, exports = "all", "none"
        for link in self._links:
            if name not in (link.a, link.b):
                continue
            peer = link.b if link.a == name else link.a
            export = "all" if name == TRANSIT and peer.startswith("s") else exports
            if name == TRANSIT and peer.startswith("r"):
                export = "none"
            bfd = "on" if self.bfd and peer not in self.exabgp_regions else "off"
            # One session per address family; none over IPv6 with an ExaBGP region.
            for version in (4,) if peer in self.exabgp_regions else (4, 6):
                mine, theirs = link.addresses(name, version)
                lines += [
                    f"protocol bgp {peer if version == 4 else peer + '_6'} {{",
                    f"  local {mine} as {me.asn};",
                    f"  neighbor {theirs} as {self.node(peer).asn};",
                    f"  hold time {HOLD_TIME_S}; keepalive time 1; connect retry time 1;",
                    f"  error wait time 1, 2; bfd {bfd};",
                    f"  ipv{version} {{ import {imports}; export {export}; }};",
                    "}",
                ]
        return "\n".join(lines) + "\n"

    def start_router(self, name: str, *, wait: bool = True) -> None:
        conf = self.directory / f"{name}.conf"
        conf.write_text(self._config(name))
        sock = self.control_socket(name)
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        self._birds[name] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(name), "bird", "-f", "-c", str(conf), "-s", str(sock)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait:
            self.wait_router(name)

    def wait_router(self, name: str) -> None:
        sock = self.control_socket(name)
        wait_for(sock.exists, STARTUP_S, f"bird of {name} to open its control socket")

    def start_front_door(self, region: str, *, wait: bool = True) -> None:
        root = self.directory / f"{region}-www"
        root.mkdir(exist_ok=True)
        (root / "index.html").write_text(region)
        self._http[region] = subprocess.Popen(
            [
                "ip", "netns", "exec", self.ns(region), sys.executable, "-m", "http.server",
                "--bind", "::", "--directory", str(root), str(HTTP_PORT),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if wait:
            self.wait_front_door(region)

    def wait_front_door(self, region: str) -> None:
        wait_for(
            lambda: self.fetch(region, "127.0.0.1") == region, STARTUP_S, f"front door of {region}"
        )

    def start_dns(self, region: str, *, wait: bool = True) -> None:
        script = self.directory / "dns_standin.py"
        script.write_text(_DNS_STANDIN)
        self._dns[region] = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ns(region),
                sys.executable,
                str(script),
                region,
                DNS_ADDRESS,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait:
            self.wait_dns(region)

    def wait_dns(self, region: str) -> None:
        wait_for(lambda: self.query(region, DNS_ADDRESS) == region, STARTUP_S, f"DNS of {region}")

    def stop_dns(self, region: str) -> None:
        process = self._dns.pop(region)
        process.kill()
        process.wait()

    def crash(self, region: str) -> None:
        """The region falls silent: its router freezes (no keepalives, no BFD, sessions
        left open, as in a hung host) and its front door and DNS server die."""
        self._birds[region].send_signal(signal.SIGSTOP)
        self._http[region].kill()
        self._http[region].wait()
        self.stop_dns(region)

    def restart(self, region: str) -> None:
        """The crashed region comes back: a fresh router and front door."""
        old = self._birds.pop(region)
        old.kill()
        old.wait()
        self.start_router(region)
        self.start_front_door(region)
        self.start_dns(region)

    def established(self) -> bool:
        """Every BGP session of every BIRD router is up (those with ExaBGP too)."""
        return all(
            "Established" in line
            for name in (TRANSIT, *self.region_names(), *self.site_names())
            if name not in self.exabgp_regions
            for line in self.birdc(name, "show", "protocols").splitlines()
            if " BGP " in line
        )

    def established_between_birds(self) -> bool:
        """Every BGP session between two BIRD routers is up."""
        return all(
            "Established" in line
            for name in (TRANSIT, *self.region_names(), *self.site_names())
            if name not in self.exabgp_regions
            for line in self.birdc(name, "show", "protocols").splitlines()
            if " BGP " in line and line.split()[0].removesuffix("_6") not in self.exabgp_regions
        )

    def neighbours(self, node: str) -> tuple[tuple[str, int, str], ...]:
        """``node``'s BGP neighbours: (their address, their AS, our address)."""
        found = []
        for link in self._links:
            if node in (link.a, link.b):
                mine, theirs = link.addresses(node, 4)
                peer = link.b if node == link.a else link.a
                found.append((theirs, self.node(peer).asn, mine))
        return tuple(found)

    def start_exabgp(
        self, region: str, config: str, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        """ExaBGP on ``config`` inside ``region``'s namespace (its output in
        ``<dir>/<region>-exabgp.log``)."""
        path = self.directory / f"{region}-exabgp.conf"
        path.write_text(config)
        log = (self.directory / f"{region}-exabgp.log").open("wb")
        exabgp = str(Path(sys.executable).with_name("exabgp"))
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(region), exabgp, str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
        log.close()
        self._birds[region] = process
        return process

    # ------------------------------------------------------------------ looking

    def birdc(self, node: str, *command: str) -> str:
        return _run("birdc", "-s", str(self.control_socket(node)), *command)

    def next_hop(self, site: str, address: str) -> str | None:
        """The interface (named after the neighbour) ``site`` sends ``address`` to, or
        ``None`` when it has no route."""
        done = subprocess.run(
            ["ip", "-j", "-n", self.ns(site), "route", "get", address],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            return None
        routes = json.loads(done.stdout)
        return str(routes[0].get("dev")) if routes else None

    def as_path(self, site: str, prefix: str) -> tuple[int, ...] | None:
        """The AS path of ``site``'s best route for ``prefix``, or ``None``."""
        out = subprocess.run(
            ["birdc", "-s", str(self.control_socket(site)), "show", "route", "for", prefix, "all"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for line in out.splitlines():
            if "BGP.as_path:" in line:
                return tuple(int(x) for x in line.split(":", 1)[1].split())
        return None

    def fetch(self, node: str, address: str, timeout: float = 0.5) -> str | None:
        """``GET /`` on ``address`` from inside ``node``'s namespace: the answering
        region's name, or ``None`` when nothing answers."""
        return self.get(node, address, HTTP_PORT, "/", timeout)

    def query(self, node: str, address: str, timeout: float = 0.5) -> str | None:
        """A DNS question to ``address`` from inside ``node``'s namespace: the region named
        in the answer, or ``None`` when none comes."""
        try:
            sock = netns_socket(self.ns(node), socket.SOCK_DGRAM)
        except OSError:
            return None
        with sock:
            sock.settimeout(timeout)
            try:
                sock.connect((address, 53))
                sock.send(dns.message.make_query("api.anycast.", "TXT").to_wire())
                answer = dns.message.from_wire(sock.recv(4096))
            except (OSError, dns.exception.DNSException):
                return None
        for rrset in answer.answer:
            for record in rrset:
                return b"".join(record.strings).decode()
        return None

    def get(
        self, node: str, address: str, port: int, path: str, timeout: float = 0.5
    ) -> str | None:
        """The body of ``GET path`` on ``address:port`` from inside ``node``'s namespace
        when it answers 200, else ``None``."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            sock = netns_socket(self.ns(node), family=family)
        except OSError:
            return None
        with sock:
            sock.settimeout(timeout)
            try:
                sock.connect((address, port))
                sock.sendall(f"GET {path} HTTP/1.0\r\nHost: anycast\r\n\r\n".encode())
                data = b""
                while chunk := sock.recv(4096):
                    data += chunk
            except OSError:
                return None
        head, _, body = data.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1:2]
        return body.decode() if status == [b"200"] else None


def netns_socket(
    netns: str, kind: int = socket.SOCK_STREAM, family: int = socket.AF_INET
) -> socket.socket:
    """A socket (IPv4 TCP by default) created inside network namespace ``netns`` (usable
    from any thread: a socket keeps the namespace it was made in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            with open(f"/run/netns/{netns}", "rb") as handle:
                if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, os.strerror(errno))
            made.append(socket.socket(family, kind))
        except BaseException as exc:
            made.append(exc)

    # setns moves only the calling thread, which ends right after.
    thread = threading.Thread(target=enter, name=f"netns-{netns}")
    thread.start()
    thread.join()
    result = made[0]
    if isinstance(result, BaseException):
        raise result
    return result


def wait_for(condition: Callable[[], bool], deadline_s: float, what: str) -> float:
    """Poll ``condition`` until true; the seconds it took. Raises ``TimeoutError``."""
    start = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - start
        if time.monotonic() - start > deadline_s:
            raise TimeoutError(f"waited {deadline_s:g} s for {what}")
        time.sleep(0.01)


@contextlib.contextmanager
def anycast_lab(
    directory: Path,
    regions: int = 3,
    exabgp_regions: frozenset[str] = frozenset(),
    *,
    bfd: bool = True,
) -> Iterator[AnycastLab]:
    with AnycastLab(directory, regions, exabgp_regions, bfd) as lab:
        wait_for(lab.established_between_birds, STARTUP_S, "every BGP session to be established")
        yield lab


__all__ = ["AnycastLab", "anycast_lab", "netns_socket", "require_tools", "wait_for"]
