"""The client keeps its secrets: the key is in no repr and in no state that
pickle or copy would take, of the Kiosk or of its Http; the journal's
files are the owner's alone."""

from __future__ import annotations

import copy
import os
import pickle
import stat
from pathlib import Path

from token_billing_kiosk import Kiosk
REDACTED_KEY = "tbk_…[redacted]"

KEY = "tbk_0123456789abcdef0123456789abcdef_s3cr3t-never-printed-anywhere"
SECRET = "s3cr3t-never-printed-anywhere"


def test_repr_and_state_show_the_key_redacted(tmp_path: Path) -> None:
    kiosk = Kiosk(
        "http://127.0.0.1:9",
        KEY,
        "01a24609-4ff2-7444-903a-02cf3e9db5e9",
        journal=tmp_path / "kiosk.sqlite3",
    )
    try:
        http = kiosk._http
        shown = [
            repr(kiosk),
            str(kiosk),
            repr(http),
            repr(kiosk.__getstate__()),
            repr(http.__getstate__()),
            repr(pickle.dumps(http.__getstate__()["_headers"])),
            repr(copy.copy(http).__dict__),
        ]
        for text in shown:
            assert SECRET not in text, text
        assert REDACTED_KEY in repr(kiosk)
        assert REDACTED_KEY in repr(http)
    finally:
        kiosk.close()


def test_the_journal_and_its_lock_are_the_owners_alone(tmp_path: Path) -> None:
    journal = tmp_path / "kiosk.sqlite3"
    # Left readable by others before (an older client, a restored backup).
    journal.touch(mode=0o644)
    os.chmod(journal, 0o644)
    lock = tmp_path / "kiosk.sqlite3.lock"
    lock.touch()
    os.chmod(lock, 0o644)
    kiosk = Kiosk("http://127.0.0.1:9", KEY, "01a24609-4ff2-7444-903a-02cf3e9db5e9", journal=journal)
    try:
        for path in (journal, lock):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    finally:
        kiosk.close()
