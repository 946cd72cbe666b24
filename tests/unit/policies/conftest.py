from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from policies.loader import examples_path

ENVELOPE = "apiVersion: gtm.dev/v1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n"


def document(kind: str, name: str, spec: str) -> str:
    """A YAML document: the envelope, then ``spec`` (already indented by two spaces)."""
    return ENVELOPE.format(kind=kind, name=name) + spec


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A private copy of the shipped example policies."""
    target = tmp_path / "policies"
    shutil.copytree(examples_path(), target)
    return target
