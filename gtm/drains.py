"""What a drain may name: the regions, zones and GPUs the state store knows.

A drain of an id nothing knows (a typo, ``gtm drain region planet-x``) would be stored and
followed by no tier, while the operator believes the traffic moved. So ``gtm drain`` and
the drain API of ``gtm up`` check the id against the store first and refuse an unknown
one, naming the known ones; ``--force`` (``?force=1``) drains an id ahead of its arrival.

An id is known when the store holds its record or its summary: ``gtm up`` writes Region
and Zone records, a deployment of your own may have only the summaries its regional LBs
and zone agents publish, and GPU workers register themselves.
"""

from __future__ import annotations

from gtm.models import DrainTarget
from gtm.state import keys
from gtm.state.store import StateStore

#: Where each target's ids are found: (key kind, index of the id in the key's parts).
_SOURCES: dict[DrainTarget, tuple[tuple[keys.Kind, int], ...]] = {
    DrainTarget.REGION: ((keys.Kind.REGION, 0), (keys.Kind.REGION_SUMMARY, 0)),
    DrainTarget.ZONE: ((keys.Kind.ZONE, 1), (keys.Kind.ZONE_SUMMARY, 1)),
    DrainTarget.GPU: ((keys.Kind.GPU, 2),),
}

PLURAL = {DrainTarget.REGION: "regions", DrainTarget.ZONE: "zones", DrainTarget.GPU: "GPUs"}

#: Most ids an error message lists before it says how many more there are.
_LISTED = 20


async def known_ids(store: StateStore, target: DrainTarget) -> tuple[str, ...]:
    """The ids of ``target`` kind the store knows, sorted."""
    found: set[str] = set()
    for kind, index in _SOURCES[target]:
        result = await store.range(keys.prefix(kind))
        for kv in result.kvs:
            parsed = keys.parse(kv.key)
            if parsed is not None and parsed.kind is kind:
                found.add(parsed.parts[index])
    return tuple(sorted(found))


def unknown_message(
    target: DrainTarget,
    target_id: str,
    known: tuple[str, ...],
    *,
    hint: str = "--force drains it anyway",
) -> str:
    """One line: the id is unknown, these are known, and ``hint`` (by default: how to
    drain it anyway; an undrain says what is drained instead)."""
    plural = PLURAL[target]
    if known:
        more = len(known) - _LISTED
        listed = f"known {plural}: {', '.join(known[:_LISTED])}"
        listed += f" and {more} more" if more > 0 else ""
    else:
        listed = f"the store knows no {plural}"
    return f"unknown {target.value} {target_id!r}; {listed} ({hint})"
