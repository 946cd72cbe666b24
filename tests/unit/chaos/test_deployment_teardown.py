"""A teardown step that does not finish is bounded: the handle logs it and moves on, so
the deployment below is always stopped (a stuck store close once hung a CI run)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from chaos import deployment


async def test_a_stuck_teardown_step_is_abandoned_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(deployment, "CLOSE_STEP_S", 0.05)
    never = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="chaos.deployment"):
        await deployment._bounded("closing the state store", never.wait())  # type: ignore[arg-type]
    assert "closing the state store took over 0.05 s" in caplog.text


async def test_a_teardown_step_that_finishes_is_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[bool] = []

    async def close() -> None:
        done.append(True)

    with caplog.at_level(logging.WARNING, logger="chaos.deployment"):
        await deployment._bounded("closing the HTTP session", close())
    assert done == [True]
    assert caplog.text == ""
