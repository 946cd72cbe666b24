"""``gtm chaos mutants``: every scenario under each of its mutants, and the matrix.

Each cell is one ``gtm chaos run SCENARIO --mutant NAME`` in its own process (a patch
mutant changes the process it is applied in; a fresh one per cell keeps cells apart),
with its report in ``REPORT/<scenario>/<mutant>/``. A cell's verdict comes from that
report's ``journal.json``:

* **caught** — the scenario failed, as it must: a criterion failed, or the run could
  not reach its faults (the mutant broke the steady state itself);
* **SURVIVED** — the scenario passed against a product without the behaviour it
  claims to test: a defect of the scenario's criteria;
* **error** — no report (the scenario file is invalid, or the runner crashed).

The suite fails unless every cell is *caught*. ``matrix.md`` and ``matrix.json`` in
``REPORT`` hold the scenario × mutant matrix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from chaos.mutants import MUTANTS


class Cell(StrEnum):
    CAUGHT = "caught"
    SURVIVED = "SURVIVED"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class CellResult:
    scenario: str
    mutant: str
    cell: Cell
    #: The run's status (completed, aborted, failed) or why there is none.
    status: str
    #: The criteria that failed (what caught the mutant).
    failed: tuple[str, ...] = ()


def judge(scenario: str, mutant: str, report: Path) -> CellResult:
    """A cell's verdict from its report's ``journal.json``."""
    try:
        header = json.loads((report / "journal.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        return CellResult(scenario, mutant, Cell.ERROR, f"no report: {type(exc).__name__}")
    failed = tuple(str(r["name"]) for r in header.get("results", []) if not r.get("passed"))
    status = str(header.get("status", "unknown"))
    cell = Cell.SURVIVED if header.get("passed") is True else Cell.CAUGHT
    return CellResult(scenario, mutant, cell, status, failed)


def run_cell(scenario: Path, mutant: str, report: Path) -> CellResult:
    """``gtm chaos run SCENARIO --mutant MUTANT`` in a child process."""
    command = [sys.executable, "-m", "gtmctl", "chaos", "run", str(scenario)]
    command += ["--mutant", mutant, "--report", str(report)]
    subprocess.run(command, check=False, stdin=subprocess.DEVNULL)
    return judge(scenario.stem, mutant, report)


def matrix_markdown(results: Sequence[CellResult]) -> str:
    """The scenario × mutant matrix: one row per scenario, one column per mutant used."""
    mutants = sorted({r.mutant for r in results})
    scenarios = sorted({r.scenario for r in results})
    cells = {(r.scenario, r.mutant): r for r in results}
    lines = [
        "# Scenario × mutant matrix",
        "",
        "Each scenario must FAIL under its own mutants (`caught`); `SURVIVED` is a scenario "
        "whose criteria cannot see the behaviour its title claims.",
        "",
        "| scenario | " + " | ".join(mutants) + " |",
        "|---|" + "---|" * len(mutants),
    ]
    for scenario in scenarios:
        row = []
        for name in mutants:
            found = cells.get((scenario, name))
            row.append("" if found is None else _cell_text(found))
        lines.append(f"| {scenario} | " + " | ".join(row) + " |")
    lines += ["", "## Mutants", ""]
    lines += [f"- `{m}`: {MUTANTS[m].breaks}" for m in mutants if m in MUTANTS]
    lines += ["", "## What caught each", ""]
    for r in sorted(results, key=lambda r: (r.scenario, r.mutant)):
        caught_by = "; ".join(r.failed) or "—"
        lines.append(f"- {r.scenario} × {r.mutant}: {r.cell.value} ({r.status}); {caught_by}")
    return "\n".join(lines) + "\n"


def _cell_text(result: CellResult) -> str:
    if result.cell is Cell.CAUGHT and result.status != "completed":
        return f"caught ({result.status})"
    return result.cell.value


def write_matrix(results: Sequence[CellResult], directory: Path) -> Path:
    """``matrix.md`` and ``matrix.json`` in ``directory``; returns the Markdown's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "matrix.json").write_text(
        json.dumps([asdict(r) for r in results], indent=1) + "\n", "utf-8"
    )
    path = directory / "matrix.md"
    path.write_text(matrix_markdown(results), "utf-8")
    return path
