"""The Grafana dashboard (deploy/grafana/gtm-overview.json) is importable as it stands:
Grafana 10's schema, the data source a variable, every query's variables defined, and
a panel for every alert. That its queries return data against a real deployment is
tests/integration/deploy/test_prometheus.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gtm-overview.json"
ALERTS = ROOT / "deploy" / "prometheus" / "gtm-alerts.yaml"
#: Grafana 10.0's dashboard schema version.
SCHEMA_VERSION = 38
#: Variables Grafana defines itself.
BUILTIN = {"__rate_interval", "__interval", "__range"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text("utf-8"))
    return document


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_schema_uid_and_a_datasource_variable() -> None:
    document = dashboard()
    assert document["schemaVersion"] >= SCHEMA_VERSION
    assert document["uid"] == "gtm-overview"
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in document["panels"]]
    assert len(ids) == len(set(ids))


def test_every_query_uses_the_datasource_variable_and_defined_variables() -> None:
    defined = {v["name"] for v in dashboard()["templating"]["list"]} | BUILTIN
    for panel in panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= defined, (panel["title"], used - defined)


def test_every_alert_has_a_panel_that_names_it() -> None:
    rules = yaml.safe_load(ALERTS.read_text("utf-8"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    described = " ".join(p.get("description", "") for p in panels())
    assert {a for a in alerts if a not in described} == set()
