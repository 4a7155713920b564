"""Signatures of deliveries and of notifications: each verifies in its own context only, so a
notification's receiver cannot replay what it got to a job endpoint (nor the other way round)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cronman.model.signing import Context, sign, verify

SECRET = "whsec_test-secret-of-the-namespace"
NOW = 1_800_000_000


def test_a_delivery_signature_is_the_documented_format() -> None:
    import hashlib
    import hmac

    mac = hmac.new(SECRET.encode(), b"1800000000.{}", hashlib.sha256).hexdigest()
    assert sign([SECRET], b"{}", NOW) == f"t=1800000000,v1={mac}"
    mac = hmac.new(SECRET.encode(), b"notification.1800000000.{}", hashlib.sha256).hexdigest()
    assert sign([SECRET], b"{}", NOW, Context.NOTIFICATION) == f"t=1800000000,v1={mac}"


@given(body=st.binary(max_size=200), at=st.integers(NOW - 300, NOW + 300), other=st.binary(max_size=200))
def test_a_signature_verifies_in_its_own_context_only(body: bytes, at: int, other: bytes) -> None:
    delivery, notification = sign([SECRET], body, at), sign([SECRET], body, at, Context.NOTIFICATION)
    assert verify(SECRET, delivery, body, NOW) and verify(SECRET, notification, body, NOW, context=Context.NOTIFICATION)
    assert not verify(SECRET, notification, body, NOW)  # replayed to a job endpoint
    assert not verify(SECRET, delivery, body, NOW, context=Context.NOTIFICATION)
    # nor with its timestamp moved into the body: what is signed cannot be re-split into the other form
    forged = notification.replace(f"t={at}", "t=0")
    assert not verify(SECRET, forged, b"notification." + str(at).encode() + b"." + body, NOW, tolerance=10**10)
    if other != body:
        assert not verify(SECRET, delivery, other, NOW)
