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
