"""HTTP with safe retries.

Retried, with exponential backoff and full jitter, until the call's deadline:
connection errors, timeouts, cut connections and garbled answers (every
``httpx.RequestError``, a local protocol error included),
429 ``rate_limited`` and 503 (waiting at least ``Retry-After``), 502 and 504
(a proxy's), and up to ``RetryPolicy.server_errors`` 500s. Every retry is
logged at WARNING. Every other error answer is a refusal, raised at once as
its typed exception. Only requests that are safe to repeat come here: reads,
and writes made idempotent by a journaled ``request_id`` or by the
reservation's state.

A 401 or 403 is answered before the service looks the ``request_id`` up, so
after an attempt that may have reached the service (a transport error once
the connection was open, or a 5xx answer) it does not prove that nothing
happened: a journaled request then stays pending (``pending_on_give_up``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import httpx

from ._errors import ApiError, Unreachable, error_from_problem

log = logging.getLogger("token_billing_kiosk")

RETRIED_STATUSES = (429, 502, 503, 504)

#: Refusals answered before the service looks a ``request_id`` up (the key is
#: checked first): a replay of a request that did land can get them too.
BEFORE_REPLAY_STATUSES = (401, 403)

#: Transport errors raised before any byte of the request was sent.
NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """How retries are spaced. The deadline of each call bounds them all."""

    base_delay_seconds: float = 0.2
    max_delay_seconds: float = 5.0
    server_errors: int = 3

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base·2^attempt)]."""
        ceiling = min(self.max_delay_seconds, self.base_delay_seconds * (2 ** min(attempt, 20)))
        return rng.uniform(0.0, ceiling)


#: How a key is shown anywhere it could be printed or serialised: never the key.
REDACTED_KEY = "tbk_…[redacted]"


class Http:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        request_timeout_seconds: float,
        retry: RetryPolicy,
        client: Optional[httpx.Client] = None,
        user_agent: str,
    ) -> None:
        self.retry = retry
        self.request_timeout_seconds = request_timeout_seconds
        self._rng = random.Random()
        self._stopped = threading.Event()
        self._client = client or httpx.Client()
        self._base_url = base_url.rstrip("/")
        # The key lives only in this header mapping: never logged, never
        # journaled, not in any repr.
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": user_agent,
        }

    def __repr__(self) -> str:
        return f"Http(base_url={self._base_url!r}, api_key={REDACTED_KEY!r})"

    def __getstate__(self) -> Dict[str, Any]:
        """What pickle and copy take: the key redacted (a copy cannot
        authenticate; make a new client with the key instead)."""
        state = dict(self.__dict__)
        state["_headers"] = {**self._headers, "Authorization": f"Bearer {REDACTED_KEY}"}
        return state

    def stop(self) -> None:
        """Calls give up at their next retry instead of waiting (the kiosk
        is closing)."""
        self._stopped.set()

    def close(self) -> None:
        self._client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        deadline: float,
        body: Optional[Mapping[str, Any]] = None,
        params: Optional[Mapping[str, Any]] = None,
        read_timeout_seconds: Optional[float] = None,
        request_id: Optional[str] = None,
        pending_on_give_up: bool = False,
        may_have_landed: bool = False,
    ) -> Tuple[int, Dict[str, Any]]:
        """``(status, JSON body)`` of the first 2xx answer; a refusal raises
        its typed exception (``pending=False``); giving up at the deadline
        raises ``Unreachable`` or the last retryable error (500 included), with
        ``pending=pending_on_give_up``. So does a 401 or 403 once an attempt
        (of this call or, with ``may_have_landed``, an earlier one) may have
        reached the service."""
        attempt = 0
        server_errors = 0
        read_timeout = read_timeout_seconds or self.request_timeout_seconds
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            timeout = httpx.Timeout(
                max(0.5, min(self.request_timeout_seconds, remaining)),
                read=max(0.5, min(read_timeout, remaining + 1.0)),
            )
            started = time.monotonic()
            try:
                response = self._client.request(
                    method,
                    self._base_url + path,
                    json=body,
                    params=params,
                    headers=self._headers,
                    timeout=timeout,
                )
            except httpx.RequestError as error:
                failure: Any = error
                reason = type(error).__name__
                retry_after: Optional[float] = None
                if not isinstance(error, NOT_SENT_ERRORS):
                    may_have_landed = True
            else:
                elapsed = time.monotonic() - started
                status = response.status_code
                data = _json(response)
                log.info(
                    "%s %s -> %d in %.2fs (attempt %d, request_id %s)",
                    method, path, status, elapsed, attempt, request_id,
                )
                if 200 <= status < 300:
                    return status, data
                reason = str(status)
                retry_after = _retry_after(response)
                retryable = status in RETRIED_STATUSES and not (
                    status == 429 and data.get("code") != "rate_limited"
                )
                failure = error_from_problem(
                    status, data, request_id=request_id, retry_after=retry_after
                )
                if status == 500:
                    # A bug or a broken dependency: a few retries, then give
                    # up, leaving a journaled request pending (a 500 does not
                    # prove that nothing happened).
                    server_errors += 1
                    if server_errors > self.retry.server_errors:
                        raise _give_up(failure, method, path, request_id, pending_on_give_up)
                elif not retryable:
                    if may_have_landed and status in BEFORE_REPLAY_STATUSES:
                        failure.pending = pending_on_give_up
                    raise failure
                if status >= 500:
                    may_have_landed = True
            delay = self.retry.backoff(attempt - 1, self._rng)
            if retry_after is not None:
                delay = retry_after + delay / 4
            if time.monotonic() + delay >= deadline:
                raise _give_up(failure, method, path, request_id, pending_on_give_up)
            log.warning(
                "%s %s: %s, retrying in %.2fs (attempt %d, request_id %s)",
                method, path, reason, delay, attempt, request_id,
            )
            if self._stopped.wait(delay):
                raise _give_up(failure, method, path, request_id, pending_on_give_up)


def _give_up(
    failure: Any, method: str, path: str, request_id: Optional[str], pending: bool
) -> Exception:
    if isinstance(failure, ApiError):
        failure.pending = pending
        return failure
    error = Unreachable(
        f"{method} {path}: no answer before the deadline ({type(failure).__name__})",
        request_id=request_id,
        pending=pending,
    )
    error.__cause__ = failure
    return error


def _json(response: httpx.Response) -> Dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _retry_after(response: httpx.Response) -> Optional[float]:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
