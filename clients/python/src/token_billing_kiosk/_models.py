"""What the service answers, as typed, immutable values.

Each model names the OpenAPI schema it reads (``OPENAPI_SCHEMA``); a test
keeps the fields and their types equal to the service's ``/openapi.json``.
Fields the service may add later are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar, Dict, Mapping, Optional

JOB_TERMINAL_STATUSES = ("succeeded", "failed")

#: Every event type of the feed and the webhooks (the service's
#: ``EventView``, docs/webhooks.md); a test keeps it equal to the types of
#: the service's /openapi.json.
EVENT_TYPES = (
    "account.balance_low",
    "account.balance_recovered",
    "account.balance_depleted",
    "credit.created",
    "adjustment.created",
    "reservation.expired",
    "grant.expired",
    "grant.expiring",
    "grant.rolled_over",
    "topup.granted",
    "topup.requested",
    "topup.request_expired",
    "topup.cap_reached",
    "job.succeeded",
    "job.failed",
    "invariant.violated",
    "endpoint.disabled",
    "key.budget_low",
    "key.budget_exhausted",
)

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:\d{2})$"
)


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp as an aware ``datetime`` (any fraction length;
    ``datetime.fromisoformat`` of Python 3.9 takes neither ``Z`` nor 9 digits)."""
    match = _RFC3339.match(text)
    if not match:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    day, clock, fraction, zone = match.groups()
    micros = (fraction or "0")[:6].ljust(6, "0")
    value = datetime.fromisoformat(f"{day}T{clock}.{micros}")
    if zone in ("Z", "z"):
        offset = timedelta(0)
    else:
        sign = -1 if zone[0] == "-" else 1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    return value.replace(tzinfo=timezone(offset))


def _time(data: Mapping[str, Any], name: str) -> datetime:
    return parse_time(str(data[name]))


def _optional_time(data: Mapping[str, Any], name: str) -> Optional[datetime]:
    value = data.get(name)
    return None if value is None else parse_time(str(value))


def _optional_str(data: Mapping[str, Any], name: str) -> Optional[str]:
    value = data.get(name)
    return None if value is None else str(value)


def _object(value: Any) -> Optional[Dict[str, Any]]:
    return dict(value) if isinstance(value, dict) else None


@dataclass(frozen=True)
class Balance:
    """An account's balances: every token is available, reserved or used."""

    OPENAPI_SCHEMA: ClassVar[str] = "AccountView"

    account_id: str
    name: str
    status: str
    available: int
    reserved: int
    used: int
    credited: int
    adjusted: int
    active_reservations: int
    max_active_reservations: int
    version: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Balance":
        return cls(
            account_id=str(data["account_id"]),
            name=str(data["name"]),
            status=str(data["status"]),
            available=int(data["available"]),
            reserved=int(data["reserved"]),
            used=int(data["used"]),
            credited=int(data["credited"]),
            adjusted=int(data["adjusted"]),
            active_reservations=int(data["active_reservations"]),
            max_active_reservations=int(data["max_active_reservations"]),
            version=int(data["version"]),
        )


@dataclass(frozen=True)
class JobReservation:
    """The reservation a job spends."""

    OPENAPI_SCHEMA: ClassVar[str] = "JobReservation"

    reservation_id: str
    state: str
    expires_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JobReservation":
        return cls(
            reservation_id=str(data["reservation_id"]),
            state=str(data["state"]),
            expires_at=_time(data, "expires_at"),
        )


@dataclass(frozen=True)
class Job:
    """A generation job. ``status``: ``queued`` → ``running`` →
    ``succeeded`` | ``failed``; ``result`` holds the provider's ``output``
    once succeeded, ``error`` ``{code, message}`` once failed."""

    OPENAPI_SCHEMA: ClassVar[str] = "JobView"

    job_id: str
    request_id: str
    account_id: str
    kind: str
    status: str
    cost: int
    attempts: int
    reservation: JobReservation
    result: Optional[Dict[str, Any]]
    error: Optional[Dict[str, Any]]
    created_at: datetime
    updated_at: datetime
    finished_at: Optional[datetime]

    @property
    def terminal(self) -> bool:
        return self.status in JOB_TERMINAL_STATUSES

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def output(self) -> Any:
        """The provider's ``output`` (an image URL with the simulated
        provider), or ``None``."""
        return None if self.result is None else self.result.get("output")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Job":
        return cls(
            job_id=str(data["job_id"]),
            request_id=str(data["request_id"]),
            account_id=str(data["account_id"]),
            kind=str(data["kind"]),
            status=str(data["status"]),
            cost=int(data["cost"]),
            attempts=int(data["attempts"]),
            reservation=JobReservation.from_json(data["reservation"]),
            result=_object(data.get("result")),
            error=_object(data.get("error")),
            created_at=_time(data, "created_at"),
            updated_at=_time(data, "updated_at"),
            finished_at=_optional_time(data, "finished_at"),
        )


@dataclass(frozen=True)
class Reservation:
    """Tokens held for one operation: ``held`` → ``committed`` |
    ``released`` | ``expired``."""

    OPENAPI_SCHEMA: ClassVar[str] = "ReservationView"

    reservation_id: str
    account_id: str
    request_id: str
    amount: int
    state: str
    committed_amount: int
    expires_at: datetime
    job_id: Optional[str]
    created_at: datetime
    resolved_at: Optional[datetime]

    @property
    def held(self) -> bool:
        return self.state == "held"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Reservation":
        return cls(
            reservation_id=str(data["reservation_id"]),
            account_id=str(data["account_id"]),
            request_id=str(data["request_id"]),
            amount=int(data["amount"]),
            state=str(data["state"]),
            committed_amount=int(data["committed_amount"]),
            expires_at=_time(data, "expires_at"),
            job_id=_optional_str(data, "job_id"),
            created_at=_time(data, "created_at"),
            resolved_at=_optional_time(data, "resolved_at"),
        )


@dataclass(frozen=True)
class Event:
    """One event of the account's feed (``GET /v1/events``): ``type`` such
    as ``credit.created`` (a top-up), ``account.balance_low``,
    ``job.succeeded``; ``data`` holds ``account_id``, the account's
    ``balances`` after the movement and the object it is about."""

    OPENAPI_SCHEMA: ClassVar[str] = "EventView"

    id: str
    type: str
    created_at: datetime
    data: Dict[str, Any]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Event":
        return cls(
            id=str(data["id"]),
            type=str(data["type"]),
            created_at=_time(data, "created_at"),
            data=_object(data.get("data")) or {},
        )


def _optional_int(data: Mapping[str, Any], name: str) -> Optional[int]:
    value = data.get(name)
    return None if value is None else int(value)


@dataclass(frozen=True)
class TopupFiring:
    """One firing of a top-up rule: ``outcome`` ``granted``, ``requested``
    (a request to the customer: ``state`` ``open``, ``fulfilled`` or
    ``expired``), ``cap_reached`` or ``skipped``."""

    OPENAPI_SCHEMA: ClassVar[str] = "TopupFiringView"

    firing_id: str
    rule_id: str
    outcome: str
    tokens: int
    state: Optional[str]
    expires_at: Optional[datetime]
    credit_id: Optional[str]
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TopupFiring":
        return cls(
            firing_id=str(data["firing_id"]),
            rule_id=str(data["rule_id"]),
            outcome=str(data["outcome"]),
            tokens=int(data["tokens"]),
            state=_optional_str(data, "state"),
            expires_at=_optional_time(data, "expires_at"),
            credit_id=_optional_str(data, "credit_id"),
            created_at=_time(data, "created_at"),
        )


#: A rule's ``status`` while a top-up request it opened waits for the customer.
REQUEST_OPEN = "request_open"


@dataclass(frozen=True)
class TopupRule:
    """A top-up rule of the account (``GET …/topup-rules``) and what it is
    doing: ``status`` is ``armed`` (it fires when ``available`` goes below
    ``threshold_tokens``), ``request_open`` (its request waits for the
    customer's credit: ``last_firing``), ``waiting_for_use`` (what it added
    is not used yet: ``unconsumed_tokens``), ``cap_reached``,
    ``waiting_for_balance``, ``scheduled`` or ``disabled``."""

    OPENAPI_SCHEMA: ClassVar[str] = "TopupRuleView"

    rule_id: str
    trigger: str
    mode: str
    method: str
    threshold_tokens: Optional[int]
    tokens: Optional[int]
    target_tokens: Optional[int]
    enabled: bool
    armed: Optional[bool]
    status: str
    unconsumed_tokens: Optional[int]
    last_firing: Optional[TopupFiring]

    @property
    def open_request(self) -> Optional[TopupFiring]:
        """The request this rule opened and that waits for the customer, if any."""
        firing = self.last_firing
        if self.status == REQUEST_OPEN and firing is not None and firing.state == "open":
            return firing
        return None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TopupRule":
        firing = data.get("last_firing")
        return cls(
            rule_id=str(data["rule_id"]),
            trigger=str(data["trigger"]),
            mode=str(data["mode"]),
            method=str(data["method"]),
            threshold_tokens=_optional_int(data, "threshold_tokens"),
            tokens=_optional_int(data, "tokens"),
            target_tokens=_optional_int(data, "target_tokens"),
            enabled=bool(data["enabled"]),
            armed=None if data.get("armed") is None else bool(data["armed"]),
            status=str(data["status"]),
            unconsumed_tokens=_optional_int(data, "unconsumed_tokens"),
            last_firing=TopupFiring.from_json(firing) if isinstance(firing, dict) else None,
        )


@dataclass(frozen=True)
class TopupState:
    """The account's top-ups as a booth needs them on a 402: is one on its
    way (``open_request``, and from which rule), will one fire (``armed``),
    or is it stopped by a cap (``capped``)."""

    rules: "tuple[TopupRule, ...]"

    @property
    def open_request(self) -> Optional[TopupRule]:
        """The rule whose top-up request waits for the customer (the oldest), if any."""
        return next((rule for rule in self.rules if rule.open_request is not None), None)

    @property
    def armed(self) -> "tuple[TopupRule, ...]":
        """Rules that fire when the balance goes below their line."""
        return tuple(rule for rule in self.rules if rule.status == "armed")

    @property
    def capped(self) -> "tuple[TopupRule, ...]":
        """Rules stopped by their daily or monthly cap."""
        return tuple(rule for rule in self.rules if rule.status == "cap_reached")

    @property
    def on_its_way(self) -> bool:
        """True when a top-up is on its way: a request is open, or a rule
        will grant at the next movement."""
        return self.open_request is not None or any(
            rule.mode == "grant" and rule.trigger == "threshold" for rule in self.armed
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One movement of the account's tokens (``GET …/ledger``), with the
    balances after it. ``kind``: ``credit``, ``adjustment``, ``reserve``,
    ``commit``, ``release``, ``expire`` or ``grant_expire``."""

    OPENAPI_SCHEMA: ClassVar[str] = "LedgerEntryView"

    entry_id: int
    account_id: str
    kind: str
    amount: int
    available_after: int
    reserved_after: int
    used_after: int
    reservation_id: Optional[str]
    job_id: Optional[str]
    external_ref: Optional[str]
    reason: Optional[str]
    actor: str
    created_at: datetime
    grant_id: Optional[str]
    api_key_id: Optional[str]
    topup_rule_id: Optional[str]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LedgerEntry":
        return cls(
            entry_id=int(data["entry_id"]),
            account_id=str(data["account_id"]),
            kind=str(data["kind"]),
            amount=int(data["amount"]),
            available_after=int(data["available_after"]),
            reserved_after=int(data["reserved_after"]),
            used_after=int(data["used_after"]),
            reservation_id=_optional_str(data, "reservation_id"),
            job_id=_optional_str(data, "job_id"),
            external_ref=_optional_str(data, "external_ref"),
            reason=_optional_str(data, "reason"),
            actor=str(data["actor"]),
            created_at=_time(data, "created_at"),
            grant_id=_optional_str(data, "grant_id"),
            api_key_id=_optional_str(data, "api_key_id"),
            topup_rule_id=_optional_str(data, "topup_rule_id"),
        )


@dataclass(frozen=True)
class Grant:
    """A credit grant (``GET …/grants``): tokens of one credit or positive
    adjustment, drawn by priority then soonest expiry. ``status``:
    ``active``, ``depleted`` or ``expired``."""

    OPENAPI_SCHEMA: ClassVar[str] = "GrantView"

    grant_id: str
    account_id: str
    amount: int
    remaining: int
    reserved: int
    expires_at: Optional[datetime]
    priority: int
    status: str
    external_ref: Optional[str]
    created_at: datetime
    expired_at: Optional[datetime]
    topup_rule_id: Optional[str]
    #: What was paid for the grant, in integer minor units of ``currency``
    #: (cents); None: unpriced. Money is never a float.
    amount_paid: Optional[int]
    currency: Optional[str]
    #: The lapsed grant a rollover carried this one's tokens from; None
    #: for any other grant.
    rolled_over_from: Optional[str]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Grant":
        return cls(
            grant_id=str(data["grant_id"]),
            account_id=str(data["account_id"]),
            amount=int(data["amount"]),
            remaining=int(data["remaining"]),
            reserved=int(data["reserved"]),
            expires_at=_optional_time(data, "expires_at"),
            priority=int(data["priority"]),
            status=str(data["status"]),
            external_ref=_optional_str(data, "external_ref"),
            created_at=_time(data, "created_at"),
            expired_at=_optional_time(data, "expired_at"),
            topup_rule_id=_optional_str(data, "topup_rule_id"),
            amount_paid=_optional_int(data, "amount_paid"),
            currency=_optional_str(data, "currency"),
            rolled_over_from=_optional_str(data, "rolled_over_from"),
        )
