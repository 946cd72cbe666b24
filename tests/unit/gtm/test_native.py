from __future__ import annotations

import logging
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from gtm import native
from gtm.testing.kernels import source_of


def test_a_python_module_is_reported_as_python() -> None:
    found = native.kernel("gtm.clock")
    assert found.state is native.KernelState.PYTHON
    assert "not compiled" in found.describe()


def test_a_kernel_whose_source_is_newer_than_its_extension_is_stale() -> None:
    name = "global_lb.kernels"
    if native.kernel(name).state is native.KernelState.PYTHON:
        assert os.environ.get("GTM_PURE_PYTHON"), "kernels must be compiled (run pip install)"
        return
    source = source_of(name)
    before = source.stat()
    extension = native.kernel(name).path
    try:
        later = os.stat(extension).st_mtime + 60
        os.utime(source, (later, later))
        stale = native.kernel(name)
        assert stale.state is native.KernelState.STALE
        assert "pip install -e ." in stale.describe()
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert native.kernel(name).state is native.KernelState.COMPILED


def test_version_lists_every_kernel() -> None:
    from click.testing import CliRunner

    from gtmctl.cli import cli

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    for name in native.KERNEL_MODULES:
        assert f"kernel {name}: " in result.output


def test_a_kernel_not_running_compiled_is_logged_with_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gtm.native"):
        native.warn_if_not_compiled("gtm.clock")  # a plain module stands for one
    assert "kernel gtm.clock: python" in caplog.text
    assert "not compiled" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gtm.native"):
        native.warn_if_not_compiled("no_such_module_xyz")  # a C kernel that was not built
    assert "kernel no_such_module_xyz: python" in caplog.text


# ---------------------------------------------------------------- wheel installs
# A wheel install is laid out here by hand, as pip lays it: the package's files, and a
# dist-info RECORD listing each with its sha256. pip writes a kernel's .py after the
# extension beside it, so the source is the newer file although both come from one build.

SUFFIX = EXTENSION_SUFFIXES[0]


def _install(site: Path, *, with_record: bool) -> tuple[Path, Path]:
    package = site / "global_lb"
    package.mkdir(parents=True)
    extension = package / f"kernels{SUFFIX}"
    source = package / "kernels.py"
    extension.write_bytes(b"\x7fELF compiled from the source below")
    source.write_text("def kernel() -> None: ...\n")
    os.utime(extension, (1_000_000, 1_000_000))
    os.utime(source, (1_000_060, 1_000_060))  # written a minute later
    if with_record:
        dist_info = site / "gtm_traffic_manager-0.1.0.dist-info"
        dist_info.mkdir()
        rows = [
            f"global_lb/kernels{SUFFIX},{native._sha256(extension)},{extension.stat().st_size}",
            f"global_lb/kernels.py,{native._sha256(source)},{source.stat().st_size}",
            "gtm_traffic_manager-0.1.0.dist-info/RECORD,,",
        ]
        (dist_info / "RECORD").write_text("\n".join(rows) + "\n")
    return extension, source


def test_a_wheel_installs_kernels_are_fresh_whatever_the_order_files_were_written(
    tmp_path: Path,
) -> None:
    extension, _ = _install(tmp_path, with_record=True)
    assert native.extension_state(extension, "global_lb.kernels") is native.KernelState.COMPILED


def test_a_wheel_installs_kernel_whose_source_was_edited_after_install_is_stale(
    tmp_path: Path,
) -> None:
    extension, source = _install(tmp_path, with_record=True)
    source.write_text("def kernel() -> int: return 1\n")
    os.utime(source, (900_000, 900_000))  # older than the extension: the hash decides
    assert native.extension_state(extension, "global_lb.kernels") is native.KernelState.STALE


def test_without_a_record_the_modification_times_decide(tmp_path: Path) -> None:
    extension, source = _install(tmp_path, with_record=False)  # as an editable install
    assert native.extension_state(extension, "global_lb.kernels") is native.KernelState.STALE
    os.utime(source, (900_000, 900_000))
    assert native.extension_state(extension, "global_lb.kernels") is native.KernelState.COMPILED


def test_record_hashes_are_written_as_wheels_write_them(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    # RECORD of any wheel: the sha256 of no bytes, urlsafe base64 without padding.
    assert native._sha256(empty) == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


def test_the_interpreter_says_whether_its_core_is_a_shared_library(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "55d0-55d1 r-xp 00000000 08:01 12 /usr/bin/python3.11\n"
        "7f00-7f01 r-xp 00000000 08:01 13 /opt/py/lib/libpython3.11.so.1.0\n"
        "7f01-7f02 r--p 00001000 08:01 13 /opt/py/lib/libpython3.11.so.1.0\n"
    )
    described = native.interpreter(maps)
    assert described.startswith(f"{sys.implementation.name} {sys.version_info.major}.")
    assert described.endswith("(core from /opt/py/lib/libpython3.11.so.1.0)")
    maps.write_text("55d0-55d1 r-xp 00000000 08:01 12 /usr/bin/python3.11\n")
    assert native.interpreter(maps).endswith("(core linked in)")


def test_the_interpreter_without_its_mappings_leaves_the_link_untold(tmp_path: Path) -> None:
    version = ".".join(map(str, sys.version_info[:3]))
    executable = Path(sys.executable).resolve()
    assert native.interpreter(tmp_path / "absent") == (
        f"{sys.implementation.name} {version} at {executable}"
    )
