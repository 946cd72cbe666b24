"""What the security checks cost, each against a named peer measured in the same run:

* **limits middleware** (:mod:`gtm.http_limits`): POSTs of a typical chat body (1 KiB)
  to an aiohttp app built with ``limited_app`` vs a plain ``web.Application`` (the
  peer), one kept-alive connection, sequential; printed: requests/s, p50 µs and the p50
  ratio. The modes take turns in rounds so a busier machine slows both alike.
* **JSON depth scan** (``json_too_deep``) vs ``json.loads`` of the same body (the parse
  the scan guards): µs per body for a 20-message chat body, and the ratio.
* **admin token check** (salted SHA-256, :mod:`gtm.admin_auth`) vs a tenant API key's
  first check (scrypt N=2^14, :mod:`policies.apikeys`): µs per verification and the
  ratio — the cost a flood of bad tokens imposes on each.

    python bench/http_limits.py            # 2,000 requests per mode, 2,000 scans
    python bench/http_limits.py --smoke    # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from gtm.admin_auth import Role, TokenFile
from gtm.http_limits import HttpLimits, json_too_deep, limited_app
from gtm.stats import percentile
from policies.apikeys import generate_key, hash_key, parse_hash, verify_key

ROUNDS = 4
BODY = json.dumps(
    {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 4}
            for i in range(20)
        ],
        "max_tokens": 64,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": [1]}}}],
    }
).encode()


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"bytes": len(await request.read())})


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    app.router.add_post("/v1/chat/completions", _echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"


async def _run(url: str, count: int) -> list[float]:
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(url, data=BODY) as response:
                await response.read()
                assert response.status == 200
            latencies.append(time.perf_counter() - started)
    return latencies


async def http_figures(count: int) -> None:
    plain_runner, plain_url = await _serve(web.Application(client_max_size=32 << 20))
    limited_runner, limited_url = await _serve(limited_app(HttpLimits(), client_max_size=32 << 20))
    results: dict[str, list[float]] = {"plain aiohttp": [], "limited_app": []}
    try:
        await _run(plain_url, 20)  # warm-up
        await _run(limited_url, 20)
        for _ in range(ROUNDS):
            results["plain aiohttp"] += await _run(plain_url, count // ROUNDS)
            results["limited_app"] += await _run(limited_url, count // ROUNDS)
    finally:
        await plain_runner.cleanup()
        await limited_runner.cleanup()
    p50 = {name: percentile(values, 0.5) * 1e6 for name, values in results.items()}
    for name, values in results.items():
        print(f"{name:15s} {len(values) / sum(values):8.0f} req/s   p50 {p50[name]:7.1f} µs")
    ratio = p50["limited_app"] / p50["plain aiohttp"]
    print(f"limits middleware p50 ratio vs plain aiohttp: {ratio:.3f}")


def _per_call_us(call: Callable[[], object], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - started) / count * 1e6


def scan_figures(count: int) -> None:
    assert not json_too_deep(BODY)
    scan = _per_call_us(lambda: json_too_deep(BODY), count)
    parse = _per_call_us(lambda: json.loads(BODY), count)
    print(f"depth scan {scan:6.1f} µs   json.loads {parse:6.1f} µs   ({len(BODY)} B body)")
    print(f"depth scan / json.loads: {scan / parse:.3f}")


def token_figures(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokens = TokenFile(Path(tmp) / "tokens.json")
        token, record = tokens.create(Role.OPERATOR, now=0.0)
        wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
        admin = _per_call_us(lambda: record.matches(wrong), count)
    key = generate_key()
    stored = parse_hash(hash_key(key))
    scrypt_count = max(3, count // 500)
    tenant = _per_call_us(lambda: verify_key(key, stored), scrypt_count)
    print(f"admin token check {admin:8.2f} µs   tenant key scrypt {tenant:10.1f} µs")
    print(f"tenant scrypt / admin sha256: {tenant / admin:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds (CI)")
    args = parser.parse_args()
    count = 200 if args.smoke else 2000
    asyncio.run(http_figures(count))
    scan_figures(count)
    token_figures(count)


if __name__ == "__main__":
    main()
