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
after each record) and ``verify`` checks the chain still reaches it. An attacker who
can rewrite the log can rewrite the head file too: for tamper-evidence against the
operator, also ship the head hash somewhere they cannot write (the state store, a
remote log).

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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
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
            self._file = path.open("ab")
            self._size = path.stat().st_size
            if self._fsync is not FsyncPolicy.NEVER:
                _fsync_dir(self._dir)
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

    def file(self, path: Path, previous: str | None, watch_seq: int | None) -> None:
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
        self._lines(name, lines[:-1], previous, watch_seq)
        self._check_file_name(path, lines[0])

    def _lines(
        self, name: str, lines: list[bytes], previous: str | None, watch_seq: int | None
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
                    if expected_seq == watch_seq:
                        self.seen[expected_seq] = self.expected_prev
                    continue
            self.line(name, number, line, previous if number == 1 else None, watch_seq)
        if self.expected_seq is not None:
            self.head = Head(self.expected_seq - 1, self.expected_prev or GENESIS)

    def line(
        self, name: str, number: int, line: bytes, previous: str | None, watch_seq: int | None
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
        if watch_seq is not None and parsed.seq == watch_seq:
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
        match = re.search(r"-([0-9]{12})\.jsonl$", path.name)
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
    from_genesis: bool = True,
    check_records: bool = False,
    max_problems: int = 100,
) -> VerifyReport:
    """Verify a chain spread over ``paths`` (in chain order; directories expand to their
    chain files and contribute their ``.head`` file when ``head`` is not given).

    Args:
        head: where the chain must reach (detects truncation of the newest file).
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
    watch = head.seq if head is not None else None
    previous: str | None = None
    for path in files:
        verifier.file(path, previous, watch)
        previous = str(path)
    if not files:
        verifier.problem(", ".join(map(str, paths)) or "(no paths)", 0, "no audit files given")
    if head is not None:
        _check_head(verifier, head, previous or "")
    return VerifyReport(verifier.records, len(files), tuple(verifier.problems), verifier.head)


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
