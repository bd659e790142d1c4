"""The list readers (``ledger``, ``reservations``, ``jobs``, ``grants``):
every item of every page, once, in the service's order, following its
cursor; and on a key over its rate limit, waiting as ``Retry-After`` says
instead of failing."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Dict, List

from token_billing_kiosk import Grant, Job, Kiosk, LedgerEntry, Reservation

from conftest import Account, Admin

MakeKiosk = Callable[..., Kiosk]


def every(admin: Admin, account_id: str, resource: str, member: str) -> List[Dict[str, Any]]:
    """The whole list in one page, as the admin reads it."""
    page = admin._ok(
        admin.http.get(f"/v1/accounts/{account_id}/{resource}", params={"limit": 500})
    )
    assert page["next_after"] is None, page
    return list(page[member])


def busy_account(admin: Admin, booth: Kiosk, account: Account) -> None:
    """Five credits (five grants), three jobs, four reservations (two
    committed, one released, one held): more than two pages of each."""
    for _ in range(4):
        admin.credit(account.account_id, 3)
    for n in range(3):
        assert booth.generate("standard", {"prompt": f"guest {n}"}).succeeded
    for n in range(4):
        reservation = booth.reserve(1, request_id=str(uuid.uuid4()))
        if n < 2:
            booth.commit(reservation)
        elif n == 2:
            booth.release(reservation)


def test_readers_yield_every_item_once_in_order_across_pages(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=5)
    booth = new_kiosk(account)
    busy_account(admin, booth, account)
    a = account.account_id

    ledger = list(booth.ledger(page_size=2))
    assert all(isinstance(entry, LedgerEntry) for entry in ledger)
    expected = [entry["entry_id"] for entry in every(admin, a, "ledger", "entries")]
    assert len(expected) > 6, expected
    assert [entry.entry_id for entry in ledger] == expected

    reservations = list(booth.reservations(page_size=2))
    assert all(isinstance(r, Reservation) for r in reservations)
    expected = [r["reservation_id"] for r in every(admin, a, "reservations", "reservations")]
    assert len(expected) == 7, expected  # 3 jobs' and 4 of their own
    assert [r.reservation_id for r in reservations] == expected
    assert [r.reservation_id for r in booth.reservations("held", page_size=1)] == [
        r["reservation_id"]
        for r in every(admin, a, "reservations", "reservations")
        if r["state"] == "held"
    ]

    jobs = list(booth.jobs(page_size=2))
    assert all(isinstance(job, Job) for job in jobs)
    expected = [job["job_id"] for job in every(admin, a, "jobs", "jobs")]
    assert len(expected) == 3
    assert [job.job_id for job in jobs] == expected

    grants = list(booth.grants(page_size=2))
    assert all(isinstance(grant, Grant) for grant in grants)
    expected = [grant["grant_id"] for grant in every(admin, a, "grants", "grants")]
    assert len(expected) == 5
    assert [grant.grant_id for grant in grants] == expected

    # From a cursor: what comes after it, nothing before.
    after = ledger[2].entry_id
    assert [e.entry_id for e in booth.ledger(after=after, page_size=3)] == [
        e.entry_id for e in ledger[3:]
    ]
    # Lazy: a page is asked only when the loop reaches it.
    reader = booth.ledger(page_size=2)
    assert next(reader).entry_id == ledger[0].entry_id


def test_a_reader_over_the_rate_limit_waits_it_out(
    admin: Admin, new_kiosk: MakeKiosk, strict_replica: str
) -> None:
    # The strict replica allows one request a second per key (burst 1).
    account = admin.account(credit=1)
    for _ in range(5):
        admin.credit(account.account_id, 1)
    booth = new_kiosk(account, url=strict_replica)
    expected = [entry["entry_id"] for entry in every(admin, account.account_id, "ledger", "entries")]
    assert len(expected) == 6
    started = time.monotonic()
    seen = [entry.entry_id for entry in booth.ledger(page_size=2)]
    took = time.monotonic() - started
    print(f"readers: 3 pages at 1 request/s read in {took:.2f} s")
    assert seen == expected
    # Three pages at one request a second: the reader waited, and was refused
    # on the way (each refusal waited out, not raised).
    assert took >= 1.5, took
