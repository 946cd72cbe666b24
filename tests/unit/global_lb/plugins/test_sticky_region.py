"""The front door keeps a conversation in the region its prefix was just sent to."""

from __future__ import annotations

from global_lb.plugins.affinity import RegionMemory, sticky_region
from global_lb.view import GlobalView
from gtm.models import ClientInfo, GeoPoint, RouteRequest
from gtm.routing.placement import Recall
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, summary, view
from tests.unit.global_lb.helpers import load as load_of

LONDON = GeoPoint(lat=51.5, lon=-0.13)
PROMPT = tuple(range(500, 564))
#: 64 blocks of 100 tokens: a long conversation.
TOKENS = 6400
PER_BLOCK = 100.0
EVERYWHERE = frozenset(REGION_IDS)


def _request() -> RouteRequest:
    return RouteRequest(
        model=MODEL,
        input_tokens=TOKENS,
        tenant="t1",
        client=ClientInfo(country="GB", location=LONDON),
        prefix_hashes=PROMPT,
    )


def _view(
    running: dict[str, int] | None = None,
    *,
    down: tuple[str, ...] = (),
    drained: tuple[str, ...] = (),
) -> GlobalView:
    running = running or {}
    return view(
        summaries=[summary(r, load_of(running=running.get(r, 10))) for r in REGION_IDS],
        down=down,
        drained=drained,
    )


def _sticky(
    recall: Recall | None, chosen: str, v: GlobalView, allowed: frozenset[str] = EVERYWHERE
) -> str | None:
    return sticky_region(
        recall,
        chosen,
        _request(),
        v,
        allowed,
        point=LONDON,
        country="GB",
        tokens_per_block=PER_BLOCK,
    )


HOME = Recall("eu-west", len(PROMPT), 0.5, TOKENS)


def test_a_repeat_goes_back_to_the_region_that_holds_its_prefix() -> None:
    # The decision spread the next turn to a neighbour: back where the cache is.
    assert _sticky(HOME, "eu-central", _view()) == "eu-west"
    assert _sticky(None, "eu-central", _view()) == "eu-central"
    assert _sticky(HOME, "eu-west", _view()) == "eu-west"


def test_never_outside_the_allowed_set_nor_to_an_unavailable_region() -> None:
    assert _sticky(HOME, "eu-central", _view(), frozenset({"eu-central"})) == "eu-central"
    assert _sticky(HOME, "eu-central", _view(down=("eu-west",))) == "eu-central"
    assert _sticky(HOME, "eu-central", _view(drained=("eu-west",))) == "eu-central"


def test_affinity_yields_to_load() -> None:
    # Past half full and 1.25× the mean utilisation: the conversation moves on.
    assert _sticky(HOME, "eu-central", _view({"eu-west": 90})) == "eu-central"
    # Busier than the others but under half full: it stays.
    assert _sticky(HOME, "eu-central", _view({"eu-west": 40})) == "eu-west"


def test_a_cache_does_not_pay_for_an_ocean() -> None:
    small = Recall("us-west", 1, 0.5, TOKENS)  # one block: a shared system prompt
    assert _sticky(small, "eu-west", _view()) == "eu-west"


def test_the_memory_remembers_where_it_forwarded() -> None:
    memory = RegionMemory()
    v = _view()
    request = _request()

    def place(chosen: str, now: float) -> str | None:
        return memory.place(
            chosen, request, v, EVERYWHERE, point=LONDON, country="GB",
            tokens_per_block=PER_BLOCK, now=now,
        )  # fmt: skip

    assert place("eu-west", 1.0) == "eu-west"
    assert place("eu-central", 2.0) == "eu-west"
    assert memory.memory.recall(PROMPT, 3.0) == Recall("eu-west", len(PROMPT), 2.0, TOKENS)
