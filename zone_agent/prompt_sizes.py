"""What another client's waiting request weighs at a worker, measured (sans-io).

The zone's view counts a worker's waiting requests that are not the agent's (other
clients': a second agent in front of the same GPUs, another router) as prefill queued
there (``ModelIndex.external_queued``). Their prompts are unknown to the agent; each is
taken to weigh what the worker's recent requests weighed: the prompt tokens it computed
per request (uncached, as :func:`zone_agent.calibration.prefill_counters` reads the
engine's counters), a ratio of the counters' growth between scrapes with older growth
decayed (half-life :data:`HALF_LIFE_S`), so it follows the traffic mix.

Before a worker has prefilled a request since the agent began scraping it, there is no
measure and the view uses its fixed guess (``ViewSettings.mean_prompt_tokens``). A fixed
guess is wrong by the ratio of the real mix to it: 64 waiting chat requests of ~15
tokens read as ~65,000 tokens (3 s of an H100's prefill), and a flow-controlled agent
holds its requests behind a queue its GPU clears in milliseconds.

The agent's loop updates it once per scrape; decisions never see it: the view copies
:meth:`PromptSizes.of` when it is rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from zone_agent.calibration import PrefillCounters

#: Half-life of a measure's weight (s): a minute-old mix counts a quarter.
HALF_LIFE_S = 30.0

_NONE: Mapping[str, float] = MappingProxyType({})
_ZERO = PrefillCounters(0.0, 0.0, 0.0)


class _Measure:
    __slots__ = ("at", "last", "requests", "tokens")

    def __init__(self, last: PrefillCounters) -> None:
        self.last = last
        #: Decayed sums of the counters' growth, and when they were last decayed.
        self.tokens = 0.0
        self.requests = 0.0
        self.at = 0.0


class PromptSizes:
    """Each worker's prompt tokens computed per request lately, by model."""

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self._half_life_s = half_life_s
        self._measures: dict[str, dict[str, _Measure]] = {}
        self._sizes: dict[str, Mapping[str, float]] = {}

    def observe(
        self, gpu_id: str, model: str, counters: PrefillCounters | None, now: float
    ) -> None:
        """One scrape's cumulative counters of one (worker, model) (``model`` as the
        scrape labels it, "" for none). None counts as zero: an engine writes a labelled
        histogram's series at its first observation, so one absent before its first
        request is at zero (and one that never exposes them never measures anything)."""
        if counters is None:
            counters = _ZERO
        measures = self._measures.setdefault(gpu_id, {})
        measure = measures.get(model)
        if measure is None:
            measures[model] = _Measure(counters)  # the baseline
            return
        last, measure.last = measure.last, counters
        requests = counters.requests - last.requests
        tokens = counters.tokens - last.tokens
        if requests < 0 or tokens < 0 or requests == 0:
            return  # an engine restarted (this is the new baseline), or nothing prefilled
        if measure.requests > 0:
            decay = 0.5 ** (max(0.0, now - measure.at) / self._half_life_s)
            measure.tokens *= decay
            measure.requests *= decay
        measure.tokens += tokens
        measure.requests += requests
        measure.at = now
        self._publish(gpu_id)

    def of(self, gpu_id: str) -> Mapping[str, float]:
        """Tokens per request of ``gpu_id``'s models measured so far (read-only)."""
        return self._sizes.get(gpu_id, _NONE)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the workers not in ``keep`` (gone from the inventory)."""
        kept = set(keep)
        for gpu_id in [g for g in self._measures if g not in kept]:
            del self._measures[gpu_id]
            self._sizes.pop(gpu_id, None)

    def _publish(self, gpu_id: str) -> None:
        self._sizes[gpu_id] = MappingProxyType(
            {
                model: m.tokens / m.requests
                for model, m in self._measures.get(gpu_id, {}).items()
                if m.requests > 0
            }
        )


def tokens_per_request(sizes: Mapping[str, float], model: str, default: float) -> float:
    """What one of ``model``'s waiting requests weighs at a worker of ``sizes``:
    measured for that model, else for the worker's unlabelled series (an engine serving
    one model), else ``default``."""
    measured = sizes.get(model)
    if measured is None:
        measured = sizes.get("")
    return default if measured is None else measured
