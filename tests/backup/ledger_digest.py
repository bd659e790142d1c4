#!/usr/bin/env python3
"""Recomputes `token-billing ledger-digest` without the service's code.

An auditor's independent check of the chain (docs/backup.md, "The ledger
digest"): reads one ledger entry per line on stdin, in id order, and prints
the digest, the number of entries and the format as JSON.

Format 2, sha256-chain-v2 (the default of `ledger-digest`): each line is
the entry as a JSON object with every column, as psql prints
`row_to_json(e)` of `ledger_entries e`. Its canonical form is that object
with its keys sorted, compact, every time (a column named `…_at`) in UTC
with six decimals and a `Z`; a column added after format 2 (`api_key_id`)
is left out when it is null, so digests kept before it still compute.

Format 1, sha256-chain-v1 (`ledger-digest --format 1`, for digests kept
before format 2): each line is a JSON array [id, account_id, kind, amount,
available_after, reserved_after, used_after, reservation_id, job_id,
external_ref, reason, actor, created_at], hashed as it is, compact.

    link_0 = "0" * 64
    link_n = sha256_hex(link_{n-1} + "\\n" + canonical(entry_n))
"""

import hashlib
import json
import sys
from datetime import datetime, timezone

FORMATS = {1: "sha256-chain-v1", 2: "sha256-chain-v2"}
LATER_COLUMNS = ("api_key_id",)


def utc_micros(text: str) -> str:
    instant = datetime.fromisoformat(text).astimezone(timezone.utc)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(entry) -> str:
    if isinstance(entry, dict):
        entry = {
            name: utc_micros(value) if name.endswith("_at") and value is not None else value
            for name, value in entry.items()
            if not (name in LATER_COLUMNS and value is None)
        }
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False)


def main() -> None:
    link = "0" * 64
    entries = 0
    last_entry_id = None
    version = None
    for line in sys.stdin:
        if not line.strip():
            continue
        entry = json.loads(line)
        shape = 2 if isinstance(entry, dict) else 1
        if version not in (None, shape):
            sys.exit("ledger_digest.py: lines of both formats (objects and arrays)")
        version = shape
        link = hashlib.sha256(f"{link}\n{canonical(entry)}".encode("utf-8")).hexdigest()
        entries += 1
        last_entry_id = entry["id"] if shape == 2 else entry[0]
    print(
        json.dumps(
            {
                "digest": link,
                "entries": entries,
                "last_entry_id": last_entry_id,
                "format": FORMATS[version or 2],
            }
        )
    )


if __name__ == "__main__":
    main()
