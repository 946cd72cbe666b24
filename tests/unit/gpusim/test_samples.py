"""``gpusim.samples.busy_exposition``: every flavour's text of a busy worker, with the
requests asked for finished and the rest still running."""

from __future__ import annotations

import pytest

from gpusim.metrics import MetricsFlavor
from gpusim.samples import busy_exposition
from gtm.gpu_profiles import LLAMA_8B
from zone_agent.scrape import parse_metrics


@pytest.mark.parametrize("flavor", list(MetricsFlavor), ids=[f.value for f in MetricsFlavor])
def test_a_busy_worker_has_finished_and_running_requests(flavor: MetricsFlavor) -> None:
    text = busy_exposition(flavor, requests=8, finished=4, max_num_seqs=4)
    figures = parse_metrics(text, scraped_at=0.0, default_model=LLAMA_8B).models[LLAMA_8B]
    assert 0 < figures.running <= 4
