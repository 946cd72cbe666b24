"""Region choice: residency verdict → routing profile → region, fallbacks and reasons.

Sans-io and synchronous (ARCHITECTURE §3): :meth:`GlobalRouter.decide` is a function of
the request, the client's location and an immutable :class:`GlobalView`.

**Residency first.** The policies engine gives the allowed set for (tenant, model, data
class, client country); an empty set is a refusal (HTTP 451) before any scoring. The
profile's mandatory ``residency-filter`` then keeps only allowed regions, so neither the
choice nor any fallback can be outside the set.

**Decision cache.** A cold decision over tens of regions is most of the global tier's
latency budget (bench/global_decision.py measures both). A decision depends only on the
view, the client's geo cell, the
allowed set, the model, the tenant (affinity), the prompt size and — for the spread
picker's draw — the request id, so decisions are cached per view revision under
``(cell, allowed, model, tenant, token bucket, spread slot)``:

* the prompt size enters as its power-of-two bucket (its own-prefill term changes by
  at most 2× inside one — a few ms against RTT differences of tens of ms) — or not at
  all when every surviving region has the same per-token prefill time (the same GPU
  type everywhere): a prompt then adds the same time to every region's cost, the TTFT
  scores compare cost differences, and the choice holds for any size (up to float
  rounding); the predicted TTFT is worked out per request from the chosen region's
  prompt-independent cost (:func:`global_lb.plugins.ttft.with_prompt`, as on a miss);
* the request id enters as one of :data:`SPREAD_SLOTS` slots, so when the spread picker
  splits a cell's traffic, it does so in sixteenths instead of per request.

A new view revision (a summary published, a health change, a new policy) starts an
empty cache. ``cache_size=0`` turns caching off (every decision is computed).

**The runner.** A cache miss runs the profile on the core runner
(:class:`gtm.routing.Runner`) over a :class:`~global_lb.batch.RegionBatch`, taking the
tier's fast paths when the profile's plugins declare them (:mod:`global_lb.pipeline`).
The trace is not built on a decision: :attr:`RouteOutcome.trace` asks the runner's
outcome when first read (``gtm route``, ``POST /v1/route``), so forwarding a request
never pays for it; nor for ordering the survivors (:class:`global_lb.ranking.Ranking`:
``scores`` and ``fallbacks`` are worked out when read, and :meth:`RouteOutcome.targets`
selects the few retries the front door needs without ordering the rest).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, NamedTuple

from global_lb.batch import GlobalCap, Layout, RegionBatch
from global_lb.geo import Location
from global_lb.pipeline import ChoiceState
from global_lb.plugins import affinity, ttft
from global_lb.profiles import RegionProfile
from global_lb.ranking import NO_RANKING, Ranking
from global_lb.view import GlobalView, RegionState, RequestContext
from gtm.errors import ConfigError, NoEligibleCandidate
from gtm.models import DecisionTrace, GeoPoint, RouteRequest
from gtm.policy_store import ActivePolicy
from gtm.routing import Outcome, ProfileSpec, capabilities_of
from policies import ResidencyQuery, Verdict

log = logging.getLogger(__name__)

#: Slots a cell's traffic is split into when the spread picker spreads it (see above).
SPREAD_SLOTS = 16
#: Decisions kept per view revision; a full cache is cleared (a new revision clears it
#: about once a second anyway, when regional LBs publish their summaries).
DEFAULT_CACHE_SIZE = 65_536
#: Prompt sizes are bucketed by powers of two above this many tokens.
_TOKEN_QUANTUM = 64


class Refusal(StrEnum):
    """Why no region was chosen; each maps to one HTTP status."""

    RESIDENCY = "residency"  # 451: no region may serve this request
    NO_AVAILABLE_REGION = "no-available-region"  # 503: allowed regions are all down/drained
    MODEL_NOT_SERVED = "model-not-served"  # 404: no allowed region serves the model


HTTP_STATUS: Mapping[Refusal, int] = {
    Refusal.RESIDENCY: 451,
    Refusal.NO_AVAILABLE_REGION: 503,
    Refusal.MODEL_NOT_SERVED: 404,
}


class TraceSource:
    """A decision's trace: given, or built on first read by running the routing profile
    over the same request, view and context (the fast path builds none).

    Memoised: several outcomes (cache hits) share one source, and the profile runs at
    most once for it. The view and the request are immutable, so a later run sees what
    the decision saw.
    """

    __slots__ = ("_build", "_trace")

    def __init__(
        self,
        trace: DecisionTrace | None = None,
        build: Callable[[], DecisionTrace | None] | None = None,
    ) -> None:
        self._trace = trace
        self._build = build

    def get(self) -> DecisionTrace | None:
        build = self._build
        if build is not None:
            self._trace = build()
            self._build = None
        return self._trace


class RerunTrace(TraceSource):
    """A decision's trace source: on first read, the profile decides again over the
    same request, view and context (the same choice: decisions are deterministic) and
    its outcome builds the trace.

    Keeps what the decision read, in slots, not its outcome nor its context: every cold
    decision keeps one in the decision cache, and those are objects the cyclic garbage
    collector would walk. Not a closure, for the same reason."""

    __slots__ = ("_country", "_layout", "_point", "_profile", "_request", "_verdict", "_view")

    def __init__(
        self,
        profile: RegionProfile,
        layout: Layout,
        request: RouteRequest,
        view: GlobalView,
        verdict: Verdict,
        point: GeoPoint | None,
        country: str | None,
    ) -> None:
        # TraceSource.__init__'s fields set here: one call less per cold decision.
        self._trace = None
        self._build = None
        self._profile = profile
        self._layout = layout
        self._request = request
        self._view: GlobalView | None = view  # None once built
        self._verdict = verdict
        self._point = point
        self._country = country

    def get(self) -> DecisionTrace | None:
        view = self._view
        if view is not None:
            verdict = self._verdict
            batch = RegionBatch(
                self._layout, self._request, view, verdict.allowed, self._point,
                self._country, verdict.rule or "",
            )  # fmt: skip
            try:
                self._trace = self._profile.decide(batch).to_decision().trace
            except NoEligibleCandidate as exc:  # pragma: no cover - it chose before
                self._trace = exc.trace
            self._view = None
        return self._trace


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """One region decision: where to go, where to go next, and why."""

    decision_id: str
    region: str | None
    verdict: Verdict
    refusal: Refusal | None = None
    #: Human-readable detail of a refusal (the filter that emptied the set and why).
    detail: str = ""
    #: Where :attr:`trace` comes from (built on first read after a fast-path decision).
    trace_source: TraceSource | None = field(default=None, repr=False, compare=False)
    predicted_ttft_ms: float | None = None
    #: The survivors in order (:attr:`scores`, :attr:`fallbacks`): worked out when read.
    ranking: Ranking = field(default=NO_RANKING, repr=False, compare=False)
    cached: bool = False
    location: Location | None = None
    view_revision: str = ""

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """Other surviving regions, best first: where retries go (all inside ``allowed``)."""
        return self.ranking.fallbacks

    @property
    def scores(self) -> tuple[tuple[str, float], ...]:
        """(region, total score) of the survivors, best first."""
        return self.ranking.scores

    def targets(self, attempts: int) -> tuple[str, ...]:
        """The region then its first fallbacks, ``attempts`` in all (where a request is
        forwarded and retried): orders only as many survivors as that needs."""
        if self.region is None or attempts <= 0:
            return ()
        return (self.region, *self.ranking.head(attempts - 1))

    @property
    def trace(self) -> DecisionTrace | None:
        """Who removed what and every survivor's scores (``None`` for a residency
        refusal, decided before any profile runs)."""
        return None if self.trace_source is None else self.trace_source.get()

    @property
    def allowed(self) -> tuple[str, ...]:
        return tuple(sorted(self.verdict.allowed))

    @property
    def reasons(self) -> tuple[str, ...]:
        """Reason codes: the residency verdict's, then the refusal or the choice's."""
        codes = [f"residency:{self.verdict.reason.value}"]
        if self.refusal is not None:
            codes.append(f"refused:{self.refusal.value}")
        elif self.region is not None and self.ranking.best not in (None, self.region):
            codes.append("spread")
        return tuple(codes)

    @property
    def http_status(self) -> int:
        return 200 if self.refusal is None else HTTP_STATUS[self.refusal]

    def to_json(self) -> dict[str, Any]:
        """The ``POST /v1/route`` answer (and ``gtm route --json``)."""
        location = self.location
        return {
            "decision_id": self.decision_id,
            "region": self.region,
            "fallbacks": list(self.fallbacks),
            "allowed": list(self.allowed),
            "reasons": list(self.reasons),
            "refusal": None if self.refusal is None else self.refusal.value,
            "detail": self.detail,
            "residency": {
                "reason": self.verdict.reason.value,
                "rule": self.verdict.rule,
                "denied_by": list(self.verdict.denied_by),
                "assumed_jurisdiction": self.verdict.assumed_jurisdiction,
            },
            "scores": [{"region": r, "total": round(t, 6)} for r, t in self.scores],
            "predicted_ttft_ms": self.predicted_ttft_ms,
            "client": None
            if location is None
            else {
                "country": location.country,
                "location": None
                if location.point is None
                else {"lat": location.point.lat, "lon": location.point.lon},
                "network": str(location.network),
                "source": location.source.value,
            },
            "cached": self.cached,
            "view_revision": self.view_revision,
            "trace": None if self.trace is None else trace_json(self.trace),
        }


#: RouteOutcome's slots in field order, each slot's setter (what the frozen dataclass's
#: ``__init__`` calls through ``object.__setattr__``, with keyword parsing around it).
_OUTCOME_SETTERS = tuple(getattr(RouteOutcome, f.name).__set__ for f in fields(RouteOutcome))


def _outcome(
    decision_id: str,
    region: str | None,
    verdict: Verdict,
    refusal: Refusal | None,
    detail: str,
    trace_source: TraceSource | None,
    predicted_ttft_ms: float | None,
    ranking: Ranking,
    cached: bool,
    location: Location | None,
    view_revision: str,
) -> RouteOutcome:
    """``RouteOutcome(...)`` with every field given, in field order: one per decision,
    so built through the slot setters directly (the keyword call parses its arguments
    each time; the dataclass has no ``__post_init__`` to skip).
    tests/unit/global_lb/test_router.py checks it against the constructor."""
    outcome = object.__new__(RouteOutcome)
    (
        set_decision_id,
        set_region,
        set_verdict,
        set_refusal,
        set_detail,
        set_trace_source,
        set_predicted_ttft_ms,
        set_ranking,
        set_cached,
        set_location,
        set_view_revision,
    ) = _OUTCOME_SETTERS
    set_decision_id(outcome, decision_id)
    set_region(outcome, region)
    set_verdict(outcome, verdict)
    set_refusal(outcome, refusal)
    set_detail(outcome, detail)
    set_trace_source(outcome, trace_source)
    set_predicted_ttft_ms(outcome, predicted_ttft_ms)
    set_ranking(outcome, ranking)
    set_cached(outcome, cached)
    set_location(outcome, location)
    set_view_revision(outcome, view_revision)
    return outcome


def trace_json(trace: DecisionTrace) -> dict[str, Any]:
    return {
        "profile": trace.profile,
        "candidates": list(trace.candidates),
        "filters": [
            {
                "plugin": f.plugin,
                "removed": [{"region": cid, "why": why} for cid, why in f.reasons],
                "remaining": f.remaining,
            }
            for f in trace.filters
        ],
        "weights": [{"scorer": s, "weight": w} for s, w in trace.weights],
        "scores": [
            {
                "region": s.candidate,
                "scores": {name: round(v, 6) for name, v in s.scores},
                "total": round(s.total, 6),
            }
            for s in trace.scores
        ],
        "picker": trace.picker,
    }


def cell_of(point: GeoPoint | None, country: str | None) -> tuple[str | None, int, int] | None:
    """The geo cell decisions are cached and precomputed for: the country and a
    0.5° × 0.5° square (≤ 56 km across, ≤ 0.8 ms of modelled RTT)."""
    if point is None:
        return None if country is None else (country, 1000, 1000)
    return (country, round(point.lat * 2.0), round(point.lon * 2.0))


def token_bucket(tokens: int) -> int:
    return (tokens // _TOKEN_QUANTUM).bit_length()


def spread_slot(request_id: str) -> int:
    return zlib.crc32(request_id.encode()) % SPREAD_SLOTS


#: A cache entry saying "this key's decisions are randomised: look up per spread slot".
_PER_SLOT: Any = object()
#: Entries under a key without the prompt size: "look up per token bucket" or "the
#: choice does not depend on the prompt size: look up under bucket ``None``".
_PER_BUCKET: Any = object()
_ANY_SIZE: Any = object()


@dataclass(slots=True)
class _Cache:
    revision: object = None
    entries: dict[tuple[object, ...], _Cached] = field(default_factory=dict)


#: Verdicts remembered per policy generation (tenant × model × data class × country).
_VERDICT_MEMO_SIZE = 65_536


@dataclass(slots=True)
class _VerdictMemo:
    engine: object
    entries: dict[tuple[str, str, str, str | None], Verdict] = field(default_factory=dict)


class _Cached(NamedTuple):
    """A cached decision (a NamedTuple: built in C, one per cold decision)."""

    region: str | None
    refusal: Refusal | None
    detail: str
    trace: TraceSource
    predicted_ttft_ms: float | None
    ranking: Ranking
    #: Whether the picker drew at random among the best (the spread picker).
    spread: bool = False
    #: The choice holds for any prompt size (pipeline.ChoiceState.per_token); the
    #: predicted TTFT is then worked out per request from the chosen region's
    #: prompt-independent cost.
    per_token: float | None = None
    fixed: float = 0.0

    def predicted(self, tokens: int) -> float | None:
        per_token = self.per_token
        if per_token is None or self.predicted_ttft_ms is None:
            return self.predicted_ttft_ms
        return ttft.prediction(ttft.with_prompt(self.fixed, per_token, tokens))


#: Builds a router's profile from a policy set in force (``GlobalRouter(follow=...)``):
#: the profile and the spec it was built from. Raises :class:`gtm.errors.ConfigError`
#: for a profile this tier cannot run.
ProfileSource = Callable[[ActivePolicy], tuple[RegionProfile, ProfileSpec]]


class GlobalRouter:
    """Chooses regions with a routing profile, over views, with a per-view cache.

    ``profile`` must be built from ``spec`` (``profiles.build``). ``fast_path=False``
    runs its reference (no fast paths) on every cache miss, what the fast paths are
    checked against.

    ``follow``: the profile comes from the policy in force. When a view carries another
    policy generation (a hot reload: ``gtm policy apply``), the router asks ``follow``
    for that policy's profile before deciding over it, and swaps it in if its spec
    differs (the decision cache starts afresh). A profile that cannot be built is
    logged and the one in force stays — as the regional tier does.
    """

    def __init__(
        self,
        profile: RegionProfile,
        spec: ProfileSpec,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        timer: Callable[[], float] = time.perf_counter,
        fast_path: bool = True,
        follow: ProfileSource | None = None,
    ) -> None:
        self._fast_path = fast_path
        self._follow = follow
        #: The policy the profile was last checked against (``None``: not yet).
        self._followed: ActivePolicy | None = None
        self._cache_size = cache_size
        self._verdicts = _VerdictMemo(None)
        self._revision: tuple[object, str] = (None, "")
        self._timer = timer
        self._install(profile, spec)

    def _install(self, profile: RegionProfile, spec: ProfileSpec) -> None:
        self._profile = profile if self._fast_path else profile.reference()
        self._spec = spec
        homes = [
            ws.scorer
            for ws in profile.scorers
            if isinstance(ws.scorer, affinity.TenantAffinityScorer)
        ]
        # The tenant enters the cache key only when a scorer depends on it (affinity)...
        self._per_tenant = bool(homes)
        # ... and the conversation (first prefix block) when it keys homes by conversation.
        self._per_conversation = any(home.per_conversation for home in homes)
        self._layout: Layout | None = None
        self._layout_view: GlobalView | None = None
        self._cache = _Cache()

    def _follow_policy(self, policy: ActivePolicy) -> None:
        """Swap in ``policy``'s profile if it differs from the one in force."""
        self._followed = policy
        if self._follow is None:
            return
        try:
            profile, spec = self._follow(policy)
        except ConfigError as exc:
            log.error(
                "policy generation %d: routing profile not applied; keeping %r: %s",
                policy.generation,
                self._spec.name,
                exc,
            )
            return
        if spec != self._spec:
            log.info(
                "policy generation %d: routing profile %r swapped in", policy.generation, spec.name
            )
            self._install(profile, spec)

    @property
    def profile(self) -> RegionProfile:
        return self._profile

    @property
    def spec(self) -> ProfileSpec:
        """The spec of the profile in force."""
        return self._spec

    @property
    def fast_paths(self) -> tuple[str, ...]:
        """The fast paths the profile takes (none: its plugins decide one by one)."""
        return self._profile.fast_paths

    def verdict(self, request: RouteRequest, view: GlobalView, country: str | None) -> Verdict:
        # The engine memoises verdicts by ResidencyQuery, but building and hashing that
        # dataclass costs more than the rest of a cached decision: remember them here
        # by a plain tuple, per engine (a policy generation).
        engine = view.policy.engine
        memo = self._verdicts
        if memo.engine is not engine:
            memo = self._verdicts = _VerdictMemo(engine)
        key = (request.tenant, request.model, request.data_class, country)
        found = memo.entries.get(key)
        if found is None:
            found = engine.allowed_regions(ResidencyQuery(*key))
            if len(memo.entries) >= _VERDICT_MEMO_SIZE:
                memo.entries.clear()
            memo.entries[key] = found
        return found

    def decide(
        self,
        request: RouteRequest,
        view: GlobalView,
        location: Location | None = None,
        *,
        verdict: Verdict | None = None,
    ) -> RouteOutcome:
        """Choose a region for ``request`` from ``location`` over ``view``.

        ``location`` defaults to what ``request.client`` says (country and point).
        Never raises for a refusal: the outcome says why (``outcome.refusal``).
        """
        if view.policy is not self._followed:
            self._follow_policy(view.policy)
        point = location.point if location is not None else request.client.location
        country = location.country if location is not None else request.client.country
        if verdict is None:
            verdict = self.verdict(request, view, country)
        revision = self._revision_text(view)
        if verdict.refused:
            return RouteOutcome(
                decision_id=request.request_id,
                region=None,
                verdict=verdict,
                refusal=Refusal.RESIDENCY,
                detail=verdict.explain(),
                location=location,
                view_revision=revision,
            )
        cached, hit = self._cached(request, view, verdict, point, country)
        return _outcome(
            request.request_id,
            cached.region,
            verdict,
            cached.refusal,
            cached.detail,
            cached.trace,
            cached.predicted(request.input_tokens) if hit else cached.predicted_ttft_ms,
            cached.ranking,
            hit,
            location,
            revision,
        )

    def _revision_text(self, view: GlobalView) -> str:
        """``snapshot.policy.health`` of ``view``, formatted once per view revision."""
        last = self._revision
        if last[0] is not view.revision:
            rev = view.revision
            last = self._revision = (rev, f"{rev.snapshot}.{rev.policy}.{rev.health}")
        return last[1]

    def _cached(
        self,
        request: RouteRequest,
        view: GlobalView,
        verdict: Verdict,
        point: GeoPoint | None,
        country: str | None,
    ) -> tuple[_Cached, bool]:
        if self._cache_size <= 0:
            return self._run(request, view, verdict, point, country), False
        cache = self._cache
        if cache.revision is not view.revision:
            cache = self._cache = _Cache(view.revision)
        head: tuple[object, ...] = (
            cell_of(point, country),
            verdict.allowed,
            request.model,
            affinity.affinity_key(request, per_conversation=self._per_conversation)
            if self._per_tenant
            else None,
        )
        sizing = cache.entries.get(head)
        bucket = None if sizing is _ANY_SIZE else token_bucket(request.input_tokens)
        key = (*head, bucket)
        found = cache.entries.get(key)
        if found is _PER_SLOT:
            key = (*key, spread_slot(request.request_id))
            found = cache.entries.get(key)
        if found is not None:
            return found, True
        found = self._run(request, view, verdict, point, country)
        if len(cache.entries) >= self._cache_size:
            cache.entries.clear()
        if sizing is None or head not in cache.entries:  # the first decision of ``head``
            # Whether it depends on the prompt size is a property of the survivors (their
            # per-token times), the same for every client of the key.
            any_size = found.per_token is not None
            cache.entries[head] = _ANY_SIZE if any_size else _PER_BUCKET
            key = (*head, None if any_size else token_bucket(request.input_tokens))
        if len(key) == 5 and found.spread:
            cache.entries[key] = _PER_SLOT
            key = (*key, spread_slot(request.request_id))
        cache.entries[key] = found
        return found, False

    def _layout_of(self, view: GlobalView) -> Layout:
        layout = self._layout
        last = self._layout_view
        if layout is None or last is not view:
            since = view.since  # an overlay of the last view: the same regions
            if layout is None or last is None or since is None or since[0] is not last.revision:
                layout = self._layout = Layout.of(view, layout)
            self._layout_view = view
        return layout

    def _run(
        self,
        request: RouteRequest,
        view: GlobalView,
        verdict: Verdict,
        point: GeoPoint | None,
        country: str | None,
    ) -> _Cached:
        # The last view's layout without a call: a cold decision is a few dozen calls.
        layout = self._layout
        if layout is None or self._layout_view is not view:
            layout = self._layout_of(view)
        batch = RegionBatch(
            layout, request, view, verdict.allowed, point, country, verdict.rule or ""
        )
        try:
            outcome = self._profile.decide(batch)
        except NoEligibleCandidate as exc:
            refusal = self._refusal_of(exc.filter_name)
            if refusal is Refusal.MODEL_NOT_SERVED and _listed(view, verdict, request.model):
                # An allowed region lists the model with no healthy GPU now (all down,
                # or their scrapes lapsed): unavailable, retryable — not an unknown model.
                refusal = Refusal.NO_AVAILABLE_REGION
            return _Cached(None, refusal, str(exc), TraceSource(exc.trace), None, NO_RANKING)
        trace = RerunTrace(self._profile, layout, request, view, verdict, point, country)
        state = batch.state
        if type(state) is ChoiceState:  # the fast path's state is the ranking
            return _Cached(
                batch.ids[outcome.choice], None, "", trace, outcome.predicted_ttft_ms, state,
                batch.spread, state.per_token, state.fixed,
            )  # fmt: skip
        return _cached_of(outcome, trace)

    def _refusal_of(self, filter_name: str) -> Refusal:
        for plugin in self._profile.filters:
            if plugin.name == filter_name:
                capabilities = capabilities_of(plugin)
                if GlobalCap.RESIDENCY in capabilities:
                    return Refusal.RESIDENCY
                if GlobalCap.SERVES_MODEL in capabilities:
                    return Refusal.MODEL_NOT_SERVED
        return Refusal.NO_AVAILABLE_REGION

    def choose_region(
        self, request: RouteRequest, view: GlobalView, ctx: RequestContext
    ) -> RegionState | None:
        """Run the profile without residency lookup or cache (DNS answers build their
        own context); ``None`` when every region was filtered out."""
        if view.policy is not self._followed:
            self._follow_policy(view.policy)
        try:
            outcome = self._profile.decide(RegionBatch.of(self._layout_of(view), request, ctx))
        except NoEligibleCandidate:
            return None
        return view.regions[outcome.choice]


def _cached_of(outcome: Outcome[RegionBatch], trace: TraceSource) -> _Cached:
    """A decision the plugins made one by one (no fast path's ranking): the survivors'
    totals, in position order."""
    batch = outcome.batch
    region = batch.ids[outcome.choice]
    survivors = batch.survivors.tolist()
    totals = outcome.totals[survivors].tolist()
    names = tuple([batch.ids[i] for i in survivors])
    best = min(range(len(names)), key=lambda k: (-totals[k], names[k]))
    ranking = Ranking(names, totals, best, survivors.index(outcome.choice))
    return _Cached(region, None, "", trace, outcome.predicted_ttft_ms, ranking, batch.spread)


def _listed(view: GlobalView, verdict: Verdict, model: str) -> bool:
    """Whether a region the verdict allows lists ``model`` in its summary (with or
    without a healthy GPU for it)."""
    return any(
        region.id in verdict.allowed and region.terms.get(model) is not None
        for region in view.regions
    )
