"""A kiosk process SIGKILLed at seeded points, restarted on the same
journal until it finishes: every guest action it asked for becomes exactly
one job (or reservation), charged once, and the ledger agrees.

Kill points (each run draws up to three, one per life of the process):

- ``before_send``: the request is journaled, the proxy holds its bytes and
  the process dies before they reach the service;
- ``after_send``: the service has the whole request (and, half the time,
  has answered it), the process dies before reading the answer;
- ``during_long_poll``: the process dies while the service holds its
  ``wait_seconds`` poll;
- ``after_finish``: the job finished and the service's answer saying so is
  on its way: the process dies before reading it;
- ``random_instant``: at a random instant of its life (journal writes
  included).

``KILL_RUNS`` (default 24) and ``KILL_SEED`` (default 20261201) set the runs;
``KILL_PARALLEL`` (6) how many run at once.

Then each reservation call on its own: ``KILL_RESERVATION_RUNS`` (default 8)
runs of three actions (``reserve``, ``extend``, then ``commit`` of 1 token or
``release``), the first life of run *k* killed at the *k*-th of the eight
points (before or after the send of each call), the second at another:
each action is one reservation, committed once or released, none left held,
and the ledger agrees.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlparse

from conftest import Account, Admin
from fault_proxy import PASS, Action, FaultProxy, Request

CHILD = Path(__file__).with_name("kiosk_process.py")
PHASES = ("before_send", "after_send", "during_long_poll", "after_finish", "random_instant")
ACTIONS_PER_RUN = 3
RESERVATION_CREDIT = 1_100


@dataclass
class Plan:
    """One life's kill point; ``target`` counts matching requests."""

    phase: str
    target: int
    wait_ms: int
    wait_answer: bool
    seen: int = 0
    fired: bool = False
    #: Only requests of this reservation call count (reserve, extend, commit, release).
    call: Optional[str] = None

    def decide(self, request: Request) -> Action:
        if self.fired:
            return PASS
        if self.call is not None and call_of(request.method, request.path) != self.call:
            return PASS
        if self.phase == "before_send":
            return self._count(Action("kill_before_send"))
        if self.phase == "after_send" and request.method == "POST":
            return self._count(Action("kill_after_send", wait_answer=self.wait_answer))
        if self.phase == "during_long_poll" and "wait_seconds=" in request.path:
            return Action("kill_during_wait", after_ms=self.wait_ms)
        if self.phase == "after_finish" and request.method == "GET":
            return Action("kill_after_answer", answer_matches=self._terminal)
        return PASS

    def _count(self, action: Action) -> Action:
        self.seen += 1
        return action if self.seen - 1 == self.target else PASS

    def _terminal(self, answer: bytes) -> bool:
        if b'"status":"succeeded"' in answer or b'"status":"failed"' in answer:
            self.seen += 1
            return self.seen - 1 == self.target
        return False


RESERVATION_CALLS = ("reserve", "extend", "commit", "release")
RESERVATION_POINTS = [(phase, call) for phase in ("before_send", "after_send")
                      for call in RESERVATION_CALLS]


def call_of(method: str, path: str) -> Optional[str]:
    """The reservation call a request is, by its path; None for others."""
    if method != "POST":
        return None
    path = path.split("?")[0]
    if path.endswith("/reservations"):
        return "reserve"
    last = path.rsplit("/", 1)[-1]
    return last if last in ("extend", "commit", "release") else None


@dataclass
class RunResult:
    seed: int
    workload: str
    lives: int = 0
    kills: Counter = field(default_factory=Counter)
    charges: int = 0
    #: Commits the run's actions call for (a released reservation has none).
    charged: int = 0
    actions: int = 0
    #: What the proxies fired, life by life: (phase, method, path, action).
    fired: List[Tuple[str, str, str, str]] = field(default_factory=list)


def run_once(
    admin: Admin, upstream: Any, seed: int, workdir: Path, workload: str,
    given: Optional[List[Plan]] = None,
) -> RunResult:
    rng = random.Random(seed)
    count = ACTIONS_PER_RUN
    credit = count + 2 if workload == "jobs" else RESERVATION_CREDIT
    account: Account = admin.account(credit=credit)
    journal = workdir / f"run-{seed}.sqlite3"
    delays = [rng.randint(200, 600) for _ in range(count)]
    result = RunResult(seed, workload)
    plans: List[Optional[Plan]] = []
    for _ in range(rng.randint(1, 3)):
        phase = rng.choice(PHASES if workload == "jobs" else
                           ("before_send", "after_send", "random_instant"))
        target = rng.randint(0, 4 if phase == "before_send" else 2)
        plans.append(Plan(phase, target, rng.randint(20, 150), rng.random() < 0.5))
    if given is not None:
        plans = list(given)
    plans.append(None)  # the last life runs to the end
    final: Optional[Dict[str, Any]] = None
    run_started = time.monotonic()
    for plan in plans:
        life_started = time.monotonic()
        child: Optional[subprocess.Popen[str]] = None

        def kill() -> None:
            assert child is not None
            os.kill(child.pid, signal.SIGKILL)

        proxy = FaultProxy(upstream, plan.decide if plan else (lambda _request: PASS), kill)
        timer: Optional[threading.Timer] = None
        try:
            child = subprocess.Popen(
                [sys.executable, str(CHILD), "--url", proxy.url, "--account",
                 account.account_id, "--journal", str(journal), "--count", str(count),
                 "--delays-ms", ",".join(map(str, delays)), "--workload", workload],
                env=dict(os.environ, KIOSK_KEY=account.kiosk_key),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            if plan is not None and plan.phase == "random_instant":
                timer = threading.Timer(rng.uniform(0.05, 1.5), kill)
                timer.start()
            out, err = child.communicate(timeout=120)
        finally:
            if timer is not None:
                timer.cancel()
            proxy.close()
        result.lives += 1
        result.fired += [(plan.phase if plan else "-", method, path, kind)
                         for _, method, path, kind in proxy.fired]
        if os.environ.get("KILL_VERBOSE"):
            print(f"seed {seed} life {result.lives} {plan.phase if plan else '-'} "
                  f"rc {child.returncode} {time.monotonic() - life_started:.2f}s "
                  f"fired {proxy.fired}", flush=True)
        if child.returncode == -signal.SIGKILL:
            label = plan.phase if plan else "unplanned"
            result.kills[label] += 1
            continue
        assert child.returncode == 0, f"seed {seed}: kiosk exited {child.returncode}:\n{err}"
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        final = lines[-1]
        assert final["event"] == "done", lines
        break
    assert final is not None, f"seed {seed}: the last life was killed"
    check_books(admin, account, final["journal"], count, workload, seed)
    result.actions = count
    ledger = admin.ledger(account.account_id)
    result.charges = sum(1 for entry in ledger if entry["kind"] == "commit")
    result.charged = count if workload == "jobs" else sum(1 for a in range(count) if a % 3 != 2)
    return result


def check_books(
    admin: Admin, account: Account, journal: List[Dict[str, Any]], count: int,
    workload: str, seed: int,
) -> None:
    where = f"seed {seed} ({workload})"
    if workload == "jobs":
        entries = [e for e in journal if e["operation"] == "job"]
        actions = sorted(e["body"]["params"]["action"] for e in entries)
        assert actions == list(range(count)), f"{where}: journaled actions {actions}"
        assert all(e["state"] == "done" for e in entries), f"{where}: {entries}"
        assert all(e["answer"]["status"] == "succeeded" for e in entries), where
        admin.wait_for_jobs_terminal(account.account_id)
        jobs = admin.jobs(account.account_id)
        assert sorted(j["request_id"] for j in jobs) == sorted(
            e["request_id"] for e in entries
        ), f"{where}: the service's jobs are not the journal's requests"
        assert all(j["status"] == "succeeded" for j in jobs), f"{where}: {jobs}"
    else:
        entries = [e for e in journal if e["operation"] == "reserve"]
        actions = sorted(e["body"]["amount"] - 1000 for e in entries)
        assert actions == list(range(count)), f"{where}: journaled actions {actions}"
        reservations = admin.reservations(account.account_id)
        assert sorted(r["request_id"] for r in reservations) == sorted(
            e["request_id"] for e in entries
        ), f"{where}: the service's reservations are not the journal's requests"
        # Every third action is released, the others commit 1 token.
        ends = {r["amount"] - 1000: (r["state"], r["committed_amount"]) for r in reservations}
        assert ends == {
            action: ("released", 0) if action % 3 == 2 else ("committed", 1)
            for action in range(count)
        }, f"{where}: {reservations}"
        # An extension of a reservation already ended is refused: nothing to do.
        assert not [
            e for e in journal
            if e["state"] != "done" and not (e["operation"] == "extend" and e["state"] == "refused")
        ], f"{where}: {journal}"
    charged = count if workload == "jobs" else sum(1 for a in range(count) if a % 3 != 2)
    balances = admin.assert_books(account.account_id)
    assert (balances["used"], balances["reserved"]) == (charged, 0), f"{where}: {balances}"
    ledger = admin.ledger(account.account_id)
    kinds = Counter(entry["kind"] for entry in ledger)
    assert kinds["reserve"] == count and kinds["commit"] == charged, f"{where}: {kinds}"
    assert sum(e["amount"] for e in ledger if e["kind"] == "commit") == charged, where
    assert kinds["expire"] == 0, f"{where}: {kinds}"
    if workload == "reservations":
        # Reservation by reservation: reserved once, its commit (1 token or
        # none) and the rest given back once.
        for r in reservations:
            moved = Counter()
            for e in ledger:
                if e["reservation_id"] == r["reservation_id"]:
                    moved[e["kind"]] += e["amount"]
            assert (moved["reserve"], moved["commit"], moved["release"]) == (
                r["amount"], r["committed_amount"], r["amount"] - r["committed_amount"]
            ), f"{where}: ledger of {r['reservation_id']}: {dict(moved)}"


def test_kiosk_killed_at_seeded_points_charges_each_request_once(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    runs = int(os.environ.get("KILL_RUNS", "24"))
    seed = int(os.environ.get("KILL_SEED", "20261201"))
    parallel = int(os.environ.get("KILL_PARALLEL", "6"))
    parsed = urlparse(service_url)
    upstream = (parsed.hostname, parsed.port)
    started = time.monotonic()
    seeds = [seed * 1000 + run for run in range(runs)]
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(
            lambda s: run_once(admin, upstream, s, tmp_path,
                               "reservations" if s % 4 == 3 else "jobs"),
            seeds,
        ))
    kills: Counter = Counter()
    for result in results:
        kills.update(result.kills)
    charges = sum(r.charges for r in results)
    actions = sum(r.actions for r in results)
    # A before_send plan counts every request, long polls included: only a
    # kill before a POST proves that a journaled request that never reached
    # the service is sent again (and once) after the restart.
    before_send_posts = sum(
        1 for r in results for _, method, path, kind in r.fired
        if kind == "kill_before_send" and method == "POST"
    )
    print(
        f"\nkill points: seed {seed}, {runs} runs "
        f"({sum(r.workload == 'jobs' for r in results)} job runs, "
        f"{sum(r.workload == 'reservations' for r in results)} reservation runs), "
        f"{sum(r.lives for r in results)} process lives, {sum(kills.values())} SIGKILLs "
        f"({', '.join(f'{phase} {kills[phase]}' for phase in PHASES)}; "
        f"before_send on a journaled POST {before_send_posts}), "
        f"{actions} guest actions, {charges} charges (commit entries), "
        f"{time.monotonic() - started:.1f}s"
    )
    # Every job is charged once; a reservation action commits once, or is
    # released (every third).
    assert charges == sum(r.charged for r in results), (charges, actions)
    # The seeds must reach every kind of kill point, or the test proves less
    # than it says.
    missing = [phase for phase in PHASES if kills[phase] == 0]
    assert not missing, f"no kill at {missing}: raise KILL_RUNS or change KILL_SEED"
    assert before_send_posts > 0, (
        "no before_send kill on a POST: raise KILL_RUNS or change KILL_SEED"
    )


def test_kiosk_killed_before_and_after_each_reservation_call_settles_each_action_once(
    admin: Admin, service_url: str, tmp_path: Path
) -> None:
    runs = int(os.environ.get("KILL_RESERVATION_RUNS", "8"))
    parsed = urlparse(service_url)
    upstream = (parsed.hostname, parsed.port)
    started = time.monotonic()

    def plans(k: int) -> List[Plan]:
        # The first life runs every action from scratch: its point is
        # always reached. The second is killed at another, if it gets there.
        return [Plan(phase, 0, 0, True, call=call) for phase, call in
                (RESERVATION_POINTS[k % 8], RESERVATION_POINTS[(k + 3) % 8])]

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(
            lambda k: run_once(admin, upstream, 20261205 * 100 + k, tmp_path,
                               "reservations", plans(k)),
            range(runs),
        ))
    hit: Counter = Counter()
    for result in results:
        for _, method, path, kind in result.fired:
            if kind in ("kill_before_send", "kill_after_send"):
                hit[(kind[len("kill_"):], call_of(method, path))] += 1
    print(
        f"\nkill points (reservation calls): {runs} runs, "
        f"{sum(sum(r.kills.values()) for r in results)} SIGKILLs: "
        + ", ".join(f"{phase} {call} {hit[(phase, call)]}" for phase, call in RESERVATION_POINTS)
        + f"; {sum(r.actions for r in results)} actions, {sum(r.charges for r in results)} commits, "
        f"{sum(r.actions - r.charged for r in results)} releases, {time.monotonic() - started:.1f}s"
    )
    missing = [point for point in RESERVATION_POINTS if hit[point] == 0]
    assert not missing, f"no kill at {missing}: KILL_RESERVATION_RUNS must be at least 8"
