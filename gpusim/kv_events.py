"""The emulator's KV-cache events: vLLM's ``--kv-events-config`` ZMQ publisher.

``gtm gpu-sim --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'``
publishes what its prefix cache (:class:`gpusim.prefix_cache.BlockPool`) does, as vLLM's
``ZmqEventPublisher`` does (the wire format: :mod:`gtm.kv_events`):

* a ``BlockStored`` when the engine registers full prompt blocks — consecutive blocks of
  one prompt registered in one forward pass are one event, as vLLM's block pool queues
  them per request and step (``block_hashes``, the parent of the first, the blocks'
  ``token_ids``, ``block_size``);
* a ``BlockRemoved`` per evicted block, an ``AllBlocksCleared`` when the cache is reset;
* one ``KVEventBatch`` per engine step that changed the cache, on a PUB socket as
  ``[topic, seq, payload]``, the last ``buffer_steps`` kept for the ROUTER replay socket.

Tokens and hashes
    The emulator tokenizes prompts with :mod:`gtm.tokens` (a deterministic, model-free
    approximation of a BPE tokenizer; every gtm tier and the emulator share it), and its
    block hashes are :func:`gtm.tokens.block_hashes` (BLAKE2b chained over 16-token
    blocks, vLLM's block size). Those are the ``token_ids`` and ``block_hashes`` it
    publishes. A consumer that re-hashes ``token_ids`` (llm-d, vllm-router, gtm's zone
    agent) matches a prompt only if it tokenizes as the engine does: against the emulator
    that is :func:`gtm.tokens.encode_text`/``encode_chat``; against a real vLLM it is the
    model's tokenizer and chat template — the emulator needs no model download.

The engine runs synchronously inside the event loop, so every event of one step is
recorded before :meth:`KVEventPublisher.run` wakes: each wake-up is one step's batch.
Sending never blocks (PUB drops beyond its high-water mark, as in vLLM); a full queue
(``max_queue_size`` events waiting) drops the oldest and counts them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from prometheus_client import Counter

from gtm.errors import ConfigError
from gtm.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventsConfig,
    binds,
    encode_batch,
    seq_bytes,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

#: How many blocks' tokens the publisher remembers between a prompt's arrival and its
#: blocks' registration (per prompt block; a prompt aborted before its prefill leaves its
#: entries to be pushed out).
TOKEN_MEMORY_BLOCKS = 1 << 18


class KVEventRecorder:
    """The pool's :class:`~gpusim.prefix_cache.PoolListener`: turns registrations and
    evictions into vLLM events, coalescing a prompt's consecutive blocks."""

    def __init__(self, publisher: KVEventPublisher, block_size: int) -> None:
        self._publisher = publisher
        self._block_size = block_size
        #: Block hash -> (parent hash or None, the block's token ids), from the prompts
        #: submitted (:meth:`note_prompt`); read when the block is registered.
        self._blocks: OrderedDict[int, tuple[int | None, tuple[int, ...]]] = OrderedDict()

    def note_prompt(self, tokens: Sequence[int], hashes: Sequence[int]) -> None:
        """Remember the token ids of a submitted prompt's full blocks."""
        bs = self._block_size
        blocks = self._blocks
        parent: int | None = None
        for index, block_hash in enumerate(hashes):
            blocks[block_hash] = (parent, tuple(tokens[index * bs : (index + 1) * bs]))
            blocks.move_to_end(block_hash)
            parent = block_hash
        while len(blocks) > TOKEN_MEMORY_BLOCKS:
            blocks.popitem(last=False)

    def stored(self, block_hash: int) -> None:
        parent, tokens = self._blocks.get(block_hash, (None, ()))
        self._publisher.stored(block_hash, parent, tokens, self._block_size)

    def removed(self, block_hash: int) -> None:
        self._publisher.add(BlockRemoved(block_hashes=(block_hash,)))

    def cleared(self) -> None:
        self._publisher.add(AllBlocksCleared())


class KVEventPublisher:
    """vLLM's ``ZmqEventPublisher`` on the emulator's event loop."""

    def __init__(self, config: KVEventsConfig, *, registry: CollectorRegistry) -> None:
        self.config = config
        self._topic = config.topic.encode("utf-8")
        self._pending: list[KVEvent] = []
        self._wake = asyncio.Event()
        #: Set while the worker's host can be heard (cleared by the ``black_hole`` fault,
        #: :meth:`silence`): a silent host publishes nothing and answers no replay.
        self._heard = asyncio.Event()
        self._heard.set()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        #: The endpoints actually bound or connected (a ``*`` port resolved).
        self.endpoint = config.endpoint
        self.replay_endpoint = config.replay_endpoint
        self._batches = Counter(
            "gtm_gpusim_kv_event_batches",
            "KV-event batches published (one per engine step that changed the cache).",
            registry=registry,
        )
        self._events = Counter(
            "gtm_gpusim_kv_events",
            "KV events published, by type.",
            ["type"],
            registry=registry,
        )
        self._dropped = Counter(
            "gtm_gpusim_kv_events_dropped",
            "KV events dropped because max_queue_size events were waiting.",
            registry=registry,
        )
        self._replays = Counter(
            "gtm_gpusim_kv_event_replays",
            "Replay requests answered on the replay endpoint.",
            registry=registry,
        )

    def silence(self, silent: bool) -> None:
        """The host goes silent (the emulator's ``black_hole`` fault) or is heard again.
        While silent, each step's events wait in the queue (the oldest dropped past
        ``max_queue_size``, counted, as when a real publisher's queue fills) and replay
        requests wait unanswered; heard again, what waited goes out in one batch, as a
        partitioned subscriber sees the backlog arrive when the network heals."""
        if silent:
            self._heard.clear()
        else:
            self._heard.set()
            self._wake.set()

    @property
    def silent(self) -> bool:
        return not self._heard.is_set()

    def recorder(self, block_size: int) -> KVEventRecorder:
        """A listener for one engine's block pool."""
        return KVEventRecorder(self, block_size)

    # ------------------------------------------------------------------ recording

    def add(self, event: KVEvent) -> None:
        pending = self._pending
        if len(pending) >= self.config.max_queue_size:
            del pending[0]
            self._dropped.inc()
        pending.append(event)
        self._wake.set()

    def stored(
        self, block_hash: int, parent: int | None, tokens: tuple[int, ...], block_size: int
    ) -> None:
        """A registered block; appended to the step's last ``BlockStored`` when it
        continues that event's chain (the same prompt's next block)."""
        pending = self._pending
        if pending:
            last = pending[-1]
            if (
                isinstance(last, BlockStored)
                and parent is not None
                and last.block_hashes[-1] == parent
                and last.block_size == block_size
            ):
                pending[-1] = BlockStored(
                    block_hashes=(*last.block_hashes, block_hash),
                    parent_block_hash=last.parent_block_hash,
                    token_ids=last.token_ids + tokens,
                    block_size=block_size,
                )
                return
        self.add(
            BlockStored(
                block_hashes=(block_hash,),
                parent_block_hash=parent,
                token_ids=tokens,
                block_size=block_size,
            )
        )

    # ------------------------------------------------------------------ sockets

    def open(self) -> None:
        """Bind or connect the PUB socket and bind the replay ROUTER (vLLM's
        ``_socket_setup``); :class:`ConfigError` when an endpoint cannot be used."""
        ctx = self._ctx = zmq.asyncio.Context()
        try:
            pub = self._pub = ctx.socket(zmq.PUB)
            pub.set_hwm(self.config.hwm)
            pub.setsockopt(zmq.LINGER, 0)
            if binds(self.config.endpoint):
                pub.bind(self.config.endpoint)
                self.endpoint = _last_endpoint(pub)
            else:
                pub.connect(self.config.endpoint)
            if self.config.replay_endpoint is not None:
                replay = self._replay = ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.config.replay_endpoint)
                self.replay_endpoint = _last_endpoint(replay)
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(f"--kv-events-config: {exc}") from None

    def close(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def run(self) -> None:
        """Publish each step's events as one batch, for as long as the worker runs."""
        pub = self._pub
        if pub is None:
            raise RuntimeError("open() the publisher first")
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._heard.wait()
            events, self._pending = self._pending, []
            if events:
                await self._publish(pub, events)

    async def _publish(self, pub: zmq.asyncio.Socket, events: list[KVEvent]) -> None:
        payload = encode_batch(time.time(), events, encoding=self.config.encoding)
        seq = self._seq
        self._seq += 1
        await pub.send_multipart((self._topic, seq_bytes(seq), payload))
        self._buffer.append((seq, payload))
        self._batches.inc()
        for event in events:
            self._events.labels(type(event).__name__).inc()

    async def serve_replay(self) -> None:
        """Answer replay requests: every buffered batch from the asked sequence number
        on, then the end marker (vLLM's ``_service_replay``)."""
        replay = self._replay
        if replay is None:
            return
        while True:
            frames = await replay.recv_multipart()
            await self._heard.wait()
            if len(frames) != 3:
                log.warning("invalid KV-event replay request (%d frames)", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            self._replays.inc()
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await replay.send_multipart((client, b"", seq_bytes(seq), payload))
            await replay.send_multipart((client, b"", END_SEQ, b""))

    @property
    def sequence(self) -> int:
        """The next batch's sequence number (batches published so far)."""
        return self._seq


def _last_endpoint(sock: zmq.asyncio.Socket) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)
