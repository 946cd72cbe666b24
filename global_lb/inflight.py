"""The global tier's in-flight ledger: what this replica sent to each region since that
region's last summary.

Region summaries are published about once a second and reach the global tier through
the state store, so every decision inside one second reads the same loads. Without a
correction, all of them go to the region that looked best when its summary was
published — a herd, the more so as the decision cache repeats the choice per client
cell. The regional tier solved the same problem for zones with its "unseen" ledger
(:class:`regional_lb.view.ZoneAccounting`, llm-d's router-local in-flight accounting in
spirit); this is its counterpart for regions:

* **charge** when a request is sent to a region (the front door, when it forwards; the
  simulator, when it hands a request to a regional LB): one request and its prompt
  tokens, by model;
* **reconcile** when a newer summary of that region arrives: charges made at or before
  its ``published_at`` are in its load now and are dropped; later ones stay;
* **expire** charges older than :attr:`LedgerSettings.expire_s` whatever the summaries
  say (a region whose summaries stopped must not pile up charges forever; by then the
  request has been prefilled or queued where the next summary will show it);
* **cancel** a charge whose forward failed (connection error, 5xx, a refusal): the
  region never took that request.

Scoring sees the charges through :meth:`InflightLedger.view`: an *overlay* of the global
view whose regions' :class:`~global_lb.view.ModelTerms` count the unseen requests as
waiting (headroom) and their prompt tokens as queued prefill (TTFT cost) — exactly what
the regional tier adds for zones. The overlay is an ordinary immutable
:class:`~global_lb.view.GlobalView` (its :class:`~global_lb.view.ViewRevision` carries
the ledger epoch), so the router's fast path, its generic profile, its decision cache
and traces all read the same numbers; the fast path == profile property holds on
overlays too (tests/property/test_global_fast_path.py).

**Resolution.** A new overlay resets the per-view caches (decision cache, the fast
path's per-view arrays), so a region's charges enter the overlay only once those not
yet shown reach :attr:`LedgerSettings.resolution_ms` of queueing or
:attr:`LedgerSettings.resolution_headroom` of its running capacity — each region at its
own resolution: a new overlay shows anew only the regions that got there (and those a
cancel, reconcile or expiry discharged), the others as the previous overlay showed
them. An overlay then differs from the previous one in a region or two, and the fast
path's per-view work carries over: the overlay names the positions that changed
(``GlobalView.since``), so the plugins patch those alone, and the memos of every client
whose allowed regions did not change carry over (bench/global_ledger.py measures it
against rebuilding every charged region whenever one got there). Every
region's unshown queueing stays under the resolution. The overlay is rebuilt in full
whenever the base view changes. ``resolution_ms=0`` shows every charge at once.

**Clocks.** Charges are stamped with the caller's wall-clock seconds (``now``), compared
with the summaries' ``published_at`` (the regional LB's wall clock). A request charged
just before a summary was published but still in transit is dropped as "seen" one
summary early; clock skew between tiers shifts that by the skew. Both errors last at
most one publish interval.

**DNS does not charge.** A DNS answer is cached by resolvers for its TTL and stands for
an unknown number of requests (a resolver hides its clients, and the global tier never
sees the requests that follow), and the responder decides once per client cell per view,
so a charge could not change the answers already handed out. The DNS profile's spread
picker spreads cells instead, and DNS-steered traffic reaches the regional LBs directly,
showing in their next summary. The responder reads the base view (an overlay per charge
would empty its per-view answer cache on every forwarded request).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from global_lb.view import ANY_MODEL, GlobalView, ModelTerms, RegionState, model_terms

#: Charges older than this are dropped even without a newer summary: the regional LBs
#: publish every second (regional_lb README), so 5 s is several missed publications.
DEFAULT_EXPIRE_S = 5.0
#: Unreflected queueing that triggers a new overlay: a quarter of the TTFT scorer's
#: 100 ms scale (global_lb.plugins.ttft), a score factor of e^-0.25 — against the ~1 s
#: of decisions a summary alone leaves blind. Measured: gtm's p99 TTFT in the 120-GPU
#: simulation was the same with 2 to 50 ms, while a new overlay per charge costs the
#: front door several decisions' worth (bench/global_ledger.py).
DEFAULT_RESOLUTION_MS = 25.0
#: Unreflected share of a region's running capacity that triggers a new overlay: 1 %
#: of the load scorer's and the spread picker's headroom.
DEFAULT_RESOLUTION_HEADROOM = 0.01


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    #: False: nothing is charged and decisions read the summaries alone (for A/B runs).
    enabled: bool = True
    expire_s: float = DEFAULT_EXPIRE_S
    resolution_ms: float = DEFAULT_RESOLUTION_MS
    resolution_headroom: float = DEFAULT_RESOLUTION_HEADROOM

    def __post_init__(self) -> None:
        if not (self.expire_s > 0 and self.resolution_ms >= 0 and self.resolution_headroom >= 0):
            raise ValueError(
                "ledger settings: expire_s must be > 0, resolutions >= 0; "
                f"got {self.expire_s}, {self.resolution_ms}, {self.resolution_headroom}"
            )


@dataclass(frozen=True, slots=True)
class Unseen:
    """What a region's last summary cannot know about yet, for one model."""

    requests: float = 0.0
    tokens: float = 0.0


@dataclass(slots=True)
class Charge:
    """One charge (a forwarded request, or a share of one); :meth:`InflightLedger.cancel`
    takes it back."""

    region: str
    model: str
    requests: float
    tokens: float
    at: float
    live: bool = True


class InflightLedger:
    """Charges per region and model since each region's last summary; builds overlays.

    Not thread-safe: the front door and the simulator call it from one thread (the event
    loop), between decisions, so no decision sees a half-applied change.
    """

    def __init__(self, settings: LedgerSettings | None = None) -> None:
        self._settings = settings or LedgerSettings()
        #: Per region, its live charges in the order they were made.
        self._charges: dict[str, deque[Charge]] = {}
        #: (region, model) -> [requests, tokens] of the live charges.
        self._totals: dict[tuple[str, str], list[float]] = {}
        #: region -> ``published_at`` of the summary last reconciled against.
        self._seen: dict[str, float] = {}
        self._base: GlobalView | None = None
        self._overlay: GlobalView | None = None
        self._epoch = 0
        #: Something changed that the overlay must show (charges past the resolution,
        #: a cancel, a reconcile, an expiry).
        self._stale = True
        #: Per region, charged since the overlay last showed it: [requests, tokens].
        self._pending: dict[str, list[float]] = {}
        #: Regions the next overlay shows anew (when the base view is the same): those
        #: whose pending charges reached the resolution, and those a cancel, reconcile
        #: or expiry discharged. The others keep what the previous overlay showed, so an
        #: overlay changes few regions and the router's decisions on the earlier one
        #: mostly stand (global_lb.router: decisions outlive a view in its lineage).
        self._due: set[str] = set()
        #: The base view the overlay was built on.
        self._built_on: GlobalView | None = None
        self._places: tuple[GlobalView, dict[str, int]] | None = None
        #: The oldest live charge's time (a lower bound; ∞: none): the front door asks
        #: for the view before every decision, and most of the time nothing expires.
        self._oldest = math.inf

    @property
    def settings(self) -> LedgerSettings:
        return self._settings

    # ------------------------------------------------------------------ charges

    def charge(
        self, region: str, model: str, input_tokens: float, now: float, requests: float = 1.0
    ) -> Charge:
        """Count ``requests`` of ``model`` with ``input_tokens`` prompt tokens (in all)
        as sent to ``region`` at wall time ``now``."""
        entry = Charge(region, model, float(requests), float(input_tokens), now)
        if not self._settings.enabled:
            entry.live = False
            return entry
        self._charges.setdefault(region, deque()).append(entry)
        self._oldest = min(self._oldest, now)
        self._add(entry, 1.0)
        pending = self._pending.setdefault(region, [0.0, 0.0])
        pending[0] += entry.requests
        pending[1] += entry.tokens
        if region not in self._due and self._material(region, pending):
            self._due.add(region)
            self._stale = True
        return entry

    def cancel(self, charge: Charge) -> None:
        """The region never took ``charge``'s request (the forward failed or was refused)."""
        if charge.live:
            charge.live = False
            self._add(charge, -1.0)
            self._due.add(charge.region)
            self._stale = True

    def unseen(self, region: str, model: str) -> Unseen:
        """Requests and prompt tokens of ``model`` charged to ``region`` and not yet in a
        summary (``model`` :data:`~global_lb.view.ANY_MODEL`: every model's)."""
        if model == ANY_MODEL:
            requests = tokens = 0.0
            for (rid, _), (r, t) in self._totals.items():
                if rid == region:
                    requests += r
                    tokens += t
            return Unseen(requests, tokens)
        found = self._totals.get((region, model))
        return Unseen() if found is None else Unseen(found[0], found[1])

    def reconcile(self, view: GlobalView, now: float) -> None:
        """Drop what ``view``'s newer summaries account for, and charges past expiry."""
        for region in view.regions:
            summary = region.summary
            if summary is None or self._seen.get(region.id) == summary.published_at:
                continue
            self._seen[region.id] = summary.published_at
            self._drop(region.id, summary.published_at)
        cutoff = now - self._settings.expire_s
        for region_id in list(self._charges):
            self._drop(region_id, cutoff, before=True)
        self._oldest = self._oldest_charge()

    def _oldest_charge(self) -> float:
        return min((charges[0].at for charges in self._charges.values()), default=math.inf)

    def _drop(self, region: str, until: float, *, before: bool = False) -> None:
        charges = self._charges.get(region)
        while charges and (charges[0].at < until if before else charges[0].at <= until):
            entry = charges.popleft()
            if entry.live:
                entry.live = False
                self._add(entry, -1.0)
                self._due.add(region)
                self._stale = True
        if charges is not None and not charges:
            del self._charges[region]

    def _add(self, entry: Charge, sign: float) -> None:
        key = (entry.region, entry.model)
        totals = self._totals.setdefault(key, [0.0, 0.0])
        totals[0] += sign * entry.requests
        totals[1] += sign * entry.tokens
        if totals[0] <= 1e-9 and totals[1] <= 1e-9:
            del self._totals[key]  # also clears float dust from adding and removing

    def _material(self, region: str, pending: list[float]) -> bool:
        """Whether ``pending`` charges on ``region`` move its terms past the resolution."""
        settings = self._settings
        base = self._base
        state = None if base is None else base.by_id.get(region)
        if state is None or state.summary is None:
            return False  # the overlay cannot show them: no load to add them to
        load = state.loads.get(ANY_MODEL)
        if load is None:
            return False
        rate, slots = load.prefill_tokens_per_s, load.max_running_requests
        queued = rate > 0.0 and 1000.0 * pending[1] / rate >= settings.resolution_ms
        return queued or (slots > 0 and pending[0] / slots >= settings.resolution_headroom)

    # ------------------------------------------------------------------ overlay

    def view(self, base: GlobalView, now: float) -> GlobalView:
        """``base`` with the unseen charges added to its regions' terms (``base`` itself
        when nothing is charged). Reconciles with ``base`` first when it is new."""
        if not self._settings.enabled:
            return base
        if base is not self._base:
            self._base = base
            self._stale = True
            self.reconcile(base, now)
        else:
            self._expire(now)
        if not self._stale and self._overlay is not None:
            return self._overlay
        self._stale = False
        self._overlay = self._build(base)
        return self._overlay

    def _expire(self, now: float) -> None:
        cutoff = now - self._settings.expire_s
        if self._oldest >= cutoff:
            return  # nothing is old enough (the usual case)
        for region_id in list(self._charges):
            charges = self._charges[region_id]
            if charges and charges[0].at < cutoff:
                self._drop(region_id, cutoff, before=True)
        self._oldest = self._oldest_charge()

    def _build(self, base: GlobalView) -> GlobalView:
        charged = {rid for rid, _ in self._totals}
        previous, due = self._overlay, self._due
        self._due = set()
        same_base = previous is not None and self._built_on is base
        self._built_on = base
        if same_base:
            # Same summaries: only the regions due are shown anew.
            for rid in due:
                self._pending.pop(rid, None)
        else:
            self._pending.clear()
        if not charged:
            return base
        since = None
        if same_base:
            assert previous is not None
            # The previous overlay's regions, the due ones shown anew; which positions
            # changed goes with the overlay (per-view work is patched, not redone).
            shown = list(previous.regions)
            changed = 0
            for rid in due:
                i = self._positions(base).get(rid)
                if i is not None:
                    state = self._state(base.regions[i], charged)
                    if state is not shown[i]:
                        shown[i] = state
                        changed |= 1 << i
            regions = tuple(shown)
            since = (previous.revision, changed)
        else:
            regions = tuple(self._state(r, charged) for r in base.regions)
        self._epoch += 1
        return base.overlay(regions, self._epoch, since)

    def _positions(self, base: GlobalView) -> Mapping[str, int]:
        """Each region's position in ``base`` (remembered for the base in use)."""
        found = self._places
        if found is None or found[0] is not base:
            found = self._places = (base, {r.id: i for i, r in enumerate(base.regions)})
        return found[1]

    def _state(self, state: RegionState, charged: set[str]) -> RegionState:
        if state.id not in charged or state.summary is None:
            return state
        return self._charged_state(state)

    def _charged_state(self, state: RegionState) -> RegionState:
        terms: dict[str, ModelTerms] = {}
        for model, load in state.loads.items():
            unseen = self.unseen(state.id, model)
            if unseen.requests == 0.0 and unseen.tokens == 0.0:
                terms[model] = state.terms[model]
            else:
                terms[model] = model_terms(load, unseen.requests, unseen.tokens)
        return state.with_terms(MappingProxyType(terms))


__all__ = [
    "DEFAULT_EXPIRE_S",
    "Charge",
    "InflightLedger",
    "LedgerSettings",
    "Unseen",
]
