"""The residency audit trail: append-only, hash-chained JSONL, and its verifier.

Every residency-relevant decision is one line::

    {"hash":"<sha256 hex>","prev":"<hash of the previous line>","seq":42,"record":{...}}

``hash`` is SHA-256 over everything between ``{"hash":"…",`` and the closing ``}`` —
the previous hash, the sequence number and the record's canonical JSON (sorted keys,
no whitespace, ASCII). So editing any field, deleting, inserting or reordering lines
breaks the chain where it happened, and :func:`verify` says at which file and line.
The fixed layout lets the verifier check a line by slicing bytes, without parsing
JSON to find the hash (1M records verify in a few seconds).

**No prompt text, by construction.** :class:`AuditRecord` is a frozen type with
exactly the decision's fields, each validated against a narrow pattern (ids, country
codes, reason codes), so free text cannot be logged through it.

**Rotation** starts a new file (``<prefix>-<first seq>.jsonl``) when the current one
would exceed ``max_bytes``; the chain simply continues, so the first record of a new
file carries the last hash of the previous one and a missing or truncated file breaks
the chain at the next file's first line.

**Truncation of the newest file's tail** cannot be seen from the chain alone; the
writer therefore keeps ``<prefix>.head`` (the last seq and hash, rewritten in place
after each record) and ``verify`` checks the chain still reaches it. Whoever can cut
the log can delete or rewrite the head file too, so the head is also **anchored**
outside the files: an :class:`Anchor` (the chain's directory and prefix, the file
holding the last record, its seq and hash, the time) that the tiers write to the
state store at every rotation and at a bounded interval (:mod:`gtm.audit_anchor`; this
package stays store-free and only defines the record and the check). ``verify`` given
the stored anchor says whether the chain still reaches it (:func:`verify_chain`): a
chain that ends below its anchor has lost its tail, whatever its ``.head`` says, and
records after the anchor are counted as not yet anchored. An anchor protects against
whoever can write the log's directory but not the store; a writer that can also write
the store can rewrite both (SECURITY.md).

**Durability.** Each record is one ``write`` followed by ``flush``, so a process crash
loses nothing already appended. ``fsync`` is a choice (:class:`FsyncPolicy`): the
default fsyncs when a file is rotated or closed, not per record — on common SSDs an
fsync costs 0.1–10 ms, which would cap decisions at a few hundred per second; a power
loss can then lose the records written since the last rotation, never corrupt earlier
ones (the verifier reports a torn last line as truncation).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from policies.errors import AuditChainError, AuditError
from policies.residency import ResidencyQuery, Verdict

GENESIS = "0" * 64
#: Rotate files at this size. 64 MiB is ~200k records: small enough to ship and verify
#: one file quickly, large enough that rotation (and its fsync) is rare.
DEFAULT_MAX_BYTES = 64 << 20

_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_COUNTRY = re.compile(r"^[A-Z]{2}$")
_TOKEN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_REASON = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_MAX_ALLOWED = 256

_HEAD = b'{"hash":"'
_PREV = b'"prev":"'
_SEQ = b'","seq":'
_RECORD = b',"record":'
_PAYLOAD_START = len(_HEAD) + 64 + 2  # after '{"hash":"<64 hex>",'


class ChainRecord(Protocol):
    """What a chain line carries: :class:`AuditRecord` here; other logs (the admin audit
    log of :mod:`gtm.admin_auth`) reuse the same chain format with their own record type."""

    def to_json(self) -> dict[str, Any]: ...


class FsyncPolicy(StrEnum):
    NEVER = "never"  # flush to the OS only (survives a process crash)
    ROTATE = "rotate"  # also fsync when a file is rotated or closed
    ALWAYS = "always"  # fsync every record (slow; survives power loss record by record)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One residency decision. Only these fields exist; each is validated."""

    time: float  # Unix seconds
    tenant: str
    client_country: str | None
    data_class: str
    policy_revision: str
    allowed: tuple[str, ...]  # sorted, unique
    chosen_region: str | None  # None when refused
    reason: str
    decision_id: str
    #: Where the client's location came from (``geoip``, ``trusted-proxy-xff``,
    #: ``signed-upstream``, ``unknown-policy``); ``None`` in records written before tiers
    #: said, and then left out of the line, so those lines keep their bytes and verify.
    location_source: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.time, int | float) and math.isfinite(self.time)) or self.time < 0:
            raise ValueError("time must be a finite, non-negative Unix timestamp")
        _check(_ID, self.tenant, "tenant")
        _check(_ID, self.data_class, "data_class")
        _check(_TOKEN, self.policy_revision, "policy_revision")
        _check(_REASON, self.reason, "reason")
        _check(_TOKEN, self.decision_id, "decision_id")
        if self.client_country is not None:
            _check(_COUNTRY, self.client_country, "client_country")
        if self.location_source is not None:
            _check(_REASON, self.location_source, "location_source")
        if self.chosen_region is not None:
            _check(_ID, self.chosen_region, "chosen_region")
        if len(self.allowed) > _MAX_ALLOWED:
            raise ValueError(f"at most {_MAX_ALLOWED} allowed regions")
        for region in self.allowed:
            _check(_ID, region, "allowed")
        object.__setattr__(self, "allowed", tuple(sorted(set(self.allowed))))
        object.__setattr__(self, "time", float(self.time))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "allowed": list(self.allowed),
            "chosen_region": self.chosen_region,
            "client_country": self.client_country,
            "data_class": self.data_class,
            "decision_id": self.decision_id,
            "policy_revision": self.policy_revision,
            "reason": self.reason,
            "tenant": self.tenant,
            "time": self.time,
        }
        if self.location_source is not None:
            data["location_source"] = self.location_source
        return data

    @classmethod
    def from_json(cls, data: Any) -> AuditRecord:
        if not isinstance(data, dict) or not _REQUIRED <= set(data) <= _FIELDS:
            raise ValueError(f"expected the fields {sorted(_REQUIRED)} (and location_source)")
        if not isinstance(data["allowed"], list):
            raise ValueError("allowed must be a list")
        return cls(**{**data, "allowed": tuple(data["allowed"])})


_FIELDS = frozenset(AuditRecord.__dataclass_fields__)
_REQUIRED = _FIELDS - {"location_source"}


def decision_record(
    query: ResidencyQuery,
    verdict: Verdict,
    *,
    time: float,
    policy_revision: str,
    chosen_region: str | None,
    decision_id: str,
    location_source: str | None = None,
) -> AuditRecord:
    """The audit record of one residency decision, the same way in every tier.

    Raises:
        ValueError: a field is not an id / code (e.g. a data class that is not a
            lowercase id): validate request fields before routing on them.
    """
    if chosen_region is not None and chosen_region not in verdict.allowed:
        raise ValueError(f"chosen region {chosen_region!r} is outside the allowed set")
    return AuditRecord(
        time=time,
        tenant=query.tenant,
        client_country=query.client_country,
        data_class=query.data_class,
        policy_revision=policy_revision,
        allowed=tuple(verdict.allowed),
        chosen_region=chosen_region,
        reason=verdict.reason.value,
        decision_id=decision_id,
        location_source=location_source,
    )


def _check(pattern: re.Pattern[str], value: object, name: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{name}: {value!r} does not match {pattern.pattern}")


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def encode_line(seq: int, prev: str, record: ChainRecord) -> tuple[bytes, str]:
    """The line for ``record`` and its hash."""
    payload = b"%s%s%s%d%s%s" % (
        _PREV,
        prev.encode(),
        _SEQ,
        seq,
        _RECORD,
        _canonical(record.to_json()),
    )
    digest = hashlib.sha256(payload).hexdigest()
    return b'%s%s",%s}\n' % (_HEAD, digest.encode(), payload), digest


@dataclass(frozen=True, slots=True)
class ParsedLine:
    hash: str
    prev: str
    seq: int
    record: bytes  # canonical JSON of the record
    hash_ok: bool


def parse_line(line: bytes) -> ParsedLine:
    """Split one line (without its newline) by the fixed layout; ValueError if it is not one."""
    if not (line.startswith(_HEAD) and line.endswith(b"}") and len(line) > _PAYLOAD_START + 90):
        raise ValueError("not an audit record")
    claimed = line[len(_HEAD) : len(_HEAD) + 64]
    payload = line[_PAYLOAD_START:-1]
    if line[len(_HEAD) + 64 : _PAYLOAD_START] != b'",' or not payload.startswith(_PREV):
        raise ValueError("not an audit record")
    prev = payload[len(_PREV) : len(_PREV) + 64]
    rest = payload[len(_PREV) + 64 :]
    if not rest.startswith(_SEQ):
        raise ValueError("not an audit record")
    seq_text, sep, record = rest[len(_SEQ) :].partition(_RECORD)
    if not sep or not seq_text.isdigit():
        raise ValueError("not an audit record")
    return ParsedLine(
        hash=claimed.decode("ascii", "replace"),
        prev=prev.decode("ascii", "replace"),
        seq=int(seq_text),
        record=record,
        hash_ok=hashlib.sha256(payload).hexdigest().encode() == claimed,
    )


@dataclass(frozen=True, slots=True)
class Head:
    """The end of a chain: the last record's sequence number and hash."""

    seq: int
    hash: str

    def to_bytes(self) -> bytes:
        # Fixed width, so an in-place rewrite always covers the previous content.
        return _canonical({"hash": self.hash, "seq": self.seq}).ljust(_HEAD_WIDTH - 1) + b"\n"

    @classmethod
    def read(cls, path: Path) -> Head:
        try:
            data = json.loads(path.read_bytes())
            head = cls(seq=int(data["seq"]), hash=str(data["hash"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"{path}: not a readable audit head file ({exc})") from None
        return head


_HEAD_WIDTH = 128


@dataclass(frozen=True, slots=True)
class ChainPosition:
    """Where a chain ends: the name of the file holding its last record (no directory),
    and that record's sequence number and hash."""

    file: str
    seq: int
    hash: str

    @property
    def head(self) -> Head:
        return Head(self.seq, self.hash)

    @property
    def file_records(self) -> int:
        """Records of :attr:`file` up to and including ``seq`` (files are named for their
        first seq)."""
        match = _FILE_SEQ.search(self.file)
        return self.seq - int(match.group(1)) + 1 if match else self.seq


_FILE_SEQ = re.compile(r"-([0-9]{12})\.jsonl$")

#: Called by the writer, under its lock, when it starts a new file: the position of the
#: file it leaves (its last record). Must only record it and return.
RotationHook = Callable[[ChainPosition], None]


# ---------------------------------------------------------------------------- writer


class AuditWriter:
    """Appends records to ``<directory>/<prefix>-<first seq>.jsonl`` files.

    Safe for concurrent callers in one process (a lock serialises appends); a second
    writer on the same directory — in this process or another — is refused (an
    exclusive ``flock`` on ``<prefix>.lock``), since two writers would fork the chain.
    Opening a directory that already holds a chain continues it.

    Raises:
        AuditChainError: the newest existing record is damaged (torn or edited).
        AuditError: the directory is locked by another writer or cannot be written.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        prefix: str = "audit",
        max_bytes: int = DEFAULT_MAX_BYTES,
        fsync: FsyncPolicy = FsyncPolicy.ROTATE,
    ) -> None:
        if not _ID.fullmatch(prefix):
            raise ValueError(f"prefix must be a lowercase id, got {prefix!r}")
        self._dir = Path(directory)
        self._prefix = prefix
        self._max_bytes = max_bytes
        self._fsync = fsync
        self._lock = threading.Lock()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire_dir_lock()
        self._file: BinaryIO | None = None
        self._size = 0
        self._path = self._dir  # the open file (meaningful while _file is not None)
        self._head_path: Path | None = None  # the file holding the head record
        self._on_rotate: RotationHook | None = None
        try:
            self._head = self._recover()
            self._head_fd = os.open(self._dir / f"{prefix}.head", os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _acquire_dir_lock(self) -> int:
        fd = os.open(self._dir / f"{self._prefix}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise AuditError(f"{self._dir}: another audit writer holds the lock") from None
            raise AuditError(f"{self._dir}: cannot lock: {exc.strerror}") from None
        return fd

    @property
    def head(self) -> Head:
        """The last record appended (seq 0 and the genesis hash before the first)."""
        return self._head

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def prefix(self) -> str:
        return self._prefix

    def position(self) -> ChainPosition | None:
        """Where the chain ends now (None before its first record)."""
        with self._lock:
            return self._position()

    def _position(self) -> ChainPosition | None:
        if self._head.seq == 0 or self._head_path is None:
            return None
        return ChainPosition(self._head_path.name, self._head.seq, self._head.hash)

    def set_rotation_hook(self, hook: RotationHook | None) -> None:
        """Have ``hook`` called with the position of each file the writer leaves for a
        new one (the anchorer, :mod:`gtm.audit_anchor`, anchors it)."""
        with self._lock:
            self._on_rotate = hook

    def files(self) -> list[Path]:
        return chain_files(self._dir, self._prefix)

    def _recover(self) -> Head:
        for path in reversed(self.files()):
            last = _last_line(path)
            if last is None:
                continue
            try:
                parsed = parse_line(last[:-1]) if last.endswith(b"\n") else None
            except ValueError:
                parsed = None
            if parsed is None or not parsed.hash_ok:
                raise AuditChainError(
                    f"{path}: the last record is damaged (torn write or edit); run "
                    "`gtm audit verify` on the directory and move the file aside to start a "
                    "new chain"
                )
            self._head_path = path
            return Head(parsed.seq, parsed.hash)
        return Head(0, GENESIS)

    def append(self, record: ChainRecord) -> Head:
        """Append ``record``; returns its position in the chain."""
        with self._lock:
            if self._lock_fd < 0:
                raise AuditError("audit writer is closed")
            seq = self._head.seq + 1
            line, digest = encode_line(seq, self._head.hash, record)
            stream = self._stream_for(seq, len(line))
            try:
                stream.write(line)
                stream.flush()
                if self._fsync is FsyncPolicy.ALWAYS:
                    os.fsync(stream.fileno())
            except OSError as exc:
                raise AuditError(f"cannot append to the audit log: {exc.strerror}") from None
            self._size += len(line)
            self._head = Head(seq, digest)
            self._head_path = self._path
            os.pwrite(self._head_fd, self._head.to_bytes(), 0)
            return self._head

    def _stream_for(self, seq: int, length: int) -> BinaryIO:
        if self._file is not None and self._size + length > self._max_bytes and self._size:
            self._close_file()
        if self._file is None:
            current = self.files()
            newest = current[-1] if current else None
            if newest is not None and newest.stat().st_size + length <= self._max_bytes:
                path = newest
            else:
                path = self._dir / f"{self._prefix}-{seq:012d}.jsonl"
            left = self._position() if path != self._head_path else None
            self._file = path.open("ab")
            self._path = path
            self._size = path.stat().st_size
            if self._fsync is not FsyncPolicy.NEVER:
                _fsync_dir(self._dir)
            if left is not None and self._on_rotate is not None:
                self._on_rotate(left)
        return self._file

    def _close_file(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self._fsync is not FsyncPolicy.NEVER:
            os.fsync(self._file.fileno())
        self._file.close()
        self._file = None

    def close(self) -> None:
        with self._lock:
            if self._lock_fd < 0:
                return
            self._close_file()
            if self._fsync is not FsyncPolicy.NEVER:
                os.fsync(self._head_fd)
            os.close(self._head_fd)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_line(path: Path, chunk: int = 1 << 16) -> bytes | None:
    """The last line of ``path`` (with its newline if it has one), or None if empty."""
    with path.open("rb") as stream:
        end = stream.seek(0, os.SEEK_END)
        if end == 0:
            return None
        data = b""
        position = end
        while position > 0:
            step = min(chunk, position)
            position -= step
            stream.seek(position)
            data = stream.read(step) + data
            cut = data.rfind(b"\n", 0, len(data) - 1)
            if cut >= 0:
                return data[cut + 1 :]
        return data


def chain_files(directory: Path, prefix: str = "audit") -> list[Path]:
    """The chain's files in a directory, oldest first (names sort by first seq)."""
    pattern = re.compile(rf"^{re.escape(prefix)}-[0-9]{{12}}\.jsonl$")
    return sorted(p for p in directory.iterdir() if pattern.fullmatch(p.name))


_CHAIN_FILE = re.compile(r"^(?P<prefix>[a-z0-9][a-z0-9-]*)-[0-9]{12}\.jsonl$")


@dataclass(frozen=True, slots=True)
class Chain:
    """One writer's chain: the files ``<directory>/<prefix>-<seq>.jsonl`` and its head."""

    directory: Path
    prefix: str

    @property
    def files(self) -> list[Path]:
        return chain_files(self.directory, self.prefix)

    @property
    def head_file(self) -> Path:
        return self.directory / f"{self.prefix}.head"


def find_chains(root: Path) -> list[Chain]:
    """Every chain under ``root`` (itself and its subdirectories, in path order).

    A deployment writes one chain per writer, each in a directory of its own (a writer
    locks its directory): ``gtm up``'s run directory holds ``audit/global``,
    ``audit/regional-<region>`` and ``admin-audit``.
    """
    chains: list[Chain] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories.sort()
        prefixes = sorted({m["prefix"] for n in names if (m := _CHAIN_FILE.fullmatch(n))})
        chains.extend(Chain(Path(directory), prefix) for prefix in prefixes)
    return chains


# ---------------------------------------------------------------------------- anchors

_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class PriorAnchor:
    """An anchor a writer found its chain below when it started: the chain had lost
    records the store had seen (its tail was cut, or its files replaced) before the
    restart."""

    seq: int
    hash: str
    revision: int
    found_seq: int  # where the chain ended when the writer started

    def to_json(self) -> dict[str, Any]:
        return {
            "found_seq": self.found_seq,
            "hash": self.hash,
            "revision": self.revision,
            "seq": self.seq,
        }


@dataclass(frozen=True, slots=True)
class Anchor:
    """A chain's end as recorded outside its directory (the state store, by
    :mod:`gtm.audit_anchor`): which chain (the writer's host, absolute directory and
    prefix), the file holding its last record, that record's seq and hash, and when.

    ``cut`` is carried from the first anchor a writer wrote after finding its chain
    below the stored anchor, in every later anchor of that chain: a restart does not
    launder a cut tail.
    """

    directory: str
    prefix: str
    file: str
    seq: int
    hash: str
    time: float
    host: str = ""
    cut: PriorAnchor | None = None

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.prefix):
            raise ValueError(f"prefix: {self.prefix!r} is not a lowercase id")
        if not (self.file.startswith(f"{self.prefix}-") and _FILE_SEQ.search(self.file)):
            raise ValueError(f"file: {self.file!r} is not a file of the {self.prefix} chain")
        if not _HASH.fullmatch(self.hash):
            raise ValueError("hash: expected 64 lowercase hex digits")
        if self.seq < 1:
            raise ValueError("seq: an anchor records at least one record")
        if not math.isfinite(self.time) or self.time < 0:
            raise ValueError("time must be a finite, non-negative Unix timestamp")

    @property
    def position(self) -> ChainPosition:
        return ChainPosition(self.file, self.seq, self.hash)

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "directory": self.directory,
            "file": self.file,
            "hash": self.hash,
            "host": self.host,
            "prefix": self.prefix,
            "seq": self.seq,
            "time": self.time,
        }
        if self.cut is not None:
            data["cut"] = self.cut.to_json()
        return _canonical(data)

    @classmethod
    def decode(cls, raw: bytes) -> Anchor:
        """The anchor in ``raw``; ValueError if it is not one."""
        try:
            data = json.loads(raw)
            cut = data.get("cut")
            return cls(
                directory=_text(data["directory"]),
                prefix=_text(data["prefix"]),
                file=_text(data["file"]),
                seq=_integer(data["seq"]),
                hash=_text(data["hash"]),
                time=float(data["time"]),
                host=_text(data.get("host", "")),
                cut=None
                if cut is None
                else PriorAnchor(
                    seq=_integer(cut["seq"]),
                    hash=_text(cut["hash"]),
                    revision=_integer(cut["revision"]),
                    found_seq=_integer(cut["found_seq"]),
                ),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an audit anchor ({exc})") from None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _integer(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class StoredAnchor:
    """An anchor as read back: with its key and the store revision that wrote it."""

    anchor: Anchor
    revision: int
    key: str

    def describe(self) -> str:
        return f"the anchor at revision {self.revision} ({_iso(self.anchor.time)})"


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def match_anchors(
    chains: Sequence[Chain], anchors: Iterable[StoredAnchor]
) -> dict[Chain, StoredAnchor]:
    """Which anchor records each chain: the one naming its directory (resolved) and
    prefix; else, for a chain copied elsewhere, the only one naming a directory of the
    same name and that prefix. Several for one directory (hosts sharing a path): the
    newest."""
    pool = sorted(anchors, key=lambda stored: stored.revision, reverse=True)
    found: dict[Chain, StoredAnchor] = {}
    for chain in chains:
        here = chain.directory.resolve()
        same = [a for a in pool if a.anchor.prefix == chain.prefix]
        exact = [a for a in same if Path(a.anchor.directory) == here]
        if exact:
            found[chain] = exact[0]
            continue
        named = {a.key: a for a in same if Path(a.anchor.directory).name == here.name}
        if len(named) == 1:
            found[chain] = next(iter(named.values()))
    return found


def orphan_anchors(
    roots: Iterable[Path], chains: Sequence[Chain], anchors: Iterable[StoredAnchor]
) -> list[StoredAnchor]:
    """Anchors of directories under ``roots`` in which no chain was found: their
    chains were deleted (or their files renamed)."""
    matched = {a.key for a in match_anchors(chains, anchors).values()}
    resolved = [root.resolve() for root in roots]
    return [
        a
        for a in anchors
        if a.key not in matched
        and any(Path(a.anchor.directory).is_relative_to(root) for root in resolved)
    ]


# ---------------------------------------------------------------------------- verifier


@dataclass(frozen=True, slots=True)
class AuditProblem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return (
            f"{self.file}:{self.line}: {self.message}"
            if self.line
            else f"{self.file}: {self.message}"
        )


@dataclass(frozen=True, slots=True)
class VerifyReport:
    records: int
    files: int
    problems: tuple[AuditProblem, ...]
    head: Head | None  # the last well-formed record
    #: The anchor the chain was checked against, if any.
    anchor: StoredAnchor | None = None
    #: Records after the anchor (written since it; not yet anchored).
    unanchored: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class _Verifier:
    def __init__(self, *, from_genesis: bool, check_records: bool, max_problems: int) -> None:
        self.from_genesis = from_genesis
        self.check_records = check_records
        self.max_problems = max_problems
        self.problems: list[AuditProblem] = []
        self.records = 0
        self.expected_prev: str | None = GENESIS if from_genesis else None
        self.expected_seq: int | None = 1 if from_genesis else None
        self.head: Head | None = None
        self.seen: dict[int, str] = {}  # seq -> hash, only for checking a head file

    def problem(self, file: str, line: int, message: str) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(AuditProblem(file, line, message))

    def file(self, path: Path, previous: str | None, watch: frozenset[int]) -> None:
        name = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            self.problem(name, 0, f"cannot read: {exc.strerror}")
            self.expected_prev = self.expected_seq = None
            return
        if not data:
            self.problem(name, 0, "empty file (truncated?)")
            return
        lines = data.split(b"\n")
        if lines[-1]:
            self.problem(name, len(lines), "last line is incomplete (file truncated mid-record)")
        self._lines(name, lines[:-1], previous, watch)
        self._check_file_name(path, lines[0])

    def _lines(
        self, name: str, lines: list[bytes], previous: str | None, watch: frozenset[int]
    ) -> None:
        """The hot loop: a well-linked line costs one SHA-256 and a few slices; anything
        unexpected drops to :meth:`line`, which diagnoses it."""
        sha256 = hashlib.sha256
        start, hash_end = len(_HEAD), len(_HEAD) + 64
        prev_at, seq_at = len(_PREV), len(_PREV) + 64 + len(_SEQ)
        for number, line in enumerate(lines, start=1):
            expected_prev, expected_seq = self.expected_prev, self.expected_seq
            payload = line[_PAYLOAD_START:-1]
            claimed = line[start:hash_end]
            if (
                expected_prev is not None
                and expected_seq is not None
                and not self.check_records
                and line[:start] == _HEAD
                and payload[prev_at : prev_at + 64] == expected_prev.encode()
                and sha256(payload).hexdigest().encode() == claimed
            ):
                cut = payload.find(_RECORD, seq_at)
                if cut > 0 and payload[seq_at:cut] == b"%d" % expected_seq:
                    self.records += 1
                    self.expected_prev = claimed.decode()
                    self.expected_seq = expected_seq + 1
                    if expected_seq in watch:
                        self.seen[expected_seq] = self.expected_prev
                    continue
            self.line(name, number, line, previous if number == 1 else None, watch)
        if self.expected_seq is not None:
            self.head = Head(self.expected_seq - 1, self.expected_prev or GENESIS)

    def line(
        self, name: str, number: int, line: bytes, previous: str | None, watch: frozenset[int]
    ) -> None:
        try:
            parsed = parse_line(line)
        except ValueError:
            self.problem(name, number, "not an audit record (malformed line)")
            self.expected_prev = self.expected_seq = None
            return
        self.records += 1
        if not parsed.hash_ok:
            self.problem(
                name, number, f"seq {parsed.seq}: content does not match its hash (edited)"
            )
        elif self.check_records:
            self._check_record(name, number, parsed)
        self._check_link(name, number, parsed, previous)
        if parsed.seq in watch:
            self.seen[parsed.seq] = parsed.hash
        self.expected_prev, self.expected_seq = parsed.hash, parsed.seq + 1

    def _check_record(self, name: str, number: int, parsed: ParsedLine) -> None:
        try:
            AuditRecord.from_json(json.loads(parsed.record))
        except (ValueError, TypeError) as exc:
            self.problem(name, number, f"seq {parsed.seq}: not a valid audit record ({exc})")

    def _check_link(self, name: str, number: int, parsed: ParsedLine, previous: str | None) -> None:
        expected_seq, expected_prev = self.expected_seq, self.expected_prev
        if expected_seq is None or expected_prev is None:
            return  # resynchronising after a malformed line, or a chain checked mid-way
        if parsed.seq > expected_seq:
            missing = parsed.seq - expected_seq
            where = f" at the end of {previous}" if previous else ""
            self.problem(
                name,
                number,
                f"{missing} record(s) missing before this one{where} "
                f"(expected seq {expected_seq}, found {parsed.seq}): deleted or truncated",
            )
        elif parsed.seq < expected_seq:
            self.problem(
                name,
                number,
                f"out of order: expected seq {expected_seq}, found {parsed.seq} "
                "(records reordered, duplicated or inserted)",
            )
        elif parsed.prev != expected_prev:
            if expected_seq == 1:
                message = "the first record does not start from the genesis hash"
            elif previous:
                message = f"does not continue the chain of {previous} (files out of order?)"
            else:
                message = "does not link to the previous record (a record was replaced or inserted)"
            self.problem(name, number, f"seq {parsed.seq}: {message}")

    def _check_file_name(self, path: Path, first_line: bytes) -> None:
        match = _FILE_SEQ.search(path.name)
        if match is None:
            return
        try:
            first_seq = parse_line(first_line).seq
        except ValueError:
            return
        if int(match.group(1)) != first_seq:
            self.problem(
                str(path),
                1,
                f"file is named for seq {int(match.group(1))} but starts at seq {first_seq} "
                "(its first records were removed)",
            )


def verify(
    paths: Sequence[str | Path],
    *,
    head: Head | None = None,
    anchor: StoredAnchor | None = None,
    from_genesis: bool = True,
    check_records: bool = False,
    max_problems: int = 100,
) -> VerifyReport:
    """Verify a chain spread over ``paths`` (in chain order; directories expand to their
    chain files and contribute their ``.head`` file when ``head`` is not given).

    Args:
        head: where the chain must reach (detects truncation of the newest file).
        anchor: the chain's anchor from the state store: the chain must reach and
            contain its record (detects a cut tail even when the head file was cut
            too); records after it are counted in ``unanchored``.
        from_genesis: the first record must be the chain's first (seq 1, genesis
            hash). Pass False when older files were deleted by retention.
        check_records: also parse each record and validate its fields (slower: a JSON
            parse and a model validation per record; the chain alone already proves the
            records are the ones written).
    """
    files, found_head = _expand(paths)
    verifier = _Verifier(
        from_genesis=from_genesis, check_records=check_records, max_problems=max_problems
    )
    head = head or found_head
    watch = frozenset(
        p.seq for p in (head, anchor.anchor if anchor is not None else None) if p is not None
    )
    previous: str | None = None
    for path in files:
        verifier.file(path, previous, watch)
        previous = str(path)
    if not files:
        verifier.problem(", ".join(map(str, paths)) or "(no paths)", 0, "no audit files given")
    if head is not None:
        _check_head(verifier, head, previous or "")
    unanchored = _check_anchor(verifier, anchor, previous or "") if anchor is not None else 0
    return VerifyReport(
        verifier.records,
        len(files),
        tuple(verifier.problems),
        verifier.head,
        anchor=anchor,
        unanchored=unanchored,
    )


def verify_chain(
    chain: Chain,
    *,
    anchor: StoredAnchor | None = None,
    from_genesis: bool = True,
    check_records: bool = False,
    max_problems: int = 100,
) -> VerifyReport:
    """Verify one writer's chain against its ``.head`` file and, if given, its anchor:
    a head file missing (or emptied) while the store holds an anchor is a problem too —
    the writer rewrites it after every record, so it was deleted.

    Raises:
        AuditError: the head file exists but cannot be read.
    """
    head_file = chain.head_file
    head = Head.read(head_file) if head_file.is_file() and head_file.stat().st_size else None
    report = verify(
        chain.files,
        head=head,
        anchor=anchor,
        from_genesis=from_genesis,
        check_records=check_records,
        max_problems=max_problems,
    )
    if head is None and anchor is not None:
        state = "empty" if head_file.exists() else "missing"
        missing = AuditProblem(
            str(head_file),
            0,
            f"{state}, but {anchor.describe()} records {anchor.anchor.seq} records: "
            "the head file was deleted or emptied",
        )
        report = replace(report, problems=(missing, *report.problems))
    return report


def _check_anchor(verifier: _Verifier, stored: StoredAnchor, last_file: str) -> int:
    """Problems if the chain does not reach or contain the anchored record; the number
    of records after it."""
    anchor = stored.anchor
    seen = verifier.seen.get(anchor.seq)
    reached = verifier.head.seq if verifier.head is not None else None
    records = f"{anchor.seq} records (last seq {anchor.seq}, hash {anchor.hash}, in {anchor.file})"
    if anchor.cut is not None:
        cut = anchor.cut
        verifier.problem(
            last_file,
            0,
            f"tail was cut before a restart: {stored.describe()} says its writer found the "
            f"chain ending at seq {cut.found_seq} without the record of the anchor at revision "
            f"{cut.revision} (seq {cut.seq}, hash {cut.hash}): "
            + (
                f"{cut.seq - cut.found_seq} record(s) lost"
                if cut.seq > cut.found_seq
                else "the anchored record was replaced"
            ),
        )
    if seen is None:
        if reached is not None and reached < anchor.seq:
            verifier.problem(
                last_file,
                0,
                f"tail may be missing: {stored.describe()} records {records} but the chain "
                f"ends at seq {reached}: {anchor.seq - reached} record(s) cut",
            )
        else:
            verifier.problem(
                last_file,
                0,
                f"{stored.describe()} records {records}, and that record is not in the chain",
            )
        return 0
    if seen != anchor.hash:
        verifier.problem(
            last_file,
            0,
            f"record seq {anchor.seq} does not match {stored.describe()} "
            f"(hash {anchor.hash}): rewritten",
        )
        return 0
    return max(0, (reached or anchor.seq) - anchor.seq)


def _check_head(verifier: _Verifier, head: Head, last_file: str) -> None:
    if head.seq == 0:
        return
    reached = verifier.head.seq if verifier.head else 0
    if reached < head.seq:
        verifier.problem(
            last_file,
            0,
            f"chain ends at seq {reached} but the head says seq {head.seq}: "
            f"{head.seq - reached} record(s) missing at the end (truncated)",
        )
    elif verifier.seen.get(head.seq) != head.hash:
        verifier.problem(
            last_file, 0, f"record seq {head.seq} does not match the head hash (rewritten)"
        )


def _expand(paths: Iterable[str | Path]) -> tuple[list[Path], Head | None]:
    files: list[Path] = []
    head: Head | None = None
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            files.extend(found)
            prefixes = {p.name.rsplit("-", 1)[0] for p in found}
            for prefix in prefixes:
                head_path = path / f"{prefix}.head"
                if head_path.exists() and head_path.stat().st_size:
                    head = Head.read(head_path)
        else:
            files.append(path)
    return files, head


def iter_records(paths: Sequence[str | Path]) -> Iterator[tuple[int, AuditRecord]]:
    """(seq, record) for every well-formed line, without verifying the chain."""
    files, _ = _expand(paths)
    for path in files:
        with path.open("rb") as stream:
            for line in stream:
                parsed = parse_line(line.rstrip(b"\n"))
                yield parsed.seq, AuditRecord.from_json(json.loads(parsed.record))


def record_hash(directory: Path, prefix: str, seq: int) -> str | None:
    """The hash of record ``seq`` of a chain as its files hold it now (None if no file
    holds it), reading only the file named for the last first-seq at or below ``seq``.
    Checks the line's own hash, not the chain (that is :func:`verify`'s job)."""
    holding = [path for path in chain_files(directory, prefix) if _first_seq(path) <= seq]
    if not holding:
        return None
    with holding[-1].open("rb") as stream:
        for line in stream:
            try:
                parsed = parse_line(line.rstrip(b"\n"))
            except ValueError:
                continue
            if parsed.seq == seq:
                return parsed.hash if parsed.hash_ok else None
    return None


def _first_seq(path: Path) -> int:
    match = _FILE_SEQ.search(path.name)
    return int(match.group(1)) if match else 0
