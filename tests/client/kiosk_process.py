"""A kiosk process for the kill-point tests: started, SIGKILLed at chosen
points, started again on the same journal, until it finishes its work.

Each start: ``resume()`` first (the journal's open requests), then the
guest actions ``0 … count-1`` not yet in the journal, each one
``generate`` (workload ``jobs``) or ``reserve`` + ``extend`` (local work
that takes a while) + ``commit`` of 1 token, or ``release`` for every third
action (workload ``reservations``). A reservation that ``resume()`` returns
still held gets that same end: in this workload the local work is done by
the time the reservation is answered. Prints JSON lines; the last one, ``done``, lists
the journal. The key comes from the environment (``KIOSK_KEY``), never argv.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from token_billing_kiosk import Kiosk, Reservation


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--account", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--delays-ms", required=True, help="comma-separated, one per action")
    parser.add_argument("--workload", choices=("jobs", "reservations"), default="jobs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    delays = [int(text) for text in args.delays_ms.split(",")]
    kiosk = Kiosk(args.url, os.environ["KIOSK_KEY"], args.account, args.journal, timeout=60)

    def finish(reservation: Reservation, action: int) -> Reservation:
        """The end of an action's reservation: release every third, else commit 1."""
        if action % 3 == 2:
            return kiosk.release(reservation)
        return kiosk.commit(reservation, amount=1)

    for outcome in kiosk.resume(timeout=60):
        if outcome.error is not None:
            emit("resume_error", request_id=outcome.request_id, error=str(outcome.error))
            return 3
        reservation = outcome.reservation
        if reservation is not None and reservation.held and outcome.operation == "reserve":
            reservation = finish(reservation, int(outcome.entry.body["amount"]) - 1000)
        emit(
            "resumed",
            request_id=outcome.request_id,
            operation=outcome.operation,
            status=outcome.job.status if outcome.job else None,
            state=reservation.state if reservation else None,
        )

    def action_of(params: object) -> int:
        assert isinstance(params, dict)
        return int(params["action"])

    done = set()
    for entry in kiosk.history(limit=10_000):
        if entry.operation == "job":
            done.add(action_of(entry.body["params"]))
        elif entry.operation == "reserve":
            done.add(int(entry.body["amount"]) - 1000)
    for action in range(args.count):
        if action in done:
            continue
        if args.workload == "jobs":
            params = {"action": action, "simulate": {"delay_ms": delays[action]}}
            job = kiosk.generate("standard", params)
            emit("generated", action=action, request_id=job.request_id, status=job.status)
        else:
            # The amount names the action (1000 + n): the journal alone then
            # says which actions were asked for.
            reservation = kiosk.reserve(1000 + action, ttl_seconds=60)
            kiosk.extend(reservation, 120)
            ended = finish(reservation, action)
            emit("ended", action=action, request_id=reservation.request_id, state=ended.state)

    journal = [
        {
            "request_id": entry.request_id,
            "operation": entry.operation,
            "state": entry.state,
            "body": entry.body,
            "answer": entry.answer,
        }
        for entry in kiosk.history(limit=10_000)
    ]
    emit("done", journal=journal)
    kiosk.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
