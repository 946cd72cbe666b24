"""A daemon as a systemd unit starts it (deploy/systemd): configured by ``GTM_``
variables alone, ``Type=notify`` readiness on a real notify socket, and
``MemoryDenyWriteExecute=yes`` (here the kernel's own ``PR_SET_MDWE``, which refuses the
same mappings). ``python -m gtm global`` must say READY=1, serve DNS and the front door on
the addresses its environment named, and say STOPPING=1 and exit cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import dns.asyncquery
import dns.message
import dns.rcode
import pytest

from gtm.net import free_ports

pytestmark = pytest.mark.integration

#: Refuse writable-and-executable memory for the process and what it executes
#: (prctl PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN), then become ``argv[1:]``.
UNDER_MDWE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(f"PR_SET_MDWE: errno {ctypes.get_errno()}")
os.execv(sys.argv[1], sys.argv[1:])
"""
HOST = "127.0.0.1"
TIMEOUT_S = 60.0


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        yield sock, path


async def test_the_global_tier_runs_from_its_environment_as_a_notify_unit(
    notify_socket: tuple[socket.socket, str], tmp_path: Path
) -> None:
    sock, path = notify_socket
    dns_port, http_port = free_ports(HOST, 2)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GTM_") and key != "NOTIFY_SOCKET"
    }
    env |= {
        "NOTIFY_SOCKET": path,
        "GTM_DNS_LISTEN": f"{HOST}:{dns_port}",
        "GTM_HTTP_LISTEN": f"{HOST}:{http_port}",
        "GTM_ZONE": "gtm.example.",
        "GTM_AUDIT_DIR": str(tmp_path / "audit"),
        "GTM_LOG_LEVEL": "warning",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", UNDER_MDWE, sys.executable, "-m", "gtm", "global",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    try:
        ready = await asyncio.wait_for(loop.sock_recv(sock, 4096), TIMEOUT_S)
        assert ready == b"READY=1"
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{HOST}:{http_port}/healthz") as response,
        ):
            assert response.status == 200
        query = dns.message.make_query("api.gtm.example.", "A")
        answer = await dns.asyncquery.udp(query, HOST, port=dns_port, timeout=TIMEOUT_S)
        assert answer.rcode() == dns.rcode.NOERROR  # the zone its environment named
        proc.send_signal(signal.SIGTERM)
        stopping = await asyncio.wait_for(loop.sock_recv(sock, 4096), TIMEOUT_S)
        assert stopping == b"STOPPING=1"
        assert await asyncio.wait_for(proc.wait(), TIMEOUT_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stderr is not None
        errors = (await proc.stderr.read()).decode()
    assert "Traceback" not in errors, errors
