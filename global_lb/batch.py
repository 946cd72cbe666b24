"""The global tier's data layout for the core runner: one decision's regions by position,
and the per-view work its plugins share.

A :class:`RegionBatch` is what :class:`gtm.routing.Runner` decides over: the view's
regions by position (view order; ``build_view`` lists them by id), the request and its
:class:`~global_lb.view.RequestContext` (the residency verdict's allowed set, the
client). Besides the runner's numpy ``alive`` mask, the global tier writes a set of
positions as a Python int (bit i: position i): a view has tens of regions, so a set is
one or two machine words that Python ANDs, hashes and memoises faster than numpy builds
an array, and a decision's filters are a few ANDs of masks prepared per view.

:class:`Layout` holds what depends on the region ids alone (the positions, ids and numpy
arrays of a mask, the mask of an allowed set); successive views over the same regions
(the in-flight ledger's overlays, new summaries) share it. :class:`PerModel` is a
plugin's per-view column, one entry per region and model, worked out on first use; a
view that differs from the previous one in a few regions (an overlay) patches those
entries instead of redoing all (:func:`changed_positions`; an overlay names them).

:class:`GlobalCap` lists what the global tier's fast paths read from a plugin's class
(:mod:`global_lb.pipeline`); :class:`MaskFilter` is the filters' shared form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import ClassVar, Generic, TypeVar

import numpy as np

from global_lb.view import GlobalView, RegionState, RequestContext
from gtm.models import GeoPoint, RouteRequest
from gtm.routing import Batch, Plugin, Removal
from gtm.routing.framework import Bools, Ints

E = TypeVar("E")
R = TypeVar("R")
K = TypeVar("K")
V = TypeVar("V")

#: Masks, allowed sets and per-model columns remembered per layout or view; a view lives
#: about a second and sees a handful of each, so the bound only stops a pathological
#: policy from growing them.
MEMO_SIZE = 4096


class GlobalCap(StrEnum):
    """What a global plugin's class offers the tier's fast paths (``capabilities``)."""

    #: A :class:`MaskFilter`: what it keeps is a bit mask (``kept``).
    MASK_FILTER = "mask-filter"
    #: A filter that enforces residency (every global profile runs one; a refusal by it
    #: is HTTP 451).
    RESIDENCY = "residency"
    #: A filter of unavailable regions (a refusal by it is HTTP 503).
    AVAILABILITY = "availability"
    #: A filter of regions that do not serve the model (a refusal by it is HTTP 404).
    SERVES_MODEL = "serves-model"
    #: A scorer with a survivor form (``survivor_scores(batch, positions)``).
    SURVIVOR_SCORES = "survivor-scores"
    #: The ``ttft-scorer``: its scale is ``scale_ms`` (the fused TTFT + load total).
    TTFT_SCORE = "ttft-score"
    #: The ``load-scorer``: scores are the regions' headroom.
    HEADROOM_SCORE = "headroom-score"
    #: The ``headroom-spread-picker``: ``spreads`` and ``draw`` over survivors.
    HEADROOM_SPREAD = "headroom-spread"


def remember(memo: dict[K, V], key: K, value: V) -> V:
    """``memo[key] = value`` (a full memo is emptied first), and the value."""
    if len(memo) >= MEMO_SIZE:
        memo.clear()
    memo[key] = value
    return value


class Layout:
    """Functions of a view's region ids: masks, positions, ids and arrays of them."""

    __slots__ = (
        "_allowed",
        "_arrays",
        "_names",
        "_positions",
        "_removed",
        "all_true",
        "full",
        "id_ordered",
        "ids",
    )

    def __init__(self, ids: tuple[str, ...]) -> None:
        self.ids = ids
        #: Every position's bit.
        self.full = (1 << len(ids)) - 1
        #: The ids ascend: the first of equal totals is the smallest id.
        self.id_ordered = list(ids) == sorted(ids)
        self._allowed: dict[frozenset[str], int] = {}
        self._positions: dict[int, tuple[int, ...]] = {}
        self._names: dict[int, tuple[str, ...]] = {}
        self._arrays: dict[int, tuple[Bools, Ints]] = {}
        self._removed: dict[int, Bools] = {}
        #: The all-true alive mask every batch starts from (shared, read only: the
        #: runner replaces a batch's mask, never writes it).
        self.all_true = np.ones(len(ids), dtype=np.bool_)
        self.all_true.flags.writeable = False

    @classmethod
    def of(cls, view: GlobalView, previous: Layout | None) -> Layout:
        """``previous`` when ``view`` has its ids in its order, else a new one."""
        regions = view.regions
        if previous is not None and len(previous.ids) == len(regions):
            ids = previous.ids
            if all(r.id == rid for r, rid in zip(regions, ids, strict=True)):
                return previous
        return cls(tuple(r.id for r in regions))

    def allowed_mask(self, allowed: frozenset[str]) -> int:
        found = self._allowed.get(allowed)
        if found is None:
            found = 0
            for i, rid in enumerate(self.ids):
                if rid in allowed:
                    found |= 1 << i
            remember(self._allowed, allowed, found)
        return found

    def positions(self, mask: int) -> tuple[int, ...]:
        """The set bits of ``mask``, ascending (view order)."""
        found = self._positions.get(mask)
        if found is None:
            found = tuple(i for i in range(len(self.ids)) if mask >> i & 1)
            remember(self._positions, mask, found)
        return found

    def names(self, mask: int) -> tuple[str, ...]:
        """The ids of :meth:`positions`."""
        found = self._names.get(mask)
        if found is None:
            ids = self.ids
            found = tuple([ids[i] for i in self.positions(mask)])
            remember(self._names, mask, found)
        return found

    def arrays(self, mask: int) -> tuple[Bools, Ints]:
        """``mask`` as the runner's alive array and its survivors (shared: read only)."""
        found = self._arrays.get(mask)
        if found is None:
            alive = np.zeros(len(self.ids), dtype=np.bool_)
            survivors = np.array(self.positions(mask), dtype=np.intp)
            alive[survivors] = True
            alive.flags.writeable = False
            survivors.flags.writeable = False
            found = remember(self._arrays, mask, (alive, survivors))
        return found

    def removed(self, kept: int) -> Bools:
        """The positions ``kept`` lacks, as a filter's removal mask (shared: read only)."""
        found = self._removed.get(kept)
        if found is None:
            found = ~self.arrays(kept)[0]
            found.flags.writeable = False
            remember(self._removed, kept, found)
        return found


def bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def changed_positions(old: GlobalView, new: GlobalView) -> int | None:
    """The positions whose region differs between two views of the same regions in the
    same order (bit mask), or None when they list other regions."""
    since = new.since
    if since is not None and since[0] is old.revision:
        return since[1]
    before, after = old.regions, new.regions
    if len(before) != len(after):
        return None
    changed = 0
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        if a is not b:
            if a.id != b.id:
                return None
            changed |= 1 << i
    return changed


class PerModel(Generic[E, R]):
    """A plugin's per-view work: per model, ``entry(region, model)`` of each region and
    what ``derive`` makes of them, worked out on first use; entries of regions that did
    not change since ``previous`` (the view before) are taken from it, and with
    ``patch`` (``patch(previous result, entries, changed positions)``) so is the result."""

    __slots__ = ("_derive", "_entries", "_entry", "_found", "_patch", "changed", "parent", "view")

    def __init__(
        self,
        view: GlobalView,
        entry: Callable[[RegionState, str], E],
        derive: Callable[[tuple[E, ...]], R],
        previous: PerModel[E, R] | None = None,
        patch: Callable[[R, tuple[E, ...], int], R] | None = None,
    ) -> None:
        self.view = view
        self._entry = entry
        self._derive = derive
        self._patch = patch
        self._entries: dict[str, tuple[E, ...]] = {}
        self._found: dict[str, R] = {}
        changed = None if previous is None else changed_positions(previous.view, view)
        #: The view before (one level: its own parent is dropped) and what changed.
        self.parent = previous if changed is not None else None
        self.changed = changed or 0
        if previous is not None:
            previous.parent = None

    def get(self, model: str) -> R:
        found = self._found.get(model)
        if found is None:
            entries = self._entries.get(model)
            if entries is None:
                entries = remember(self._entries, model, self._entries_of(model))
            parent, patch = self.parent, self._patch
            inherited = None if parent is None else parent._found.get(model)
            if patch is None or inherited is None:
                found = remember(self._found, model, self._derive(entries))
            else:
                found = remember(self._found, model, patch(inherited, entries, self.changed))
        return found

    def _entries_of(self, model: str) -> tuple[E, ...]:
        regions, entry, parent = self.view.regions, self._entry, self.parent
        inherited = None if parent is None else parent._entries.get(model)
        if inherited is None:
            return tuple([entry(region, model) for region in regions])
        patched = list(inherited)
        for i in bits(self.changed):
            patched[i] = entry(regions[i], model)
        return tuple(patched)


class DecisionState:
    """What a fast path worked out for a decision, for what is asked after it."""

    __slots__ = ()

    def priced(self) -> Mapping[int, float] | None:
        """The TTFT cost it computed for its choice, by position (None: not computed)."""
        return None


class RegionBatch(Batch):
    """One region decision's working set (see the module docstring)."""

    __slots__ = (
        "allowed",
        "country",
        "layout",
        "mask",
        "model",
        "point",
        "rule",
        "spread",
        "state",
    )

    def __init__(
        self,
        layout: Layout,
        request: RouteRequest,
        view: GlobalView,
        allowed: frozenset[str],
        point: GeoPoint | None = None,
        country: str | None = None,
        rule: str = "",
    ) -> None:
        """``allowed``: the region ids residency allows (and ``rule``, the residency rule
        that allowed them); ``point``, ``country``: the client's (see
        :class:`~global_lb.view.RequestContext`)."""
        super().__init__(layout.ids, request, view, layout.all_true)
        self.layout = layout
        self.allowed = allowed
        self.point = point
        self.country = country
        self.rule = rule
        self.model = request.model
        #: The survivors as a bit mask, when a fast path filtered (else None).
        self.mask: int | None = None
        #: Whether the picker drew at random among the best (the spread picker).
        self.spread = False
        #: The choice fast path's survivors, totals and costs (else None).
        self.state: DecisionState | None = None

    @classmethod
    def of(cls, layout: Layout, request: RouteRequest, ctx: RequestContext) -> RegionBatch:
        """A batch over ``ctx``'s view for ``request`` in ``ctx``."""
        return cls(
            layout, request, ctx.view, ctx.allowed, ctx.client_point, ctx.client_country,
            ctx.residency_rule,
        )  # fmt: skip

    @property
    def regions(self) -> tuple[RegionState, ...]:
        view: GlobalView = self.view  # type: ignore[assignment]
        return view.regions

    @property
    def ctx(self) -> RequestContext:
        """The decision's context as one object (made when asked for)."""
        view: GlobalView = self.view  # type: ignore[assignment]
        return RequestContext(view, self.allowed, self.point, self.country, self.rule)

    def allowed_ids(self) -> frozenset[str]:
        """``allow-list-filter``'s ``from_context``: the residency verdict's set."""
        return self.allowed

    def survivor_mask(self) -> int:
        """The survivors as a bit mask (once the filters ran)."""
        mask = self.mask
        if mask is None:
            mask = 0
            for i in self.survivors.tolist():
                mask |= 1 << i
            self.mask = mask
        return mask


class MaskFilter(Plugin):
    """A filter whose survivors are a bit mask (:meth:`kept`): the runner's ``removes``
    is its complement, and the global fast path ANDs the masks of every such filter."""

    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({GlobalCap.MASK_FILTER})

    def kept(self, batch: RegionBatch, /) -> int:
        """The positions this filter keeps for the batch's request (any, not only alive):
        a function of the view, the allowed set and the model alone (the fast path
        remembers the survivors per view under those)."""
        raise NotImplementedError

    def reason(self, batch: RegionBatch, /) -> Callable[[int], str]:
        """Why a position it does not keep is removed."""
        raise NotImplementedError

    def removes(self, batch: RegionBatch, /) -> Removal | None:
        kept = self.kept(batch)
        layout = batch.layout
        if kept == layout.full:
            return None
        return Removal(layout.removed(kept), self.reason(batch))


def gather(column: Sequence[float], positions: Sequence[int]) -> list[float]:
    return [column[i] for i in positions]
