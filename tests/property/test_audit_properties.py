"""Property tests for the audit chain: any single tampering of a random chain (edit,
deletion, insertion, swap, truncation), anywhere, is detected at the first line it
touches."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.audit import (
    GENESIS,
    AuditRecord,
    AuditWriter,
    FsyncPolicy,
    chain_files,
    encode_line,
    parse_line,
    verify,
)


def _record(i: int) -> AuditRecord:
    return AuditRecord(
        time=1_700_000_000.0 + i,
        tenant="demo-global",
        client_country="US",
        data_class="default",
        policy_revision="1-abc",
        allowed=("us-east", "us-west"),
        chosen_region="us-east",
        reason="allowed",
        decision_id=f"d{i}",
    )


def _lines(directory: Path) -> list[tuple[Path, bytes]]:
    return [
        (path, line)
        for path in chain_files(directory)
        for line in path.read_bytes().splitlines(True)
    ]


def _rewrite(directory: Path, lines: list[tuple[Path, bytes]]) -> None:
    for path in chain_files(directory):
        path.write_bytes(b"".join(line for owner, line in lines if owner == path))


def _position(lines: list[tuple[Path, bytes]], index: int) -> tuple[str, int]:
    """File and 1-based line of the record at ``index`` in the flat list."""
    path = lines[index][0]
    return str(path), sum(1 for owner, _ in lines[:index] if owner == path) + 1


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    count=st.integers(3, 40),
    max_bytes=st.sampled_from([2_000, 4_000, 1 << 20]),
    operation=st.sampled_from(["edit", "delete", "insert", "swap", "truncate"]),
    where=st.floats(0.0, 1.0, exclude_max=True),
)
def test_any_single_tampering_is_detected_where_it_happened(
    count: int, max_bytes: int, operation: str, where: float
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with AuditWriter(directory, max_bytes=max_bytes, fsync=FsyncPolicy.NEVER) as writer:
            for i in range(count):
                writer.append(_record(i))
        assert verify([directory]).ok
        lines = _lines(directory)
        index = min(int(where * count), count - 2)
        expected = _position(lines, index)
        path, line = lines[index]
        if operation == "edit":
            lines[index] = (path, line.replace(b"us-east", b"eu-west", 1))
        elif operation == "delete":
            del lines[index]
            expected = _position(lines, index)
        elif operation == "insert":
            # A strong forger: correct seq, correct link, valid hash. The forged line is
            # itself consistent; the chain breaks at the record it pushed down.
            prev = parse_line(lines[index - 1][1].rstrip()).hash if index else GENESIS
            forged, _ = encode_line(index + 1, prev, _record(999))
            lines.insert(index, (path, forged))
            expected = _position(lines, index + 1)
        elif operation == "swap":
            lines[index], lines[index + 1] = (
                (path, lines[index + 1][1]),
                (lines[index + 1][0], line),
            )
        else:  # truncate everything from index on: only the head file can tell
            lines = lines[:index]
            expected = (str(chain_files(directory)[-1]), 0)
        _rewrite(directory, lines)
        report = verify([directory])
        assert not report.ok
        first = report.problems[0]
        if operation == "truncate" and expected[0] != first.file:
            # Whole files emptied: the emptied file is reported first.
            assert first.message == "empty file (truncated?)"
        else:
            assert (first.file, first.line) == expected
