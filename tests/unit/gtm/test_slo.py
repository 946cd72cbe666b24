"""The goodput SLO has one home (gtm.slo): every default that means it reads it."""

from __future__ import annotations

from fleetsim.metrics import SLO_TPOT_S, SLO_TTFT_S
from gtm.slo import TPOT_SLO_MS, TTFT_SLO_MS
from zone_agent.flow import AdmissionSettings
from zone_agent.plugins.slo_picker import Params
from zone_agent.profiles import DEFAULT_TTFT_SCALE_MS


def test_every_default_of_the_slo_is_gtm_slos() -> None:
    assert (TTFT_SLO_MS, TPOT_SLO_MS) == (2_000.0, 100.0)  # issue 10's SLO
    assert (SLO_TTFT_S * 1000.0, SLO_TPOT_S * 1000.0) == (TTFT_SLO_MS, TPOT_SLO_MS)
    settings = AdmissionSettings()
    assert (settings.ttft_slo_ms, settings.tpot_slo_ms) == (TTFT_SLO_MS, TPOT_SLO_MS)
    assert Params().ttft_slo_ms == TTFT_SLO_MS
    assert DEFAULT_TTFT_SCALE_MS == TTFT_SLO_MS
