"""Verifying the service's webhook deliveries (Stripe's ``construct_event``),
as the Standard Webhooks specification signs them (docs/webhooks.md):
``webhook-signature`` is ``v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">``
with the key the base64 after ``whsec_``, several space-separated during a
secret rotation. Standard library only (``hmac``, ``hashlib``)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Any, Mapping, Optional, Union

from ._errors import KioskError
from ._models import Event

#: How far ``webhook-timestamp`` may be from now, either way (the standard's five minutes).
WEBHOOK_TOLERANCE_SECONDS = 300


class WebhookVerificationError(KioskError):
    """A delivery that is forged, stale or malformed: answer it 400 and do
    not act on it. ``reason``: ``missing_header``, ``malformed_header``,
    ``timestamp_out_of_tolerance``, ``no_matching_signature``,
    ``invalid_secret`` or ``malformed_body``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _header(headers: Mapping[str, str], name: str) -> str:
    value: Optional[str] = None
    for key, found in headers.items():
        if key.lower() == name:
            value = found
    if not value:
        raise WebhookVerificationError("missing_header", f"the delivery has no {name} header")
    return value


def _base64(text: str) -> Optional[bytes]:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def verify_webhook(
    body: Union[bytes, str],
    headers: Mapping[str, str],
    secret: str,
    *,
    tolerance_seconds: float = WEBHOOK_TOLERANCE_SECONDS,
    now: Optional[float] = None,
) -> Event:
    """Checks a delivery and returns its :class:`Event`. ``body`` is the raw
    body as received (bytes, or the exact text; never re-encoded JSON),
    ``headers`` any mapping of the request's headers (any case), ``secret``
    the endpoint's ``whsec_…``; ``now``: Unix seconds, for tests. Raises
    :class:`WebhookVerificationError` when a header is missing or
    malformed, the timestamp is further than ``tolerance_seconds`` from
    now, no ``v1`` signature matches (compared in constant time), or the
    body is not an event."""
    message_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    key = _base64(secret[len("whsec_"):] if secret.startswith("whsec_") else secret)
    if not key:
        raise WebhookVerificationError(
            "invalid_secret", "the secret is not `whsec_` followed by base64"
        )
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 15):
        raise WebhookVerificationError("malformed_header", "webhook-timestamp is not Unix seconds")
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance_seconds:
        raise WebhookVerificationError(
            "timestamp_out_of_tolerance",
            f"webhook-timestamp is more than {tolerance_seconds:g} s from now "
            "(a replay, or a clock to fix)",
        )
    payload = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    expected = hmac.new(
        key, f"{message_id}.{timestamp}.".encode("utf-8") + payload, hashlib.sha256
    ).digest()
    matched = False
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        signature = _base64(value) if version == "v1" else None
        if signature is not None and hmac.compare_digest(signature, expected):
            matched = True
    if not matched:
        raise WebhookVerificationError(
            "no_matching_signature", "no v1 signature of the delivery matches the secret"
        )
    try:
        event: Any = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise WebhookVerificationError("malformed_body", "the signed body is not JSON") from None
    if not (
        isinstance(event, dict)
        and isinstance(event.get("id"), str)
        and isinstance(event.get("type"), str)
        and isinstance(event.get("data"), dict)
    ):
        raise WebhookVerificationError(
            "malformed_body", "the signed body is not an event (id, type, data)"
        )
    return Event.from_json(event)
