"""The timings a test runs its nodes with, named.

- ``DEFAULTS``: what a user gets. Read from the defaults of :class:`cronman.settings.Settings`, not
  copied: ``cronman dev`` sets none of these settings, and the chart (charts/cronman/values.yaml)
  sets the lease, the heartbeat interval and the TTL to the same values
  (tests/unit/test_timings.py checks both stay so). Heartbeat every 3 s, TTL 30 s, lease 5 s,
  membership and change polls 1 s. A dead node's heartbeat counts for 30 s, six leases: what the
  incident tests (a crash, a join, a leave, a Redis failover) must survive.
- ``FAST``: heartbeat TTL 3 s, lease 2 s, polls 0.3 s. For tests of mechanics (a handover, a
  reload, a restart of Redis): the same code paths in a tenth of the time, and a dead node's TTL
  runs out inside a short test.

A test picks one with ``@pytest.mark.timings(DEFAULTS)`` (or ``FAST``); the ``settings`` fixture
(tests/conftest.py) and the cluster harness (tests/cluster/conftest.py) run with it. A test
marked ``cluster`` must name its timings; any other test runs at ``FAST`` unless it says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cronman.settings import Settings

# The settings FAST changes; every other setting is at its default in both.
TIMING_FIELDS = (
    "heartbeat_interval_seconds",
    "heartbeat_ttl_seconds",
    "membership_poll_seconds",
    "lease_seconds",
    "change_poll_seconds",
    "history_flush_seconds",
    "load_grace_seconds",
    "history_recover_after_seconds",
    "progress_seconds",
    "outage_after_seconds",
)


@dataclass(frozen=True)
class Timings:
    name: str
    values: Mapping[str, float]

    @property
    def heartbeat_interval(self) -> float:
        return self.values["heartbeat_interval_seconds"]

    @property
    def heartbeat_ttl(self) -> float:
        return self.values["heartbeat_ttl_seconds"]

    @property
    def lease(self) -> float:
        return self.values["lease_seconds"]

    @property
    def membership_poll(self) -> float:
        return self.values["membership_poll_seconds"]

    @property
    def bound(self) -> float:
        """The promise the incident tests hold the cluster to: an occurrence due while any node
        was alive is delivered within lease + 2 heartbeat intervals + 2 s of its due time,
        whatever the TTL (13 s at the defaults)."""
        return self.lease + 2 * self.heartbeat_interval + 2.0

    def env(self) -> dict[str, str]:
        """The same timings as ``CRONMAN_*`` environment variables."""
        return {f"CRONMAN_{name.upper()}": str(value) for name, value in self.values.items()}

    def __str__(self) -> str:
        return self.name


def _shipped() -> dict[str, float]:
    return {name: float(Settings.model_fields[name].default) for name in TIMING_FIELDS}


DEFAULTS = Timings("defaults", MappingProxyType(_shipped()))
FAST = Timings(
    "fast",
    MappingProxyType(
        {
            "heartbeat_interval_seconds": 0.5,
            "heartbeat_ttl_seconds": 3.0,
            "membership_poll_seconds": 0.3,
            "lease_seconds": 2.0,
            "change_poll_seconds": 0.3,
            "history_flush_seconds": 0.05,
            "load_grace_seconds": 2.0,
            "history_recover_after_seconds": 3.0,
            "progress_seconds": 0.5,
            "outage_after_seconds": 5.0,
        }
    ),
)
assert set(FAST.values) == set(TIMING_FIELDS)
