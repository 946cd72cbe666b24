"""The repository needs nothing beside it (issue 22): no tracked file refers to a data
folder outside the clone, the ``shared`` folder a workspace once kept next to it. Data
the product reads ships in ``gtm/data``; data only tests and benchmarks read is in
``data/``.

CHANGELOG.md is not checked: it is history, and its entries say where the data lived
when they were written. This file is checked too: it spells what it forbids in parts.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The sibling folder by its relative path, and a path or Path expression that joins that
#: folder's name and "data".
OUTSIDE = re.compile(rb"\.\./shared|shared[\"']?\s*/\s*[\"']?data")
NOT_CHECKED = {"CHANGELOG.md"}
SIBLING = "shared"


def _tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    names = [name.decode() for name in listed if name]
    return [ROOT / name for name in names if name not in NOT_CHECKED and (ROOT / name).is_file()]


def test_no_tracked_file_refers_to_a_folder_beside_the_repository() -> None:
    files = _tracked_files()
    assert len(files) > 500  # the listing worked (a git checkout)
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        for number, line in enumerate(path.read_bytes().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_the_pattern_finds_what_it_forbids() -> None:
    for text in (
        f"../{SIBLING}/data/x.csv",
        f'parents[2] / "{SIBLING}" / "data"',
        f"{SIBLING}/data",
    ):
        assert OUTSIDE.search(text.encode()), text
    assert not OUTSIDE.search(b"data/latency/azure_regions.csv")
