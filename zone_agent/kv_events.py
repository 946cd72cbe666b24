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
(:meth:`ZoneKVEvents.sent`) it maps each token block to the text blocks that end in it,
in proportion (text block ``i`` of ``n`` ends in token block ``ceil((i+1)·m/n) − 1`` of
``m``). :class:`EngineBlocks` then holds the engines' word over the agent's record: a
stored token block adds its text blocks to that GPU's entry (a prompt another router
sent there counts too), an evicted one takes them out, and sending the prompt there
again puts them back at once. The agent's own record stays the fallback: a GPU whose
stream is stale (disconnected, a gap the replay could not fill) has what its engine said
forgotten (:meth:`KVEventSource.stale`), and the decision reads the agent's guess.

Sans-io: :class:`KVEventSource` changes the index between decisions (decisions are
synchronous, so none sees half an event batch); :class:`KVEventSubscriber` is the only
I/O — one supervised task per worker reading its PUB socket, asking the replay socket
on a sequence gap, counting what it applied and what it could not read (a malformed
message is counted and skipped, never raised).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge
from zmq.utils.monitor import parse_monitor_message

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
from gtm.models import GpuWorker
from gtm.tasks import TaskSupervisor
from gtm.tokens import PromptError, block_hashes, encode_chat, encode_text, parse_chat_messages
from zone_agent.config import KVEventsSource
from zone_agent.prefix import DictPrefixIndex, PrefixIndex
from zone_agent.request import Endpoint, ZoneRequest, first_prompt

log = logging.getLogger(__name__)

#: Token blocks whose text blocks the agent remembers (the prompts it sent lately).
KEY_MEMORY = 1 << 18
#: Engine hashes remembered per GPU (what it reported stored and has not evicted).
ENGINE_MEMORY = 1 << 20
#: Prompts waiting to be mapped, and prompts remembered as mapped (not tokenized again).
PENDING_MEMORY = 4096
#: Seconds a replay answer may take before the stream is declared stale.
REPLAY_TIMEOUT_S = 5.0


#: Text blocks tracked per direction (held, evicted) before the oldest is forgotten (its
#: GPUs fall back to the agent's own record for it).
OVERLAY_MEMORY = 1 << 20


class EngineBlocks:
    """What the engines said about the agent's text blocks, over the agent's own record:
    ``held`` (block → mask of the slots whose engine stored it) and ``evicted`` (block →
    mask of the slots whose engine evicted it). A slot's bit is in at most one of them."""

    def __init__(self) -> None:
        self._held: dict[int, int] = {}
        self._evicted: dict[int, int] = {}

    def adjust(self, block: int, mask: int) -> int:
        """``mask`` (the slots the agent's record says hold ``block``) as the engines
        say: plus the slots that stored it, minus those that evicted it."""
        return (mask | self._held.get(block, 0)) & ~self._evicted.get(block, 0)

    def stored(self, slot: int, blocks: Iterable[int]) -> None:
        _move(slot, blocks, into=self._held, out_of=self._evicted)

    def removed(self, slot: int, blocks: Iterable[int]) -> None:
        _move(slot, blocks, into=self._evicted, out_of=self._held)

    def sent(self, slot: int, blocks: Iterable[int]) -> None:
        """The agent sent these blocks to ``slot``: its record holds them again."""
        _clear(slot, blocks, self._evicted)

    def forget(self, slot: int) -> None:
        """Forget what ``slot``'s engine said (its stream is stale: back to the record)."""
        clear = ~(1 << slot)
        self._held = {b: m & clear for b, m in self._held.items() if m & clear}
        self._evicted = {b: m & clear for b, m in self._evicted.items() if m & clear}

    def __len__(self) -> int:
        return len(self._held) + len(self._evicted)

    def silent_on(self, blocks: tuple[int, ...]) -> bool:
        """Whether the engines said nothing of any of ``blocks`` (one C-level pass each
        way: then the agent's record alone answers, at its compiled speed)."""
        return self._held.keys().isdisjoint(blocks) and self._evicted.keys().isdisjoint(blocks)

    @property
    def evicted_blocks(self) -> int:
        return len(self._evicted)


def _move(
    slot: int, blocks: Iterable[int], *, into: dict[int, int], out_of: dict[int, int]
) -> None:
    bit = 1 << slot
    blocks = tuple(blocks)
    _clear(slot, blocks, out_of)
    for block in blocks:
        into[block] = into.pop(block, 0) | bit  # re-inserted: the newest
    while len(into) > OVERLAY_MEMORY:
        del into[next(iter(into))]


def _clear(slot: int, blocks: Iterable[int], masks: dict[int, int]) -> None:
    clear = ~(1 << slot)
    for block in blocks:
        mask = masks.get(block, 0) & clear
        if mask:
            masks[block] = mask
        else:
            masks.pop(block, None)


class MatchPath(StrEnum):
    """How a prompt's prefix was matched (``gtm_zone_prefix_matches_total{path}``)."""

    #: The engines said nothing of the prompt's blocks: the index's own match (compiled).
    COMPILED = "compiled"
    #: They did: a Python walk reading their word over the agent's record.
    ENGINE_OVERLAY = "engine-overlay"


class _Evicting:
    """Mixed into the agent's index: matching reads the engines' word over the agent's
    record, and sending a prompt to a GPU again makes it the GPU's again. Each match is
    counted by its path (``matches``, when given): the overlay walk is the slow one."""

    engine: EngineBlocks
    _count_compiled: Callable[[], None]
    _count_overlay: Callable[[], None]

    def _bind(self, engine: EngineBlocks, matches: Counter | None) -> None:
        self.engine = engine
        if matches is None:
            self._count_compiled = self._count_overlay = _not_counted
        else:
            self._count_compiled = matches.labels(MatchPath.COMPILED.value).inc
            self._count_overlay = matches.labels(MatchPath.ENGINE_OVERLAY.value).inc

    def insert(self, slot: int, hashes: Iterable[int], capacity: int) -> None:
        hashes = tuple(hashes)
        self.engine.sent(slot, hashes)
        super().insert(slot, hashes, capacity)  # type: ignore[misc]

    def match_groups(self, hashes: tuple[int, ...]) -> list[tuple[int, int]]:
        if self.engine.silent_on(hashes):
            self._count_compiled()
            found: list[tuple[int, int]] = super().match_groups(hashes)  # type: ignore[misc]
            return found
        self._count_overlay()
        groups: list[tuple[int, int]] = []
        holders = self.holders  # type: ignore[attr-defined]
        adjust = self.engine.adjust
        alive = adjust(hashes[0], holders(hashes[0]))
        depth, end = 1, len(hashes)
        while alive:
            if depth < end:
                block = hashes[depth]
                still = alive & adjust(block, holders(block))
            else:
                still = 0
            gone = alive & ~still
            if gone:
                groups.append((depth, gone))
            alive = still
            depth += 1
        return groups


def _not_counted() -> None:
    pass


class EvictingPrefixIndex(_Evicting, PrefixIndex):
    """The agent's :class:`~zone_agent.prefix.PrefixIndex`, corrected by the engines."""

    def __init__(self, engine: EngineBlocks, matches: Counter | None = None) -> None:
        super().__init__()
        self._bind(engine, matches)


class EvictingDictPrefixIndex(_Evicting, DictPrefixIndex):
    """The reference form of :class:`EvictingPrefixIndex`."""

    def __init__(self, engine: EngineBlocks, matches: Counter | None = None) -> None:
        super().__init__()
        self._bind(engine, matches)


@dataclass(frozen=True, slots=True)
class Applied:
    """What one batch did: events applied, and stored blocks whose parent was unknown."""

    events: int = 0
    orphans: int = 0


class KVEventSource:
    """Applies each GPU's KV events to the agent's prefix index (sans-io)."""

    def __init__(self, engine: EngineBlocks) -> None:
        self.engine = engine
        #: Token-block key → the text blocks that end in it (prompts the agent sent).
        self._texts: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        #: Per slot: engine hash → token-block key, for the blocks it holds.
        self._keys: dict[int, OrderedDict[int, int]] = {}
        #: Prompts sent and not yet mapped (:meth:`defer`), at most PENDING_MEMORY.
        self._pending: deque[tuple[Callable[[], tuple[int, ...]], int, tuple[int, ...]]] = deque(
            maxlen=PENDING_MEMORY
        )
        #: (last text block, blocks, block size) of the prompts deferred lately.
        self._mapped: OrderedDict[tuple[int, int, int], None] = OrderedDict()

    def defer(
        self,
        tokens: Callable[[], tuple[int, ...]],
        block_size: int,
        text_hashes: tuple[int, ...],
    ) -> None:
        """:meth:`sent`, with the tokenization (``tokens()``) done when the next batch of
        events is applied: off the request's path, once per prompt (a prompt whose text
        blocks were mapped lately is not tokenized again)."""
        tail = (text_hashes[-1], len(text_hashes), block_size) if text_hashes else None
        if tail is None or tail in self._mapped:
            return
        self._mapped[tail] = None
        while len(self._mapped) > PENDING_MEMORY:
            self._mapped.popitem(last=False)
        self._pending.append((tokens, block_size, text_hashes))

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
        """Apply one batch of ``slot``'s events to the index (the prompts deferred
        since are mapped first: their blocks' events follow their sending)."""
        pending = self._pending
        while pending:
            tokens, block_size, text_hashes = pending.popleft()
            ids = tokens()
            if ids:
                self.sent(ids, block_size, text_hashes)
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
                        self.engine.stored(slot, covered)
                while len(keys) > ENGINE_MEMORY:
                    keys.popitem(last=False)
            elif isinstance(event, BlockRemoved):
                for engine in event.block_hashes:
                    key = keys.pop(engine, -1)
                    covered = self._texts.get(key) if key != -1 else None
                    if covered:
                        self.engine.removed(slot, covered)
            elif isinstance(event, AllBlocksCleared):
                for key in keys.values():
                    covered = self._texts.get(key)
                    if covered:
                        self.engine.removed(slot, covered)
                keys.clear()
        return Applied(events=len(batch.events), orphans=orphans)

    def stale(self, slot: int) -> None:
        """``slot``'s stream can no longer be trusted: forget what its engine said (the
        agent's own record decides again)."""
        self.engine.forget(slot)
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
        self.disconnects = Counter(
            "gtm_zone_kv_event_disconnects",
            "Times a worker's KV-event stream was disconnected (it went stale).",
            ["gpu"],
            registry=registry,
        )
        self.prefix_matches = Counter(
            "gtm_zone_prefix_matches",
            "Prompt prefixes matched with KV events on, by path: the compiled index "
            "(the engines said nothing of the prompt's blocks) or the engine-overlay "
            "walk in Python (they did).",
            ["path"],
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
        """Read the stream until cancelled (a supervised task). A disconnection (the
        worker restarted, the network broke) makes the stream stale at once: what the
        engine said is forgotten, and the next message starts it again from the replay
        buffer's beginning."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self._endpoint)
        stale = self._metrics.stale.labels(self.gpu_id)
        stale.set(1)  # until the stream delivers, placement is the agent's own record
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        self._source.stale(self.slot)
                        self.last_seq = -1
                        stale.set(1)
                        self._metrics.disconnects.labels(self.gpu_id).inc()
                if sub not in ready:
                    continue
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
                self._apply(seq, batch)
                stale.set(0)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
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


def engine_tokens(raw: bytes, endpoint: Endpoint) -> tuple[int, ...]:
    """The first prompt's token ids as the emulator renders it (``gpusim.server``: a chat
    through :func:`gtm.tokens.encode_chat`, a completion's text through
    :func:`gtm.tokens.encode_text`, token arrays as they are); () when the body has none."""
    try:
        body = json.loads(raw)
        if endpoint is Endpoint.CHAT:
            return encode_chat(parse_chat_messages(body.get("messages")))
        prompt = body.get("prompt")
    except (ValueError, AttributeError, PromptError):
        return ()
    first = first_prompt(prompt)
    if isinstance(first, str):
        return encode_text(first)
    return first or ()


class ZoneKVEvents:
    """The zone agent's KV-event source: one supervised subscriber per worker, the
    engines' word the agent's prefix indexes read, and the hook that maps each prompt sent."""

    def __init__(
        self, config: KVEventsSource, *, supervisor: TaskSupervisor, registry: CollectorRegistry
    ) -> None:
        self.config = config
        self.engine = EngineBlocks()
        self.source = KVEventSource(self.engine)
        self.metrics = KVEventMetrics(registry)
        self._tokenize: Callable[[bytes, Endpoint], tuple[int, ...]] = engine_tokens
        if config.tokenizer is not None:
            from zone_agent.kv_tokenizer import HfPromptTokenizer

            self._tokenize = HfPromptTokenizer(config.tokenizer)
        self._supervisor = supervisor
        self._ctx: zmq.asyncio.Context | None = None
        #: gpu id → (endpoints, its task, its subscriber).
        self._running: dict[
            str, tuple[tuple[str, str | None], asyncio.Task[object], KVEventSubscriber]
        ] = {}

    def indexes(self) -> tuple[EvictingPrefixIndex, EvictingPrefixIndex]:
        """The agent's two prefix indexes (sent, answered), reading the engines' word."""
        matches = self.metrics.prefix_matches
        return EvictingPrefixIndex(self.engine, matches), EvictingPrefixIndex(self.engine, matches)

    def subscriber(self, gpu_id: str) -> KVEventSubscriber | None:
        entry = self._running.get(gpu_id)
        return None if entry is None else entry[2]

    def sync(self, workers: Iterable[GpuWorker], slot_of: Callable[[str], int]) -> None:
        """Subscribe to every worker's stream, stop those of workers gone (call with the
        inventory whenever it changes; needs a running loop)."""
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        wanted: dict[str, tuple[str, str | None]] = {
            w.id: self.config.endpoints(w) for w in workers
        }
        for gpu_id, (endpoints, task, _) in list(self._running.items()):
            if wanted.get(gpu_id) != endpoints:
                task.cancel()
                del self._running[gpu_id]
        for gpu_id, endpoints in wanted.items():
            if gpu_id in self._running:
                continue
            subscriber = KVEventSubscriber(
                gpu_id=gpu_id,
                slot=slot_of(gpu_id),
                endpoint=endpoints[0],
                replay_endpoint=endpoints[1],
                topic=self.config.topic,
                source=self.source,
                metrics=self.metrics,
                context=self._ctx,
            )
            task = self._supervisor.spawn(f"kv-events:{gpu_id}", subscriber.run())
            self._running[gpu_id] = (endpoints, task, subscriber)

    def sent(self, raw: bytes, facts: ZoneRequest, block_size: int) -> None:
        """A request's body was sent to a GPU: map its token blocks to its text blocks."""
        if facts.prefix_hashes:
            endpoint, tokenize = facts.endpoint, self._tokenize
            self.source.defer(lambda: tokenize(raw, endpoint), block_size, facts.prefix_hashes)

    def close(self) -> None:
        """After the supervisor's tasks are cancelled: close the ZeroMQ context."""
        self._running.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
