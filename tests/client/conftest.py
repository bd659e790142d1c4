"""Fixtures: the service that tests/client/run.sh started (real binary, real
PostgreSQL), an admin client for setting up accounts and reading the books,
and fresh kiosks on fresh accounts."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx
import pytest

from token_billing_kiosk import Kiosk, RetryPolicy


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run these tests through tests/client/run.sh")
    return value


@dataclass
class Account:
    account_id: str
    kiosk_key: str


class Admin:
    """The test's own view of the service, as an admin: setup and the books."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def _ok(self, response: httpx.Response) -> Any:
        assert response.is_success, f"{response.request.method} {response.request.url}: " \
            f"{response.status_code} {response.text}"
        return response.json() if response.content else None

    def account(
        self,
        credit: int = 0,
        max_active_reservations: Optional[int] = None,
        budget: Optional[Dict[str, Any]] = None,
    ) -> Account:
        """A new account and a kiosk key of it (with ``budget``, its spending
        limit)."""
        body: Dict[str, Any] = {"name": f"client test {uuid.uuid4()}"}
        if max_active_reservations is not None:
            body["max_active_reservations"] = max_active_reservations
        account_id = self._ok(self.http.post("/v1/accounts", json=body))["account_id"]
        if credit:
            self.credit(account_id, credit)
        key_body: Dict[str, Any] = {"scope": "kiosk", "label": "test"}
        if budget is not None:
            key_body["budget"] = budget
        key = self._ok(self.http.post(f"/v1/accounts/{account_id}/api-keys", json=key_body))["key"]
        return Account(account_id, key)

    def credit(self, account_id: str, amount: int) -> None:
        self._ok(
            self.http.post(
                f"/v1/accounts/{account_id}/credits",
                json={"amount": amount, "external_ref": f"test-{uuid.uuid4()}"},
            )
        )

    def patch(self, account_id: str, **fields: Any) -> None:
        self._ok(self.http.patch(f"/v1/accounts/{account_id}", json=fields))

    def balances(self, account_id: str) -> Dict[str, Any]:
        return dict(self._ok(self.http.get(f"/v1/accounts/{account_id}")))

    def ledger(self, account_id: str) -> List[Dict[str, Any]]:
        entries: List[Dict[str, Any]] = []
        after: Optional[str] = None
        while True:
            params: Dict[str, Any] = {"limit": 1000}
            if after:
                params["after"] = after
            page = self._ok(self.http.get(f"/v1/accounts/{account_id}/ledger", params=params))
            entries += page["entries"]
            after = page["next_after"]
            if not after:
                return entries

    def jobs(self, account_id: str) -> List[Dict[str, Any]]:
        jobs: List[Dict[str, Any]] = []
        after: Optional[str] = None
        while True:
            params: Dict[str, Any] = {"limit": 500}
            if after:
                params["after"] = after
            page = self._ok(self.http.get(f"/v1/accounts/{account_id}/jobs", params=params))
            jobs += page["jobs"]
            after = page["next_after"]
            if not after:
                return jobs

    def reservations(self, account_id: str) -> List[Dict[str, Any]]:
        page = self._ok(
            self.http.get(f"/v1/accounts/{account_id}/reservations", params={"limit": 500})
        )
        assert page["next_after"] is None
        return list(page["reservations"])

    def wait_for_jobs_terminal(self, account_id: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(job["status"] in ("succeeded", "failed") for job in self.jobs(account_id)):
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs of {account_id} still unfinished after {timeout}s")

    def assert_books(self, account_id: str) -> Dict[str, Any]:
        """The account's invariants, from the API: conservation, reserved =
        held reservations, and the ledger's last balances-after = the
        account's balances. Returns the balances."""
        account = self.balances(account_id)
        assert account["credited"] + account["adjusted"] == (
            account["available"] + account["reserved"] + account["used"]
        ), account
        held = [r for r in self.reservations(account_id) if r["state"] == "held"]
        assert account["reserved"] == sum(r["amount"] for r in held), (account, held)
        ledger = self.ledger(account_id)
        if ledger:
            last = ledger[-1]
            assert (last["available_after"], last["reserved_after"], last["used_after"]) == (
                account["available"], account["reserved"], account["used"]
            ), (last, account)
        return account


@pytest.fixture(scope="session")
def service_url() -> str:
    return _required("TB_URL")


@pytest.fixture(scope="session")
def admin(service_url: str) -> Admin:
    return Admin(service_url, _required("TB_ADMIN_KEY"))


@pytest.fixture
def new_kiosk(
    service_url: str, tmp_path: Path
) -> Iterator[Callable[..., Kiosk]]:
    """Makes kiosks with journals in the test's own directory; closes them."""
    made: List[Kiosk] = []

    def make(account: Account, url: Optional[str] = None, **options: Any) -> Kiosk:
        options.setdefault("timeout", 30)
        options.setdefault("retry", RetryPolicy(base_delay_seconds=0.05, max_delay_seconds=0.5))
        journal = tmp_path / f"journal-{len(made)}.sqlite3"
        kiosk = Kiosk(url or service_url, account.kiosk_key, account.account_id, journal, **options)
        made.append(kiosk)
        return kiosk

    yield make
    for kiosk in made:
        try:
            kiosk.close()
        except Exception:  # already closed by the test
            pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def strict_replica() -> Iterator[str]:
    """A second replica on the same database with a rate limit of one
    request a second per key (burst 1): for the `rate_limited` refusal."""
    port = free_port()
    env = dict(
        os.environ,
        DATABASE_URL=_required("TB_DATABASE_URL"),
        BIND_ADDR=f"127.0.0.1:{port}",
        ADMIN_API_KEY=_required("TB_ADMIN_KEY"),
        RATE_LIMIT_PER_SECOND="1",
        RATE_LIMIT_BURST="1",
        # Configured as the first replica (run.sh) but for its rate limit:
        # its webhook relay shares the database's deliveries, and one that
        # refused the tests' loopback receivers would fail theirs.
        WEBHOOK_ALLOW_PRIVATE_URLS="true",
        RUST_LOG="warn",
    )
    log = open(os.environ.get("TB_SCRATCH", "/tmp") + f"/replica-{port}.log", "wb")
    process = subprocess.Popen(
        [_required("TB_BINARY"), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the strict replica exited; see its log"
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the strict replica never became ready"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
