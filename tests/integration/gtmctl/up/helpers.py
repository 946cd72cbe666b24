"""Run ``gtm up`` as a subprocess on private loopback addresses and free ports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import dns.asyncquery
import dns.edns
import dns.message

from gtm.net import free_ports
from gtm.topology import Topology, load_topology, on_private_block, write_topology

#: Generous bounds for a loaded 2-core CI machine; each test stays well inside them.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
BANNER_END = "Ctrl-C stops everything."


def private_topology(tmp_path: Path, regions: tuple[str, ...] | None = None) -> Path:
    """The example topology (its ``regions`` only, if given) on a private block
    (:func:`gtm.topology.on_private_block`), so a test never collides with ``make up``."""
    example = load_topology()
    kept = tuple(r for r in example.regions if regions is None or r.id in regions)
    moved = on_private_block(example.model_copy(update={"regions": kept}), random.Random())
    return write_topology(moved, tmp_path / "topology.yaml")


@dataclass
class Up:
    process: asyncio.subprocess.Process
    dns_port: int
    http_port: int
    banner: str
    topology: Topology
    admin_dir: Path

    def admin_headers(self) -> dict[str, str]:
        """The operator token ``gtm up`` created for its drain API."""
        token = (self.admin_dir / "operator.token").read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def address(self, region: str) -> str:
        return str(next(r.address for r in self.topology.regions if r.id == region))

    def region_of(self, address: str) -> str:
        return next(r.id for r in self.topology.regions if str(r.address) == address)

    async def resolve(self, name: str, subnet: str | None = None) -> list[str]:
        options: list[dns.edns.Option] = []
        if subnet is not None:
            address, _, length = subnet.partition("/")
            options.append(dns.edns.ECSOption(address, int(length)))
        query = dns.message.make_query(name, "A", use_edns=0, options=options)
        answer = await dns.asyncquery.udp(query, "127.0.0.1", port=self.dns_port, timeout=2.0)
        return sorted(rr.to_text() for rrset in answer.answer for rr in rrset)


async def _read_banner(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    lines: list[str] = []
    while True:
        raw = await process.stdout.readline()
        if not raw:
            raise AssertionError("gtm up exited before it was ready:\n" + "".join(lines))
        lines.append(raw.decode())
        if BANNER_END in lines[-1]:
            return "".join(lines)


@contextlib.asynccontextmanager
async def running_up(
    tmp_path: Path,
    *args: str,
    regions: tuple[str, ...] | None = None,
    root_args: tuple[str, ...] = (),
    start_timeout_s: float | None = None,
) -> AsyncIterator[Up]:
    """``gtm [root_args] up`` with ``args`` on a private topology; SIGINT on the way out,
    asserting that it exits 0 in time without a traceback. The caller's ``GTM_LOG*``
    settings are not passed on (the tests read the logs' default shape)."""
    topology_path = private_topology(tmp_path, regions)
    dns_port, http_port = free_ports("127.0.0.1", 2)
    stderr_path = tmp_path / "up.stderr"
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gtmctl",
            *root_args,
            "up",
            *("--topology", str(topology_path)),
            *("--dns-listen", f"127.0.0.1:{dns_port}", "--http-listen", f"127.0.0.1:{http_port}"),
            *("--run-dir", str(tmp_path / "run")),
            *("--admin-dir", str(tmp_path / "admin")),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("GTM_LOG")},
                "PYTHONWARNINGS": "error",
            },
        )
    try:
        try:
            banner = await asyncio.wait_for(
                _read_banner(process), start_timeout_s or START_TIMEOUT_S
            )
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\nstderr:\n{stderr_path.read_text()[-4000:]}") from None
        yield Up(
            process, dns_port, http_port, banner, load_topology(topology_path), tmp_path / "admin"
        )
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        errors = stderr_path.read_text()
        assert code == 0, errors[-4000:]
        assert "Traceback" not in errors, errors[-4000:]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def processes_with(*markers: str) -> list[int]:
    """Pids of live processes whose command line contains every one of ``markers``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(m in cmdline for m in markers) and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Let the page's fetch of /api/v1/fleet and its first render finish first.
    "--virtual-time-budget=5000",
)


async def chromium(tmp_path: Path, url: str, *action: str) -> str:
    """Run headless Chromium (Debian's ``chromium``) on ``url``; its stdout."""
    process = await asyncio.create_subprocess_exec(
        "chromium",
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1400",
        *action,
        url,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 60.0)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"chromium exited with {process.returncode}"
    return out.decode()
