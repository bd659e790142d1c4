"""A booth that boots without network: three presses a crash left open in
its journal, the venue's network down (tests/client/fault_proxy.py closes
every connection), then up. ``resume()`` returns within its one deadline,
so the first guest is served within 5 s of the start; when the network
comes back the three presses settle in the background, one at a time, and
the service has one job and one commit for each."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import List
from urllib.parse import urlparse

from conftest import Admin

from token_billing_kiosk import RESUME_TIMEOUT_SECONDS, Kiosk, Outcome, RetryPolicy, Unreachable
from token_billing_kiosk._journal import Journal

from fault_proxy import PASS, FaultProxy


def _open_presses(journal_path: Path, account_id: str, count: int) -> List[str]:
    """``count`` presses journaled and never answered (a crash before the send)."""
    journal = Journal(journal_path)
    presses = []
    for n in range(count):
        request_id = str(uuid.uuid4())
        journal.begin(
            request_id,
            "job",
            account_id,
            {"request_id": request_id, "kind": "standard", "params": {"prompt": f"press {n}"}},
        )
        presses.append(request_id)
    journal.close()
    return presses


def _network(service_url: str) -> FaultProxy:
    parsed = urlparse(service_url)
    proxy = FaultProxy((parsed.hostname or "127.0.0.1", parsed.port or 80), lambda _r: PASS)
    proxy.down = True
    return proxy


def test_offline_boot_serves_at_once_and_settles_each_press_once_later(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    account = admin.account(credit=10)
    journal = tmp_path / "booth.sqlite3"
    presses = _open_presses(journal, account.account_id, 3)
    network = _network(service_url)
    try:
        started = time.monotonic()
        booth = Kiosk(network.url, account.kiosk_key, account.account_id, journal,
                      retry=RetryPolicy(base_delay_seconds=0.05, max_delay_seconds=0.5))
        called: List[str] = []
        outcomes = booth.resume(on_settled=lambda outcome: called.append(outcome.request_id))
        ready = time.monotonic() - started
        print(f"offline boot: resume() returned after {ready:.2f}s, "
              f"{sum(o.error is not None and o.error.pending for o in outcomes)} presses pending, "
              f"{network.refused} connections refused")
        assert ready < 5.0, f"the first guest waited {ready:.2f}s (at most 5)"
        assert ready < RESUME_TIMEOUT_SECONDS + 1.5, ready
        assert sorted(o.request_id for o in outcomes) == sorted(presses)
        for outcome in outcomes:
            assert isinstance(outcome.error, Unreachable) and outcome.error.pending, outcome
        assert len(booth.pending()) == 3
        assert network.refused > 0 and network.requests == 0
        assert admin.jobs(account.account_id) == []

        up_at = time.monotonic()
        network.down = False
        settled: List[Outcome] = booth.settled(timeout=60)
        print(f"offline boot: {len(settled)} presses settled {time.monotonic() - up_at:.2f}s "
              f"after the network came back")
        # One at a time, in resume()'s order, each once.
        order = [o.request_id for o in outcomes]
        assert [o.request_id for o in settled] == order
        assert called == order
        for outcome in settled:
            assert outcome.error is None, outcome
            assert outcome.job is not None and outcome.job.succeeded, outcome
        assert booth.pending() == []
        # A later resume() has nothing left to send.
        assert booth.resume() == [] and booth.settled() == settled
        booth.close()
    finally:
        network.close()
    jobs = admin.jobs(account.account_id)
    assert sorted(job["request_id"] for job in jobs) == sorted(presses)
    kinds = Counter(entry["kind"] for entry in admin.ledger(account.account_id))
    assert kinds["commit"] == 3, kinds
    balances = admin.assert_books(account.account_id)
    assert (balances["used"], balances["reserved"]) == (3, 0)


def test_close_stops_the_background_while_the_network_is_down(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    account = admin.account(credit=10)
    journal = tmp_path / "booth.sqlite3"
    presses = _open_presses(journal, account.account_id, 2)
    network = _network(service_url)
    try:
        booth = Kiosk(network.url, account.kiosk_key, account.account_id, journal,
                      retry=RetryPolicy(base_delay_seconds=0.05, max_delay_seconds=0.5))
        outcomes = booth.resume(timeout=0.5)
        assert [o.error is not None and o.error.pending for o in outcomes] == [True, True]
        started = time.monotonic()
        booth.close()
        closed = time.monotonic() - started
        print(f"offline boot: close() stopped the background in {closed:.2f}s")
        assert closed < 3.0, closed
        assert booth.settled() == []
    finally:
        network.close()
    # Still open in the journal for the next start.
    with Kiosk(service_url, account.kiosk_key, account.account_id, journal) as later:
        assert sorted(e.request_id for e in later.pending()) == sorted(presses)
