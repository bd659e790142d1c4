"""Kiosk.watch: the account's event feed as a long poll. A top-up reaches a
watching booth within a second or two, nothing from before the watch is
replayed unless asked, several types are filtered, a kiosk key never sees
another account's events, and closing the kiosk ends the watch quietly."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, List, Tuple

from token_billing_kiosk import Event, Kiosk

from conftest import Account, Admin


def watcher(kiosk: Kiosk, **options: Any) -> "queue.Queue[Event]":
    """Starts watching now (where the feed ends is read before this
    returns), and queues what comes, in a thread."""
    events: "queue.Queue[Event]" = queue.Queue()
    feed = kiosk.watch(**options)

    def run() -> None:
        for event in feed:
            events.put(event)
        ended.append(True)

    ended: List[bool] = []
    thread = threading.Thread(target=run, daemon=True)
    threading_watchers.append((thread, ended))
    thread.start()
    return events


threading_watchers: List[Tuple[threading.Thread, List[bool]]] = []


def visible(admin: Admin, account_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        page = admin.http.get("/v1/events", params={"account_id": account_id}).json()
        if page["events"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"no event of {account_id} in the feed after 10 s")


def next_event(events: "queue.Queue[Event]", seconds: float) -> Event:
    return events.get(timeout=seconds)


def test_a_top_up_reaches_a_watching_booth_at_once(
    admin: Admin, new_kiosk: Callable[..., Kiosk]
) -> None:
    account = admin.account(credit=3)
    other = admin.account(credit=1)
    kiosk = new_kiosk(account)
    # The feed shows an event once no earlier transaction can still commit:
    # wait until the first credit is in it, so that "from now on" is after it.
    visible(admin, account.account_id)
    events = watcher(kiosk, types=["credit.created"])
    # The watch starts at the end of the feed: the first credit is history.
    admin.credit(other.account_id, 7)
    started = time.monotonic()
    admin.credit(account.account_id, 5)
    event = next_event(events, 10)
    took = time.monotonic() - started
    assert event.type == "credit.created"
    assert event.data["account_id"] == account.account_id
    assert event.data["credit"]["amount"] == 5, event.data
    assert took < 5, f"the top-up took {took:.2f}s to reach the booth"
    assert events.empty(), "another account's credit or an old one reached the booth"


def test_from_start_several_types_and_resuming_after_an_event(
    admin: Admin, new_kiosk: Callable[..., Kiosk]
) -> None:
    account = admin.account(credit=2)
    kiosk = new_kiosk(account)
    job = kiosk.generate("standard", {"prompt": "a test"}, timeout=60)
    assert job.succeeded
    events = watcher(kiosk, types={"credit.created", "job.succeeded"}, from_start=True)
    seen: List[Event] = [next_event(events, 10), next_event(events, 10)]
    assert [event.type for event in seen] == ["credit.created", "job.succeeded"], seen
    # From the first event on: only the second comes again.
    again = watcher(kiosk, types={"credit.created", "job.succeeded"}, after=seen[0].id)
    assert next_event(again, 10).id == seen[1].id


def test_closing_the_kiosk_ends_its_watch_quietly(
    admin: Admin, new_kiosk: Callable[..., Kiosk]
) -> None:
    account = admin.account(credit=1)
    kiosk = new_kiosk(account)
    before = len(threading_watchers)
    watcher(kiosk, wait_seconds=2)
    thread, ended = threading_watchers[before]
    kiosk.close()
    # The poll in flight holds the thread up to wait_seconds at most.
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert ended == [True], "the watch raised instead of ending"
