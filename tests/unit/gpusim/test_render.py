"""gpu-sim's renderer process (gpusim.render): the token ids the engine charges, from a
process of the worker's own that starts at the first render and ends with the worker."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

from gpusim.render import Renderer, token_ids_json
from gtm.tokens import encode_text


async def test_the_renderer_tokenizes_in_a_process_of_its_own_started_at_first_use() -> None:
    before = set(multiprocessing.active_children())
    renderer = Renderer()
    assert set(multiprocessing.active_children()) == before  # nothing until a render
    try:
        texts = ["one two three", "a much longer prompt " * 200]
        answer = await renderer.token_ids_json(texts)
        assert [json.loads(a) for a in answer] == [list(encode_text(t)) for t in texts]
        (child,) = set(multiprocessing.active_children()) - before
        assert child.pid != os.getpid()
    finally:
        await renderer.close()
    # close() returns once the executor has joined its process.
    assert not child.is_alive()
    assert child.exitcode is not None


def test_the_renderer_process_imports_nothing_of_the_worker() -> None:
    # spawn imports the function's module in the new process: it must stay light.
    probe = (
        "import sys, gpusim.render; "
        "print(sorted(m for m in sys.modules if m.startswith(('gpusim', 'aiohttp'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['gpusim', 'gpusim.render']"


def test_token_ids_json_is_the_engines_tokenization() -> None:
    assert [json.loads(x) for x in token_ids_json(["one two", ""])] == [
        list(encode_text("one two")),
        [],
    ]
