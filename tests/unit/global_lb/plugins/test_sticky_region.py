"""The front door keeps a conversation in the region its prefix was just sent to."""

from __future__ import annotations

from global_lb.inflight import InflightLedger, LedgerSettings
from global_lb.plugins.affinity import RegionMemory, sticky_region
from global_lb.view import GlobalView
from gtm.models import ClientInfo, GeoPoint, GpuClassLoad, ModelLoad, RouteRequest
from gtm.routing.cost import without_turn
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


# A region of one fast GPU beside three slow ones: its free fast GPU prices it, its
# average GPU (pooled backlog) is much slower.
FAST = GpuClassLoad(gpu_class="H100", healthy_gpus=1, prefill_tokens_per_s=20_000.0, free_gpus=1)
SLOW = GpuClassLoad(gpu_class="L4", healthy_gpus=3, prefill_tokens_per_s=15_000.0, free_gpus=3)
#: The previous turn's prompt prefix: half of this one (the new turn adds as much).
HALF = Recall("eu-west", len(PROMPT) // 2, 2.0, TOKENS)


def _mixed(*, busy: bool = False, published_at: float = 1.0) -> ModelLoad:
    """The mixed region's load; ``busy``: its summary counts the previous turn as
    prefilling on the fast GPU."""
    fast = FAST.model_copy(update={"free_gpus": 0, "queued_prefill_tokens": TOKENS})
    return load_of(running=10, queued=TOKENS if busy else 0, prefill=35_000.0).model_copy(
        update={"classes": (fast if busy else FAST, SLOW)}
    )


def _mixed_view(*, busy: bool, published_at: float) -> GlobalView:
    summaries = [
        summary(r, _mixed(busy=busy and r == "eu-west")).model_copy(
            update={"published_at": published_at}
        )
        for r in REGION_IDS
    ]
    return view(summaries=summaries)


def test_the_home_is_priced_with_its_free_fast_gpu_after_the_previous_turn() -> None:
    # A summary taken while the previous turn was prefilling on the home's fast GPU
    # counts it as queued there and that GPU as busy; the turn is over (the client sent
    # the next one after the answer), so the home keeps its fast GPU — the one holding
    # the prefix — and is not priced by its average GPU against a peer's idle fast one.
    v = _mixed_view(busy=True, published_at=3.0)
    assert _sticky(HALF, "eu-central", v) == "eu-west"
    # The same home with the turn still waiting behind it (a summary taken before the
    # turn was sent cannot hold it): priced as it is.
    assert without_turn(v.by_id["eu-west"].loads[MODEL], 0) is v.by_id["eu-west"].loads[MODEL]


def test_the_front_door_ledger_charge_of_the_previous_turn_does_not_move_it() -> None:
    # The summary predates the previous turn: the front door's in-flight ledger charges
    # that turn to the home, where it takes the free fast GPU until the next summary.
    base = _mixed_view(busy=False, published_at=1.0)
    ledger = InflightLedger(LedgerSettings(resolution_ms=0.0))
    ledger.charge("eu-west", MODEL, TOKENS, now=2.0)
    overlay = ledger.view(base, 2.5)
    assert overlay.by_id["eu-west"].terms[MODEL] != base.by_id["eu-west"].terms[MODEL]
    assert _sticky(HALF, "eu-central", overlay) == "eu-west"


def test_without_turn_gives_the_gpu_back_to_the_class_that_took_it() -> None:
    busy = _mixed(busy=True)
    done = without_turn(busy, TOKENS)
    assert done.queued_prefill_tokens == 0
    assert done.classes == (FAST, SLOW)
    assert without_turn(_mixed(), TOKENS) == _mixed()


def test_the_memory_follows_a_spill_to_the_region_that_served_it() -> None:
    # Forwarded to eu-west, whose regional LB spilled it to eu-central: the prefix is
    # cached in eu-central, and the next turn goes back there, priced as sent then.
    memory = RegionMemory()
    request = _request()
    memory.place(
        "eu-west", request, _view(), EVERYWHERE, point=LONDON, country="GB",
        tokens_per_block=PER_BLOCK, now=1.0,
    )  # fmt: skip
    memory.served(PROMPT, "eu-central", sent_at=1.0, tokens=TOKENS)
    assert memory.memory.recall(PROMPT, 2.0) == Recall("eu-central", len(PROMPT), 1.0, TOKENS)


def test_a_backlog_the_summary_showed_before_the_previous_turn_has_drained() -> None:
    # The home's summary predates the previous turn and shows its fast GPU busy with
    # a backlog: that backlog was ahead of the turn, which is answered since (first
    # come, first served), so the GPU holding the prefix is free again.
    v = _mixed_view(busy=True, published_at=1.0)
    assert _sticky(HALF, "eu-central", v) == "eu-west"
