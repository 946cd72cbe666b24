from __future__ import annotations

import logging
import os

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
