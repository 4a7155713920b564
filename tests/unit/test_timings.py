"""The timings the incident tests call the defaults are what a user gets: the defaults of
``Settings``, which ``cronman dev`` leaves alone and the chart sets to the same values."""

from __future__ import annotations

import inspect
from pathlib import Path

import yaml

from cronman.dev import devstack
from cronman.settings import Settings
from tests.timings import DEFAULTS, FAST, TIMING_FIELDS

CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "cronman" / "values.yaml"


def test_the_defaults_are_the_settings_defaults() -> None:
    shipped = Settings(database_url="postgresql://x@127.0.0.1/x", redis_url="redis://127.0.0.1:1/0")
    assert dict(DEFAULTS.values) == {name: getattr(shipped, name) for name in TIMING_FIELDS}
    assert DEFAULTS.bound == 13.0  # lease 5 s + 2 heartbeat intervals of 3 s + 2 s


def test_the_chart_sets_the_same_timings() -> None:
    config = yaml.safe_load(CHART_VALUES.read_text())["config"]
    set_by_chart = {
        name: float(config[f"CRONMAN_{name.upper()}"]) for name in TIMING_FIELDS if f"CRONMAN_{name.upper()}" in config
    }
    assert set_by_chart, "the chart sets the lease and the heartbeat timings"
    assert set_by_chart == {name: DEFAULTS.values[name] for name in set_by_chart}


def test_cronman_dev_sets_no_timing() -> None:
    source = inspect.getsource(devstack)
    assert not [name for name in TIMING_FIELDS if f"CRONMAN_{name.upper()}" in source]


def test_fast_changes_the_timings_only() -> None:
    assert set(FAST.values) == set(TIMING_FIELDS)
    assert FAST.heartbeat_ttl < DEFAULTS.heartbeat_ttl and FAST.lease < DEFAULTS.lease
