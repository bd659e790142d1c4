#!/usr/bin/env python3
"""A webhook receiver for the tests: a real HTTP server on loopback that
verifies every delivery with the `standardwebhooks` package from PyPI (an
implementation of the Standard Webhooks specification that shares nothing
with the service's signing code).

    python3 tests/webhooks/receiver.py            # prints "PORT <n>", then serves

Control (JSON):
    POST /_control/secrets  {"secrets": ["whsec_…", …]}   secrets to verify with
    GET  /_control/received                               every delivery so far

Deliveries: POST /hook/<anything>?fail=N&status=S&hang=T&retry_after=R
    the first N requests of each webhook-id are answered S (default 500;
    with Retry-After: R when given), after sleeping T seconds when given;
    later ones 200. Each request is recorded with, per secret, whether the
    signature verified.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

lock = threading.Lock()
secrets = []
received = []
seen = {}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_control/received":
            with lock:
                body = json.dumps(received).encode()
            self.answer(200, body, [("Content-Type", "application/json")])
        else:
            self.answer(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        payload = self.rfile.read(length)
        url = urlparse(self.path)
        if url.path == "/_control/secrets":
            with lock:
                secrets[:] = json.loads(payload)["secrets"]
            self.answer(204)
            return
        if not url.path.startswith("/hook/"):
            self.answer(404)
            return
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        headers = {
            "webhook-id": self.headers.get("webhook-id", ""),
            "webhook-timestamp": self.headers.get("webhook-timestamp", ""),
            "webhook-signature": self.headers.get("webhook-signature", ""),
        }
        with lock:
            current = list(secrets)
        verified = {}
        for secret in current:
            try:
                Webhook(secret).verify(payload, headers)
                verified[secret[-6:]] = True
            except WebhookVerificationError as error:
                verified[secret[-6:]] = str(error) or "invalid"
        webhook_id = headers["webhook-id"]
        with lock:
            seen[webhook_id] = seen.get(webhook_id, 0) + 1
            count = seen[webhook_id]
        fail = int(query.get("fail", "0"))
        status = int(query.get("status", "500")) if count <= fail else 200
        try:
            body = json.loads(payload)
        except ValueError:
            body = None
        # Recorded on arrival (before any hang), so a test can act on it.
        with lock:
            received.append({
                "path": url.path,
                "webhook_id": webhook_id,
                "timestamp": headers["webhook-timestamp"],
                "signatures": headers["webhook-signature"].split(" "),
                "verified": verified,
                "body": body,
                "status": status,
                "user_agent": self.headers.get("User-Agent"),
            })
        if count <= fail and "hang" in query:
            time.sleep(float(query["hang"]))
        extra = []
        if status != 200 and "retry_after" in query:
            extra.append(("Retry-After", query["retry_after"]))
        self.answer(status, b"ok" if status == 200 else b"no", extra)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
