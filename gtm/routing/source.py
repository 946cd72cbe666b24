"""Where a tier's routing profile comes from: the policy files, hot-reloaded.

Every tier reads its profile from the RoutingProfiles documents of the policy set in
force, by tier and profile name, and rebuilds it when the policy generation changes.
:class:`ProfileSource` is that rule, once: it starts from the tier's built-in default
(used while no policy names the profile), builds the policy's profile when a new
generation arrives, and when that fails keeps the last good profile — the failure is
logged and counted (``gtm_routing_profile_reload_failures_total{tier,profile}``), and not
retried until the next generation. A tier asks :meth:`ProfileSource.update` with the
policy of the view it decides over; the check is one comparison per decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from gtm.errors import ConfigError, GtmError
from gtm.models import Tier
from gtm.policy_store import ActivePolicy
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.registry import ProfileSpec, load_profile_spec

log = logging.getLogger(__name__)

R = TypeVar("R")


def policy_profile_spec(
    policy: ActivePolicy | None, tier: Tier, name: str, default: Mapping[str, Any] | ProfileSpec
) -> ProfileSpec:
    """The policy set's routing profile ``name`` if it has one, else ``default``.

    Raises:
        ConfigError: the policy's profile is for another tier, or is not a valid profile.
    """
    if policy is not None and name in policy.policy_set.profiles:
        found = policy.policy_set.profiles[name]
        if found.tier.value != tier.value:
            raise ConfigError(f"routing profile {name!r} is for tier {found.tier.value!r}")
        data: Mapping[str, Any] | ProfileSpec = policy.policy_set.profile_config(name)
    else:
        data = default
    if isinstance(data, ProfileSpec):
        return data
    try:
        return load_profile_spec(dict(data))
    except GtmError as exc:
        raise ConfigError(str(exc)) from None


class ProfileSource(Generic[R]):
    """A tier's built routing profile, following the policy in force."""

    def __init__(
        self,
        tier: Tier,
        name: str,
        default: Mapping[str, Any] | ProfileSpec,
        build: Callable[[ProfileSpec], R],
        *,
        metrics: RoutingMetrics | None = None,
        adjust: Callable[[ProfileSpec], ProfileSpec] | None = None,
        policy: ActivePolicy | None = None,
    ) -> None:
        """``build`` turns a spec into the tier's profile; ``adjust`` rewrites every spec
        first (e.g. a filter the tier always runs). The default must build. With
        ``policy``, its profile is then loaded as by :meth:`update`."""
        self.tier = tier
        self.name = name
        self._default = default
        self._build = build
        self._adjust = adjust
        self._metrics = metrics
        self._generation = 0
        self._spec = self._spec_for(None)
        self._current = build(self._spec)
        if policy is not None:
            self.update(policy)

    @property
    def current(self) -> R:
        return self._current

    @property
    def spec(self) -> ProfileSpec:
        return self._spec

    @property
    def generation(self) -> int:
        """The policy generation last looked at (0: none yet)."""
        return self._generation

    def update(self, policy: ActivePolicy | None) -> R:
        """The profile for ``policy``: rebuilt when its generation is new and the spec
        changed; the last good one when the new one fails to build."""
        if policy is None or policy.generation == self._generation:
            return self._current
        self._generation = policy.generation
        try:
            spec = self._spec_for(policy)
            if spec != self._spec:
                self._current, self._spec = self._build(spec), spec
        except GtmError as exc:
            log.error(
                "%s routing profile %r of policy generation %d not applied; keeping the "
                "one in force: %s",
                self.tier,
                self.name,
                policy.generation,
                exc,
            )
            if self._metrics is not None:
                self._metrics.profile_reload_failures.labels(self.tier, self.name).inc()
        return self._current

    def _spec_for(self, policy: ActivePolicy | None) -> ProfileSpec:
        spec = policy_profile_spec(policy, self.tier, self.name, self._default)
        return spec if self._adjust is None else self._adjust(spec)
