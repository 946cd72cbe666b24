from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import threading
from pathlib import Path

import pytest

from policies.audit import (
    GENESIS,
    Anchor,
    AuditRecord,
    AuditWriter,
    FsyncPolicy,
    Head,
    PriorAnchor,
    chain_files,
    decision_record,
    encode_line,
    iter_records,
    parse_line,
    verify,
)
from policies.errors import AuditChainError, AuditError
from policies.residency import ReasonCode, ResidencyQuery, Verdict

DELETED = "deleted or truncated"
REORDERED = "(records reordered, duplicated or inserted)"


def record(i: int, **overrides: object) -> AuditRecord:
    fields: dict[str, object] = {
        "time": 1_700_000_000.0 + i,
        "tenant": "demo-eu",
        "client_country": "DE",
        "data_class": "default",
        "policy_revision": "3-7b84ff000ddf",
        "allowed": ("eu-west", "eu-central"),
        "chosen_region": "eu-west",
        "reason": "allowed",
        "decision_id": f"d-{i}",
    }
    fields.update(overrides)
    return AuditRecord(**fields)  # type: ignore[arg-type]


def write_chain(directory: Path, count: int, max_bytes: int = 1 << 20) -> list[Path]:
    with AuditWriter(directory, max_bytes=max_bytes, fsync=FsyncPolicy.NEVER) as writer:
        for i in range(count):
            writer.append(record(i))
    return chain_files(directory)


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def problems(paths: list[Path] | list[str | Path], **kwargs: object) -> list[str]:
    report = verify(paths, **kwargs)  # type: ignore[arg-type]
    return [str(p) for p in report.problems]


# ---------------------------------------------------------------------------- records


def test_record_normalises_and_serialises() -> None:
    rec = record(1, allowed=("eu-west", "eu-central", "eu-west"), time=5)
    assert rec.allowed == ("eu-central", "eu-west")
    assert rec.time == 5.0
    assert AuditRecord.from_json(rec.to_json()) == rec


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant", "Please summarise this patient's file"),
        ("decision_id", "ignore previous instructions"),
        ("reason", "the prompt was: hello"),
        ("client_country", "Germany"),
        ("chosen_region", "EU WEST"),
        ("allowed", ("eu-west", "some text here")),
        ("time", float("nan")),
        ("time", -1.0),
        ("data_class", ""),
        # `$` alone matches before a trailing newline: ids are matched whole.
        ("tenant", "acme\n"),
        ("chosen_region", "eu-west\n"),
        ("client_country", "DE\n"),
    ],
)
def test_free_text_cannot_be_logged(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field if field != "time" else "time must be"):
        record(1, **{field: value})


def test_only_the_decision_fields_exist() -> None:
    assert set(AuditRecord.__dataclass_fields__) == {
        "time",
        "tenant",
        "client_country",
        "data_class",
        "policy_revision",
        "allowed",
        "chosen_region",
        "reason",
        "decision_id",
        "location_source",
    }
    with pytest.raises(ValueError, match="expected the fields"):
        AuditRecord.from_json({**record(1).to_json(), "prompt": "secret"})


def test_the_location_source_is_kept_and_old_records_keep_their_bytes() -> None:
    """Records from before tiers said where a location came from have no such field:
    they read back unchanged (same JSON, so the same chain hash); new ones carry it."""
    old = record(1)
    assert "location_source" not in old.to_json()
    assert AuditRecord.from_json(old.to_json()) == old
    new = dataclasses.replace(old, location_source="signed-upstream")
    assert AuditRecord.from_json(new.to_json()).location_source == "signed-upstream"
    with pytest.raises(ValueError, match="location_source"):
        dataclasses.replace(old, location_source="Free text")


def test_decision_record_from_a_verdict() -> None:
    query = ResidencyQuery("demo-eu", "m", "default", "FR")
    verdict = Verdict(frozenset({"eu-west", "eu-central"}), ReasonCode.ALLOWED, rule="r")
    rec = decision_record(
        query, verdict, time=5.0, policy_revision="1-abc", chosen_region="eu-west", decision_id="d1"
    )
    assert rec == AuditRecord(
        time=5.0,
        tenant="demo-eu",
        client_country="FR",
        data_class="default",
        policy_revision="1-abc",
        allowed=("eu-central", "eu-west"),
        chosen_region="eu-west",
        reason="allowed",
        decision_id="d1",
    )
    with pytest.raises(ValueError, match="outside the allowed set"):
        decision_record(
            query, verdict, time=5.0, policy_revision="1", chosen_region="us-east", decision_id="d"
        )
    refused = Verdict(frozenset(), ReasonCode.DENIED)
    rec = decision_record(
        query, refused, time=5.0, policy_revision="1", chosen_region=None, decision_id="d2"
    )
    assert (rec.allowed, rec.chosen_region, rec.reason) == ((), None, "denied")


def test_line_layout_is_json_and_hash_chained() -> None:
    line, digest = encode_line(1, GENESIS, record(0))
    data = json.loads(line)
    assert list(data) == ["hash", "prev", "seq", "record"]
    assert (data["hash"], data["prev"], data["seq"]) == (digest, GENESIS, 1)
    parsed = parse_line(line.rstrip(b"\n"))
    assert parsed.hash_ok
    assert (parsed.seq, parsed.prev, parsed.hash) == (1, GENESIS, digest)
    with pytest.raises(ValueError, match="not an audit record"):
        parse_line(b'{"hello": "world"}')


# ---------------------------------------------------------------------------- writer


def test_writes_verify_and_read_back(tmp_path: Path) -> None:
    files = write_chain(tmp_path, 50)
    report = verify([tmp_path])
    assert report.ok
    assert (report.records, report.files) == (50, 1)
    assert report.head == Head.read(tmp_path / "audit.head")
    assert report.head.seq == 50
    assert [seq for seq, _ in iter_records(files)] == list(range(1, 51))
    assert next(iter_records(files))[1] == record(0)


def test_rotation_keeps_the_chain_across_files(tmp_path: Path) -> None:
    files = write_chain(tmp_path, 40, max_bytes=4096)
    assert len(files) > 3
    first_seq = [parse_line(lines_of(f)[0].rstrip()).seq for f in files]
    assert [f.name for f in files] == [f"audit-{s:012d}.jsonl" for s in first_seq]
    for previous, current in itertools.pairwise(files):
        last = parse_line(lines_of(previous)[-1].rstrip())
        assert parse_line(lines_of(current)[0].rstrip()).prev == last.hash
    assert verify(files).ok
    assert all(f.stat().st_size <= 4096 for f in files)


def test_reopening_continues_the_chain(tmp_path: Path) -> None:
    write_chain(tmp_path, 10)
    with AuditWriter(tmp_path, fsync=FsyncPolicy.ALWAYS) as writer:
        assert writer.head.seq == 10
        assert writer.append(record(10)).seq == 11
    report = verify([tmp_path])
    assert report.ok
    assert report.records == 11


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with (
        AuditWriter(tmp_path),
        pytest.raises(AuditError, match="another audit writer holds the lock"),
    ):
        AuditWriter(tmp_path)
    with AuditWriter(tmp_path) as writer:  # released on close
        writer.append(record(0))
    with pytest.raises(AuditError, match="closed"):
        writer.append(record(1))


def test_refuses_to_continue_a_damaged_chain(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 3)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(AuditChainError, match="the last record is damaged"):
        AuditWriter(tmp_path)


def test_concurrent_callers_keep_one_chain(tmp_path: Path) -> None:
    with AuditWriter(tmp_path, max_bytes=16_384, fsync=FsyncPolicy.NEVER) as writer:

        def work(base: int) -> None:
            for i in range(100):
                writer.append(record(base + i))

        threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    report = verify([tmp_path])
    assert report.ok, report.problems
    assert report.records == 400


# ---------------------------------------------------------------------------- tampering


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def test_edit_is_detected(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 10)
    lines = lines_of(path)
    lines[4] = lines[4].replace(b'"chosen_region":"eu-west"', b'"chosen_region":"us-east"')
    rewrite(path, lines)
    assert problems([path]) == [f"{path}:5: seq 5: content does not match its hash (edited)"]


def test_edit_with_a_recomputed_hash_breaks_the_next_link(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 10)
    lines = lines_of(path)
    forged, _ = encode_line(
        5, parse_line(lines[4].rstrip()).prev, record(4, chosen_region="us-east")
    )
    lines[4] = forged
    rewrite(path, lines)
    assert problems([path]) == [
        f"{path}:6: seq 6: does not link to the previous record (a record was replaced or inserted)"
    ]


def test_deletion_is_detected(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 10)
    lines = lines_of(path)
    del lines[3:5]
    rewrite(path, lines)
    assert problems([path]) == [
        f"{path}:4: 2 record(s) missing before this one (expected seq 4, found 6): "
        "deleted or truncated"
    ]


def test_insertion_is_detected(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 10)
    lines = lines_of(path)
    previous = parse_line(lines[2].rstrip())
    inserted, _ = encode_line(previous.seq + 1, previous.hash, record(99))
    lines.insert(3, inserted)
    rewrite(path, lines)
    assert problems([path]) == [
        f"{path}:5: out of order: expected seq 5, found 4 "
        "(records reordered, duplicated or inserted)"
    ]


def test_reordering_is_detected(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 10)
    lines = lines_of(path)
    lines[5], lines[6] = lines[6], lines[5]
    rewrite(path, lines)
    assert problems([path]) == [
        f"{path}:6: 1 record(s) missing before this one (expected seq 6, found 7): {DELETED}",
        f"{path}:7: out of order: expected seq 8, found 6 {REORDERED}",
        f"{path}:8: 1 record(s) missing before this one (expected seq 7, found 8): {DELETED}",
    ]


def test_truncated_tail_is_detected_through_the_head_file(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 10)
    rewrite(path, lines_of(path)[:7])
    assert problems([tmp_path]) == [
        f"{path}: chain ends at seq 7 but the head says seq 10: "
        "3 record(s) missing at the end (truncated)"
    ]
    assert problems([path]) == []  # without a head, a shorter chain is a valid chain
    assert problems([path], head=Head(10, "0" * 64)) != []


def test_torn_last_line_is_detected(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 5)
    path.write_bytes(path.read_bytes()[:-30])
    assert problems([path]) == [f"{path}:5: last line is incomplete (file truncated mid-record)"]


def test_truncated_or_missing_rotated_files_break_the_chain(tmp_path: Path) -> None:
    files = write_chain(tmp_path, 40, max_bytes=4096)
    first, second = files[0], files[1]
    rewrite(first, lines_of(first)[:-2])
    found = problems(files)
    seq = int(second.name[6:18])
    assert found == [
        f"{second}:1: 2 record(s) missing before this one at the end of {first} "
        f"(expected seq {seq - 2}, found {seq}): {DELETED}"
    ]
    missing_middle = [files[0], *files[2:]]
    assert any(f"{files[2]}:1:" in p and "missing" in p for p in problems(missing_middle))


def test_a_chain_must_start_at_genesis_unless_told_otherwise(tmp_path: Path) -> None:
    files = write_chain(tmp_path, 40, max_bytes=4096)
    later = files[1:]
    assert problems(later)[0].startswith(f"{later[0]}:1: ")
    assert "missing before this one" in problems(later)[0]
    assert problems(later, from_genesis=False) == []
    rewrite(files[1], lines_of(files[1])[1:])
    assert f"{files[1]}:1: file is named for seq" in problems(later, from_genesis=False)[0]


def test_garbage_lines_and_deep_record_checks(tmp_path: Path) -> None:
    (path,) = write_chain(tmp_path, 4)
    lines = lines_of(path)
    lines.insert(2, b"this is not json\n")
    rewrite(path, lines)
    assert problems([path]) == [f"{path}:3: not an audit record (malformed line)"]
    bad, _ = encode_line(1, GENESIS, record(0))
    forged = bad.replace(b'"reason":"allowed"', b'"reason":"Free text"')
    payload = forged[75:-2]
    forged = b'{"hash":"' + hashlib.sha256(payload).hexdigest().encode() + b'",' + payload + b"}\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "audit-000000000001.jsonl").write_bytes(forged)
    assert problems([other]) == []
    assert problems([other], check_records=True)[0].endswith(
        "reason: 'Free text' does not match ^[a-z0-9][a-z0-9_-]{0,62}$)"
    )


def test_nothing_to_verify(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert problems([empty]) == [f"{empty}: empty file (truncated?)"]
    assert problems([tmp_path / "none"]) == [
        f"{tmp_path / 'none'}: cannot read: No such file or directory"
    ]


def test_an_anchor_round_trips_and_refuses_what_is_not_one() -> None:
    anchor = Anchor(
        directory="/var/log/gtm/audit/global",
        prefix="global",
        file="global-000000000101.jsonl",
        seq=150,
        hash="ab" * 32,
        time=1_700_000_000.5,
        host="lb-1",
        cut=PriorAnchor(seq=120, hash="cd" * 32, revision=7, found_seq=100),
    )
    assert Anchor.decode(anchor.encode()) == anchor
    assert anchor.position.file_records == 50
    assert Anchor.decode(dataclasses.replace(anchor, cut=None).encode()).cut is None
    for bad in (
        b"not json",
        b"[]",
        b'{"prefix": "global"}',
        anchor.encode().replace(b'"seq":150', b'"seq":"150"'),
        anchor.encode().replace(b'"seq":150', b'"seq":0'),
        anchor.encode().replace(b"ab" * 32, b"AB" * 32),
        anchor.encode().replace(b"global-000000000101", b"regional-000000000101"),
    ):
        with pytest.raises(ValueError, match=r"\S"):
            Anchor.decode(bad)
