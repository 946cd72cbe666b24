"""Plugin registry and profile configuration, after llm-d's ``EndpointPickerConfig``.

A routing profile is configured by reference, as in llm-d (``docs/architecture.md``)::

    name: gpu-default
    plugins:
      - {type: allow-list-filter, name: not-drained, parameters: {from_context: true}}
      - {type: ttft-scorer, name: ttft, parameters: {scale_ms: 500}}
      - {type: max-score-picker}
    profile:
      filters: [not-drained]
      scorers: [{ref: ttft, weight: 2}]
      picker: max-score-picker
      cost_model: ttft

``plugins`` declares instances (``name`` defaults to ``type``), each with the parameters of
its type's pydantic ``Params`` model (frozen, unknown fields forbidden). ``profile``
refers to them by name. A plugin referenced twice (say as a scorer and as the cost
model) is one object.

There is no global registry: :func:`default_registry` builds a fresh one with the
built-in generic plugins, and each tier registers its own plugins and its declared fast
paths (:class:`gtm.routing.runner.FastPath`) on its own copy. A factory is ``(name,
params) -> plugin``; a tier that must inject something that is not configuration (a GPU
profile table, a random-source factory) registers a closure.

One vocabulary: type names read ``<concept>-<filter|scorer|picker|cost-model>``; the
names used before (:data:`VOCABULARY_ALIASES`) stay accepted as deprecated aliases,
each logged once per registry when a profile uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from gtm.errors import GtmError, PluginError
from gtm.models import Frozen, Tier
from gtm.routing.filters import allow_list
from gtm.routing.framework import CostModel, ExtensionPoint, Filter, Picker, Scorer
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.pickers import max_score, power_of_two, random_pick, weighted_random
from gtm.routing.runner import DEFAULT_PLUGIN_TIMING_EVERY, FastPath, Runner, Weighted
from policies.documents import PluginSpec as PluginSpec
from policies.documents import ScorerRef as ScorerRef
from policies.types import Identifier

_log = logging.getLogger(__name__)

P = TypeVar("P", bound=BaseModel)

_PROTOCOLS: Mapping[ExtensionPoint, type] = {
    ExtensionPoint.FILTER: Filter,
    ExtensionPoint.SCORER: Scorer,
    ExtensionPoint.PICKER: Picker,
    ExtensionPoint.COST_MODEL: CostModel,
}

#: Type names used before the one vocabulary → their name in it (ttft-cost-model names
#: the same type as ttft-scorer, and is not deprecated).
VOCABULARY_ALIASES: Mapping[str, str] = {
    "healthy-filter": "health-filter",
    "serves-model-filter": "model-filter",
    "ttft-cost": "ttft-scorer",
    "kv-cache-utilization-scorer": "kv-cache-scorer",
    "prefix-cache-scorer": "prefix-affinity-scorer",
    "random": "random-picker",
}


# ---------------------------------------------------------------------------- config


class ProfilePlugins(Frozen):
    """Which declared plugins the profile runs, at which extension point (the body of a
    policy file's ``Profile``, without its name and tier)."""

    filters: tuple[Identifier, ...] = Field(default=(), max_length=64)
    scorers: tuple[ScorerRef, ...] = Field(default=(), max_length=64)
    #: Exactly one; a list is accepted only to be refused with a clear message.
    picker: Identifier | tuple[Identifier, ...] | None = None
    cost_model: Identifier | None = None


class ProfileSpec(Frozen):
    """A whole routing profile as configuration (see the module docstring). Plugin
    instances and scorer references are the policy files' own models
    (:class:`policies.documents.PluginSpec`, :class:`~policies.documents.ScorerRef`): one
    definition, one validation."""

    name: Identifier = "default"
    plugins: tuple[PluginSpec, ...] = Field(default=(), max_length=256)
    profile: ProfilePlugins
    #: Keep only the N best survivors' scores in each decision trace (None: all).
    trace_scores: int | None = Field(default=None, ge=0)
    #: Time the plugins on one decision in N (1: every one); see gtm/routing/README.md.
    plugin_timing_every: int = Field(default=DEFAULT_PLUGIN_TIMING_EVERY, ge=1)


def _describe(error: ValidationError, prefix: str) -> str:
    parts = []
    for item in error.errors(include_url=False):
        location = ".".join(str(p) for p in (prefix, *item["loc"]) if p != "")
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


def load_profile_spec(data: object) -> ProfileSpec:
    """Validate configuration data into a :class:`ProfileSpec`; errors name the field."""
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as exc:
        raise PluginError(f"invalid routing profile: {_describe(exc, '')}") from exc


# ---------------------------------------------------------------------------- registry


@dataclass(frozen=True, slots=True)
class PluginType:
    """A registered plugin type: its parameter model and its factory."""

    type_name: str
    params: type[BaseModel]
    factory: Callable[[str, Any], object]


def _check_params_model(type_name: str, params: type[BaseModel]) -> None:
    config = params.model_config
    if config.get("frozen") is not True or config.get("extra") != "forbid":
        raise PluginError(
            f"plugin type {type_name!r}: its Params model {params.__name__} must be frozen "
            "and forbid extra fields (derive it from gtm.models.Frozen)"
        )


class PluginRegistry:
    """Plugin type name → (Params model, factory). Build one per tier; never share globally."""

    def __init__(self) -> None:
        self._types: dict[str, PluginType] = {}
        self._aliases: dict[str, str] = {}
        self._warned: set[str] = set()
        self._fast_paths: list[FastPath] = []

    def register(
        self, type_name: str, params: type[P], factory: Callable[[str, P], object]
    ) -> None:
        """Register ``type_name``. Raises PluginError if the name is taken."""
        if not type_name:
            raise PluginError("a plugin type needs a name")
        if type_name in self._types or type_name in self._aliases:
            raise PluginError(f"plugin type {type_name!r} is already registered")
        _check_params_model(type_name, params)
        self._types[type_name] = PluginType(type_name, params, factory)

    def register_alias(self, deprecated: str, type_name: str) -> None:
        """Keep accepting an old type name; using it logs a deprecation warning."""
        if type_name not in self._types:
            raise PluginError(f"alias {deprecated!r} points at unknown plugin type {type_name!r}")
        if deprecated in self._types or deprecated in self._aliases:
            raise PluginError(f"plugin type {deprecated!r} is already registered")
        self._aliases[deprecated] = type_name

    def register_vocabulary_aliases(self) -> None:
        """Accept the :data:`VOCABULARY_ALIASES` whose new name is registered here."""
        for deprecated, type_name in VOCABULARY_ALIASES.items():
            if type_name in self._types and deprecated not in self._aliases:
                self.register_alias(deprecated, type_name)

    def register_fast_path(self, path: FastPath) -> None:
        """Declare a fast path that profiles built here take when their plugins can."""
        if any(p.name == path.name for p in self._fast_paths):
            raise PluginError(f"fast path {path.name!r} is already registered")
        self._fast_paths.append(path)

    def fast_paths(self) -> tuple[FastPath, ...]:
        return tuple(self._fast_paths)

    def copy(self) -> PluginRegistry:
        """An independent registry with the same types, aliases and fast paths."""
        clone = PluginRegistry()
        clone._types = dict(self._types)
        clone._aliases = dict(self._aliases)
        clone._fast_paths = list(self._fast_paths)
        return clone

    def type_names(self) -> tuple[str, ...]:
        """Registered type names, sorted (aliases not included)."""
        return tuple(sorted(self._types))

    def aliases(self) -> Mapping[str, str]:
        """Deprecated type name → current type name."""
        return dict(self._aliases)

    def plugin_type(self, type_name: str) -> PluginType:
        """The registered type, following a deprecated alias. Raises PluginError if unknown."""
        current = self._aliases.get(type_name)
        if current is not None:
            if type_name not in self._warned:
                self._warned.add(type_name)
                _log.warning("plugin type %r is deprecated; use %r", type_name, current)
            type_name = current
        found = self._types.get(type_name)
        if found is None:
            known = ", ".join(self.type_names()) or "none"
            raise PluginError(f"unknown plugin type {type_name!r} (known: {known})")
        return found

    # ------------------------------------------------------------------ building

    def build_plugin(self, spec: PluginSpec, where: str = "plugin") -> object:
        """Validate ``spec.parameters`` against the type's Params and call its factory."""
        label = f"{where} {spec.plugin_name!r}"
        try:
            plugin_type = self.plugin_type(spec.type)
        except PluginError as exc:
            raise PluginError(f"{label}: {exc}") from exc
        label = f"{label} (type {plugin_type.type_name!r})"
        try:
            params = plugin_type.params.model_validate(dict(spec.parameters))
        except ValidationError as exc:
            raise PluginError(f"{label}: {_describe(exc, 'parameters')}") from exc
        try:
            return plugin_type.factory(spec.plugin_name, params)
        except (GtmError, ValueError, TypeError) as exc:
            raise PluginError(f"{label}: {exc}") from exc

    def build(
        self,
        spec: ProfileSpec,
        *,
        tier: Tier,
        metrics: RoutingMetrics | None = None,
        timer: Callable[[], float] = time.perf_counter,
        fast_paths: bool = True,
    ) -> Runner[Any]:
        """Build every declared plugin, resolve the profile's references, check the rules,
        and compose the registry's fast paths (``fast_paths=False``: none, the reference).

        Raises PluginError naming the plugin and the field for: an unknown type, invalid
        parameters, a duplicate plugin name, an unknown reference, a plugin used at an
        extension point it does not implement, a plugin used twice as a step, a weight that
        is not > 0, no picker or more than one.
        """
        plugins = self._build_plugins(spec)
        body = spec.profile
        resolve = self._resolve
        filters = [
            resolve(plugins, ref, f"profile.filters[{i}]", ExtensionPoint.FILTER)
            for i, ref in enumerate(body.filters)
        ]
        scorers = [
            Weighted(*self._weighted(plugins, i, ref, _PROTOCOLS))
            for i, ref in enumerate(body.scorers)
        ]
        picker = resolve(plugins, _one_picker(body.picker), "profile.picker", ExtensionPoint.PICKER)
        cost_model = None
        if body.cost_model is not None:
            field = "profile.cost_model"
            cost_model = resolve(plugins, body.cost_model, field, ExtensionPoint.COST_MODEL)
        # A trace names its filter and score steps by plugin: a name used twice would make
        # two steps one (the cost model may reuse a scorer: it is no step).
        names = [*body.filters, *(ref.ref for ref in body.scorers)]
        if len(set(names)) != len(names):
            raise PluginError(f"profile {spec.name!r}: plugin names must be unique: {names}")
        try:
            return Runner(
                spec.name,
                tier,
                filters,
                scorers,
                picker,
                cost_model=cost_model,
                fast_paths=self._fast_paths if fast_paths else (),
                metrics=metrics,
                timer=timer,
                plugin_timing_every=spec.plugin_timing_every,
                trace_scores=spec.trace_scores,
            )
        except PluginError as exc:
            raise PluginError(f"profile {spec.name!r}: {exc}") from exc

    def _build_plugins(self, spec: ProfileSpec) -> dict[str, Any]:
        plugins: dict[str, Any] = {}
        for i, plugin_spec in enumerate(spec.plugins):
            name = plugin_spec.plugin_name
            if name in plugins:
                raise PluginError(
                    f"plugins[{i}] {name!r}: duplicate plugin name; give each instance a "
                    "distinct name"
                )
            plugins[name] = self.build_plugin(plugin_spec, where=f"plugins[{i}]")
        return plugins

    @staticmethod
    def _resolve(
        plugins: Mapping[str, Any],
        ref: str,
        field: str,
        point: ExtensionPoint,
        protocols: Mapping[ExtensionPoint, type] = _PROTOCOLS,
    ) -> Any:
        plugin = plugins.get(ref)
        if plugin is None:
            declared = ", ".join(plugins) or "none"
            raise PluginError(f"{field}: unknown plugin {ref!r} (declared: {declared})")
        if not isinstance(plugin, protocols[point]):
            raise PluginError(
                f"{field}: plugin {ref!r} ({type(plugin).__name__}) is not a {point} plugin"
            )
        return plugin

    def _weighted(
        self,
        plugins: Mapping[str, Any],
        i: int,
        ref: ScorerRef,
        protocols: Mapping[ExtensionPoint, type],
    ) -> tuple[Any, float]:
        """The scorer and its weight (> 0 and finite, as ScorerRef validated)."""
        field = f"profile.scorers[{i}].ref"
        return self._resolve(plugins, ref.ref, field, ExtensionPoint.SCORER, protocols), ref.weight


def _one_picker(picker: str | tuple[str, ...] | None) -> str:
    if picker is None or picker == ():
        raise PluginError("profile.picker: missing; a profile has exactly one picker")
    if isinstance(picker, tuple):
        if len(picker) > 1:
            raise PluginError(
                f"profile.picker: {len(picker)} pickers ({', '.join(picker)}); "
                "a profile has exactly one picker"
            )
        return picker[0]
    return picker


# ---------------------------------------------------------------------------- built-ins


def default_registry() -> PluginRegistry:
    """A fresh registry holding the built-in generic plugins (pickers, allow-list filter)."""
    registry = PluginRegistry()
    registry.register(max_score.TYPE_NAME, max_score.Params, max_score.build)
    registry.register(
        weighted_random.TYPE_NAME, weighted_random.Params, weighted_random.WeightedRandomPicker
    )
    registry.register(power_of_two.TYPE_NAME, power_of_two.Params, power_of_two.PowerOfTwoPicker)
    registry.register(random_pick.TYPE_NAME, random_pick.Params, random_pick.RandomPicker)
    registry.register(allow_list.TYPE_NAME, allow_list.Params, allow_list.AllowListFilter)
    registry.register_vocabulary_aliases()
    return registry
