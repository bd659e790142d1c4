"""verify_webhook against the service's own deliveries (a real endpoint and a
real HTTP receiver of the test's own; run.sh starts the service with
WEBHOOK_ALLOW_PRIVATE_URLS=true) and against an independent implementation
of Standard Webhooks (the ``standardwebhooks`` package), both ways."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError as LibraryError

from conftest import Admin
from token_billing_kiosk import (
    WEBHOOK_TOLERANCE_SECONDS,
    WebhookVerificationError,
    verify_webhook,
)

Delivery = Tuple[bytes, Dict[str, str]]


class Receiver:
    """Every delivery's raw body and headers, answered 204."""

    def __init__(self) -> None:
        self.deliveries: List[Delivery] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.arrived:
                    receiver.deliveries.append((body, dict(self.headers.items())))
                    receiver.arrived.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, matches: Callable[[Dict[str, Any]], bool], attempts: Callable[[], Any]) -> Delivery:
        with self.arrived:
            found: List[Delivery] = []

            def ready() -> bool:
                found[:] = [d for d in self.deliveries if matches(json.loads(d[0]))]
                return bool(found)

            # The relay passes an event once no older transaction of the
            # cluster is open (the feed's horizon), so another session's
            # long transaction on the same server delays it: 60 s, not 30.
            if not self.arrived.wait_for(ready, timeout=60):
                pytest.fail(f"no matching delivery within 60 s; the endpoint's attempts: {attempts()}")
            return found[0]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.server.shutdown()
    made.server.server_close()


def random_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def refused(reason: str, *args: Any, **options: Any) -> None:
    with pytest.raises(WebhookVerificationError) as caught:
        verify_webhook(*args, **options)
    assert caught.value.reason == reason, caught.value


def test_the_services_deliveries_verify_and_forgeries_are_refused(
    admin: Admin, receiver: Receiver
) -> None:
    account = admin.account()
    answer = admin.http.post(
        "/v1/webhook-endpoints",
        json={"url": receiver.url, "events": ["credit.created"], "account_id": account.account_id},
    )
    assert answer.status_code == 201, answer.text
    endpoint = answer.json()
    assert endpoint["secret"].startswith("whsec_")

    def credit(amount: int) -> Delivery:
        ref = f"py-webhook-{uuid.uuid4()}"
        booked = admin.http.post(
            f"/v1/accounts/{account.account_id}/credits",
            json={"amount": amount, "external_ref": ref},
        )
        assert booked.status_code == 201, booked.text
        return receiver.wait(
            lambda e: e["type"] == "credit.created" and e["data"]["credit"]["external_ref"] == ref,
            lambda: admin.http.get(
                f"/v1/webhook-endpoints/{endpoint['endpoint_id']}/deliveries"
            ).json(),
        )

    body, headers = credit(7)
    event = verify_webhook(body, headers, endpoint["secret"])
    assert event.type == "credit.created"
    assert event.id == headers["webhook-id"]
    assert event.data["account_id"] == account.account_id
    assert event.data["credit"]["amount"] == 7
    assert event.data["balances"]["available"] == 7
    # The same as text, and the independent library agrees.
    assert verify_webhook(body.decode(), headers, endpoint["secret"]).id == event.id
    assert Webhook(endpoint["secret"]).verify(body, headers)["id"] == event.id

    tampered = body.replace(b'"amount":7', b'"amount":70')
    assert tampered != body
    refused("no_matching_signature", tampered, headers, endpoint["secret"])
    refused("no_matching_signature", body, headers, random_secret())
    sent = int(headers["webhook-timestamp"])
    tolerance = WEBHOOK_TOLERANCE_SECONDS
    assert verify_webhook(body, headers, endpoint["secret"], now=sent + tolerance - 1).id == event.id
    refused("timestamp_out_of_tolerance", body, headers, endpoint["secret"], now=sent + tolerance + 1)
    refused("timestamp_out_of_tolerance", body, headers, endpoint["secret"], now=sent - tolerance - 1)
    unsigned = {k: v for k, v in headers.items() if k.lower() != "webhook-signature"}
    refused("missing_header", body, unsigned, endpoint["secret"])
    refused("malformed_header", body, {**headers, "webhook-timestamp": "soon"}, endpoint["secret"])

    # A rotation: the service signs with both secrets; either one verifies.
    rotated = admin.http.post(f"/v1/webhook-endpoints/{endpoint['endpoint_id']}/rotate-secret")
    assert rotated.status_code == 200, rotated.text
    new_secret = rotated.json()["secret"]
    assert new_secret != endpoint["secret"]
    body, headers = credit(5)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new_secret, endpoint["secret"]):
        assert verify_webhook(body, headers, secret).data["credit"]["amount"] == 5
    refused("no_matching_signature", body, headers, random_secret())
    deleted = admin.http.delete(f"/v1/webhook-endpoints/{endpoint['endpoint_id']}")
    assert deleted.is_success, deleted.text


def test_the_standardwebhooks_package_and_verify_webhook_agree() -> None:
    secret = random_secret()
    library = Webhook(secret)
    message_id = str(uuid.uuid4())
    payload = json.dumps(
        {
            "id": message_id,
            "type": "account.balance_low",
            "created_at": datetime.now(timezone.utc).isoformat(),
            "data": {"account_id": str(uuid.uuid4()), "balances": {"available": 3}},
        }
    )
    stamp = datetime.now(timezone.utc).replace(microsecond=0)
    headers = {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": library.sign(message_id, stamp, payload),
    }
    # The library signs; verify_webhook accepts, and refuses a changed byte.
    event = verify_webhook(payload, headers, secret)
    assert event.type == "account.balance_low"
    assert event.data["balances"]["available"] == 3
    refused("no_matching_signature", payload.replace('"available": 3', '"available": 4'), headers, secret)
    # Several signatures, ours last: any one that matches is enough.
    other = Webhook(random_secret()).sign(message_id, stamp, payload)
    several = {**headers, "webhook-signature": f"{other} v2,ignored {headers['webhook-signature']}"}
    assert verify_webhook(payload, several, secret).id == message_id
    # The library and verify_webhook agree on the same headers, and on a stale one.
    assert library.verify(payload, headers)["id"] == message_id
    old = datetime.fromtimestamp(time.time() - WEBHOOK_TOLERANCE_SECONDS - 10, timezone.utc)
    stale = {
        **headers,
        "webhook-timestamp": str(int(old.timestamp())),
        "webhook-signature": library.sign(message_id, old, payload),
    }
    with pytest.raises(LibraryError):
        library.verify(payload, stale)
    refused("timestamp_out_of_tolerance", payload, stale, secret)
