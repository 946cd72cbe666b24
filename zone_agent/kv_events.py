"""KV events as a prefix-placement source: what each GPU's engine says it cached and evicted.

The agent's prefix index (:mod:`zone_agent.prefix`) records what it *sent* where and
guesses evictions with an LRU per GPU sized by its KV cache. An engine that publishes
vLLM's KV events (``--kv-events-config``, wire format :mod:`gtm.kv_events`) says what it
actually holds: with them, a prefix the GPU evicted stops attracting requests at once,
where the guess keeps pulling them there until its LRU catches up.

Keys (as llm-d's indexer and vllm-router do, ``gtm.kv_events``): the engine's own block
hashes are opaque (a seeded hash); a ``BlockStored`` is re-hashed from its ``token_ids``
with :func:`gtm.tokens.block_hashes` (chained from the parent block's key), and the
engine hash is kept only to apply a later ``BlockRemoved``. A prompt matches when the
agent tokenizes it as the engine does: :func:`gtm.tokens.encode_chat`/``encode_text``,
the emulator's tokenization (a real engine needs its model's tokenizer: not built).

From token blocks to the index's text blocks: the decision reads 256-byte text
fingerprints (:data:`zone_agent.prefix.BLOCK_BYTES`). When the agent sends a prompt
(:meth:`KVEventSource.sent`) it maps each token block to the text blocks that end in
it, in proportion (text block ``i`` of ``n`` ends in token block ``ceil((i+1)·m/n) − 1``
of ``m``). An evicted token block takes its text blocks out of that GPU's entry; a
stored one puts them back. The agent's own record stays the fallback: a GPU whose
stream is stale (disconnected, a gap the replay could not fill) has its evictions
forgotten (:meth:`KVEventSource.stale`), and the decision reads the agent's guess.

Sans-io: :class:`KVEventSource` changes the index between decisions (decisions are
synchronous, so none sees half an event batch); :class:`KVEventSubscriber` is the only
I/O — one supervised task per worker reading its PUB socket, asking the replay socket
on a sequence gap, counting what it applied and what it could not read (a malformed
message is counted and skipped, never raised).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventDecodeError,
    decode_batch,
    read_seq,
    seq_bytes,
)
from gtm.tokens import block_hashes
from zone_agent.prefix import DictPrefixIndex, PrefixIndex

log = logging.getLogger(__name__)

#: Token blocks whose text blocks the agent remembers (the prompts it sent lately).
KEY_MEMORY = 1 << 18
#: Engine hashes remembered per GPU (what it reported stored and has not evicted).
ENGINE_MEMORY = 1 << 20
#: Seconds a replay answer may take before the stream is declared stale.
REPLAY_TIMEOUT_S = 5.0


class Evictions:
    """Text blocks each GPU slot evicted, by the engine's word: block → slot mask."""

    def __init__(self) -> None:
        self._masks: dict[int, int] = {}

    def mask(self, block: int) -> int:
        return self._masks.get(block, 0)

    def evict(self, slot: int, blocks: Iterable[int]) -> None:
        bit = 1 << slot
        masks = self._masks
        for block in blocks:
            masks[block] = masks.get(block, 0) | bit

    def restore(self, slot: int, blocks: Iterable[int]) -> None:
        clear = ~(1 << slot)
        masks = self._masks
        for block in blocks:
            mask = masks.get(block, 0) & clear
            if mask:
                masks[block] = mask
            else:
                masks.pop(block, None)

    def forget(self, slot: int) -> None:
        """Forget every eviction of ``slot`` (its stream is stale: back to the guess)."""
        clear = ~(1 << slot)
        self._masks = {b: m & clear for b, m in self._masks.items() if m & clear}

    def __len__(self) -> int:
        return len(self._masks)


class _Evicting:
    """Mixed into the agent's index: matching skips what a GPU said it evicted, and
    sending a prompt again to a GPU forgets that the GPU evicted it."""

    evictions: Evictions

    def insert(self, slot: int, hashes: Iterable[int], capacity: int) -> None:
        hashes = tuple(hashes)
        self.evictions.restore(slot, hashes)
        super().insert(slot, hashes, capacity)  # type: ignore[misc]

    def match_groups(self, hashes: tuple[int, ...]) -> list[tuple[int, int]]:
        groups: list[tuple[int, int]] = []
        if not hashes:
            return groups
        holders = self.holders  # type: ignore[attr-defined]
        evicted = self.evictions.mask
        alive = holders(hashes[0]) & ~evicted(hashes[0])
        depth, end = 1, len(hashes)
        while alive:
            if depth < end:
                block = hashes[depth]
                still = alive & holders(block) & ~evicted(block)
            else:
                still = 0
            gone = alive & ~still
            if gone:
                groups.append((depth, gone))
            alive = still
            depth += 1
        return groups


class EvictingPrefixIndex(_Evicting, PrefixIndex):
    """The agent's :class:`~zone_agent.prefix.PrefixIndex`, told of evictions."""

    def __init__(self, evictions: Evictions) -> None:
        super().__init__()
        self.evictions = evictions


class EvictingDictPrefixIndex(_Evicting, DictPrefixIndex):
    """The reference form of :class:`EvictingPrefixIndex`."""

    def __init__(self, evictions: Evictions) -> None:
        super().__init__()
        self.evictions = evictions


@dataclass(frozen=True, slots=True)
class Applied:
    """What one batch did: events applied, and stored blocks whose parent was unknown."""

    events: int = 0
    orphans: int = 0


class KVEventSource:
    """Applies each GPU's KV events to the agent's prefix index (sans-io)."""

    def __init__(self, evictions: Evictions) -> None:
        self.evictions = evictions
        #: Token-block key → the text blocks that end in it (prompts the agent sent).
        self._texts: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        #: Per slot: engine hash → token-block key, for the blocks it holds.
        self._keys: dict[int, OrderedDict[int, int]] = {}

    def sent(
        self, token_ids: tuple[int, ...], block_size: int, text_hashes: tuple[int, ...]
    ) -> None:
        """Remember how a prompt's token blocks (as the engine tokenizes it) cover its
        text blocks (the fingerprint the decision reads)."""
        keys = block_hashes(token_ids, block_size)
        m, n = len(keys), len(text_hashes)
        if not m or not n:
            return
        ends: dict[int, list[int]] = {}
        for i, text in enumerate(text_hashes):
            ends.setdefault(min(m - 1, math.ceil((i + 1) * m / n) - 1), []).append(text)
        texts = self._texts
        for j, covered in ends.items():
            texts[keys[j]] = tuple(covered)
            texts.move_to_end(keys[j])
        while len(texts) > KEY_MEMORY:
            texts.popitem(last=False)

    def apply(self, slot: int, batch: EventBatch) -> Applied:
        """Apply one batch of ``slot``'s events to the index."""
        keys = self._keys.setdefault(slot, OrderedDict())
        orphans = 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                parent = None
                if event.parent_block_hash is not None:
                    parent = keys.get(event.parent_block_hash)
                    if parent is None:
                        orphans += 1
                        continue
                own = block_hashes(event.token_ids, event.block_size, parent=parent)
                for engine, key in zip(event.block_hashes, own, strict=False):
                    keys[engine] = key
                    keys.move_to_end(engine)
                    covered = self._texts.get(key)
                    if covered:
                        self.evictions.restore(slot, covered)
                while len(keys) > ENGINE_MEMORY:
                    keys.popitem(last=False)
            elif isinstance(event, BlockRemoved):
                for engine in event.block_hashes:
                    key = keys.pop(engine, -1)
                    covered = self._texts.get(key) if key != -1 else None
                    if covered:
                        self.evictions.evict(slot, covered)
            elif isinstance(event, AllBlocksCleared):
                for key in keys.values():
                    covered = self._texts.get(key)
                    if covered:
                        self.evictions.evict(slot, covered)
                keys.clear()
        return Applied(events=len(batch.events), orphans=orphans)

    def stale(self, slot: int) -> None:
        """``slot``'s stream can no longer be trusted: forget its evictions (the agent's
        own record decides again) and what it said it held."""
        self.evictions.forget(slot)
        self._keys.pop(slot, None)


class KVEventMetrics:
    """``gtm_zone_kv_events_*``: what each worker's stream delivered."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.applied = Counter(
            "gtm_zone_kv_events_applied",
            "KV events applied to the prefix index, by worker.",
            ["gpu"],
            registry=registry,
        )
        self.gaps = Counter(
            "gtm_zone_kv_event_gaps",
            "Sequence gaps seen on a worker's KV-event stream.",
            ["gpu"],
            registry=registry,
        )
        self.replays = Counter(
            "gtm_zone_kv_event_replays",
            "Replay requests sent to a worker's replay endpoint, by outcome.",
            ["gpu", "outcome"],
            registry=registry,
        )
        self.decode_errors = Counter(
            "gtm_zone_kv_event_decode_errors",
            "KV-event messages that could not be read (skipped), by worker.",
            ["gpu"],
            registry=registry,
        )
        self.stale = Gauge(
            "gtm_zone_kv_events_stale",
            "1 while a worker's KV-event stream is stale (placement uses the agent's record).",
            ["gpu"],
            registry=registry,
        )


class KVEventSubscriber:
    """One worker's stream: SUB on its endpoint, DEALER on its replay endpoint."""

    def __init__(
        self,
        *,
        gpu_id: str,
        slot: int,
        endpoint: str,
        replay_endpoint: str | None,
        topic: str,
        source: KVEventSource,
        metrics: KVEventMetrics,
        context: zmq.asyncio.Context,
    ) -> None:
        self.gpu_id = gpu_id
        self.slot = slot
        self._endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode("utf-8")
        self._source = source
        self._metrics = metrics
        self._ctx = context
        self.last_seq = -1

    async def run(self) -> None:
        """Read the stream until cancelled (a supervised task)."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.connect(self._endpoint)
        stale = self._metrics.stale.labels(self.gpu_id)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    self._metrics.decode_errors.labels(self.gpu_id).inc()
                    continue
                try:
                    seq = read_seq(frames[1])
                    batch = decode_batch(frames[2])
                except KVEventDecodeError as exc:
                    self._metrics.decode_errors.labels(self.gpu_id).inc()
                    log.debug("KV event from %s unreadable: %s", self.gpu_id, exc)
                    continue
                if seq <= self.last_seq:
                    continue  # a duplicate (replayed already)
                if seq > self.last_seq + 1:
                    self._metrics.gaps.labels(self.gpu_id).inc()
                    if not await self._replay(self.last_seq + 1, seq):
                        self._source.stale(self.slot)
                        stale.set(1)
                self._apply(seq, batch)
                stale.set(0)
        finally:
            sub.close(linger=0)
            self._source.stale(self.slot)
            stale.set(1)

    def _apply(self, seq: int, batch: EventBatch) -> None:
        applied = self._source.apply(self.slot, batch)
        self._metrics.applied.labels(self.gpu_id).inc(applied.events)
        self.last_seq = seq

    async def _replay(self, first: int, until: int) -> bool:
        """Ask for batches ``first .. until-1``; whether the gap was filled."""
        if self._replay_endpoint is None:
            self._metrics.replays.labels(self.gpu_id, "no-endpoint").inc()
            return False
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._replay_endpoint)
        try:
            await sock.send_multipart((b"", seq_bytes(first)))
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while True:
                    frames = await sock.recv_multipart()
                    # [b"", seq, payload]; vLLM PR #45177 adds the topic before seq.
                    if len(frames) not in (3, 4):
                        raise KVEventDecodeError("a replay answer has 3 or 4 frames")
                    seq, payload = read_seq(frames[-2]), frames[-1]
                    if seq == -1:
                        break
                    if seq < until and seq > self.last_seq:
                        self._apply(seq, decode_batch(payload))
        except (TimeoutError, KVEventDecodeError) as exc:
            self._metrics.replays.labels(self.gpu_id, "failed").inc()
            log.warning("KV-event replay from %s failed: %s", self.gpu_id, exc)
            return False
        finally:
            sock.close(linger=0)
        filled = self.last_seq >= until - 1
        self._metrics.replays.labels(self.gpu_id, "filled" if filled else "short").inc()
        return filled
