"""The kiosk: journaled, retried calls to the token-billing service."""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Type,
    TypeVar,
    Union,
)

import httpx

from ._errors import (
    ApiError,
    JobNotFinished,
    KioskError,
    ReservationNotHeld,
    Unreachable,
)
from ._http import REDACTED_KEY, Http, RetryPolicy
from ._journal import Journal, JournalEntry
from ._models import (
    Balance,
    Event,
    Grant,
    Job,
    LedgerEntry,
    Reservation,
    TopupRule,
    TopupState,
)

log = logging.getLogger("token_billing_kiosk")

__version__ = "0.1.0"

#: The service waits at most this long in one long poll (``wait_seconds``).
LONG_POLL_MAX_SECONDS = 30

#: The longest page of the event feed.
EVENT_PAGE_MAX = 1000

#: How long :meth:`Kiosk.resume` tries, for the whole journal, by default.
RESUME_TIMEOUT_SECONDS = 3.0

#: Each background attempt at a request resume() left pending gives up after this.
BACKGROUND_ATTEMPT_SECONDS = 10.0

ReservationRef = Union[str, Reservation]

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Kiosk.resume` made of one open journal entry.

    ``job`` for a job (terminal, unless ``error`` is a
    :class:`JobNotFinished`), ``reservation`` for a reservation request (a
    ``held`` one is still yours to commit or release), ``error`` when it was
    refused (``error.pending`` false) or is still without an answer
    (``error.pending`` true: a later ``resume()`` tries again).
    """

    entry: JournalEntry
    job: Optional[Job] = None
    reservation: Optional[Reservation] = None
    error: Optional[KioskError] = None

    @property
    def request_id(self) -> str:
        return self.entry.request_id

    @property
    def operation(self) -> str:
        return self.entry.operation


class Kiosk:
    """A kiosk bound to one account.

    ``journal`` is the path of the kiosk's SQLite journal (created when
    missing; one process at a time). ``timeout`` is the default deadline, in
    seconds, of each call including its retries and waits.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        account_id: str,
        journal: "Union[str, os.PathLike[str]]",
        *,
        timeout: float = 120.0,
        request_timeout: float = 15.0,
        retry: RetryPolicy = RetryPolicy(),
        http_client: Optional[httpx.Client] = None,
        keep_finished_days: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.account_id = str(uuid.UUID(str(account_id)))
        self.timeout = timeout
        self._closed = False
        self._stop = threading.Event()
        self._rng = random.Random()
        self._background_lock = threading.Lock()
        self._background: Optional[threading.Thread] = None
        self._settled: List[Outcome] = []
        self._journal = Journal(journal)
        self._http = Http(
            self.base_url,
            api_key,
            request_timeout_seconds=request_timeout,
            retry=retry,
            client=http_client,
            user_agent=f"token-billing-kiosk/{__version__}",
        )
        pruned = self._journal.prune(keep_finished_days * 86400.0)
        if pruned:
            log.debug("journal: forgot %d finished entries", pruned)

    def __repr__(self) -> str:
        return (
            f"Kiosk(base_url={self.base_url!r}, account_id={self.account_id!r}, "
            f"api_key={REDACTED_KEY!r}, journal={self._journal.path!r})"
        )

    def __getstate__(self) -> Dict[str, Any]:
        """What pickle and copy take: the key redacted (the Http's state
        is its redacted state)."""
        return {**self.__dict__, "_http": self._http.__getstate__()}

    def close(self) -> None:
        """Stops the background settling of :meth:`resume` (at its next
        retry: an HTTP request in flight ends first), then closes the HTTP
        client and the journal."""
        self._closed = True
        self._stop.set()
        self._http.stop()
        with self._background_lock:
            background = self._background
        if background is not None and background is not threading.current_thread():
            background.join(BACKGROUND_ATTEMPT_SECONDS + 5.0)
        self._http.close()
        self._journal.close()

    def __enter__(self) -> "Kiosk":
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    # -- reads -------------------------------------------------------------

    def balance(self, *, timeout: Optional[float] = None) -> Balance:
        """The account's balances (``available``, ``reserved``, ``used``)."""
        _, data = self._http.call(
            "GET", f"/v1/accounts/{self.account_id}", deadline=self._deadline(timeout)
        )
        return Balance.from_json(data)

    def job(self, request_id: str, *, timeout: Optional[float] = None) -> Job:
        """A job as it is now."""
        _, data = self._http.call(
            "GET", self._job_path(request_id), deadline=self._deadline(timeout)
        )
        return Job.from_json(data)

    def topup_rules(self, *, timeout: Optional[float] = None) -> List[TopupRule]:
        """The account's top-up rules (``GET …/topup-rules``, at most 20),
        oldest first, each with its ``status``, ``unconsumed_tokens`` and
        ``last_firing``."""
        _, data = self._http.call(
            "GET",
            f"/v1/accounts/{self.account_id}/topup-rules",
            deadline=self._deadline(timeout),
        )
        return [TopupRule.from_json(rule) for rule in data.get("rules") or []]

    def topup_state(self, *, timeout: Optional[float] = None) -> TopupState:
        """What a sold-out booth asks on :class:`InsufficientTokens`: is a
        top-up on its way (``open_request``: the rule whose request waits for
        the customer; ``armed``), or stopped by a cap (``capped``)."""
        return TopupState(tuple(self.topup_rules(timeout=timeout)))

    def pending(self) -> List[JournalEntry]:
        """Journaled requests of this account without a final answer yet:
        ``pending`` (may or may not have reached the service), ``accepted``
        (a job not finished yet), ``held`` (a reservation not yet committed or
        released), oldest first."""
        return self._journal.open_entries(self.account_id)

    def history(self, limit: int = 100) -> List[JournalEntry]:
        """The journal's entries of this account, newest first."""
        return self._journal.entries(self.account_id, limit)

    # -- lists, every page ---------------------------------------------------

    def ledger(
        self,
        *,
        since: Optional[datetime] = None,
        after: Optional[int] = None,
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[LedgerEntry]:
        """Every ledger entry of the account, oldest first (``GET …/ledger``),
        page after page: ``for entry in kiosk.ledger(): ...``. ``since`` (an
        aware ``datetime``): only entries written at or after it; ``after``:
        only entries after that ``entry_id``. Each page is one request,
        retried like every read within ``timeout`` (the kiosk's default), and
        waits as ``Retry-After`` says when the key is over its rate limit;
        the next page is asked only when the loop reaches it."""
        params: Dict[str, Any] = {}
        if since is not None:
            if since.tzinfo is None:
                raise ValueError("since must be an aware datetime")
            params["since"] = since.isoformat()
        return self._pages(
            "ledger", "entries", LedgerEntry.from_json, params, after, page_size, timeout
        )

    def reservations(
        self,
        state: Optional[str] = None,
        *,
        after: Optional[str] = None,
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[Reservation]:
        """Every reservation of the account, newest first (``GET
        …/reservations``), page after page; ``state``: only ``held``,
        ``committed``, ``released`` or ``expired`` ones. As :meth:`ledger`."""
        params = {} if state is None else {"state": state}
        return self._pages(
            "reservations",
            "reservations",
            Reservation.from_json,
            params,
            after,
            page_size,
            timeout,
        )

    def jobs(
        self,
        status: Optional[str] = None,
        *,
        after: Optional[str] = None,
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[Job]:
        """Every generation job of the account, newest first (``GET
        …/jobs``), page after page; ``status``: only ``queued``, ``running``,
        ``succeeded`` or ``failed`` ones. As :meth:`ledger`."""
        params = {} if status is None else {"status": status}
        return self._pages("jobs", "jobs", Job.from_json, params, after, page_size, timeout)

    def grants(
        self,
        status: Optional[str] = None,
        *,
        after: Optional[str] = None,
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[Grant]:
        """Every credit grant of the account, in creation order (``GET
        …/grants``), page after page; ``status``: only ``active``,
        ``depleted`` or ``expired`` ones. As :meth:`ledger`. (The top-up
        rules, at most 20, come in one answer: :meth:`topup_rules`.)"""
        params = {} if status is None else {"status": status}
        return self._pages("grants", "grants", Grant.from_json, params, after, page_size, timeout)

    def _pages(
        self,
        resource: str,
        member: str,
        read: Callable[[Mapping[str, Any]], T],
        params: Dict[str, Any],
        after: Optional[Any],
        page_size: Optional[int],
        timeout: Optional[float],
    ) -> Iterator[T]:
        """The items of a cursor-paged list (docs/api.md: pass ``next_after``
        back as ``after``; ``null`` on the last page), one page at a time."""
        path = f"/v1/accounts/{self.account_id}/{resource}"
        cursor = None if after is None else str(after)
        while True:
            query = dict(params)
            if page_size is not None:
                query["limit"] = page_size
            if cursor is not None:
                query["after"] = cursor
            _, page = self._http.call("GET", path, params=query, deadline=self._deadline(timeout))
            for raw in page.get(member) or []:
                yield read(raw)
            next_after = page.get("next_after")
            if next_after is None:
                return
            if str(next_after) == cursor:
                # A cursor that does not move would page for ever.
                raise KioskError(f"GET {path}: the service gave the cursor {cursor} again")
            cursor = str(next_after)

    # -- the event feed ----------------------------------------------------

    def watch(
        self,
        types: Optional[Collection[str]] = None,
        *,
        after: Optional[str] = None,
        since: Optional[datetime] = None,
        from_start: bool = False,
        wait_seconds: int = LONG_POLL_MAX_SECONDS,
        timeout: Optional[float] = None,
    ) -> Iterator[Event]:
        """The account's events as they commit, oldest first, for ever: a
        long poll (``wait_seconds``) that holds no connection on the service
        while nothing happens, so a top-up (``credit.created``) reaches the
        booth within a second instead of at the next guest's press.

        ``types`` keeps only those event types (all when ``None``). The feed
        starts after the event ``after``; or after the last event created
        before ``since`` (an aware ``datetime``); without either, at the end
        of the feed (only what commits from now on: one request, the
        service's ``start=now``, whatever the account's history), or at its
        start with ``from_start``. Each poll is retried like every read within
        ``timeout`` (the kiosk's default); past it :class:`Unreachable` (or
        the typed refusal) is raised and the iterator ends: call ``watch``
        again with ``after`` = the last event's ``id`` to go on without a
        gap. "From now on" is decided when ``watch`` is called (it reads the
        end of the feed then), not at the first ``next()``; the feed shows an
        event only once no earlier transaction can still commit, so events
        committed just before the call may still come. Run it in a
        thread of its own (the :class:`Kiosk` may be shared between
        threads); ``close()`` of the kiosk ends it quietly.
        """
        wanted = None if types is None else frozenset(types)
        if sum((after is not None, since is not None, from_start)) > 1:
            raise ValueError("give at most one of after, since and from_start")
        cursor = after
        start: Optional[str] = None
        if since is not None:
            if since.tzinfo is None:
                raise ValueError("since must be an aware datetime")
            start = since.isoformat()
        elif cursor is None and not from_start:
            cursor = self._end_of_feed(timeout)
        wait = max(0, min(LONG_POLL_MAX_SECONDS, int(wait_seconds)))
        return self._watch(wanted, cursor, start, wait, timeout)

    def _watch(
        self,
        wanted: "Optional[frozenset[str]]",
        cursor: Optional[str],
        start: Optional[str],
        wait: int,
        timeout: Optional[float],
    ) -> Iterator[Event]:
        # One type is filtered by the service; several, here.
        only = next(iter(wanted)) if wanted is not None and len(wanted) == 1 else None
        while not self._closed:
            try:
                # `start` until the feed gives a cursor.
                page = self._events(cursor, start if cursor is None else None, only, wait, timeout)
            except Exception:
                if self._closed:  # closed while the poll was in flight
                    return
                raise
            for raw in page.get("events") or []:
                event = Event.from_json(raw)
                cursor = event.id
                if wanted is None or event.type in wanted:
                    yield event
            next_after = page.get("next_after")
            if next_after is not None:
                cursor = str(next_after)

    def _events(
        self,
        after: Optional[str],
        start: Optional[str],
        only: Optional[str],
        wait: int,
        timeout: Optional[float],
    ) -> Dict[str, Any]:
        params: Dict[str, Any] = {"account_id": self.account_id, "wait_seconds": wait}
        if after is not None:
            params["after"] = after
        elif start is not None:
            params["start"] = start
        if only is not None:
            params["type"] = only
        _, data = self._http.call(
            "GET",
            "/v1/events",
            params=params,
            deadline=self._deadline(timeout),
            read_timeout_seconds=wait + self._http.request_timeout_seconds,
        )
        return data

    def _end_of_feed(self, timeout: Optional[float]) -> Optional[str]:
        """The id of the account's latest listed event (``None``: no event
        yet), from the service's ``start=now``: one request, no history."""
        _, page = self._http.call(
            "GET",
            "/v1/events",
            params={"account_id": self.account_id, "start": "now", "limit": 1},
            deadline=self._deadline(timeout),
        )
        next_after = page.get("next_after")
        return None if next_after is None else str(next_after)

    # -- jobs --------------------------------------------------------------

    def generate(
        self,
        kind: str,
        params: Mapping[str, Any],
        *,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
    ) -> Job:
        """Creates a generation job and waits for it to finish.

        The ``request_id`` (a new UUID unless given) is journaled before the
        first send and reused by every retry, so the job is created and
        charged once whatever happens to the network or to this process.
        Returns the terminal job (``succeeded`` or ``failed``: a failed job's
        tokens are released). Raises a typed :class:`ApiError` when refused,
        :class:`JobNotFinished` or :class:`Unreachable` (``pending=True``)
        when the deadline passes first.
        """
        deadline = self._deadline(timeout)
        return self._wait(self._submit(kind, params, request_id, deadline), deadline)

    def submit(
        self,
        kind: str,
        params: Mapping[str, Any],
        *,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
    ) -> Job:
        """Creates a generation job (journaled like :meth:`generate`) and
        returns it without waiting for it to finish."""
        return self._submit(kind, params, request_id, self._deadline(timeout))

    def _submit(
        self,
        kind: str,
        params: Mapping[str, Any],
        request_id: Optional[str],
        deadline: float,
    ) -> Job:
        request_id = str(uuid.UUID(request_id)) if request_id else str(uuid.uuid4())
        body = {"request_id": request_id, "kind": kind, "params": dict(params)}
        entry = self._journal.begin(request_id, "job", self.account_id, body)
        log.debug("journaled job %s", request_id)
        if entry.state in ("accepted", "done") and entry.answer is not None:
            return Job.from_json(entry.answer)
        return self._create_job(entry, deadline)

    def wait(self, request_id: str, *, timeout: Optional[float] = None) -> Job:
        """Long-polls a job until it is terminal (journaled jobs are marked
        done when it is)."""
        deadline = self._deadline(timeout)
        return self._wait(self.job(request_id, timeout=timeout), deadline)

    def _post_journaled(
        self, entry: JournalEntry, path: str, deadline: float, resumed: bool = False
    ) -> Any:
        """POSTs a journaled request and returns the answer's body. A refusal
        is recorded in the journal before it is raised; a give-up that may
        still have landed (``pending``) is not: recovery asks again. Neither
        is a 401 or 403 after an attempt that may have landed (``resumed``: an
        earlier process may have sent it): the key is checked before the
        ``request_id``, so the request may exist and be charged."""
        try:
            _, data = self._http.call(
                "POST",
                path,
                body=entry.body,
                deadline=deadline,
                request_id=entry.request_id,
                pending_on_give_up=True,
                may_have_landed=resumed,
            )
        except ApiError as error:
            if not error.pending:
                self._journal.record(entry.request_id, "refused", error.problem)
            raise
        return data

    def _create_job(self, entry: JournalEntry, deadline: float, resumed: bool = False) -> Job:
        data = self._post_journaled(
            entry, f"/v1/accounts/{self.account_id}/jobs", deadline, resumed
        )
        job = Job.from_json(data)
        self._journal.record(entry.request_id, "done" if job.terminal else "accepted", data)
        return job

    def _wait(self, job: Job, deadline: float) -> Job:
        while not job.terminal:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JobNotFinished(
                    f"job {job.request_id} is still {job.status}; resume() finishes it",
                    request_id=job.request_id,
                    job=job,
                )
            wait = max(1, min(LONG_POLL_MAX_SECONDS, math.ceil(remaining)))
            log.debug("waiting up to %ds for job %s", wait, job.request_id)
            _, data = self._http.call(
                "GET",
                self._job_path(job.request_id),
                params={"wait_seconds": wait},
                deadline=deadline,
                read_timeout_seconds=wait + self._http.request_timeout_seconds,
                request_id=job.request_id,
                pending_on_give_up=True,
            )
            job = Job.from_json(data)
            if job.terminal:
                log.info("job %s %s", job.request_id, job.status)
                self._journal.record(job.request_id, "done", data)
        return job

    # -- reservations (kiosks that run their own provider) ----------------

    def reserve(
        self,
        amount: int,
        *,
        ttl_seconds: Optional[int] = None,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
    ) -> Reservation:
        """Reserves ``amount`` tokens (journaled like :meth:`generate`).
        Commit or release the reservation when the work is done; until then
        it is listed by :meth:`pending` and returned by :meth:`resume`."""
        request_id = str(uuid.UUID(request_id)) if request_id else str(uuid.uuid4())
        body: Dict[str, Any] = {"request_id": request_id, "amount": amount}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        entry = self._journal.begin(request_id, "reserve", self.account_id, body)
        log.debug("journaled reserve %s", request_id)
        if entry.state in ("held", "done") and entry.answer is not None:
            return Reservation.from_json(entry.answer)
        return self._send_reserve(entry, self._deadline(timeout))

    def commit(
        self,
        reservation: ReservationRef,
        amount: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> Reservation:
        """Spends ``amount`` (default: all held); the rest goes back."""
        body: Dict[str, Any] = {} if amount is None else {"amount": amount}
        return self._resolve("commit", _reservation_id(reservation), body, timeout)

    def release(
        self, reservation: ReservationRef, *, timeout: Optional[float] = None
    ) -> Reservation:
        """Gives every held token back to available."""
        return self._resolve("release", _reservation_id(reservation), {}, timeout)

    def extend(
        self,
        reservation: ReservationRef,
        ttl_seconds: int,
        *,
        timeout: Optional[float] = None,
    ) -> Reservation:
        """The reservation now expires ``ttl_seconds`` from now."""
        return self._resolve(
            "extend", _reservation_id(reservation), {"ttl_seconds": ttl_seconds}, timeout
        )

    def heartbeat(
        self,
        reservation: ReservationRef,
        ttl_seconds: int,
        *,
        every: Optional[float] = None,
    ) -> "Heartbeat":
        """A context manager that extends the reservation every ``every``
        seconds (default ``ttl_seconds / 3``) while a long local operation
        runs, so that it does not expire under it."""
        return Heartbeat(self, _reservation_id(reservation), ttl_seconds, every)

    def _send_reserve(
        self, entry: JournalEntry, deadline: float, resumed: bool = False
    ) -> Reservation:
        data = self._post_journaled(
            entry, f"/v1/accounts/{self.account_id}/reservations", deadline, resumed
        )
        reservation = Reservation.from_json(data)
        self._journal.record(
            entry.request_id,
            "held" if reservation.held else "done",
            data,
            reservation_id=reservation.reservation_id,
        )
        return reservation

    def _resolve(
        self,
        operation: str,
        reservation_id: str,
        body: Dict[str, Any],
        timeout: Optional[float],
    ) -> Reservation:
        request_id = str(uuid.uuid4())
        entry = self._journal.begin(
            request_id, operation, self.account_id, body, reservation_id=reservation_id
        )
        log.debug("journaled %s %s of reservation %s", operation, request_id, reservation_id)
        return self._send_resolution(entry, self._deadline(timeout))

    def _send_resolution(
        self, entry: JournalEntry, deadline: float, resumed: bool = False
    ) -> Reservation:
        reservation_id = entry.reservation_id or ""
        path = f"/v1/accounts/{self.account_id}/reservations/{reservation_id}/{entry.operation}"
        try:
            data = self._post_journaled(entry, path, deadline, resumed)
        except ReservationNotHeld as error:
            if not error.pending:
                self._journal.resolve_reservation(reservation_id)
            raise
        reservation = Reservation.from_json(data)
        self._journal.record(entry.request_id, "done", data)
        if not reservation.held:
            self._journal.resolve_reservation(reservation_id)
        return reservation

    # -- recovery ------------------------------------------------------------

    def resume(
        self,
        *,
        timeout: Optional[float] = None,
        on_settled: Optional[Callable[[Outcome], None]] = None,
    ) -> List[Outcome]:
        """Finishes every open request of the journal, oldest first, with its
        own ``request_id``: sends again what may not have arrived (the
        service answers a replay as it answered the first), waits for
        accepted jobs, and re-reads held reservations. Call it when the kiosk
        starts, before the first guest. Never raises for one request: its
        ``Outcome.error`` says.

        ``timeout`` (default :data:`RESUME_TIMEOUT_SECONDS`, 3 s) is **one
        deadline for the whole journal**, so a booth that starts without
        network serves its first guest within seconds. The requests it
        could not settle by then (``error.pending`` true; those not tried
        before the deadline are :class:`Unreachable`) stay in the journal
        and are settled in a background thread, one at a time, each with
        its own ``request_id`` (so never charged twice), until each is
        answered or the kiosk is closed; :meth:`settled` waits for them and
        ``on_settled`` is called once for each (in that thread).

        Commits, releases and extensions come first, so that a reservation
        returned ``held`` is really still held: yours to commit (if the work
        it paid for is done) or release."""
        deadline = time.monotonic() + (RESUME_TIMEOUT_SECONDS if timeout is None else timeout)
        outcomes = [
            self._resume_or_outcome(entry, deadline, tried_late=False)
            for entry in self._open_in_resume_order()
        ]
        left = [o.request_id for o in outcomes if o.error is not None and o.error.pending]
        with self._background_lock:
            running = self._background is not None and self._background.is_alive()
            if left and not running and not self._closed:
                self._settled = []
                self._background = threading.Thread(
                    target=self._settle_in_background,
                    args=(left, on_settled),
                    name="token-billing-resume",
                    daemon=True,
                )
                self._background.start()
        return outcomes

    def settled(self, timeout: Optional[float] = None) -> List[Outcome]:
        """Waits (at most ``timeout`` seconds; ``None``: as long as it takes)
        for the background settling that :meth:`resume` started, and returns
        the outcomes it settled so far, in order (``[]`` when nothing was
        left)."""
        with self._background_lock:
            background = self._background
        if background is not None:
            background.join(timeout)
        with self._background_lock:
            return list(self._settled)

    def _open_in_resume_order(self) -> List[JournalEntry]:
        entries = self._journal.open_entries(self.account_id)
        # Commits, releases and extensions first: a held reservation is read
        # again only after the resolution that was on its way, so it is not
        # handed back as held when it was in fact committed.
        entries.sort(key=lambda entry: entry.operation not in ("commit", "release", "extend"))
        return entries

    def _resume_or_outcome(self, entry: JournalEntry, deadline: float, tried_late: bool) -> Outcome:
        if not tried_late and time.monotonic() >= deadline:
            # The deadline passed on an earlier entry: this one waits for
            # the background, untried (no answer is not a refusal).
            return Outcome(
                entry,
                error=Unreachable(
                    f"{entry.operation} {entry.request_id}: not tried before resume()'s deadline",
                    request_id=entry.request_id,
                    pending=True,
                ),
            )
        log.info("resuming %s %s (%s)", entry.operation, entry.request_id, entry.state)
        try:
            return self._resume_one(entry, deadline)
        except KioskError as error:
            if isinstance(error, ReservationNotHeld) and entry.operation == "extend":
                return Outcome(entry)
            return Outcome(entry, job=getattr(error, "job", None), error=error)

    def _settle_in_background(
        self, request_ids: List[str], on_settled: Optional[Callable[[Outcome], None]]
    ) -> None:
        """One request at a time, each until it is answered (or the kiosk
        closes); the retries of one attempt are spaced by the retry policy."""
        attempt = 0
        for request_id in request_ids:
            while not self._closed:
                entry = next(
                    (e for e in self._journal.open_entries(self.account_id)
                     if e.request_id == request_id),
                    None,
                )
                if entry is None:  # settled meanwhile (a resume() or the guest's own call)
                    break
                try:
                    outcome = self._resume_or_outcome(
                        entry, time.monotonic() + BACKGROUND_ATTEMPT_SECONDS, tried_late=True
                    )
                except Exception:  # the journal closed under it
                    if self._closed:
                        return
                    raise
                if outcome.error is None or not outcome.error.pending:
                    with self._background_lock:
                        self._settled.append(outcome)
                    log.info("settled %s %s in the background", entry.operation, request_id)
                    if on_settled is not None:
                        on_settled(outcome)
                    break
                if self._closed:
                    return
                attempt += 1
                self._stop.wait(self._http.retry.backoff(attempt, self._rng))

    def _resume_one(self, entry: JournalEntry, deadline: float) -> Outcome:
        if entry.operation == "job":
            if entry.state == "accepted" and entry.answer is not None:
                job = Job.from_json(entry.answer)
            else:
                job = self._create_job(entry, deadline, resumed=True)
            return Outcome(entry, job=self._wait(job, deadline))
        if entry.operation == "reserve":
            if entry.state == "held" and entry.reservation_id is not None:
                _, data = self._http.call(
                    "GET",
                    f"/v1/accounts/{self.account_id}/reservations/{entry.reservation_id}",
                    deadline=deadline,
                    request_id=entry.request_id,
                    pending_on_give_up=True,
                )
                reservation = Reservation.from_json(data)
                if not reservation.held:
                    self._journal.record(entry.request_id, "done", data)
                return Outcome(entry, reservation=reservation)
            return Outcome(entry, reservation=self._send_reserve(entry, deadline, resumed=True))
        return Outcome(entry, reservation=self._send_resolution(entry, deadline, resumed=True))

    # -- helpers -------------------------------------------------------------

    def _deadline(self, timeout: Optional[float]) -> float:
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _job_path(self, request_id: str) -> str:
        return f"/v1/accounts/{self.account_id}/jobs/{uuid.UUID(request_id)}"


def _reservation_id(reservation: ReservationRef) -> str:
    if isinstance(reservation, Reservation):
        return reservation.reservation_id
    return str(uuid.UUID(reservation))


class Heartbeat:
    """Extends a reservation in a background thread until the ``with``
    block ends. ``error`` is the refusal that stopped it early (the
    reservation is no longer held), if any; ``beats`` counts extensions."""

    def __init__(
        self, kiosk: Kiosk, reservation_id: str, ttl_seconds: int, every: Optional[float]
    ) -> None:
        self.reservation_id = reservation_id
        self.ttl_seconds = ttl_seconds
        self.every = every if every is not None else max(1.0, ttl_seconds / 3.0)
        self.beats = 0
        self.error: Optional[KioskError] = None
        self._kiosk = kiosk
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{reservation_id}", daemon=True
        )

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                # Up to half the TTL per attempt: a slow answer is still in time.
                timeout = max(self.every, self.ttl_seconds / 2)
                self._kiosk.extend(self.reservation_id, self.ttl_seconds, timeout=timeout)
                self.beats += 1
            except ApiError as error:
                if not error.pending:
                    log.warning("heartbeat of %s stopped: %s", self.reservation_id, error.code)
                    self.error = error
                    return
                log.warning("heartbeat of %s missed: %s", self.reservation_id, error.code)
            except KioskError as error:
                log.warning("heartbeat of %s missed: %s", self.reservation_id, error)
