"""gtm.sdnotify: the notify protocol over a real unix datagram socket, as systemd's
``Type=notify`` listens for it; a daemon's wait says READY=1 when it starts and
STOPPING=1 when a signal ends it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtm.sdnotify import NOTIFY_SOCKET, notify
from gtm.serve import until_signalled


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A service manager's notify socket: a bound unix datagram socket and its path."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(30)
        yield sock, path


def test_a_message_reaches_the_socket_named_by_notify_socket(
    manager: tuple[socket.socket, str],
) -> None:
    sock, path = manager
    assert notify("READY=1", {NOTIFY_SOCKET: path})
    assert sock.recv(4096) == b"READY=1"


def test_an_abstract_socket_is_written_with_a_leading_at() -> None:
    name = f"gtm-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(30)
        assert notify("STATUS=serving", {NOTIFY_SOCKET: "@" + name})
        assert sock.recv(4096) == b"STATUS=serving"


def test_nothing_is_sent_without_a_service_manager() -> None:
    assert not notify("READY=1", {})
    assert not notify("READY=1", {NOTIFY_SOCKET: ""})
    assert not notify("READY=1", {NOTIFY_SOCKET: "vsock:2:1234"})


def test_a_socket_nobody_listens_on_is_a_warning_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not notify("READY=1", {NOTIFY_SOCKET: str(tmp_path / "gone")})
    assert "notify READY=1: cannot send" in caplog.text


async def test_a_daemons_wait_says_ready_then_stopping_on_its_signal(
    manager: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = manager
    sock.setblocking(False)
    monkeypatch.setenv(NOTIFY_SOCKET, path)
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(until_signalled((signal.SIGUSR1,)))  # noqa: TID251
    assert await asyncio.wait_for(loop.sock_recv(sock, 4096), 30) == b"READY=1"
    assert not waiting.done()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert await asyncio.wait_for(loop.sock_recv(sock, 4096), 30) == b"STOPPING=1"
    await asyncio.wait_for(waiting, 30)
