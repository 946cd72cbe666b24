"""The example policies over real Azure regions: a fleet of up to ~60 regions at their
real coordinates (``data/latency/azure_regions.csv``), for benchmarks and tests
that need the global tier's target fleet size (50 regions) rather than the examples'
six."""

from __future__ import annotations

import csv
import shutil
import tempfile
from pathlib import Path

import yaml

from gtm.policy_store import ActivePolicy, activate
from policies import load_paths
from policies.loader import examples_path


def azure_regions_policy(regions_csv: Path, count: int, generation: int = 1) -> ActivePolicy:
    """The example policies with the first ``count`` regions of ``regions_csv`` (columns
    ``region_id, region_name, country_iso, lat, lon``) as the topology, at
    ``generation``. The example tenants' regional shares name the example regions and
    are dropped; the example German-data rule is kept only if a region is in Germany."""
    with regions_csv.open() as f:
        rows = list(csv.DictReader(f))[:count]
    regions = [
        {"id": r["region_id"], "name": r["region_name"], "country": r["country_iso"],
         "location": {"lat": float(r["lat"]), "lon": float(r["lon"])}}
        for r in rows
    ]  # fmt: skip
    document = {
        "apiVersion": "gtm.dev/v1",
        "kind": "Regions",
        "metadata": {"name": "azure"},
        "spec": {"regions": regions},
    }
    examples = examples_path()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        shutil.copy(examples / "jurisdictions.yaml", directory / "jurisdictions.yaml")
        tenants = yaml.safe_load((examples / "tenants.yaml").read_text())
        for tenant in tenants["spec"]["tenants"]:
            tenant.pop("regional_shares", None)
        (directory / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        residency = yaml.safe_load((examples / "residency.yaml").read_text())
        if not any(r["country"] == "DE" for r in regions):
            residency["spec"]["rules"] = [
                r for r in residency["spec"]["rules"] if r["name"] != "de-only-data"
            ]
        (directory / "residency.yaml").write_text(yaml.safe_dump(residency))
        (directory / "regions.yaml").write_text(yaml.safe_dump(document))
        return activate(generation, load_paths([directory]))
