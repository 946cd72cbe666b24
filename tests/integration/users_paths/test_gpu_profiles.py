"""An operator prices the fleet by their own GPU performance profiles.

``gtm up --processes --gpu-profiles DIR`` on private loopback addresses, DIR holding one
file that replaces the shipped H100 × Llama-3.1-8B profile by the operator's figures
(as measured on their own hardware). Every zone agent is given it: its
``gtm_zone_profile_source`` says ``file`` for the H100 and ``shipped`` for the other
GPUs, and the H100 is priced at the file's prefill rate; requests through the front
door are served. A profile file with a wrong field stops ``gtm up`` before anything
starts, naming the file, the line and the field.

Before, profiles were a table in the code: there was no way to supply one, and an
unknown pair was silently priced as an A100-80GB serving Llama-3.1-8B.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.profile_files import render
from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.users_paths.direct_clients import (
    MODEL,
    admin_document,
    tenant_client,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Longest start of the whole deployment (a shared 2-core machine under load).
START_TIMEOUT_S = 150.0
#: The operator's measured prefill rate of their H100s (well apart from the shipped one).
OPERATORS_RATE = 12345.0
#: A refused start is quick: nothing was started.
REFUSAL_WITHIN_S = 60.0


async def profile_gauges(zone_url: str) -> dict[str, tuple[str, float]]:
    """GPU id → (source, priced prefill rate) for Llama-3.1-8B, from a zone's /metrics."""
    async with aiohttp.ClientSession() as session, session.get(zone_url + "/metrics") as r:
        text = await r.text()
    sources: dict[str, str] = {}
    rates: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") != LLAMA_8B:
                continue
            if s.name == "gtm_zone_profile_source" and s.value == 1.0:
                sources[s.labels["gpu"]] = s.labels["source"]
            elif s.name == "gtm_zone_profile_prefill_tokens_per_second":
                rates[s.labels["gpu"]] = s.value
    return {gpu: (source, rates[gpu]) for gpu, source in sources.items()}


async def test_the_operators_profile_prices_their_gpus(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    ours = dataclasses.replace(get_profile("H100", LLAMA_8B), prefill_tokens_per_s=OPERATORS_RATE)
    (profiles / "h100.yaml").write_text(render(ours, "measured on our H100s"))
    async with running_up(
        tmp_path,
        *("--processes", "--speedup", "20", "--gpu-profiles", str(profiles)),
        regions=("eu-west",),
        start_timeout_s=START_TIMEOUT_S,
    ) as up:
        async with tenant_client(up) as client:
            answer = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert answer.choices[0].message.content
        document = await admin_document(up, "fleet")
        seen: dict[str, tuple[str, float]] = {}
        types: dict[str, str] = {}
        for region in document["regions"]:
            for zone in region["zones"]:
                types.update({g["id"]: g["type"] for g in zone["gpus"]})
                seen.update(await profile_gauges(zone["url"]))
    assert set(seen) == set(types), (seen, types)
    for gpu, (source, rate) in seen.items():
        if types[gpu] == "H100":
            assert (source, rate) == ("file", OPERATORS_RATE), gpu
        else:
            assert source == "shipped", gpu
            assert rate == get_profile(types[gpu], LLAMA_8B).prefill_tokens_per_s, gpu
    assert "H100" in types.values()


async def test_a_bad_profile_file_stops_gtm_up_naming_file_line_and_field(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    text = render(get_profile("H100", LLAMA_8B), "ours").replace(
        "tensor_parallel: 1", "tensor_parallel: none"
    )
    bad.write_text(text)
    line = text.splitlines().index("tensor_parallel: none") + 1
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "up",
        *("--processes", "--gpu-profiles", str(bad), "--run-dir", str(tmp_path / "run")),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), REFUSAL_WITHIN_S)
    assert process.returncode == 2
    message = err.decode()
    assert f"{bad}:{line}: tensor_parallel:" in message, message
    assert "listening" not in out.decode()
