"""Every refusal of the service arrives as its typed exception, with its
fields, and changes nothing: not on the service, not in the journal
(a refused request is not left open). A failed generation is no refusal:
``generate`` returns the failed job, and nothing is charged."""

from __future__ import annotations

import time
import uuid
from typing import Callable

import pytest

from conftest import Admin
from token_billing_kiosk import (
    AccountSuspended,
    ApiError,
    IdempotencyKeyReused,
    InsufficientTokens,
    KeyBudgetExhausted,
    Kiosk,
    RateLimited,
    ReservationNotHeld,
    TooManyActiveReservations,
    Unauthorized,
)

MakeKiosk = Callable[..., Kiosk]


def test_a_spent_key_budget_is_its_own_refusal(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=10, budget={"budget_tokens": 2, "budget_period": "total"})
    kiosk = new_kiosk(account)
    held = kiosk.reserve(2)
    with pytest.raises(KeyBudgetExhausted) as spent:
        kiosk.reserve(1)
    assert (spent.value.status, spent.value.code) == (402, "key_budget_exhausted")
    assert (spent.value.remaining, spent.value.resets_at) == (0, None)
    assert not isinstance(spent.value, InsufficientTokens)
    # A release gives the budget back.
    kiosk.release(held)
    kiosk.release(kiosk.reserve(2))


def test_insufficient_tokens_carries_available_and_reserved(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=1)
    kiosk = new_kiosk(account)
    with pytest.raises(InsufficientTokens) as empty:
        kiosk.reserve(2)
    assert (empty.value.status, empty.value.code) == (402, "insufficient_tokens")
    assert (empty.value.available, empty.value.reserved) == (1, 0)
    assert not empty.value.pending
    held = kiosk.reserve(1)
    with pytest.raises(InsufficientTokens) as busy:
        kiosk.generate("standard", {"prompt": "x"})
    assert (busy.value.available, busy.value.reserved) == (0, 1)
    assert "another kiosk" in busy.value.detail
    # The refused requests are not open: only the held reservation is.
    assert [(e.operation, e.state) for e in kiosk.pending()] == [("reserve", "held")]
    assert [e.state for e in kiosk.history() if e.operation == "job"] == ["refused"]
    kiosk.release(held)
    assert admin.assert_books(account.account_id)["available"] == 1


def test_account_suspended(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=5)
    admin.patch(account.account_id, status="suspended")
    with pytest.raises(AccountSuspended) as refused:
        new_kiosk(account).generate("standard", {"prompt": "x"})
    assert (refused.value.status, refused.value.code) == (409, "account_suspended")
    assert admin.jobs(account.account_id) == []


def test_too_many_active_reservations(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=5, max_active_reservations=1)
    kiosk = new_kiosk(account)
    kiosk.reserve(1)
    started = time.monotonic()
    with pytest.raises(TooManyActiveReservations) as refused:
        kiosk.reserve(1)
    # A refusal, not a retry: it comes back at once.
    assert time.monotonic() - started < 5
    assert (refused.value.status, refused.value.max_active_reservations) == (429, 1)
    assert admin.balances(account.account_id)["reserved"] == 1


def test_unauthorized(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=5)
    account.kiosk_key = "not-a-key-" + uuid.uuid4().hex
    with pytest.raises(Unauthorized) as refused:
        new_kiosk(account).balance()
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")


def test_idempotency_key_reused_by_the_service_and_by_the_journal(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=5)
    first, second = new_kiosk(account), new_kiosk(account)  # two journals
    request_id = str(uuid.uuid4())
    job = first.generate("standard", {"prompt": "a"}, request_id=request_id)
    assert job.succeeded
    # Another journal: the service refuses it.
    with pytest.raises(IdempotencyKeyReused) as by_service:
        second.generate("standard", {"prompt": "b"}, request_id=request_id)
    assert by_service.value.status == 422 and "request_id" in by_service.value.detail
    # The same journal: refused before anything is sent.
    with pytest.raises(IdempotencyKeyReused) as by_journal:
        first.generate("standard", {"prompt": "b"}, request_id=request_id)
    assert "nothing was sent" in by_journal.value.detail
    # The same request again is the same job, from the journal.
    assert first.generate("standard", {"prompt": "a"}, request_id=request_id) == job
    assert len(admin.jobs(account.account_id)) == 1
    assert admin.balances(account.account_id)["used"] == 1


def test_rate_limited_after_retries_and_retried_through(
    admin: Admin, new_kiosk: MakeKiosk, strict_replica: str
) -> None:
    account = admin.account(credit=5)
    impatient = new_kiosk(account, url=strict_replica, timeout=0.5)
    with pytest.raises(RateLimited) as refused:
        for _ in range(10):  # the second within a second, unless the machine stalls
            impatient.balance()
    assert (refused.value.status, refused.value.code) == (429, "rate_limited")
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1
    # With time to wait, Retry-After is honoured and the call goes through.
    patient = new_kiosk(account, url=strict_replica, timeout=10)
    started = time.monotonic()
    patient.balance()
    patient.balance()
    assert time.monotonic() - started >= 0.5


def test_other_codes_are_a_generic_api_error(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=5)
    kiosk = new_kiosk(account)
    with pytest.raises(ApiError) as unknown_kind:
        kiosk.generate("no-such-kind", {"prompt": "x"})
    assert type(unknown_kind.value) is ApiError
    assert (unknown_kind.value.status, unknown_kind.value.code) == (400, "invalid_request")
    assert "kind" in unknown_kind.value.detail
    with pytest.raises(ApiError) as missing:
        kiosk.job(str(uuid.uuid4()))
    assert (type(missing.value), missing.value.code) == (ApiError, "not_found")


def test_reservation_not_held_after_release(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=5)
    kiosk = new_kiosk(account)
    reservation = kiosk.reserve(2)
    assert kiosk.release(reservation).state == "released"
    assert kiosk.release(reservation).state == "released"  # a replay
    with pytest.raises(ReservationNotHeld) as refused:
        kiosk.commit(reservation)
    assert (refused.value.status, refused.value.state) == (409, "released")
    assert kiosk.pending() == []
    assert admin.assert_books(account.account_id)["used"] == 0


def test_a_failed_generation_returns_the_failed_job_and_charges_nothing(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=2)
    kiosk = new_kiosk(account)
    # The simulated provider's failing outcome (src/provider/fake.rs).
    job = kiosk.generate("standard", {"simulate": {"outcome": "fail", "delay_ms": 0}})
    assert (job.status, job.succeeded, job.output) == ("failed", False, None)
    assert job.error is not None and job.error.get("code"), job.error
    assert kiosk.pending() == []
    assert [(e.state, e.answer and e.answer["status"]) for e in kiosk.history()] == [
        ("done", "failed")
    ]
    kinds = [entry["kind"] for entry in admin.ledger(account.account_id)]
    assert "commit" not in kinds and kinds[:2] == ["credit", "reserve"], kinds
    balances = admin.assert_books(account.account_id)
    assert (balances["available"], balances["reserved"], balances["used"]) == (2, 0, 0)
