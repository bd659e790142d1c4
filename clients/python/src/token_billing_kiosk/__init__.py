"""Crash-safe kiosk client for the token-billing service.

>>> from token_billing_kiosk import Kiosk
>>> kiosk = Kiosk(base_url, api_key, account_id, journal="kiosk-journal.sqlite3")
>>> job = kiosk.generate("standard", {"prompt": "..."}, timeout=60)
"""

from ._errors import (
    AccountSuspended,
    ApiError,
    IdempotencyKeyReused,
    InsufficientTokens,
    JobNotFinished,
    JournalError,
    KioskError,
    RateLimited,
    ReservationNotHeld,
    TooManyActiveReservations,
    Unauthorized,
    Unreachable,
)
from ._http import RetryPolicy
from ._journal import JournalEntry
from ._kiosk import RESUME_TIMEOUT_SECONDS, Heartbeat, Kiosk, Outcome, __version__
from ._models import (
    EVENT_TYPES,
    Balance,
    Event,
    Grant,
    Job,
    JobReservation,
    LedgerEntry,
    Reservation,
    TopupFiring,
    TopupRule,
    TopupState,
)
from ._webhooks import WEBHOOK_TOLERANCE_SECONDS, WebhookVerificationError, verify_webhook

__all__ = [
    "EVENT_TYPES",
    "AccountSuspended",
    "ApiError",
    "Balance",
    "Event",
    "Grant",
    "Heartbeat",
    "IdempotencyKeyReused",
    "InsufficientTokens",
    "Job",
    "JobNotFinished",
    "JobReservation",
    "JournalEntry",
    "JournalError",
    "Kiosk",
    "KioskError",
    "LedgerEntry",
    "Outcome",
    "RESUME_TIMEOUT_SECONDS",
    "RateLimited",
    "Reservation",
    "ReservationNotHeld",
    "RetryPolicy",
    "TooManyActiveReservations",
    "TopupFiring",
    "TopupRule",
    "TopupState",
    "Unauthorized",
    "Unreachable",
    "WEBHOOK_TOLERANCE_SECONDS",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
