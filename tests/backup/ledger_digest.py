#!/usr/bin/env python3
"""Recomputes `token-billing ledger-digest` without the service's code.

An auditor's independent check of the chain (format sha256-chain-v1,
docs/backup.md): reads one ledger entry per line on stdin, each a JSON
array [id, account_id, kind, amount, available_after, reserved_after,
used_after, reservation_id, job_id, external_ref, reason, actor, created_at]
in id order (the psql query in docs/backup.md prints exactly that), and
prints the digest and the number of entries as JSON.

    link_0 = "0" * 64
    link_n = sha256_hex(link_{n-1} + "\\n" + compact_json(entry_n))
"""

import hashlib
import json
import sys


def main() -> None:
    link = "0" * 64
    entries = 0
    last_entry_id = None
    for line in sys.stdin:
        if not line.strip():
            continue
        entry = json.loads(line)
        canonical = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
        link = hashlib.sha256(f"{link}\n{canonical}".encode("utf-8")).hexdigest()
        entries += 1
        last_entry_id = entry[0]
    print(json.dumps({"digest": link, "entries": entries, "last_entry_id": last_entry_id}))


if __name__ == "__main__":
    main()
