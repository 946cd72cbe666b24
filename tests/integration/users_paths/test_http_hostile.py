"""A client sends ``gtm zone`` what a smuggling probe or a careless client would: the
zone answers alike with its lean server (the default) and with aiohttp's, never answers
a request smuggled behind a refused one, and a refusal sent before a large body is read
reaches the client rather than a connection reset.

Real processes on loopback: one ``gtm gpu-sim`` worker and ``gtm zone`` in front of it,
driven by raw sockets (no client library sends these bytes).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from yarl import URL

from tests.integration.users_paths.direct_clients import zone_before_one_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHAT = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
).encode()
#: Behind each refused request: answered only if the connection desynced.
SMUGGLED = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: z\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(CHAT), CHAT)
)


def _chat(fields: bytes, body: bytes, target: bytes = b"/v1/chat/completions") -> bytes:
    return (
        b"POST " + target + b" HTTP/1.1\r\nHost: z\r\nContent-Type: application/json\r\n"
        + fields + b"\r\n" + body
    )  # fmt: skip


async def _exchange(url: str, data: bytes) -> bytes:
    """Send ``data`` on one connection; everything the zone answers until it closes."""
    address = URL(url)
    assert address.host is not None
    reader, writer = await asyncio.open_connection(address.host, address.port)
    try:
        writer.write(data)
        async with asyncio.timeout(30):
            return await reader.read()
    finally:
        writer.close()


def _responses(got: bytes) -> list[tuple[int, bytes]]:
    """The Content-Length responses in ``got``, in order: (status, body)."""
    out = []
    while got:
        head, _, rest = got.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length:")
        )
        out.append((int(lines[0].split()[1]), rest[:length]))
        got = rest[length:]
    return out


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
async def test_hostile_requests_get_the_same_refusals_from_either_server(
    server: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        zone = await stack.enter_async_context(
            zone_before_one_worker(server, tmp_path / "zone.log", MODEL)
        )
        close = b"Connection: close\r\n"

        # A request served, to show the path works at all.
        served = _chat(close + b"Content-Length: %d\r\n" % len(CHAT), CHAT)
        (ok,) = _responses(await _exchange(zone.url, served))
        assert ok[0] == 200

        # Content-Length and Transfer-Encoding together (RFC 9112 §6.3, §11.2): one 400,
        # the request smuggled in the "body" never answered.
        smuggle = _chat(
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED
        )
        assert [s for s, _ in _responses(await _exchange(zone.url, smuggle))] == [400]

        # Two Content-Lengths: one 400, nothing behind it answered.
        double = _chat(b"Content-Length: 2\r\nContent-Length: %d\r\n" % len(CHAT), CHAT)
        assert [s for s, _ in _responses(await _exchange(zone.url, double + SMUGGLED))] == [400]

        # A target longer than the parser takes: 400 (never served by the lean server).
        long_target = b"/v1/chat/completions?" + b"q" * 9000
        too_long = _chat(close + b"Content-Length: %d\r\n" % len(CHAT), CHAT, long_target)
        assert [s for s, _ in _responses(await _exchange(zone.url, too_long))] == [400]

        # A body over the zone's bound, sent whole: the 413 reaches the client.
        big = b"x" * (20 << 20)
        (refused,) = _responses(
            await _exchange(zone.url, _chat(b"Content-Length: %d\r\n" % len(big), big))
        )
        assert refused[0] == 413
        assert json.loads(refused[1])["error"]["code"] == "body_too_large"
