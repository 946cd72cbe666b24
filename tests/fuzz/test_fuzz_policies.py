"""Fuzzed policy files: YAML and JSON mutations of the shipped examples. Invariant: the
loader either returns a whole policy set or raises a PolicyError whose problems each
name a file and a field — never another exception, never a partial set (so nothing
partial can be applied: ``gtm policy apply`` commits only what the loader returned)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from policies import PolicyError, PolicySet, load_paths
from policies.errors import PolicyValidationError
from policies.loader import examples_path
from tests.fuzz.profiles import fuzz_settings
from tests.fuzz.strategies import JSON

EXAMPLES = examples_path()
FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node inside a parsed document."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_paths(value, (*prefix, index)))
    return found


def _mutate(document: Any, path: tuple[Any, ...], action: str, value: Any) -> Any:
    if not path:
        return value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "wrap":
        parent[last] = [parent[last]]
    elif action == "rename" and isinstance(parent, dict):
        parent[f"{last}x"] = parent.pop(last)
    else:
        parent[last] = value
    return document


@st.composite
def mutated_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, contents): one example file with one structural or textual change."""
    name = draw(st.sampled_from(FILES))
    text = (EXAMPLES / name).read_text()
    if draw(st.integers(min_value=0, max_value=4)) == 0:  # textual damage
        raw = bytearray(text.encode())
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            at = draw(st.integers(min_value=0, max_value=len(raw) - 1))
            raw[at] = draw(st.integers(min_value=0, max_value=255))
        return name, bytes(raw)
    document = yaml.safe_load(text)
    path = draw(st.sampled_from(_paths(document)))
    action = draw(st.sampled_from(("set", "delete", "wrap", "rename")))
    document = _mutate(document, path, action, draw(JSON))
    if draw(st.booleans()):
        return name.replace(".yaml", ".json"), json.dumps(document).encode()
    return name, yaml.safe_dump(document).encode()


def _load(name: str, contents: bytes) -> PolicySet | PolicyError:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for example in FILES:
            shutil.copy(EXAMPLES / example, directory / example)
        (directory / name.replace(".json", ".yaml")).unlink()
        (directory / name).write_bytes(contents)
        try:
            return load_paths([directory])
        except PolicyError as exc:
            return exc


@fuzz_settings(50)
@given(change=mutated_file())
def test_mutated_policies_load_whole_or_fail_naming_file_and_field(
    change: tuple[str, bytes],
) -> None:
    name, contents = change
    result = _load(name, contents)
    if isinstance(result, PolicySet):
        assert result.tenants is not None  # a whole set, every kind present
        return
    assert isinstance(result, PolicyValidationError), repr(result)
    assert result.problems
    for problem in result.problems:
        assert Path(problem.file).name in {name, *FILES}, problem  # names a policy file
        assert problem.path  # and a field (or <root>)
        assert problem.message


def test_the_examples_still_load_after_the_batch() -> None:
    """The invariant after a batch: the unmodified examples load as before."""
    assert isinstance(load_paths([EXAMPLES]), PolicySet)
