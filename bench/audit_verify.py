"""Audit trail throughput: append records, then verify the hash chain.

Writes a chain of residency decisions with :class:`policies.audit.AuditWriter` (default
64 MiB rotation, fsync on rotation), then verifies it with :func:`policies.audit.verify`
— chain only (what ``gtm audit verify`` does by default) and with every record's
fields validated too (``--check-records``), and against the chain's anchor (what
``gtm audit verify --state`` adds: one more watched seq, no extra pass). Target:
1,000,000 records verify in < 10 s.
Peer: ``sha256sum``-style hashing of the same bytes (one SHA-256 per line, nothing
else), the floor any line-by-line verifier pays.

    python bench/audit_verify.py            # 1,000,000 records (~40 s, ~330 MB on disk)
    python bench/audit_verify.py --smoke    # 20,000 records, a few seconds (CI)
"""

from __future__ import annotations

import argparse
import hashlib
import random
import tempfile
import time
from pathlib import Path

from policies.audit import (
    Anchor,
    AuditRecord,
    AuditWriter,
    FsyncPolicy,
    StoredAnchor,
    chain_files,
    verify,
)

TARGET_RECORDS = 1_000_000
TARGET_SECONDS = 10.0
REGIONS = ("us-east", "us-west", "eu-west", "eu-central", "ap-northeast", "ap-southeast")
COUNTRIES = ("US", "DE", "FR", "IE", "JP", "SG", "BR", "IN", None)


def records(count: int, seed: int) -> list[AuditRecord]:
    """A pool of realistic records (appending reuses them in turn)."""
    rng = random.Random(seed)
    pool = []
    for i in range(min(count, 10_000)):
        allowed = tuple(rng.sample(REGIONS, rng.randint(1, len(REGIONS))))
        pool.append(
            AuditRecord(
                time=1_700_000_000.0 + i * 0.001,
                tenant=f"tenant-{rng.randint(1, 200)}",
                client_country=rng.choice(COUNTRIES),
                data_class=rng.choice(("default", "pii", "de-only")),
                policy_revision="12-7b84ff000ddf",
                allowed=allowed,
                chosen_region=rng.choice(allowed),
                reason=rng.choice(("allowed", "allowed-after-deny")),
                decision_id=f"{rng.getrandbits(64):016x}",
            )
        )
    return pool


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f} records/s  ({seconds:6.2f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="20,000 records (CI)")
    parser.add_argument("--records", type=int, help="override the record count")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    count = args.records or (20_000 if args.smoke else TARGET_RECORDS)
    pool = records(count, args.seed)

    with tempfile.TemporaryDirectory(prefix="gtm-audit-bench-") as tmp:
        directory = Path(tmp)
        start = time.perf_counter()
        with AuditWriter(directory, fsync=FsyncPolicy.ROTATE) as writer:
            for i in range(count):
                writer.append(pool[i % len(pool)])
            end = writer.position()
        write_s = time.perf_counter() - start
        assert end is not None
        # The anchor a tier would have written last (gtm.audit_anchor), as read back.
        anchor = StoredAnchor(
            Anchor(str(directory), "audit", end.file, end.seq, end.hash, time.time()),
            revision=1,
            key="/gtm/v1/audit-anchors/bench",
        )
        files = chain_files(directory)
        size = sum(f.stat().st_size for f in files)

        start = time.perf_counter()
        report = verify([directory])
        verify_s = time.perf_counter() - start

        start = time.perf_counter()
        anchored = verify([directory], anchor=anchor)
        anchored_s = time.perf_counter() - start

        start = time.perf_counter()
        deep = verify([directory], check_records=True)
        deep_s = time.perf_counter() - start

        start = time.perf_counter()
        for path in files:
            for line in path.read_bytes().splitlines():
                hashlib.sha256(line).digest()
        floor_s = time.perf_counter() - start

    print(f"audit chain: {count:,} records, {len(files)} file(s), {size / 2**20:,.1f} MiB")
    print(f"  append (flush per record)     {rate(count, write_s)}")
    print(f"  verify (chain)                {rate(count, verify_s)}")
    print(f"  verify against the anchor     {rate(count, anchored_s)}")
    print(f"  verify --check-records        {rate(count, deep_s)}")
    print(f"  peer: sha256 per line only    {rate(count, floor_s)}")
    print(f"  verify / sha256-floor time    {verify_s / floor_s:6.2f}x")
    projected = verify_s * TARGET_RECORDS / count
    verdict = "met" if projected < TARGET_SECONDS else "MISSED"
    print(
        f"  target: {TARGET_RECORDS:,} records verify in < {TARGET_SECONDS:g} s — "
        f"{'measured' if count == TARGET_RECORDS else 'projected'} {projected:.2f} s ({verdict})"
    )
    ok = (
        report.ok
        and deep.ok
        and report.records == count
        and anchored.ok
        and anchored.anchor == anchor
        and anchored.unanchored == 0
    )
    if not ok:
        print("  VERIFY FAILED:", *report.problems[:5], sep="\n    ")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
