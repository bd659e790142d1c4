"""Exceptions. Refusals of the service map from the problem ``code``.

Every exception carries ``request_id`` (the journaled id of the request it
concerns, when there is one) and ``pending``: ``True`` when the request stays
in the journal without a final answer, so that :meth:`Kiosk.resume` will
finish it later with the same ``request_id``; ``False`` when it was
definitively answered (a refusal changes nothing on the service).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type

if TYPE_CHECKING:
    from ._models import Job


class KioskError(Exception):
    """Base class of every exception this package raises."""

    def __init__(
        self, message: str, *, request_id: Optional[str] = None, pending: bool = False
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.pending = pending


class Unreachable(KioskError):
    """No answer from the service before the deadline (connection errors,
    timeouts, cut connections). A journaled request stays pending."""


class JobNotFinished(KioskError):
    """The job was accepted (its cost is reserved) but did not reach a
    terminal status before the deadline. It stays pending in the journal;
    :meth:`Kiosk.resume` or :meth:`Kiosk.wait` picks it up again."""

    def __init__(self, message: str, *, request_id: str, job: "Job") -> None:
        super().__init__(message, request_id=request_id, pending=True)
        self.job = job


class JournalError(KioskError):
    """The journal cannot be used: it is locked by another process. (A
    ``request_id`` the journal holds for another request raises
    :class:`IdempotencyKeyReused`, before anything is sent.)"""


class ApiError(KioskError):
    """An error answer (``application/problem+json``) of the service.

    ``code`` is the service's stable problem code (``http_<status>`` when the
    body has none); ``detail`` its ``detail`` (``""`` when it has none);
    ``problem`` the whole body.
    """

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        problem: Optional[Mapping[str, Any]] = None,
        *,
        request_id: Optional[str] = None,
        pending: bool = False,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(
            f"{status} {code}: {detail}", request_id=request_id, pending=pending
        )
        self.status = status
        self.code = code
        self.detail = detail
        self.problem: Dict[str, Any] = dict(problem or {})
        self.retry_after = retry_after


class InsufficientTokens(ApiError):
    """402: not enough available tokens. ``reserved`` > 0 means another kiosk
    of the account may be using tokens right now."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.available = _int(self.problem.get("available"))
        self.reserved = _int(self.problem.get("reserved"))


class KeyBudgetExhausted(ApiError):
    """402: this kiosk key's budget (its spending limit per period) has
    fewer tokens left than asked: ``remaining`` tokens until ``resets_at``
    (RFC 3339; None for a budget that never resets). The account may still
    hold tokens; an admin raises the key's budget."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.remaining = _int(self.problem.get("remaining"))
        resets_at = self.problem.get("resets_at")
        self.resets_at: Optional[str] = resets_at if isinstance(resets_at, str) else None


class AccountSuspended(ApiError):
    """409: the account is suspended; nothing can be spent."""


class TooManyActiveReservations(ApiError):
    """429: the account holds ``max_active_reservations`` reservations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_active_reservations = _int(self.problem.get("max_active_reservations"))


class RateLimited(ApiError):
    """429: this key is over its request rate, still after the retries
    allowed before the deadline. ``retry_after`` is the service's advice in
    seconds."""


class Unauthorized(ApiError):
    """401: the API key is missing, unknown, revoked or expired. The key is
    checked before the ``request_id``: answered to a retry after an attempt
    that may have reached the service, or to :meth:`Kiosk.resume`, it proves
    nothing about the request, which stays pending (``pending`` true)."""


class IdempotencyKeyReused(ApiError):
    """422: the ``request_id`` was already used for a different request."""


class ReservationNotHeld(ApiError):
    """409: the reservation was already resolved differently or expired;
    ``state`` is its state now."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        state = self.problem.get("state")
        self.state: Optional[str] = state if isinstance(state, str) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


#: The members of a problem body the exceptions read.
PROBLEM_FIELDS = (
    "code", "status", "detail", "available", "reserved", "state", "max_active_reservations",
    "remaining", "resets_at",
)

ERRORS_BY_CODE: Dict[str, Type[ApiError]] = {
    "insufficient_tokens": InsufficientTokens,
    "key_budget_exhausted": KeyBudgetExhausted,
    "account_suspended": AccountSuspended,
    "too_many_active_reservations": TooManyActiveReservations,
    "rate_limited": RateLimited,
    "unauthorized": Unauthorized,
    "idempotency_key_reused": IdempotencyKeyReused,
    "reservation_not_held": ReservationNotHeld,
}


def error_from_problem(
    status: int,
    problem: Mapping[str, Any],
    *,
    request_id: Optional[str] = None,
    pending: bool = False,
    retry_after: Optional[float] = None,
) -> ApiError:
    """The exception for a problem body; unknown codes give ``ApiError``."""
    code = problem.get("code")
    code = code if isinstance(code, str) else f"http_{status}"
    detail = problem.get("detail")
    detail = detail if isinstance(detail, str) else ""
    cls = ERRORS_BY_CODE.get(code, ApiError)
    return cls(
        status,
        code,
        detail,
        problem,
        request_id=request_id,
        pending=pending,
        retry_after=retry_after,
    )
