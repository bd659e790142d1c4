"""Connections cut mid-request and mid-response by a proxy of the test's
own, and error answers injected by it: the client retries with the same
request_id, and nothing is charged twice."""

from __future__ import annotations

import logging
import os
import random
import time
from collections import Counter
from typing import Callable, Dict, Iterator, List
from urllib.parse import urlparse

import pytest

from conftest import Admin
from fault_proxy import PASS, Action, FaultProxy, Request
from token_billing_kiosk import ApiError, Kiosk, Unauthorized

MakeKiosk = Callable[..., Kiosk]


@pytest.fixture
def proxy_to(service_url: str) -> Iterator[Callable[[Callable[[Request], Action]], FaultProxy]]:
    proxies: List[FaultProxy] = []
    parsed = urlparse(service_url)

    def make(decide: Callable[[Request], Action]) -> FaultProxy:
        proxy = FaultProxy((parsed.hostname or "127.0.0.1", parsed.port or 80), decide)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


def once(predicate: Callable[[Request], bool], action: Action) -> Callable[[Request], Action]:
    """``action`` for the first request that matches, then pass."""
    done: List[bool] = []

    def decide(request: Request) -> Action:
        if not done and predicate(request):
            done.append(True)
            return action
        return PASS

    return decide


def is_post(suffix: str) -> Callable[[Request], bool]:
    return lambda request: request.method == "POST" and request.path.endswith(suffix)


def ledger_kinds(admin: Admin, account_id: str) -> Dict[str, int]:
    return dict(Counter(entry["kind"] for entry in admin.ledger(account_id)))


@pytest.mark.parametrize("cut", ["cut_request", "cut_response"])
def test_job_creation_cut_is_retried_into_one_job(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy], cut: str
) -> None:
    account = admin.account(credit=1)  # exactly the price: a second charge would be refused
    proxy = proxy_to(once(is_post("/jobs"), Action(cut, cut_at=0.6)))
    job = new_kiosk(account, url=proxy.url).generate("standard", {"prompt": "x"})
    assert job.succeeded
    assert [kind for *_, kind in proxy.fired] == [cut]
    assert len(admin.jobs(account.account_id)) == 1
    assert ledger_kinds(admin, account.account_id) == {"credit": 1, "reserve": 1, "commit": 1}
    admin.assert_books(account.account_id)


def test_long_poll_cut_mid_answer_is_polled_again(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy]
) -> None:
    account = admin.account(credit=3)
    proxy = proxy_to(once(lambda r: "wait_seconds=" in r.path, Action("cut_response", cut_at=0.3)))
    job = new_kiosk(account, url=proxy.url).generate(
        "standard", {"simulate": {"delay_ms": 300}}
    )
    assert job.succeeded and len(proxy.fired) == 1
    assert ledger_kinds(admin, account.account_id) == {"credit": 1, "reserve": 1, "commit": 1}


@pytest.mark.parametrize("cut", ["cut_request", "cut_response"])
def test_reserve_and_commit_cut_are_retried_into_one_charge(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy], cut: str
) -> None:
    account = admin.account(credit=2)
    cuts = [once(is_post("/reservations"), Action(cut, cut_at=0.5)),
            once(is_post("/commit"), Action(cut, cut_at=0.5))]
    proxy = proxy_to(lambda request: next(
        (action for action in (decide(request) for decide in cuts) if action.kind != "pass"),
        PASS,
    ))
    kiosk = new_kiosk(account, url=proxy.url)
    reservation = kiosk.reserve(2)  # all the account has: a second reserve would be refused
    committed = kiosk.commit(reservation, amount=1)
    assert (committed.state, committed.committed_amount) == ("committed", 1)
    assert len(proxy.fired) == 2
    assert kiosk.pending() == []
    kinds = ledger_kinds(admin, account.account_id)
    assert (kinds["reserve"], kinds["commit"]) == (1, 1), kinds
    assert admin.assert_books(account.account_id)["used"] == 1


def test_503_and_429_wait_for_retry_after(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="token_billing_kiosk")
    account = admin.account(credit=2)
    answers = [Action("answer", status=503, code="unavailable", retry_after=1),
               Action("answer", status=429, code="rate_limited", retry_after=1)]
    proxy = proxy_to(lambda request: answers.pop(0) if answers else PASS)
    started = time.monotonic()
    job = new_kiosk(account, url=proxy.url).generate("standard", {"prompt": "x"})
    assert job.succeeded
    assert time.monotonic() - started >= 2.0, "Retry-After was not honoured"
    assert [kind for *_, kind in proxy.fired] == ["answer 503", "answer 429"]
    retries = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) == 2 and "503, retrying" in retries[0] and "429, retrying" in retries[1]


def test_500s_are_retried_a_bounded_number_of_times_then_resumed(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy]
) -> None:
    account = admin.account(credit=2)
    failing = [True]
    proxy = proxy_to(
        lambda request: Action("answer", status=500, code="internal_error")
        if failing[0] else PASS
    )
    kiosk = new_kiosk(account, url=proxy.url)
    with pytest.raises(ApiError) as gave_up:
        kiosk.generate("standard", {"prompt": "x"})
    assert (gave_up.value.code, gave_up.value.pending) == ("internal_error", True)
    assert len(proxy.fired) == 4  # the first try and three retries
    assert [entry.state for entry in kiosk.pending()] == ["pending"]
    failing[0] = False
    (outcome,) = kiosk.resume()
    assert outcome.job is not None and outcome.job.succeeded
    assert outcome.request_id == gave_up.value.request_id
    assert kiosk.pending() == []
    assert len(admin.jobs(account.account_id)) == 1


def test_401_after_an_attempt_that_may_have_landed_leaves_the_job_pending(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy]
) -> None:
    """The key is checked before the request_id: a 401 to a retry (or to
    resume) does not prove that the job was not created and charged."""
    account = admin.account(credit=1)
    posts = [Action("cut_response", cut_at=0.5),  # the job is made; the answer lost
             Action("answer", status=401, code="unauthorized"),  # the retry
             Action("answer", status=401, code="unauthorized")]  # the first resume()
    proxy = proxy_to(lambda request: posts.pop(0) if request.method == "POST" and posts
                     else PASS)
    kiosk = new_kiosk(account, url=proxy.url)
    with pytest.raises(Unauthorized) as refused:
        kiosk.generate("standard", {"prompt": "x"})
    assert refused.value.pending
    assert [kind for *_, kind in proxy.fired] == ["cut_response", "answer 401"]
    assert [(e.request_id, e.state) for e in kiosk.pending()] == [
        (refused.value.request_id, "pending")
    ]
    (still,) = kiosk.resume()  # an earlier process may have sent it: not final either
    assert isinstance(still.error, Unauthorized) and still.error.pending, still
    assert [e.state for e in kiosk.pending()] == ["pending"]
    (outcome,) = kiosk.resume()
    assert outcome.error is None and outcome.job is not None and outcome.job.succeeded
    assert outcome.request_id == refused.value.request_id
    assert kiosk.pending() == []
    assert [job["request_id"] for job in admin.jobs(account.account_id)] == [
        refused.value.request_id
    ]
    assert ledger_kinds(admin, account.account_id) == {"credit": 1, "reserve": 1, "commit": 1}
    admin.assert_books(account.account_id)


def test_codes_the_service_never_sends_are_a_plain_api_error(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy]
) -> None:
    account = admin.account(credit=1)
    answers = [
        Action("answer", status=418, code="brand_new"),
        Action("answer", status=418, problem={"title": "I'm a teapot", "status": 418}),
    ]
    proxy = proxy_to(lambda request: answers.pop(0) if answers else PASS)
    kiosk = new_kiosk(account, url=proxy.url)
    with pytest.raises(ApiError) as brand_new:
        kiosk.generate("standard", {"prompt": "x"})
    error = brand_new.value
    assert type(error) is ApiError and not error.pending
    assert (error.status, error.code, error.detail) == (418, "brand_new",
                                                        "injected by the test's proxy")
    assert [e.state for e in kiosk.history()] == ["refused"]
    with pytest.raises(ApiError) as without_code:
        kiosk.balance()
    error = without_code.value
    assert type(error) is ApiError
    assert (error.status, error.code, error.detail) == (418, "http_418", "")
    assert error.problem == {"title": "I'm a teapot", "status": 418}
    assert [kind for *_, kind in proxy.fired] == ["answer 418", "answer 418"]
    assert admin.jobs(account.account_id) == []


def test_seeded_random_cuts_never_charge_twice(
    admin: Admin, new_kiosk: MakeKiosk, proxy_to: Callable[..., FaultProxy]
) -> None:
    seed = int(os.environ.get("CUT_SEED", "20261201"))
    generations = int(os.environ.get("CUT_GENERATIONS", "20"))
    rng = random.Random(seed)
    account = admin.account(credit=generations)

    def decide(request: Request) -> Action:
        roll = rng.random()
        if roll < 0.15:
            return Action("cut_request", cut_at=rng.random())
        if roll < 0.35:
            return Action("cut_response", cut_at=rng.random())
        return PASS

    proxy = proxy_to(decide)
    kiosk = new_kiosk(account, url=proxy.url)
    jobs = [
        kiosk.generate("standard", {"n": n, "simulate": {"delay_ms": 50}})
        for n in range(generations)
    ]
    assert all(job.succeeded for job in jobs)
    cuts = Counter(kind for *_, kind in proxy.fired)
    kinds = ledger_kinds(admin, account.account_id)
    print(f"\nconnection cuts: seed {seed}, {generations} generations, "
          f"{proxy.requests} requests, {dict(cuts)}, "
          f"{kinds.get('commit', 0)} charges (commit entries)")
    assert cuts["cut_request"] > 0 and cuts["cut_response"] > 0
    assert len(admin.jobs(account.account_id)) == generations
    assert (kinds["reserve"], kinds["commit"]) == (generations, generations), kinds
    balances = admin.assert_books(account.account_id)
    assert (balances["available"], balances["used"]) == (0, generations)
