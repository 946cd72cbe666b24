"""Memory footprint per process kind of ``gtm up --processes``: where each process's
memory goes, before and after some load.

Starts ``gtm up --processes`` on a private loopback block (the example topology, or its
first ``--regions`` regions), finds its processes (the ``gtm up`` parent, the front door,
the regional LBs, the zone agents, the emulated GPU workers, etcd) and reads, per process:

* **RSS**, **PSS** and **USS** (``/proc/PID/smaps_rollup``). RSS counts the shared
  libraries and the interpreter's text in full in every process, so the sum of RSS over a
  deployment overstates what it takes from the host; PSS shares them out, USS (private
  pages) is what stopping the process would give back.
* **modules**: ``len(sys.modules)`` and the top-level packages a process imported. Each
  child runs with a ``sitecustomize`` (on ``PYTHONPATH``, this benchmark's only) that
  answers ``SIGUSR2`` by writing them to a file; with ``--tracemalloc`` it also writes
  the Python heap grouped by the top-level package of the code that allocated it
  (loading modules' code shows as "importing"; tracing from interpreter start itself
  costs memory: compare RSS only between runs without it).

It samples once the deployment is ready and again after ``gtm load`` replays the
conversation trace for ``--load-seconds``. The table gives per kind the number of
processes, the mean of each figure, and the totals.

Target (checked in both modes): no serving process (front door, regional LB, zone agent,
GPU worker) imports the simulator, the chaos tooling, plotting, scipy, another
subcommand's command tree (``gtmctl.up``, ``gtmctl.load``) or, without ``--tls``, the
X.509 layer (``gtm.testing.imports.NOT_IN_A_DAEMON``, which the unit tests pin per tier
too): what a daemon does not need it must not load. RSS itself has no target here — it
depends on the machine; the soak benchmark (bench/soak.py) judges growth.

    python bench/footprint.py                 # six regions, 30 s of load (~2 min)
    python bench/footprint.py --smoke         # one region, a few seconds of load (CI)
    python bench/footprint.py --tracemalloc   # also the Python heap by package
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gtm.net import free_ports
from gtm.testing.imports import NOT_IN_A_DAEMON, loaded
from gtm.testing.processes import tree
from gtm.topology import load_topology, on_private_block, write_topology

BANNER_END = "Ctrl-C stops everything."
START_TIMEOUT_S = 360.0
STOP_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 15.0
ROOT = Path(__file__).resolve().parent.parent

#: The serving kinds; none of them may import gtm.testing.imports.NOT_IN_A_DAEMON.
SERVING = ("global", "regional", "zone", "gpu-sim")
KIND_ORDER = ("up", "global", "regional", "zone", "gpu-sim", "etcd", "other")

# Loaded by every child interpreter through PYTHONPATH (this benchmark only): SIGUSR2
# writes the process's modules (and its heap by package when tracemalloc traces) to
# $GTM_FOOTPRINT_DIR/PID.json. No product process handles SIGUSR2.
PROBE = r"""
import os, signal, sys

def _package(filename):
    marker = os.sep + "site-packages" + os.sep
    if marker in filename:
        return filename.split(marker, 1)[1].split(os.sep, 1)[0].removesuffix(".py")
    root = os.environ.get("GTM_FOOTPRINT_ROOT", "")
    if root and filename.startswith(root + os.sep):
        return filename[len(root) + 1 :].split(os.sep, 1)[0].removesuffix(".py")
    if filename.startswith("<frozen importlib"):
        return "(importing: code objects)"
    if filename.startswith("<"):
        return filename
    return "stdlib"

def _dump(signum, frame):
    modules = sorted(sys.modules)  # before this handler imports anything
    import json
    heap = {}
    if os.environ.get("PYTHONTRACEMALLOC"):
        import tracemalloc
        for stat in tracemalloc.take_snapshot().statistics("filename"):
            name = _package(stat.traceback[0].filename)
            heap[name] = heap.get(name, 0) + stat.size
    path = os.path.join(os.environ["GTM_FOOTPRINT_DIR"], f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as out:
        json.dump({"modules": modules, "heap": heap}, out)
    os.replace(path + ".tmp", path)

if os.environ.get("GTM_FOOTPRINT_DIR"):
    signal.signal(signal.SIGUSR2, _dump)
"""


@dataclass
class Sample:
    """One process at one moment."""

    pid: int
    kind: str
    rss_kb: int
    pss_kb: int
    uss_kb: int
    modules: tuple[str, ...] = ()
    heap: dict[str, int] = field(default_factory=dict)


def private_topology(directory: Path, regions: int | None) -> Path:
    """The example topology (its first ``regions``) on a private block."""
    example = load_topology()
    kept = example.regions[:regions] if regions else example.regions
    moved = on_private_block(example.model_copy(update={"regions": kept}), random.Random())
    return write_topology(moved, directory / "topology.yaml")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def kind_of(argv: list[str]) -> str:
    """The process kind from its command line (``python -m gtmctl [opts] SUBCOMMAND``)."""
    if argv and Path(argv[0]).name.startswith("etcd"):
        return "etcd"
    if "gtmctl" not in argv:
        return "other"
    rest = argv[argv.index("gtmctl") + 1 :]
    while rest and rest[0].startswith("--"):
        rest = rest[2:] if rest[0] in ("--log-level", "--log-format") else rest[1:]
    return rest[0] if rest and rest[0] in ("up", *SERVING) else "other"


def memory(pid: int) -> tuple[int, int, int]:
    """RSS, PSS and USS (private clean + dirty) of ``pid`` in kB, from smaps_rollup."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return fields.get("Rss", 0), fields.get("Pss", 0), uss


async def sample(root: int, probe_dir: Path) -> list[Sample]:
    """Memory of every process under ``root``; modules (and heap) of the Python ones."""
    pids = {pid: kind_of(_cmdline(pid)) for pid in tree(root)}
    python = [pid for pid, kind in pids.items() if kind not in ("etcd", "other")]
    for pid in python:
        (probe_dir / f"{pid}.json").unlink(missing_ok=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while time.monotonic() < deadline:
        if all((probe_dir / f"{pid}.json").exists() for pid in python):
            break
        await asyncio.sleep(0.1)
    samples = []
    for pid, kind in pids.items():
        rss, pss, uss = memory(pid)
        probe = probe_dir / f"{pid}.json"
        found = json.loads(probe.read_text()) if probe.exists() else {}
        samples.append(
            Sample(
                pid,
                kind,
                rss,
                pss,
                uss,
                tuple(found.get("modules", ())),
                found.get("heap", {}),
            )
        )
    return samples


def _kinds(samples: Iterable[Sample]) -> Iterator[tuple[str, list[Sample]]]:
    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    for kind in sorted(by_kind, key=KIND_ORDER.index):
        yield kind, by_kind[kind]


def _mb(kb: float) -> str:
    return f"{kb / 1024:7.1f}"


def table(title: str, samples: list[Sample]) -> str:
    lines = [
        f"## {title}",
        "",
        "| kind | n | RSS MB | PSS MB | USS MB | modules | packages |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, group in _kinds(samples):
        n = len(group)
        mods = [len(s.modules) for s in group if s.modules]
        packages = [len({m.split(".")[0] for m in s.modules}) for s in group if s.modules]
        lines.append(
            f"| {kind} | {n} | {_mb(sum(s.rss_kb for s in group) / n)} "
            f"| {_mb(sum(s.pss_kb for s in group) / n)} | {_mb(sum(s.uss_kb for s in group) / n)} "
            f"| {round(sum(mods) / len(mods)) if mods else '-'} "
            f"| {round(sum(packages) / len(packages)) if packages else '-'} |"
        )
    lines.append(
        f"| **total** | {len(samples)} | {_mb(sum(s.rss_kb for s in samples))} "
        f"| {_mb(sum(s.pss_kb for s in samples))} | {_mb(sum(s.uss_kb for s in samples))} | | |"
    )
    lines.append("")
    lines.append("(per kind: mean per process; total: sum over the deployment)")
    return "\n".join(lines)


def heap_table(samples: list[Sample], top: int = 12) -> str:
    lines = ["## Python heap by package (tracemalloc, mean per process, MB)", ""]
    for kind, group in _kinds(samples):
        totals: dict[str, int] = {}
        for s in group:
            for name, size in s.heap.items():
                totals[name] = totals.get(name, 0) + size
        if not totals:
            continue
        ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
        shown = ", ".join(f"{name} {size / len(group) / 2**20:.1f}" for name, size in ranked)
        lines.append(f"- **{kind}** ({sum(totals.values()) / len(group) / 2**20:.1f}): {shown}")
    return "\n".join(lines)


def packages_table(samples: list[Sample], top: int = 12) -> str:
    """Per kind, the top-level packages with the most modules (one process of each)."""
    lines = ["## Modules by top-level package (one process of each kind)", ""]
    for kind, group in _kinds(samples):
        modules = next((s.modules for s in group if s.modules), ())
        if not modules:
            continue
        counts: dict[str, int] = {}
        for name in modules:
            counts[name.split(".")[0]] = counts.get(name.split(".")[0], 0) + 1
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
        lines.append(f"- **{kind}** ({len(modules)}): " + ", ".join(f"{p} {n}" for p, n in ranked))
    return "\n".join(lines)


def violations(samples: list[Sample]) -> list[str]:
    """What the serving processes import that they must not (the target), per kind."""
    found: dict[tuple[str, str], int] = {}
    counts: dict[str, int] = {}
    for s in samples:
        if s.kind not in SERVING:
            continue
        counts[s.kind] = counts.get(s.kind, 0) + 1
        for name in loaded(frozenset(s.modules), NOT_IN_A_DAEMON):
            found[s.kind, name] = found.get((s.kind, name), 0) + 1
    return [
        f"{kind} ({n} of {counts[kind]} processes) imports {name}"
        for (kind, name), n in found.items()
    ]


async def run_load(url: str, seconds: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "load",
        *("--url", url, "--duration", repr(seconds), "--trace", "azure-conv"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"gtm load failed ({proc.returncode}): {err.decode()[-2000:]}")


async def _banner(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    while True:
        raw = await proc.stdout.readline()
        if not raw:
            raise SystemExit("gtm up exited before it was ready")
        if BANNER_END in raw.decode():
            return


async def measure(args: argparse.Namespace, work: Path) -> tuple[list[Sample], list[Sample]]:
    probe_dir = work / "probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(PROBE, "utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), os.environ.get("PYTHONPATH")])),
        "GTM_FOOTPRINT_DIR": str(probe_dir),
        "GTM_FOOTPRINT_ROOT": str(ROOT),
    }
    if args.tracemalloc:
        env["PYTHONTRACEMALLOC"] = "1"
    topology = private_topology(work, args.regions)
    dns_port, http_port = free_ports("127.0.0.1", 2)
    stderr_path = work / "up.stderr"
    with stderr_path.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gtmctl",
            "up",
            "--processes",
            *("--topology", str(topology), "--run-dir", str(work / "run")),
            *("--dns-listen", f"127.0.0.1:{dns_port}", "--http-listen", f"127.0.0.1:{http_port}"),
            *("--admin-dir", str(work / "admin")),
            *("--ready-timeout", repr(args.ready_timeout)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    try:
        try:
            await asyncio.wait_for(_banner(proc), START_TIMEOUT_S)
        except (TimeoutError, SystemExit):
            raise SystemExit(f"gtm up did not start:\n{stderr_path.read_text()[-4000:]}") from None
        await asyncio.sleep(args.settle)
        started = await sample(proc.pid, probe_dir)
        await run_load(f"http://127.0.0.1:{http_port}", args.load_seconds)
        await asyncio.sleep(args.settle)
        loaded = await sample(proc.pid, probe_dir)
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return started, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one region, 3 s of load (CI)")
    parser.add_argument("--regions", type=int, default=None, help="first N example regions")
    parser.add_argument("--load-seconds", type=float, default=None, help="default 30 (smoke 3)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before a sample")
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="gtm up's (a loaded machine)"
    )
    parser.add_argument("--tracemalloc", action="store_true", help="heap by package too")
    parser.add_argument("--json", type=Path, default=None, help="write the samples here too")
    args = parser.parse_args()
    if args.smoke:
        args.regions = args.regions or 1
    if args.load_seconds is None:
        args.load_seconds = 3.0 if args.smoke else 30.0
    with tempfile.TemporaryDirectory(prefix="gtm-footprint-") as tmp:
        started, loaded = asyncio.run(measure(args, Path(tmp)))
    regions = args.regions or len(load_topology().regions)
    print(f"# gtm up --processes footprint ({regions} regions, python {sys.version.split()[0]})")
    print()
    print(table("after start", started))
    print()
    print(table(f"after {args.load_seconds:g} s of gtm load", loaded))
    print()
    print(packages_table(loaded))
    if args.tracemalloc:
        print()
        print(heap_table(loaded))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "started": [s.__dict__ for s in started],
                    "loaded": [s.__dict__ for s in loaded],
                },
                default=list,
            )
        )
    kinds = {s.kind for s in started}
    missing = [k for k in ("up", *SERVING) if k not in kinds]
    unprobed = [f"{s.kind} (pid {s.pid})" for s in started if s.kind in SERVING and not s.modules]
    bad = sorted({*violations(started), *violations(loaded)})
    problems = (
        [f"no {k} process found" for k in missing]
        + [f"{u}: no module list (probe did not answer)" for u in unprobed]
        + bad
    )
    print()
    if problems:
        print("TARGET MISSED:\n  " + "\n  ".join(problems))
        raise SystemExit(1)
    print("target met: no serving process imports " + ", ".join(NOT_IN_A_DAEMON))


if __name__ == "__main__":
    main()
