"""Batched UDP I/O: Linux ``recvmmsg(2)`` / ``sendmmsg(2)`` through ctypes.

A Python DNS server answering from precomputed responses spends most of a query in two
system calls (``recvfrom`` + ``sendto``, each releasing and re-taking the GIL).
``recvmmsg`` reads every datagram waiting on the socket, up to a batch, in one call
(``MSG_WAITFORONE``: block for the first, then take what is there), and ``sendmmsg``
sends all the batch's responses in one: under load two calls per batch instead of two
per query — what gdnsd and Knot do. Python has neither call (``socket.recvmsg`` is one
datagram), hence ctypes over libc.

Buffers are allocated once: ``batch`` receive slots of :data:`SLOT_SIZE` bytes, their
peer addresses, and ``batch`` send slots. A response goes out in two pieces (two
iovecs): its 2-byte ID, then the rest, to the address its query came from (the receive
slot's address buffer, reused). A response computed by ``respond`` is copied into a send
slot; a cached one is not copied at all: the ID is read from the query's receive slot
and the rest from the cached bytes where they are (``CachedAnswer.address``) — two
memoryview slice copies fewer per cached answer.

:func:`available` says whether the calls exist (Linux with glibc or musl); elsewhere
the server keeps its one-datagram loop (:mod:`global_lb.dns.server`).

**Coalescing under load.** When a read returns a few datagrams (2 to
:data:`COALESCE_BELOW` - 1), the queries are coming faster than one at a time but the
loop is draining the socket between them: it would go back to sleep in ``recvmmsg``
after every handful, and each sleep and wake-up is a context switch, which costs more
than answering a cached query. The loop then pauses :data:`COALESCE_S` before reading
again, so the next read finds a batch — interrupt moderation, as NICs (and Linux NAPI)
do. A read of one datagram (light traffic) is never delayed, nor is a full read (the
queue builds up anyway). It pays where workers share the cores with other work (fewer
context switches and less CPU per query; ``bench/geodns_throughput.py`` prints the CPU
per query). The cost: under load, an answer may wait up to :data:`COALESCE_S` plus the
timer's slack more, far less than a resolver's round trip.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import ipaddress
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Protocol

from global_lb.geo import IPAddress

#: Bytes per receive and send slot. A UDP query is far smaller (we advertise 1,232
#: bytes, wire.MAX_UDP_PAYLOAD); a longer one arrives cut short and gets FORMERR. Our
#: UDP responses are at most 1,232 bytes (longer ones are truncated), so they fit too.
SLOT_SIZE = 4096
#: Datagrams per call. dnsperf keeps ~100 queries in flight per process; 64 slots
#: (256 KiB of receive buffers) take a burst in one or two calls.
DEFAULT_BATCH = 64
#: recvmmsg flag (linux/socket.h): block for the first datagram only.
MSG_WAITFORONE = 0x10000
_WAITFORONE = ctypes.c_int(MSG_WAITFORONE)
#: Reads returning 2 to this many - 1 datagrams are followed by a pause of
#: :data:`COALESCE_S` (module docstring); 0 turns coalescing off.
COALESCE_BELOW = 16
#: About what a handful of queries take to arrive at tens of thousands a second; a
#: longer pause measured no better and lengthens the wait an answer may see.
COALESCE_S = 50e-6
#: Peer addresses remembered (address bytes → ipaddress object); resolvers are few,
#: and a full table is cleared (parsing an address costs more than answering).
MAX_PEERS = 65_536
#: Room for a sockaddr_in6 (28 bytes), the larger of the two families.
_NAME_SIZE = 28


class CachedAnswer(Protocol):
    """A response cached by query bytes (``responder._Fast``)."""

    @property
    def tail(self) -> bytes: ...  # the response after its 2-byte ID
    @property
    def address(self) -> int: ...  # where ``tail``'s bytes are (buffer_address)
    @property
    def size(self) -> int: ...  # len(tail)
    @property
    def slot(self) -> int: ...  # where its answers are counted
    @property
    def per_client(self) -> bool: ...  # the answer depends on the resolver: not here


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class _MsgHdr(ctypes.Structure):
    _fields_ = (
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.c_void_p),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    )


class _MMsgHdr(ctypes.Structure):
    _fields_ = (("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint))


# Field positions, read and written through memoryviews of the arrays (a memoryview
# index is a fraction of a ctypes attribute access).
_MMSG_WORDS = ctypes.sizeof(_MMsgHdr) // 8  # 8 on LP64
_NAMELEN_WORD = _MsgHdr.msg_namelen.offset // 8
#: msg_len as a 32-bit word index (the kernel writes 32 bits; the padding after it
#: stays zero, but a 32-bit view does not depend on that).
_LEN_INT = _MMsgHdr.msg_len.offset // 4


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        receive, send = libc.recvmmsg, libc.sendmmsg
    except (OSError, AttributeError):
        return None
    # CDLL calls release the GIL: the event loop runs while this thread blocks.
    receive.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p)
    receive.restype = ctypes.c_int
    send.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
    send.restype = ctypes.c_int
    return libc


def buffer_address(data: bytes) -> int:
    """Where the bytes of ``data`` are in memory; valid while ``data`` lives (a
    ``c_char_p`` made from a bytes object points into it, without a copy)."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


def available() -> bool:
    """Whether ``recvmmsg``/``sendmmsg`` can be called (64-bit Linux)."""
    return _libc() is not None


class BatchedUdp:
    """The buffers and calls of one socket's batched loop (one thread uses it)."""

    def __init__(
        self,
        sock: socket.socket,
        batch: int = DEFAULT_BATCH,
        *,
        coalesce_below: int = COALESCE_BELOW,
        coalesce_s: float = COALESCE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        libc = _libc()
        if libc is None:
            raise OSError(errno.ENOSYS, "recvmmsg/sendmmsg are not available")
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise OSError(errno.EAFNOSUPPORT, "not an IP socket")
        self._recvmmsg, self._sendmmsg = libc.recvmmsg, libc.sendmmsg
        self.sock = sock
        self.batch = batch
        self._coalesce_below = coalesce_below
        self._coalesce_s = coalesce_s
        self._sleep = sleep
        self._v6 = sock.family == socket.AF_INET6
        self._received = bytearray(batch * SLOT_SIZE)
        self._to_send = bytearray(batch * SLOT_SIZE)
        self._names = bytearray(batch * _NAME_SIZE)
        self._rx = (_MMsgHdr * batch)()
        self._tx = (_MMsgHdr * batch)()
        self._rx_iov = (_IoVec * batch)()
        # Two pieces per response: its 2-byte ID, then the rest (see serve()).
        self._tx_iov = (_IoVec * (2 * batch))()
        # Addresses of the buffers: taken once, the bytearrays never grow.
        received = ctypes.addressof(ctypes.c_char.from_buffer(self._received))
        to_send = ctypes.addressof(ctypes.c_char.from_buffer(self._to_send))
        names = ctypes.addressof(ctypes.c_char.from_buffer(self._names))
        self._name_at = [names + i * _NAME_SIZE for i in range(batch)]
        self._received_at = [received + i * SLOT_SIZE for i in range(batch)]
        self._to_send_at = [to_send + i * SLOT_SIZE for i in range(batch)]
        iov_size = ctypes.sizeof(_IoVec)
        for i in range(batch):
            self._rx_iov[i].iov_base = received + i * SLOT_SIZE
            self._rx_iov[i].iov_len = SLOT_SIZE
            self._tx_iov[2 * i].iov_len = 2  # the ID; iov_base is set per response
            rx, tx = self._rx[i].msg_hdr, self._tx[i].msg_hdr
            rx.msg_name = self._name_at[i]
            rx.msg_namelen = _NAME_SIZE
            rx.msg_iov = ctypes.addressof(self._rx_iov) + i * iov_size
            rx.msg_iovlen = 1
            tx.msg_iov = ctypes.addressof(self._tx_iov) + 2 * i * iov_size
            tx.msg_iovlen = 2
            # Every peer of an AF_INET socket is a sockaddr_in, of an AF_INET6 socket a
            # sockaddr_in6 (IPv4 peers too, mapped): one length for every response.
            tx.msg_namelen = 28 if self._v6 else 16
        self._rx_words = memoryview(self._rx).cast("B").cast("Q")
        self._tx_words = memoryview(self._tx).cast("B").cast("Q")
        self._tx_iov_words = memoryview(self._tx_iov).cast("B").cast("Q")
        self._rx_addr = ctypes.addressof(self._rx)
        self._tx_addr = ctypes.addressof(self._tx)
        self._tx_size = ctypes.sizeof(_MMsgHdr)
        #: Receive slots the last call filled (their address lengths need a reset).
        self._used = 0

    def receive(self) -> int:
        """Block until at least one datagram is there; return how many were read."""
        words = self._rx_words
        for i in range(self._used):  # the kernel wrote the last batch's address lengths
            words[i * _MMSG_WORDS + _NAMELEN_WORD] = _NAME_SIZE
        count: int = self._recvmmsg(
            self.sock.fileno(), self._rx_addr, self.batch, MSG_WAITFORONE, None
        )
        if count < 0:
            self._used = 0
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self._used = count
        return count

    def serve(
        self,
        respond: Callable[[bytes, IPAddress], bytes | None],
        stopping: Callable[[], bool],
        fallback: Callable[[bytes, IPAddress, int], None],
        table: Callable[[], tuple[Mapping[bytes, CachedAnswer], list[int]] | None] = lambda: None,
    ) -> None:
        """Receive, answer and send batches until ``stopping()``.

        ``respond(query, client)`` answers one datagram (``None``: no response).
        ``fallback(response, client, port)`` sends a response too long for a send slot
        (none is: UDP responses are truncated to at most 1,232 bytes). ``table()``,
        asked once per batch, gives cached answers by query bytes after the ID and
        their hit counts (``Responder.udp_table``): a hit is sent without a Python call,
        a new bytes object or a copy. The caller keeps a hit's bytes alive as long as it
        holds the table (the responder replaces a full table, never empties it).
        """
        received = memoryview(self._received)
        to_send = memoryview(self._to_send)
        names = memoryview(self._names)
        rx = memoryview(self._rx).cast("B").cast("I")
        rx_words, tx, tx_iov = self._rx_words, self._tx_words, self._tx_iov_words
        name_at, received_at, to_send_at = self._name_at, self._received_at, self._to_send_at
        step, rx_step, len_int, namelen_word = _MMSG_WORDS, 2 * _MMSG_WORDS, _LEN_INT, _NAMELEN_WORD
        # Where the address bytes sit in a sockaddr_in (4..8) / sockaddr_in6 (8..24).
        start, end = (8, 24) if self._v6 else (4, 8)
        peers: dict[bytes, IPAddress] = {}
        address_of = ipaddress.ip_address
        # The calls with their arguments converted once (ctypes converts Python ints
        # through ``argtypes`` on every call otherwise, two calls a batch).
        recvmmsg, sendmmsg = self._recvmmsg, self._sendmmsg
        fd = ctypes.c_int(self.sock.fileno())
        rx_args = (fd, ctypes.c_void_p(self._rx_addr), ctypes.c_uint(self.batch), _WAITFORONE)
        tx_ptr = ctypes.c_void_p(self._tx_addr)
        coalesce_below, coalesce_s, sleep = self._coalesce_below, self._coalesce_s, self._sleep
        while not stopping():
            count: int = recvmmsg(*rx_args, None)
            if count < 0:
                if ctypes.get_errno() == errno.EBADF:
                    return  # closed under us
                continue  # EINTR, or an ICMP error reported on the next read
            sent = 0
            fast = table()
            cached, counts = fast if fast is not None else (None, [])
            for i in range(count):
                length = rx[i * rx_step + len_int]
                if not length:  # the wake-up of shutdown(), or nothing to answer
                    # The kernel may have cleared the slot's address length; every other
                    # datagram leaves it at the socket family's size, which the next
                    # read of the slot needs (no per-batch reset).
                    rx_words[i * step + namelen_word] = _NAME_SIZE
                    continue
                at = i * SLOT_SIZE
                if cached is not None:  # a hit needs no client address
                    hit = cached.get(received[at + 2 : at + length].tobytes())
                    if hit is not None and not hit.per_client:
                        counts[hit.slot] += 1
                        # Nothing copied: the ID is read from the query's receive slot,
                        # the rest from the cached bytes (``address``), which the table
                        # keeps alive (the table is replaced, never emptied, while a
                        # batch may hold it: Responder.udp_table).
                        word = 4 * sent
                        tx_iov[word] = received_at[i]
                        tx_iov[word + 2] = hit.address
                        tx_iov[word + 3] = hit.size
                        tx[sent * step] = name_at[i]
                        sent += 1
                        continue
                offset = i * _NAME_SIZE
                key = names[offset + start : offset + end].tobytes()
                client = peers.get(key)
                if client is None:
                    client = address_of(key)
                    if len(peers) >= MAX_PEERS:
                        peers.clear()
                    peers[key] = client
                reply = respond(received[at : at + length].tobytes(), client)
                if reply is None:
                    continue
                size = len(reply)
                if size < 2:  # not a DNS message (respond() never makes one)
                    continue
                if size > SLOT_SIZE:
                    fallback(reply, client, int.from_bytes(names[offset + 2 : offset + 4]))
                    continue
                out = sent * SLOT_SIZE
                to_send[out : out + size] = reply
                word = 4 * sent
                tx_iov[word] = to_send_at[sent]  # the ID, then the rest
                tx_iov[word + 2] = to_send_at[sent] + 2
                tx_iov[word + 3] = size - 2
                tx[sent * step] = name_at[i]
                sent += 1
            if sent:
                done = sendmmsg(fd, tx_ptr, sent, 0)
                if done != sent:
                    self._send(sent, done)
            if 1 < count < coalesce_below:
                sleep(coalesce_s)  # let the next read find a batch (module docstring)

    def _send(self, count: int, done: int) -> None:
        """Send the rest of the first ``count`` send slots after a ``sendmmsg`` that
        returned ``done`` (fewer, or -1). A datagram the kernel refuses is dropped (the
        client retries, as after any UDP loss) and the rest still go."""
        if done < 0:
            if ctypes.get_errno() == errno.EBADF:
                return
            done = 1  # skip the datagram that failed
        fd = self.sock.fileno()
        while done < count:
            n = self._sendmmsg(fd, self._tx_addr + done * self._tx_size, count - done, 0)
            if n < 0:
                if ctypes.get_errno() == errno.EBADF:
                    return
                n = 1  # skip the datagram that failed
            done += n
