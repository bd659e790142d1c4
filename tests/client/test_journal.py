"""The journal's promises: the request_id is on disk before the first byte
is sent; the key is never in it nor in any log line; one process at a
time; long operations and unreachable services leave requests that
``resume()`` finishes; the heartbeat keeps a reservation alive."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
import uuid
from pathlib import Path
from typing import Callable, List
from urllib.parse import urlparse

import httpx
import pytest

from conftest import Admin, free_port
from fault_proxy import PASS, Action, FaultProxy, Request
from token_billing_kiosk import (
    JobNotFinished,
    JournalError,
    Kiosk,
    ReservationNotHeld,
    Unreachable,
)

MakeKiosk = Callable[..., Kiosk]


def test_request_id_is_journaled_before_the_first_send(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    account = admin.account(credit=2)
    journal = tmp_path / "kiosk.sqlite3"
    seen: List[tuple] = []

    def decide(request: Request) -> Action:
        if request.method == "POST":
            # Another connection, as a process reading the disk would.
            with sqlite3.connect(journal) as reader:
                seen.extend(reader.execute("SELECT request_id, state FROM requests").fetchall())
            seen.append(("sent", request.body.decode()))
        return PASS

    parsed = urlparse(service_url)
    proxy = FaultProxy((parsed.hostname or "", parsed.port or 0), decide)
    try:
        with Kiosk(proxy.url, account.kiosk_key, account.account_id, journal) as kiosk:
            job = kiosk.generate("standard", {"prompt": "x"})
            assert kiosk._journal._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    finally:
        proxy.close()
    assert seen[0] == (job.request_id, "pending")
    assert seen[1][0] == "sent" and job.request_id in seen[1][1]


def test_the_key_is_never_in_the_journal_nor_in_logs(
    admin: Admin, new_kiosk: MakeKiosk, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    account = admin.account(credit=1)
    caplog.set_level(logging.DEBUG)  # every logger: ours, httpx, httpcore
    kiosk = new_kiosk(account)
    job = kiosk.generate("standard", {"prompt": "x"})
    held_error = None
    try:
        kiosk.reserve(5)
    except Exception as error:  # the refusal's text must not carry it either
        held_error = error
    assert held_error is not None
    secret = account.kiosk_key
    assert job.request_id in caplog.text  # the logs say what happened…
    assert secret not in caplog.text  # …but never with the key
    assert secret not in repr(kiosk) and secret not in str(held_error)
    assert secret not in repr(held_error.__dict__)
    kiosk.close()
    for path in tmp_path.iterdir():
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_one_process_per_journal(admin: Admin, service_url: str, tmp_path: Path) -> None:
    account = admin.account()
    journal = tmp_path / "kiosk.sqlite3"
    with Kiosk(service_url, account.kiosk_key, account.account_id, journal):
        with pytest.raises(JournalError):
            Kiosk(service_url, account.kiosk_key, account.account_id, journal)
    # Released with the first one.
    Kiosk(service_url, account.kiosk_key, account.account_id, journal).close()


def test_unreachable_service_leaves_the_request_for_resume(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    account = admin.account(credit=2)
    journal = tmp_path / "kiosk.sqlite3"
    nowhere = f"http://127.0.0.1:{free_port()}"
    with Kiosk(nowhere, account.kiosk_key, account.account_id, journal, timeout=1) as offline:
        with pytest.raises(Unreachable) as unreachable:
            offline.generate("standard", {"prompt": "x"})
        assert unreachable.value.pending
        (entry,) = offline.pending()
        assert (entry.request_id, entry.state) == (unreachable.value.request_id, "pending")
    # The network is back (and the process restarted): same journal, same request.
    with Kiosk(service_url, account.kiosk_key, account.account_id, journal) as online:
        (outcome,) = online.resume()
        assert outcome.job is not None and outcome.job.succeeded
        assert outcome.job.request_id == unreachable.value.request_id
        assert online.pending() == []
    assert len(admin.jobs(account.account_id)) == 1


def test_a_local_protocol_error_does_not_escape_resume(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    account = admin.account(credit=2)
    journal = tmp_path / "kiosk.sqlite3"
    nowhere = f"http://127.0.0.1:{free_port()}"
    with Kiosk(nowhere, account.kiosk_key, account.account_id, journal, timeout=1) as offline:
        with pytest.raises(Unreachable):
            offline.generate("standard", {"prompt": "x"})
    # A header httpx refuses to send (h11: "Illegal header value").
    broken = httpx.Client(headers={"X-Venue": "hall\nB"})
    with Kiosk(service_url, account.kiosk_key, account.account_id, journal,
               http_client=broken, timeout=1) as kiosk:
        (outcome,) = kiosk.resume()  # must not raise
        assert isinstance(outcome.error, Unreachable) and outcome.error.pending
        assert isinstance(outcome.error.__cause__, httpx.LocalProtocolError)
        assert [e.state for e in kiosk.pending()] == ["pending"]
    assert admin.jobs(account.account_id) == []


def test_a_job_longer_than_the_timeout_is_finished_by_resume(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=2)
    kiosk = new_kiosk(account)
    with pytest.raises(JobNotFinished) as slow:
        kiosk.generate("standard", {"simulate": {"delay_ms": 5000}}, timeout=2)
    assert slow.value.pending and slow.value.job.status in ("queued", "running")
    assert [e.state for e in kiosk.pending()] == ["accepted"]
    (outcome,) = kiosk.resume(timeout=30)  # waits here, not in the background
    assert outcome.job is not None and outcome.job.succeeded
    assert outcome.job.job_id == slow.value.job.job_id
    assert admin.balances(account.account_id)["used"] == 1


def test_heartbeat_keeps_a_reservation_held_past_its_ttl(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=5)
    kiosk = new_kiosk(account)
    # Without a heartbeat, a 1 s reservation is gone after 2.5 s.
    forgotten = kiosk.reserve(1, ttl_seconds=1)
    time.sleep(2.5)
    with pytest.raises(ReservationNotHeld) as expired:
        kiosk.commit(forgotten)
    assert expired.value.state == "expired"
    # With one, it outlives its TTL as long as the work runs.
    reservation = kiosk.reserve(1, ttl_seconds=3)
    with kiosk.heartbeat(reservation, ttl_seconds=3, every=0.5) as beat:
        time.sleep(5)
    assert beat.beats >= 3 and beat.error is None
    committed = kiosk.commit(reservation)
    assert committed.state == "committed" and committed.expires_at > reservation.expires_at
    assert kiosk.pending() == []
    balances = admin.assert_books(account.account_id)
    assert (balances["used"], balances["reserved"]) == (1, 0)


def test_heartbeat_stops_when_the_reservation_is_gone(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=5)
    kiosk = new_kiosk(account)
    reservation = kiosk.reserve(1)
    with kiosk.heartbeat(reservation, ttl_seconds=60, every=0.2) as beat:
        kiosk.release(reservation)
        deadline = time.monotonic() + 10
        while beat.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert isinstance(beat.error, ReservationNotHeld) and beat.error.state == "released"


def test_resume_hands_back_a_held_reservation(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=5)
    kiosk = new_kiosk(account)
    reservation = kiosk.reserve(3, request_id=str(uuid.uuid4()))
    (outcome,) = kiosk.resume()
    assert outcome.reservation is not None and outcome.reservation.held
    assert outcome.reservation.reservation_id == reservation.reservation_id
    kiosk.commit(outcome.reservation, amount=2)
    assert kiosk.resume() == [] and kiosk.pending() == []
    assert admin.assert_books(account.account_id)["used"] == 2


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_the_journal_and_its_side_files_are_private_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    """The journal holds request bodies (guests' prompts): the database and
    SQLite's -wal and -shm side files are 0600 however the process's umask
    is set."""
    from token_billing_kiosk._journal import Journal

    path = tmp_path / "kiosk.sqlite3"
    previous = os.umask(umask)
    try:
        journal = Journal(path)
        try:
            journal.begin(str(uuid.uuid4()), "job", str(uuid.uuid4()), {"prompt": "a guest's words"})
            modes = {
                suffix: stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
                for suffix in ("", "-wal", "-shm", ".lock")
            }
        finally:
            journal.close()
    finally:
        os.umask(previous)
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600, ".lock": 0o600}
