from __future__ import annotations

import pytest

from global_lb import profiles
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from tests.unit.global_lb.helpers import example_policy


@pytest.fixture
def router() -> GlobalRouter:
    """The built-in request profile (spread picker), decision cache on."""
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    return GlobalRouter(profiles.build(global_registry(), spec, None), spec)


@pytest.fixture
def dns_router() -> GlobalRouter:
    spec = profiles.profile_spec(example_policy(), "global-dns", profiles.DEFAULT_DNS_PROFILE)
    return GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=0)
