from __future__ import annotations

import platform
from pathlib import Path

from gtm._version import __version__
from gtm.metrics import (
    BUILD_INFO,
    OTHER_MODEL,
    ModelLabel,
    build_commit,
    new_registry,
    register_runtime,
)


def test_runtime_collectors_and_build_info_once_per_registry() -> None:
    registry = new_registry()
    register_runtime(registry)
    register_runtime(registry)  # a second app on the same registry: nothing twice
    names = {family.name for family in registry.collect()}
    assert {"process_cpu_seconds", "python_info", "python_gc_collections", "gtm_build_info"} <= (
        names
    )
    (family,) = (f for f in registry.collect() if f.name == BUILD_INFO)
    (sample,) = family.samples
    assert sample.value == 1
    assert sample.labels["version"] == __version__
    assert sample.labels["python"] == platform.python_version()
    assert sample.labels["commit"]


def test_a_new_registry_has_no_runtime_collectors() -> None:
    assert list(new_registry().collect()) == []


def test_build_commit_from_env_then_git_then_unknown(tmp_path: Path) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert build_commit({"GTM_BUILD_COMMIT": "abc"}, tmp_path) == "abc"
    assert build_commit({}, tmp_path) == "unknown"
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs\n{sha} refs/heads/main\n")
    assert build_commit({}, tmp_path) == sha
    (git / "refs" / "heads" / "main").write_text(sha.replace("0", "f") + "\n")
    assert build_commit({}, tmp_path) == sha.replace("0", "f")
    (git / "HEAD").write_text(sha + "\n")  # detached
    assert build_commit({}, tmp_path) == sha


def test_model_label_is_bounded_and_folds_unknown_models() -> None:
    label = ModelLabel(limit=2)
    assert label("a") == "a"
    assert label("b") == "b"
    assert label("c") == OTHER_MODEL  # past the limit
    assert label("a") == "a"  # a value already in use stays
    assert label("a", known=False) == OTHER_MODEL  # the view does not serve it
