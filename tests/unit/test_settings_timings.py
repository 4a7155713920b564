"""The timings of membership, leases and progress: ranges and the rules between them, refused
with a message that names the settings (docs/operations.md, "Settings")."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cronman.settings import Settings
from tests.timings import DEFAULTS, FAST


def test_the_defaults_and_the_test_suites_fast_timings_are_accepted() -> None:
    Settings()
    Settings(**FAST.values)
    Settings(**DEFAULTS.values)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"heartbeat_ttl_seconds": 5}, "at least twice heartbeat_interval_seconds"),
        ({"heartbeat_interval_seconds": 1, "membership_poll_seconds": 1.5}, "membership_poll_seconds"),
        ({"membership_poll_seconds": 0.5, "heartbeat_interval_seconds": 0.4}, "heartbeat_interval_seconds"),
        ({"progress_seconds": 6}, "outage_after_seconds (10) must be at least twice"),
        ({"heartbeat_ttl_seconds": 90}, "heartbeat_ttl_seconds"),
        ({"lease_seconds": 0.5}, "lease_seconds"),
        ({"lease_seconds": 31}, "lease_seconds"),
        ({"outage_after_seconds": 2}, "outage_after_seconds"),
        ({"load_grace_seconds": 61}, "load_grace_seconds"),
        ({"change_poll_seconds": 0}, "change_poll_seconds"),
    ],
)
def test_timings_out_of_range_or_against_each_other_are_refused(given: dict[str, float], named: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**given)  # type: ignore[arg-type]
    assert named in str(refused.value)
