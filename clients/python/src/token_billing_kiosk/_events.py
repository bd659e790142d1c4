"""Each event type's ``data``, as ``TypedDict``s: what the service's
``/openapi.json`` says that type carries (``EventView``, one schema per
type; tests/client/test_openapi_models.py keeps them equal). ``Event.data``
is a plain dict; type it by its ``type``::

    if event.type == "account.balance_low":
        data = cast(AccountBalanceLowData, event.data)
        show_low_tokens(data["balances"]["available"])

Resources in ``data`` (``entry``, ``credit``, ``job``, …) are the API's own
views of them, as dicts (docs/webhooks.md)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, TypedDict

Resource = Dict[str, Any]


class EventBalances(TypedDict):
    available: int
    reserved: int
    used: int
    credited: int
    adjusted: int


class AccountEventData(TypedDict):
    account_id: str
    balances: EventBalances
    low_balance_threshold: int


class AccountBalanceLowData(AccountEventData):
    entry: Optional[Resource]


class AccountBalanceRecoveredData(AccountEventData):
    entry: Optional[Resource]


class AccountBalanceDepletedData(AccountEventData):
    entry: Resource


class CreditCreatedData(AccountEventData):
    credit: Resource
    entry: Resource


class AdjustmentCreatedData(AccountEventData):
    adjustment: Resource
    entry: Resource


class ReservationExpiredData(AccountEventData):
    reservation: Resource
    entry: Resource


class GrantExpiredData(AccountEventData):
    grant_id: str
    amount: int
    grant: Resource
    entry: Resource


class GrantExpiringData(AccountEventData):
    grant_id: str
    amount: int
    expires_at: str
    grant: Resource


class GrantRolledOverData(AccountEventData):
    grant_id: str
    unused: int
    tokens: int
    max_tokens: int
    grant: Resource
    credit: Resource


class TopupGrantedData(AccountEventData):
    rule: Resource
    firing: Resource
    credit: Resource


class TopupRequestedData(AccountEventData):
    rule: Resource
    request: Resource


class TopupRequestExpiredData(AccountEventData):
    rule: Optional[Resource]
    request: Resource
    next: str


class TopupCap(TypedDict):
    per: str
    period: str
    max_tokens: int
    used_tokens: int
    tokens: int


class TopupCapReachedData(AccountEventData):
    rule: Resource
    cap: TopupCap


class JobFinishedData(AccountEventData):
    job: Resource


class InvariantViolatedData(TypedDict):
    account_id: str
    discrepancies: List[Resource]


class EndpointDisabledData(TypedDict):
    endpoint_id: str
    url: str
    reason: Optional[str]
    failing_since: Optional[str]
    last_status_code: Optional[int]
    last_error: Optional[str]


class KeyBudgetData(TypedDict):
    account_id: str
    key_id: str
    label: str
    budget: Resource


#: Each event type's ``data`` type.
EVENT_DATA: Mapping[str, type] = {
    "account.balance_low": AccountBalanceLowData,
    "account.balance_recovered": AccountBalanceRecoveredData,
    "account.balance_depleted": AccountBalanceDepletedData,
    "credit.created": CreditCreatedData,
    "adjustment.created": AdjustmentCreatedData,
    "reservation.expired": ReservationExpiredData,
    "grant.expired": GrantExpiredData,
    "grant.expiring": GrantExpiringData,
    "grant.rolled_over": GrantRolledOverData,
    "topup.granted": TopupGrantedData,
    "topup.requested": TopupRequestedData,
    "topup.request_expired": TopupRequestExpiredData,
    "topup.cap_reached": TopupCapReachedData,
    "job.succeeded": JobFinishedData,
    "job.failed": JobFinishedData,
    "invariant.violated": InvariantViolatedData,
    "endpoint.disabled": EndpointDisabledData,
    "key.budget_low": KeyBudgetData,
    "key.budget_exhausted": KeyBudgetData,
}
