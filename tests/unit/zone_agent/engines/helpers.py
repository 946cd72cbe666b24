"""The sample expositions under tests/data/engines/, parsed as the zone agent does."""

from __future__ import annotations

from pathlib import Path

from zone_agent.scrape import GpuMetrics, parse_metrics

FIXTURES = Path(__file__).resolve().parents[3] / "data" / "engines"


def exposition(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def parsed(name: str, *, default_model: str = "") -> GpuMetrics:
    return parse_metrics(exposition(name), scraped_at=1.0, default_model=default_model)
