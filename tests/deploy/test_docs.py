"""The operations guide names only settings and series that exist, and every setting is in it."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from api.metrics import api_metrics
from cronman.settings import Settings
from scheduler_node.metrics import NodeMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
OPERATIONS = (DOCS / "operations.md").read_text()


def series_names() -> set[str]:
    registry = CollectorRegistry()
    m = api_metrics()
    for metric in (m.requests, m.latency, m.job_changes, m.validation_errors):
        registry.register(metric)
    names: set[str] = set()
    for r in (registry, NodeMetrics("n").registry):
        for family in r.collect():
            names |= {family.name + s for s in ("", "_total", "_count", "_sum", "_bucket")}
    return names


def test_every_setting_is_documented() -> None:
    variables = {f"CRONMAN_{name.upper()}" for name in Settings.model_fields}
    missing = sorted(v for v in variables if f"`{v}`" not in OPERATIONS)
    assert not missing, f"docs/operations.md does not describe {missing}"


def test_documented_settings_exist() -> None:
    variables = {f"CRONMAN_{name.upper()}" for name in Settings.model_fields} | {"CRONMAN_MIGRATIONS_DIR"}
    named = set(re.findall(r"`(CRONMAN_[A-Z0-9_]+)", OPERATIONS))
    assert not named - variables, f"docs/operations.md names unknown settings {sorted(named - variables)}"


def test_documented_series_exist() -> None:
    named = set(re.findall(r"\b(cronman_[a-z_]+)", OPERATIONS))
    assert {"cronman_fire_lag_seconds", "cronman_executions_total", "cronman_api_requests_total"} <= named
    unknown = named - series_names()
    assert not unknown, f"docs/operations.md names series nobody exposes: {sorted(unknown)}"
