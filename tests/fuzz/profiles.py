"""Hypothesis settings for the fuzz suite.

``make test`` runs the ``ci`` profile: derandomized (the same cases every run, so a
failure reproduces) and sized so that the whole suite stays well under a minute.
``make fuzz`` sets ``HYPOTHESIS_PROFILE=fuzz``: random seeds and ~20× the cases.
Profiles are looked up, never loaded globally, so other property tests keep their own
settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: The profile in force: ``fuzz`` when ``HYPOTHESIS_PROFILE=fuzz``, else ``ci``.
PROFILE = "fuzz" if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz" else "ci"
#: How many more cases ``make fuzz`` runs than ``make test``.
SCALE = 20 if PROFILE == "fuzz" else 1


def fuzz_settings(ci_examples: int) -> settings:
    """Settings for one fuzz test: ``ci_examples`` cases in CI, ``SCALE``× under fuzz."""
    return settings(settings.get_profile(PROFILE), max_examples=ci_examples * SCALE)
