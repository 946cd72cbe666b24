"""The goodput SLO (issue 10): the one pair of bounds that the simulator's goodput
figure, the side-by-side benchmark, the zone's ``slo-picker`` and its flow control
(``gtm zone --ttft-slo-ms/--tpot-slo-ms``) default to, so a change of the SLO is made
once. Operators set their own with the options above."""

from __future__ import annotations

#: The longest time to first token of a good request, ms.
TTFT_SLO_MS = 2_000.0
#: The longest mean time per output token after the first of a good request, ms.
TPOT_SLO_MS = 100.0

__all__ = ["TPOT_SLO_MS", "TTFT_SLO_MS"]
