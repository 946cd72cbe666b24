from __future__ import annotations

from pathlib import Path

from policies.loader import builtin_jurisdictions_path
from policies.tools.gen_jurisdictions import generate, main

CSV = Path(__file__).resolve().parents[3] / "data" / "jurisdictions" / "country_jurisdiction.csv"


def test_committed_data_matches_the_source_table() -> None:
    assert generate(CSV) == builtin_jurisdictions_path().read_text("utf-8")
    assert main(["--csv", str(CSV), "--check"]) == 0


def test_check_mode_reports_stale_output(tmp_path: Path) -> None:
    stale = tmp_path / "jurisdictions.yaml"
    stale.write_text("old\n")
    assert main(["--csv", str(CSV), "--output", str(stale), "--check"]) == 1
    assert main(["--csv", str(CSV), "--output", str(stale)]) == 0
    assert stale.read_text() == builtin_jurisdictions_path().read_text()
