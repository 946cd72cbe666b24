"""The issue's bad flags, through the real ``gtm`` process: one line on stderr, exit 2.

The unit test (tests/unit/gtmctl/test_bad_flags.py) covers every command in-process; this
one checks what a user's terminal gets from the installed entry point, where a traceback
would show in full.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "args",
    [
        ("global", "--state", "foo://"),
        ("global", "--dns-listen", "nonsense"),
        ("up", "--state", "foo://"),
        ("up", "--dns-listen", "nonsense"),
        ("regional", "--region", "eu-west", "--listen", "127.0.0.1:99999"),
        ("drain", "region", "planet-x", "--state", "foo://"),
    ],
    ids=" ".join,
)
def test_a_bad_flag_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gtmctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"gtm {args[0]}: Invalid value for '{args[-2]}'"), line
    assert done.stdout == ""
