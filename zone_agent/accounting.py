"""The agent's own account of what it has in flight on each GPU.

Scrapes are 250 ms apart; a burst of requests between two scrapes would all see the
same "idle" GPU. So every request the agent sends is charged to its GPU at once and
released when it ends — as llm-d's token-load scorer and Dynamo's router count in-flight
work themselves:

* ``pending``: uncached prefill tokens not yet prefilled (released at the first byte of
  the response body: a worker sends the first token only after the prompt's prefill);
* ``streams``: sequences in flight (released when the response ends, fails or the client
  goes away);
* ``prefilling``: requests not yet at their first byte (to tell the agent's own waiting
  requests from other clients' in a scraped queue);
* ``kv_blocks``: KV blocks those sequences hold at admission (prompt blocks);
* ``prefilled_count`` / ``prefilled_tokens``: cumulative, the requests answered and their
  uncached tokens (the prefills finished, when they finished: the throughput check);
* the prefix blocks sent there (:class:`~zone_agent.prefix.PrefixIndex`), and apart from
  them the blocks of the prompts it answered (sent a first byte for, so it prefilled
  them): a GPU that takes requests and never answers (a black hole) holds the first and
  never the second, and the zone's stickiness (:mod:`zone_agent.affinity`) reads the
  second;
* the GPUs *silent* since a request left them without a first byte (a deadline, a
  reset, a client gone): silent until that GPU answers again.

Per-GPU values live in numpy arrays indexed by a *slot* that a GPU id keeps for the life
of the process, so a decision reads the loads of all candidates with one fancy index
(a copy: the decision sees a consistent snapshot). Every charge is made through a
:class:`Ticket` whose release is idempotent; :meth:`Accounting.totals` must come back to
zero when nothing is in flight (the tests check it after every fault).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zone_agent.prefix import HotBlocks, PrefixIndex

#: Leading blocks of each prompt counted as candidates for the zone's hot-prefix sketch:
#: system prompts and shared few-shot headers live at the start.
HOT_LEADING_BLOCKS = 2

Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SlotLoad:
    """One GPU's charges at one moment (captured with each scrape)."""

    streams: float = 0.0
    prefilling: float = 0.0
    pending: float = 0.0
    kv_blocks: float = 0.0
    #: Since the slot was made: the requests answered (their first byte came) and the
    #: uncached prompt tokens they were charged, i.e. the prefills the GPU finished for
    #: the agent, counted when they finish (the throughput check prices them).
    prefilled: float = 0.0
    prefilled_tokens: float = 0.0


class Ticket:
    """One request's charge on one GPU. Release with :meth:`close` (idempotent)."""

    __slots__ = (
        "_acc",
        "_answered",
        "_capacity",
        "_hashes",
        "_kv",
        "_pending",
        "_prefilled",
        "_sequences",
        "closed",
        "gpu_id",
        "slot",
    )

    def __init__(
        self,
        acc: Accounting,
        gpu_id: str,
        slot: int,
        pending: float,
        sequences: float,
        kv: float,
        hashes: tuple[int, ...] = (),
        capacity: int = 0,
    ) -> None:
        self._acc = acc
        self.gpu_id = gpu_id
        self.slot = slot
        self._pending = pending
        self._sequences = sequences
        self._kv = kv
        self._hashes = hashes
        self._capacity = capacity
        self._prefilled = False
        #: The GPU answered it (or, held, another data plane carries its bytes).
        self._answered = False
        self.closed = False

    def prefill_done(self) -> None:
        """The first byte of the response arrived: the prompt is prefilled."""
        if self._prefilled or self.closed:
            return
        self._prefilled = True
        self._acc._release_prefill(self.slot, self._pending)
        self._acc._count_prefill(self.slot, self._pending)
        self._answer()

    def _answer(self) -> None:
        if not self._answered:
            self._answered = True
            self._acc._answered(self.slot, self._hashes, self._capacity)

    def close(self) -> None:
        """The request ended (any way at all): release everything it still holds. Ended
        before its first byte, it leaves its GPU silent until that GPU answers again."""
        if self.closed:
            return
        if not self._prefilled:
            self._prefilled = True
            self._acc._release_prefill(self.slot, self._pending)
        if not self._answered:
            self._acc.silent.add(self.slot)
        self.closed = True
        self._acc._release_stream(self, self._sequences, self._kv)


class Accounting:
    """In-flight charges per GPU slot, plus the prefix index and hot-block sketch."""

    def __init__(self, capacity: int = 64) -> None:
        self._slot_of: dict[str, int] = {}
        size = max(1, capacity)
        self.pending: Array = np.zeros(size)
        self.streams: Array = np.zeros(size)
        self.prefilling: Array = np.zeros(size)
        self.kv_blocks: Array = np.zeros(size)
        self.prefilled_count: Array = np.zeros(size)
        self.prefilled_tokens: Array = np.zeros(size)
        self._views()
        #: ``streams.sum()``, kept as charges come and go (sequences are whole numbers,
        #: so the running sum is exact): a decision's bounded-load cap needs it.
        self.streams_total = 0.0
        self.prefix = PrefixIndex()
        #: The blocks of the prompts each GPU answered (the first byte came back).
        self.answered = PrefixIndex()
        #: Slots a request left without a first byte, until they answer again.
        self.silent: set[int] = set()
        self.hot = HotBlocks()
        self._open: set[Ticket] = set()
        self._idle: asyncio.Event | None = None
        #: Tickets :meth:`hold` keeps open, by the time they expire (oldest first): a
        #: caller may skip :meth:`expire` while it is empty (no ``now`` to read).
        self.holds: deque[tuple[float, Ticket]] = deque()
        #: Arrival numbers for round-robin baselines (1, 2, 3...): a counter's own
        #: ``__next__``, so taking one is a C call, not a Python frame.
        self.next_seq: Callable[[], int] = itertools.count(1).__next__

    # ------------------------------------------------------------------ slots

    def slot(self, gpu_id: str) -> int:
        """The slot of ``gpu_id`` (allocated on first use, kept for the process's life)."""
        slot = self._slot_of.get(gpu_id)
        if slot is None:
            slot = len(self._slot_of)
            self._slot_of[gpu_id] = slot
            if slot >= len(self.pending):
                self._grow(2 * (slot + 1))
        return slot

    def _grow(self, size: int) -> None:
        def grown(array: Array) -> Array:
            out = np.zeros(size)
            out[: len(array)] = array
            return out

        self.pending = grown(self.pending)
        self.streams = grown(self.streams)
        self.prefilling = grown(self.prefilling)
        self.kv_blocks = grown(self.kv_blocks)
        self.prefilled_count = grown(self.prefilled_count)
        self.prefilled_tokens = grown(self.prefilled_tokens)
        self._views()

    def _views(self) -> None:
        """Memory views of the arrays for the per-request charges (cast through bytes to
        be typed as floats): a slot read and written through one is a plain float
        operation, several times cheaper than numpy's scalar indexing, with the same
        float64 arithmetic. Decisions read the arrays themselves."""
        self._pending = self.pending.data.cast("B").cast("d")
        self._streams = self.streams.data.cast("B").cast("d")
        self._prefilling = self.prefilling.data.cast("B").cast("d")
        self._kv = self.kv_blocks.data.cast("B").cast("d")
        self._prefilled_count = self.prefilled_count.data.cast("B").cast("d")
        self._prefilled_tokens = self.prefilled_tokens.data.cast("B").cast("d")

    @property
    def slot_count(self) -> int:
        """How many slots are allocated (they are 0 … slot_count − 1)."""
        return len(self._slot_of)

    # ------------------------------------------------------------------ charges

    def start(
        self,
        gpu_id: str,
        *,
        prefill_tokens: float,
        sequences: int = 1,
        kv_blocks: float = 0.0,
        prefix_hashes: tuple[int, ...] = (),
        prefix_capacity: int = 0,
    ) -> Ticket:
        """Charge a request to ``gpu_id``; remember its prefix blocks went there.

        ``kv_blocks`` is a whole number of blocks (sums of them stay exact and never
        drift below zero, which the free-KV rule's shortcut relies on).
        """
        if not (kv_blocks >= 0 and kv_blocks % 1 == 0):  # NaN and infinities fail both
            raise ValueError(f"kv_blocks must be a whole number >= 0, got {kv_blocks!r}")
        slot = self._slot_of.get(gpu_id)
        if slot is None:
            slot = self.slot(gpu_id)
        self._pending[slot] += prefill_tokens
        self._prefilling[slot] += 1
        self._streams[slot] += sequences
        self.streams_total += sequences
        self._kv[slot] += kv_blocks
        if prefix_hashes:
            self.prefix.insert(slot, prefix_hashes, prefix_capacity)
            for block in prefix_hashes[:HOT_LEADING_BLOCKS]:
                self.hot.add(block)
        ticket = Ticket(
            self, gpu_id, slot, prefill_tokens, sequences, kv_blocks, prefix_hashes, prefix_capacity
        )
        self._open.add(ticket)
        return ticket

    def _release_prefill(self, slot: int, pending: float) -> None:
        self._prefilling[slot] -= 1
        # Charges are fractional (a cache credit is blocks × tokens per block), and their
        # sum released in another order than charged keeps a rounding residue (±1e-12):
        # none left prefilling there is exactly none pending.
        if self._prefilling[slot] == 0:
            self._pending[slot] = 0.0
        else:
            self._pending[slot] -= pending

    def _count_prefill(self, slot: int, tokens: float) -> None:
        self._prefilled_count[slot] += 1
        self._prefilled_tokens[slot] += tokens

    def _answered(self, slot: int, hashes: tuple[int, ...], capacity: int) -> None:
        self.silent.discard(slot)
        if hashes:
            self.answered.insert(slot, hashes, capacity)

    def _release_stream(self, ticket: Ticket, sequences: float, kv: float) -> None:
        slot = ticket.slot
        self._streams[slot] -= sequences
        self.streams_total -= sequences
        self._kv[slot] -= kv
        self._open.discard(ticket)
        if not self._open and self._idle is not None:
            self._idle.set()

    def hold(self, ticket: Ticket, until: float) -> None:
        """Keep ``ticket`` open until monotonic time ``until`` (see :meth:`expire`).

        For decisions whose bytes another data plane carries (``/v1/assign``): the agent
        never sees them end, so their charge lasts until scrapes have caught up. Nor
        does it see their first byte: they count as answered at once.
        """
        ticket._answer()
        self.holds.append((until, ticket))

    def expire(self, now: float) -> None:
        """Close held tickets whose time is up (cheap; call it before each decision)."""
        holds = self.holds
        while holds and holds[0][0] <= now:
            holds.popleft()[1].close()

    # ------------------------------------------------------------------ reading

    def at(self, gpu_id: str) -> SlotLoad:
        slot = self._slot_of.get(gpu_id)
        if slot is None:
            return SlotLoad()
        return SlotLoad(
            float(self.streams[slot]),
            float(self.prefilling[slot]),
            float(self.pending[slot]),
            float(self.kv_blocks[slot]),
            float(self.prefilled_count[slot]),
            float(self.prefilled_tokens[slot]),
        )

    def forget_prefixes(self, gpu_ids: Iterable[str]) -> None:
        """Those GPUs lost their caches (left the zone, restarted): drop their blocks."""
        for gpu_id in gpu_ids:
            slot = self._slot_of.get(gpu_id)
            if slot is not None:
                self.prefix.forget(slot)
                self.answered.forget(slot)

    @property
    def open_tickets(self) -> int:
        return len(self._open)

    @property
    def held_tickets(self) -> int:
        """Tickets kept open by :meth:`hold` until their time is up."""
        return len(self.holds)

    async def wait_idle(self) -> None:
        """Wait until no ticket is open (graceful shutdown; tests of cancellation)."""
        while self._open:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
            await self._idle.wait()

    def totals(self) -> SlotLoad:
        """Sums over every GPU: all zero when nothing is in flight (no leaks)."""
        return SlotLoad(
            float(self.streams.sum()),
            float(self.prefilling.sum()),
            float(self.pending.sum()),
            float(self.kv_blocks.sum()),
        )
