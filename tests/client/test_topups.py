"""Top-ups a kiosk can see: the account's rules and what they are doing
(``topup_rules``, ``topup_state``), so that a booth refused 402 knows at
once whether a top-up request is open and from which rule; and a watch
that starts at an instant (``since``) or at "now" without the history."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, List

import pytest

from token_billing_kiosk import Event, InsufficientTokens, Kiosk

from conftest import Admin

MakeKiosk = Callable[..., Kiosk]


def request_rule(admin: Admin, account_id: str, **fields: Any) -> Dict[str, Any]:
    body = {"trigger": "threshold", "threshold_tokens": 2, "method": "fixed",
            "tokens": 10, "mode": "request", **fields}
    response = admin.http.post(f"/v1/accounts/{account_id}/topup-rules", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_a_sold_out_booth_knows_a_request_is_open_and_from_which_rule(
    admin: Admin, new_kiosk: MakeKiosk
) -> None:
    account = admin.account(credit=3)
    booth = new_kiosk(account)
    assert booth.topup_rules() == []
    assert booth.topup_state().open_request is None and not booth.topup_state().on_its_way
    rule = request_rule(admin, account.account_id)
    (seen,) = booth.topup_rules()
    assert (seen.rule_id, seen.mode, seen.status) == (rule["rule_id"], "request", "armed")
    assert booth.topup_state().armed == (seen,)
    for n in range(3):  # 3 → 0; the request opens when available goes below 2
        assert booth.generate("standard", {"prompt": f"guest {n}"}).succeeded
    with pytest.raises(InsufficientTokens) as refused:
        booth.generate("standard", {"prompt": "one too many"})
    assert refused.value.reserved == 0
    started = time.monotonic()
    state = booth.topup_state()
    learned = time.monotonic() - started
    print(f"topups: a sold-out booth learned of the open request in {learned * 1000:.0f} ms")
    assert learned < 1.0
    assert state.on_its_way
    assert state.open_request is not None and state.open_request.rule_id == rule["rule_id"]
    firing = state.open_request.open_request
    assert firing is not None
    assert (firing.outcome, firing.state, firing.tokens) == ("requested", "open", 10)
    assert state.open_request.status == "request_open"
    # The customer's billing answers it: the request is no longer open.
    admin._ok(admin.http.post(f"/v1/accounts/{account.account_id}/credits",
                              json={"amount": 10, "external_ref": firing.firing_id}))
    after = booth.topup_state()
    assert after.open_request is None
    (answered,) = after.rules
    assert answered.last_firing is not None and answered.last_firing.state == "fulfilled"


def test_watch_since_an_instant_and_from_now(admin: Admin, new_kiosk: MakeKiosk) -> None:
    account = admin.account(credit=1)
    booth = new_kiosk(account)
    # The first credit's event, listed (the feed shows an event once no
    # earlier transaction can still commit).
    first = next(iter(booth.watch(from_start=True, wait_seconds=5)))
    assert first.type == "credit.created"
    between = datetime.now(timezone.utc)
    time.sleep(0.01)  # distinct instants: the credit below is created after `between`
    admin.credit(account.account_id, 2)
    since = booth.watch(since=between, wait_seconds=5)
    second = next(iter(since))
    assert second.type == "credit.created" and second.data["credit"]["amount"] == 2
    # From now: nothing of the above; the next credit only.
    now = booth.watch(wait_seconds=5)
    admin.credit(account.account_id, 3)
    third = next(iter(now))
    assert third.data["credit"]["amount"] == 3, third
    # Before every event: the whole history again.
    whole: List[Event] = []
    for event in booth.watch(since=between - timedelta(days=1), wait_seconds=1):
        whole.append(event)
        if len(whole) == 3:
            break
    assert [e.data["credit"]["amount"] for e in whole] == [1, 2, 3]
    with pytest.raises(ValueError):
        booth.watch(since=datetime.now())  # naive
    with pytest.raises(ValueError):
        booth.watch(after=first.id, from_start=True)
